"""The runtime record of one generated response: :class:`Sample`.

Mutable on purpose (the rollout fills it in: generate → reward → filter) and plain Python, no
torch, so plug-ins, reward servers and the control plane can use it cheaply.
Guaranteed: ``from_dict(s.to_dict()) == s`` for JSON-like ``label``/``metadata``; unknown keys
survive a round trip in ``extra``; ``from_dict`` rejects wrong types naming the field. Not checked
there: cross-field lengths (:meth:`Sample.check_lengths`, once a sample is complete).
Conventions: ``tokens`` is prompt + response; ``loss_mask``, ``rollout_log_probs``,
``teacher_log_probs`` and ``token_versions`` cover the last ``response_length`` tokens only.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Sample", "SampleStatus"]


class SampleStatus(enum.StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(slots=True)
class Sample:
    group_index: int | None = None
    index: int | None = None
    prompt: str = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | None = None
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    teacher_log_probs: list[float] = field(default_factory=list)  # algorithm.opd type engine: the teacher's
    status: SampleStatus = SampleStatus.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_version: int = 0
    token_versions: list[int] = field(default_factory=list)
    # Keys seen by from_dict that are not fields above; written back by to_dict.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length :]

    def check_lengths(self) -> None:
        """Raise ``ValueError`` if token, mask and log-prob lengths disagree."""
        if not 0 <= self.response_length <= len(self.tokens):
            raise ValueError(
                f"sample {self.index}: response_length {self.response_length} is outside "
                f"0..len(tokens)={len(self.tokens)}"
            )
        if self.loss_mask and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"sample {self.index}: loss_mask has {len(self.loss_mask)} entries but "
                f"response_length is {self.response_length} (the mask covers response tokens only)"
            )
        if self.rollout_log_probs and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: rollout_log_probs has {len(self.rollout_log_probs)} entries "
                f"but response_length is {self.response_length}"
            )
        if self.teacher_log_probs and len(self.teacher_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: teacher_log_probs has {len(self.teacher_log_probs)} entries "
                f"but response_length is {self.response_length}"
            )
        if self.token_versions and len(self.token_versions) != self.response_length:
            raise ValueError(
                f"sample {self.index}: token_versions has {len(self.token_versions)} entries "
                f"but response_length is {self.response_length}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``extra`` keys come first so real fields win on a clash."""
        out: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if isinstance(value, SampleStatus):
                value = value.value
            elif isinstance(value, (list, dict)):
                value = type(value)(value)  # shallow copy: the dict must not alias the sample
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        if not isinstance(data, Mapping):
            raise ValueError(f"a sample must be a mapping, got {type(data).__name__}")
        known: dict[str, Any] = {}
        extra: dict[str, Any] = dict(data.get("extra") or {})
        for key, value in data.items():
            if key == "extra":
                continue
            if key in _FIELD_NAMES:
                known[key] = _check_field(key, value)
            else:
                extra[key] = value
        return cls(**known, extra=extra)


_FIELD_NAMES = frozenset(f.name for f in fields(Sample)) - {"extra"}


def episode_id(sample: Sample) -> Hashable:
    """What makes samples one episode when scores are normalised per group
    (``slime.runtime.train_data.sequence_scores``): an agent session (its forked leaves share a reward), else
    the sample itself."""
    agent = (sample.metadata or {}).get("agent")
    session = agent.get("session_id") if isinstance(agent, dict) else None
    return ("session", session) if session is not None else ("sample", sample.index, id(sample))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_field(key: str, value: Any) -> Any:
    """Validate and convert one known field read from a dict."""

    def bad(expected: str) -> ValueError:
        return ValueError(f"sample field {key!r} must be {expected}, got {value!r}")

    if key in ("group_index", "index"):
        if value is not None and not _is_int(value):
            raise bad("an integer or null")
        return value
    if key in ("response_length", "weight_version"):
        if not _is_int(value):
            raise bad("an integer")
        return value
    if key in ("prompt", "response"):
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if key in ("tokens", "loss_mask", "token_versions"):
        if not isinstance(value, list) or not all(_is_int(t) for t in value):
            raise bad("a list of integers")
        return list(value)
    if key in ("rollout_log_probs", "teacher_log_probs"):
        if not isinstance(value, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) for t in value
        ):
            raise bad("a list of numbers")
        return [float(t) for t in value]
    if key == "reward":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number or null")
        return float(value)
    if key == "status":
        try:
            return SampleStatus(value)
        except ValueError:
            valid = ", ".join(s.value for s in SampleStatus)
            raise bad(f"one of {valid}") from None
    if key == "metadata":
        if not isinstance(value, Mapping):
            raise bad("a mapping")
        return dict(value)
    return value  # label: any JSON value
