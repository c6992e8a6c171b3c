"""slime's supervised fine-tuning scripts as a ``kind: SFTJob`` spec: the SFT part of ``import-slime-args``.

:func:`sft_import` takes the parsed flags (``flagmap.Flag``: name and values) and returns the SFT spec's
sections, the flags it accounts for, a note per flag that has no one-to-one field, and the spec paths
the generic flag table may have set that an SFT spec must not carry. None when the flags are not an SFT
run (neither slime's ``sft_rollout`` nor ``--loss-type sft_loss``). A contradiction (the SFT rollout
with another loss, the SFT loss on generated rollouts, a loss averaged per sample) raises
:class:`SftImportError` naming the flag: the import never turns one setting into another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["SFT_LOSS", "SFT_ROLLOUT", "SftImport", "SftImportError", "sft_import"]

SFT_ROLLOUT = "slime.rollout.sft_rollout.generate_rollout"
SFT_LOSS = "sft_loss"
# What the generic flag table may write that kind SFTJob refuses (slime.spec.sft_rules): reward, the RL
# algorithm, rollout sampling; the lead's wiring drops them when sft_import returns a result.
UNSET = (
    "reward",
    "algorithm",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.top_k",
    "rollout.over_sampling_batch_size",
    "rollout.dynamic_sampling",
    "rollout.partial",
    "model.ref_path",
    "debug",  # --debug-train-only: slime's way to start no engines for training; not a replay of saved rollouts
)


class _Flag(Protocol):
    name: str
    values: list[str]


class SftImportError(ValueError):
    """The flags ask for something kind SFTJob would train differently; ``flag`` is the one to change."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class SftImport:
    sections: dict[str, Any]  # dotted v2 spec path -> value
    consumed: tuple[str, ...]  # the flags this mapping accounts for
    notes: list[tuple[str, str]] = field(default_factory=list)  # (flag, what it became, or why it needs no field)
    unset: tuple[str, ...] = UNSET  # spec paths (and sections) an SFT spec must not carry


def _value(flags: dict[str, list[str]], name: str) -> str | None:
    vals = flags.get(name)
    return vals[-1] if vals else None


def _check_sft(flags: dict[str, list[str]]) -> bool:
    """Whether these flags are an SFT run; raises on a half-SFT one."""
    rollout, loss = _value(flags, "--rollout-function-path"), _value(flags, "--loss-type")
    if rollout != SFT_ROLLOUT and loss != SFT_LOSS:
        return False
    if rollout == SFT_ROLLOUT and loss != SFT_LOSS:
        raise SftImportError(
            "--loss-type",
            f"{SFT_ROLLOUT} makes samples without rewards, but the loss is {loss or 'policy_loss (the default)'}; "
            f"an SFT job trains --loss-type {SFT_LOSS}",
        )
    if rollout != SFT_ROLLOUT:
        raise SftImportError(
            "--rollout-function-path",
            f"--loss-type {SFT_LOSS} on {'rollouts of ' + rollout if rollout else 'generated rollouts'}: kind SFTJob "
            f"trains on the data's transcripts ({SFT_ROLLOUT}); port a custom rollout by hand",
        )
    if "--calculate-per-token-loss" not in flags:
        raise SftImportError(
            "--calculate-per-token-loss",
            "without it slime averages each sample's token mean; kind SFTJob trains the per-token mean over the "
            "step's assistant tokens: add --calculate-per-token-loss to keep the same loss",
        )
    n = _value(flags, "--n-samples-per-prompt")
    if n not in (None, "1"):
        raise SftImportError("--n-samples-per-prompt", f"{n}: kind SFTJob trains each transcript once per epoch")
    return True


def _eval(flags: dict[str, list[str]], input_key: str, notes: list[tuple[str, str]]) -> dict[str, Any]:
    """slime's validation loss (``--val-data``) as an eval set: its loss, and greedy generations too."""
    path = _value(flags, "--val-data")
    if path is None:
        return {}
    val_key = _value(flags, "--val-input-key") or "messages"
    if val_key != input_key:
        raise SftImportError(
            "--val-input-key",
            f"{val_key!r} differs from --input-key {input_key!r}; eval sets use data.input_key: rename the key "
            "in one of the files",
        )
    entry: dict[str, Any] = {"name": "val", "path": path}
    if _value(flags, "--val-interval"):
        entry["interval"] = int(_value(flags, "--val-interval") or 1)
    notes.append(("--val-data", "data.eval[0]: eval/val/loss as in slime, plus greedy generations of the last reply"))
    if "--val-batch-size" in flags:
        notes.append(("--val-batch-size", "the held-out loss runs over the whole set (a batch size is speed only)"))
    return {"data.eval": [entry]}


def sft_import(flags: Sequence[_Flag], *, entry: str | None = None) -> SftImport | None:
    """The ``kind: SFTJob`` sections of these flags (see the module doc); ``entry``: slime's script
    (``train.py``, ``train_async.py``)."""
    given = {f.name: list(f.values) for f in flags}
    if not _check_sft(given):
        return None
    input_key = _value(given, "--input-key") or "input"  # slime's default; its SFT scripts pass messages
    sections: dict[str, Any] = {
        "kind": "SFTJob",
        "rollout.n_samples_per_prompt": 1,
        "data.input_key": input_key,
        "data.label_key": None,  # a held-out generation is scored against the transcript's last reply
        "data.apply_chat_template": True,  # slime's sft_rollout always renders the messages with the template
    }
    notes = [
        ("--rollout-function-path", f"kind: SFTJob ({SFT_ROLLOUT}: the data's transcripts, no generation)"),
        ("--loss-type", "kind: SFTJob (the NLL of the assistant turns)"),
        ("--calculate-per-token-loss", "kind: SFTJob's loss is the per-token mean"),
    ]
    if _value(given, "--num-epoch"):
        sections["rollout.epochs"] = int(_value(given, "--num-epoch") or 1)
    if entry and "async" in entry:
        sections["train.async"] = False
        notes.append((entry, "train.async: false (an SFT job generates nothing to overlap with training)"))
    for flag, why in (
        ("--disable-compute-advantages-and-returns", "kind SFTJob computes no advantages or returns"),
        ("--debug-train-only", "no rollout generation; the engines start only to serve data.eval generations"),
        ("--loss-mask-type", "the tokenizer's own chat template marks the assistant turns (any prefix-stable one)"),
        ("--log-sft-entropy", "dropped: logging only (slime-submit logs the SFT loss, not its entropy)"),
    ):
        if flag in given:
            notes.append((flag, why))
    sections.update(_eval(given, input_key, notes))
    mapped = {n for n, _ in notes} | {"--input-key", "--num-epoch", "--n-samples-per-prompt", "--val-input-key"}
    consumed = tuple(f for f in given if f in mapped | {"--val-interval"})
    return SftImport(sections=sections, consumed=consumed, notes=notes)
