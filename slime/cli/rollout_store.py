"""Saved rollouts read lazily, for the viewers: one Parquet file per rollout, a page at a time.

The files are those ``debug.save_rollouts`` writes (``slime/runtime/rollout/saved.py``: the columns and
their meaning). Counting reads only each file's footer; the index that filters and sorts reads only the
small columns (ids, reward, status, version, response length); a page reads its rows' whole records from
the files they are in. pyarrow is imported when a file is read (the CLI's parser never pays for it).
The trainer's log-probs come from the rollout's sidecars (``saved.read_trainer``, matched by row and ids),
else a ``trainer_log_probs`` column or ``extra_json`` key of another writer. Token text: ``tokenizer.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SORTS", "Filter", "IndexRow", "read_index", "read_samples", "rollout_file", "saved_rollouts", "vocab"]

#: the index's columns (everything else is read per page)
INDEX_COLUMNS = ("rollout_id", "group_index", "index", "reward", "status", "weight_version", "response_tokens")
#: where a writer keeps the trainer's per-token log-probs (a column, or a key of extra_json)
TRAINER_KEYS = ("trainer_log_probs", "log_probs")
SORTS = ("order", "reward", "-reward", "len", "-len", "group")


def rollout_file(directory: Path, rollout_id: int) -> Path:
    return Path(directory) / f"rollout_{rollout_id:06d}.parquet"  # the name saved.py's rollout_path gives


def saved_rollouts(directory: Path) -> list[int]:
    """The rollout ids saved in ``directory``, ascending (none when it does not exist)."""
    out = []
    for p in Path(directory).glob("rollout_*.parquet"):
        stem = p.stem.removeprefix("rollout_")
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def count_rows(directory: Path, rollout_id: int) -> int:
    """Samples in one saved rollout: from the file's footer, no data read."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(rollout_file(directory, rollout_id)).metadata.num_rows


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What filters and sorts see of one sample; ``row`` is its position in its rollout's file."""

    rollout_id: int
    row: int
    group: int | None
    index: int | None
    reward: float | None
    status: str
    version: int
    length: int


def read_index(directory: Path, rollout_ids: Iterable[int]) -> list[IndexRow]:
    """The index of the given rollouts (small columns only), in saved order."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: list[IndexRow] = []
    for rid in rollout_ids:
        t = pq.read_table(rollout_file(directory, rid), columns=list(INDEX_COLUMNS))
        lengths = pc.list_value_length(t.column("response_tokens")).fill_null(0).to_pylist()
        cols = [t.column(c).to_pylist() for c in INDEX_COLUMNS[:-1]]
        for row, (r, g, i, rew, st, v) in enumerate(zip(*cols)):
            out.append(IndexRow(r if r is not None else rid, row, g, i, rew, st or "", v or 0, lengths[row]))
    return out


@dataclass(frozen=True, slots=True)
class Filter:
    group: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_len: int | None = None
    max_len: int | None = None
    status: str | None = None

    def keep(self, r: IndexRow) -> bool:
        reward = r.reward if r.reward is not None else float("nan")
        return (
            (self.group is None or r.group == self.group)
            and (self.min_reward is None or reward >= self.min_reward)
            and (self.max_reward is None or reward <= self.max_reward)
            and (self.min_len is None or r.length >= self.min_len)
            and (self.max_len is None or r.length <= self.max_len)
            and (self.status is None or r.status == self.status)
        )


def select(rows: list[IndexRow], flt: Filter, sort: str = "order") -> list[IndexRow]:
    """The rows ``flt`` keeps, sorted (``order``: as saved; ``-`` descending; ``group``: by group, then index)."""
    kept = [r for r in rows if flt.keep(r)]
    key = sort.lstrip("-")
    if key == "reward":
        kept.sort(key=lambda r: (r.reward is None, r.reward or 0.0), reverse=sort.startswith("-"))
    elif key == "len":
        kept.sort(key=lambda r: r.length, reverse=sort.startswith("-"))
    elif key == "group":
        kept.sort(key=lambda r: (r.rollout_id, r.group if r.group is not None else -1, r.index or 0))
    elif key != "order":
        raise ValueError(f"unknown sort {sort!r}: one of {', '.join(SORTS)}")
    return kept


def _loads(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _trainer(directory: Path, rollout_id: int) -> dict[int, Any]:
    """The rollout's sidecar entries by row (``slime/runtime/rollout/saved.py``: what they hold)."""
    from slime.runtime.rollout.saved import read_trainer

    return read_trainer(directory, rollout_id)


