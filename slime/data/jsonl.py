"""Prompt datasets read from JSONL or Parquet, with deterministic shuffling and an exact-resume cursor.

Each non-blank line (Parquet: row) is one object with the prompt (``input_key``: text or chat
messages), an optional label and metadata; ``sft=True`` reads chat transcripts (``kind: SFTJob``):
the prompt is the templated history before the last assistant reply, the label that reply. A file
is read completely before use (pyarrow reads Parquet), so a bad row fails the start
(``DatasetError`` naming ``file:line``, key and fix), never mid-epoch. Epoch ``e`` visits rows in a
permutation that is a pure function of ``(seed, e)``; restoring :meth:`PromptDataset.state_dict`
continues with exactly the batches an uninterrupted run would have produced. Over-long prompts are dropped and counted.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DatasetError", "PromptDataset", "PromptRow", "read_records"]


class DatasetError(ValueError):
    """A dataset file or row is unusable; the message names file:line and the fix."""


@dataclass(frozen=True)
class PromptRow:
    index: int  # position among the dataset's rows (after filtering)
    line: int  # 1-based line number in the file
    prompt: Any  # the raw input: a string or a list of chat messages
    text: str  # what the model sees: the prompt, chat-templated if requested
    label: Any = None
    metadata: dict = field(default_factory=dict)


def _check_messages(msgs: Any, where: str, key: str) -> None:
    if not msgs or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in msgs):
        raise DatasetError(
            f'{where}: {key!r} must be a string or a non-empty list of {{"role": ..., "content": ...}} messages'
        )


def read_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line or row number, object)`` of a JSONL or ``.parquet`` file; an unparsable line is yielded as
    the ``DatasetError`` naming it (so the caller reports it in order)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except ImportError:
            raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install 'slime-submit[runtime]')") from None
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no file
            raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
        yield from enumerate(table.to_pylist(), 1)
        return
    with path.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                yield lineno, json.loads(raw)
            except json.JSONDecodeError as exc:
                yield lineno, DatasetError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})")


class PromptDataset:
    """All rows of one JSONL file, iterated in seeded, resumable order."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        input_key: str = "prompt",
        label_key: str | None = "label",
        metadata_key: str | None = None,
        tools_key: str | None = None,
        sft: bool = False,
        tokenizer=None,
        apply_chat_template: bool = False,
        max_prompt_tokens: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.path = Path(path)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if (apply_chat_template or max_prompt_tokens) and tokenizer is None:
            raise DatasetError(f"{self.path}: apply_chat_template / max_prompt_tokens need a tokenizer")
        if not self.path.is_file():
            raise DatasetError(f"{self.path}: no such file (check the dataset path)")
        self.rows: list[PromptRow] = []
        self.dropped = 0
        self.sft = sft
        for lineno, obj in read_records(self.path):
            row = self._parse(
                obj, lineno, input_key, label_key, metadata_key, tools_key, tokenizer, apply_chat_template
            )
            if max_prompt_tokens and len(tokenizer.encode(row.text, add_special_tokens=False)) > max_prompt_tokens:
                self.dropped += 1
                continue
            self.rows.append(row)
        if not self.rows:
            why = f" ({self.dropped} longer than max_prompt_tokens={max_prompt_tokens})" if self.dropped else ""
            raise DatasetError(f"{self.path}: the dataset has no usable rows{why}")
        self.epoch = 0
        self.index = 0
        self._order_epoch = -1
        self._order: list[int] = []

    def _parse(
        self, obj: Any, lineno: int, input_key, label_key, metadata_key, tools_key, tokenizer, apply_chat_template
    ) -> PromptRow:
        where = f"{self.path}:{lineno}"
        if isinstance(obj, DatasetError):
            raise obj
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
        if input_key not in obj:
            raise DatasetError(
                f"{where}: missing key {input_key!r} (row has {sorted(obj)}); "
                "set the dataset's input_key to the prompt field"
            )
        prompt = obj[input_key]
        if isinstance(prompt, str):
            if not prompt:
                raise DatasetError(f"{where}: {input_key!r} is an empty string")
        elif isinstance(prompt, list):
            _check_messages(prompt, where, input_key)
            if not apply_chat_template:
                raise DatasetError(
                    f"{where}: {input_key!r} holds chat messages; enable apply_chat_template to turn them into a prompt"
                )
        else:
            raise DatasetError(
                f"{where}: {input_key!r} must be a string or a list of chat messages, got {type(prompt).__name__}"
            )
        if self.sft:
            return self._transcript(obj, prompt, where, lineno, input_key, label_key, tools_key, tokenizer)
        label = None
        if label_key is not None:
            if label_key not in obj:
                raise DatasetError(
                    f"{where}: missing key {label_key!r} (row has {sorted(obj)}); set label_key "
                    "to the answer field, or to null for unlabelled data"
                )
            label = obj[label_key]
        if metadata_key is not None:
            metadata = obj.get(metadata_key) or {}
            if not isinstance(metadata, dict):
                raise DatasetError(f"{where}: {metadata_key!r} must be a JSON object, got {type(metadata).__name__}")
        else:
            metadata = {k: v for k, v in obj.items() if k not in (input_key, label_key)}
        text = prompt
        if apply_chat_template:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            tools = obj.get(tools_key) if tools_key else None
            try:
                text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # noqa: BLE001 - template errors come from jinja with no row context
                raise DatasetError(f"{where}: the chat template failed on this row: {exc}") from None
        return PromptRow(index=len(self.rows), line=lineno, prompt=prompt, text=text, label=label, metadata=metadata)

    def _transcript(self, obj, messages, where, lineno, input_key, label_key, tools_key, tokenizer) -> PromptRow:
        """An SFT row: ``messages`` whole as the prompt (what trains), the history before the last assistant
        reply templated as the text (what an eval generates from), that reply (or ``label_key``) the label."""
        from slime.data.chat import split_last_reply

        split = split_last_reply(messages) if isinstance(messages, list) else None
        if split is None or not split[0]:
            raise DatasetError(
                f"{where}: {input_key!r} must be chat messages with a message before an assistant reply "
                '(kind SFTJob trains on the assistant turns), e.g. [{"role": "user", ...}, {"role": "assistant", ...}]'
            )
        history, reply = split
        tools = obj.get(tools_key) if tools_key else None
        try:
            text = tokenizer.apply_chat_template(history, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - template errors come from jinja with no row context
            raise DatasetError(f"{where}: the chat template failed on this row: {exc}") from None
        label = obj[label_key] if label_key is not None and label_key in obj else reply
        metadata = {k: v for k, v in obj.items() if k not in (input_key, label_key)}
        return PromptRow(index=len(self.rows), line=lineno, prompt=messages, text=text, label=label, metadata=metadata)

    # ----------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self.rows[i]

    def order(self, epoch: int) -> list[int]:
        """Row indices in the order epoch ``epoch`` visits them."""
        if epoch == self._order_epoch:
            return self._order
        order = list(range(len(self.rows)))
        if self.shuffle:
            # An int seed makes Random independent of PYTHONHASHSEED and platform.
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        self._order_epoch, self._order = epoch, order
        return order

    def next_batch(self, n: int) -> list[PromptRow]:
        """The next ``n`` rows, continuing into the next epoch when this one runs out."""
        if n <= 0:
            raise ValueError(f"batch size must be positive, got {n}")
        out = []
        while len(out) < n:
            order = self.order(self.epoch)
            take = min(n - len(out), len(order) - self.index)
            out.extend(self.rows[i] for i in order[self.index : self.index + take])
            self.index += take
            if self.index == len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "size": len(self.rows),
            "path": str(self.path),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a cursor saved by :meth:`state_dict`; refuses one from a different dataset or order."""
        try:
            epoch, index = int(state["epoch"]), int(state["index"])
        except (KeyError, TypeError, ValueError):
            raise DatasetError(f"{self.path}: dataset state {state!r} lacks integer 'epoch' and 'index'") from None
        for key, mine in (("size", len(self.rows)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise DatasetError(
                    f"{self.path}: saved dataset state has {key}={state[key]!r} but this dataset has {key}={mine!r};"
                    " resuming would not continue the same order (same file, seed and shuffle are required)"
                )
        if epoch < 0 or not 0 <= index < len(self.rows):
            raise DatasetError(
                f"{self.path}: saved cursor (epoch={epoch}, index={index}) is out of range for {len(self.rows)} rows"
            )
        self.epoch, self.index = epoch, index