def _sample(rec: dict[str, Any], rollout_id: int, entry: Any = None) -> dict[str, Any]:
    """One record as the viewers show it; ``entry``: its row's sidecar entry, if any."""
    extra = _loads(rec.get("extra_json")) or {}
    trainer = next((rec.get(k) for k in TRAINER_KEYS if rec.get(k) is not None), None)
    if trainer is None and entry is not None:
        trainer = entry.of(rec.get("group_index"), rec.get("index"), len(rec.get("response_tokens") or []))
    if trainer is None and isinstance(extra, dict):
        trainer = next((extra[k] for k in TRAINER_KEYS if extra.get(k) is not None), None)
    metadata = _loads(rec.get("metadata_json")) or {}
    return {
        "rollout_id": rec.get("rollout_id", rollout_id),
        "group": rec.get("group_index"),
        "index": rec.get("index"),
        "prompt": rec.get("prompt") or "",
        "prompt_len": len(rec.get("prompt_tokens") or []),
        "response": rec.get("response") or "",
        "tokens": list(rec.get("response_tokens") or []),
        "reward": rec.get("reward"),
        "status": rec.get("status") or "",
        "label": _loads(rec.get("label_json")),
        "version": rec.get("weight_version") or 0,
        "token_versions": list(rec.get("token_versions") or []),
        "loss_mask": [int(x) for x in rec.get("loss_mask") or []],
        "engine_lp": [float(x) for x in rec.get("rollout_log_probs") or []],
        "trainer_lp": [float(x) for x in trainer] if isinstance(trainer, list) else None,
        "metadata": metadata if isinstance(metadata, dict) else {"value": metadata},
    }


def read_samples(directory: Path, refs: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
    """Whole records of the samples ``refs`` = (rollout id, row), in that order; each file is read once."""
    import pyarrow.parquet as pq

    refs = list(refs)
    by_file: dict[int, list[int]] = {}
    for rid, row in refs:
        by_file.setdefault(rid, []).append(row)
    got: dict[tuple[int, int], dict[str, Any]] = {}
    for rid, rows in by_file.items():
        table = pq.read_table(rollout_file(directory, rid)).take(sorted(set(rows)))
        trainer = _trainer(directory, rid)
        for row, rec in zip(sorted(set(rows)), table.to_pylist()):
            got[(rid, row)] = _sample(rec, rid, trainer.get(row))
    return [got[ref] for ref in refs]


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode (byte-level BPE vocabularies spell bytes with these)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _tokenizer_files(task_dir: Path, spec: dict[str, Any]) -> list[Path]:
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    found = [task_dir / "final_model" / "tokenizer.json", *sorted((task_dir / "model").glob("*/tokenizer.json"))]
    for key in ("tokenizer", "path"):
        if isinstance(model.get(key), str):
            found.append(Path(model[key]) / "tokenizer.json")
    return [p for p in found if p.is_file()]


def vocab(task_dir: Path, spec: dict[str, Any]) -> dict[int, str] | None:
    """Token id -> its text, from the run's ``tokenizer.json`` (byte-level BPE decoded); None when not found."""
    for path in _tokenizer_files(Path(task_dir), spec):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        model = doc.get("model") or {}
        v = model.get("vocab")
        pairs = v.items() if isinstance(v, dict) else ((t[0], i) for i, t in enumerate(v or []))
        out = {int(i): str(t) for t, i in pairs}
        if "ByteLevel" in json.dumps(doc.get("decoder") or {}):
            dec = _byte_decoder()
            out = {i: bytes(dec.get(ch, 63) for ch in t).decode("utf-8", "replace") for i, t in out.items()}
        for a in doc.get("added_tokens") or []:
            out[int(a["id"])] = str(a["content"])
        return out
    return None


def iter_samples(directory: Path, rollout_ids: Iterable[int], limit: int | None = None) -> Iterable[dict[str, Any]]:
    """Every sample of the given rollouts in saved order (each file read once), at most ``limit``."""
    import pyarrow.parquet as pq

    n = 0
    for rid in rollout_ids:
        trainer = _trainer(directory, rid)
        for row, rec in enumerate(pq.read_table(rollout_file(directory, rid)).to_pylist()):
            if limit is not None and n >= limit:
                return
            yield {**_sample(rec, rid, trainer.get(row)), "row": row}
            n += 1
