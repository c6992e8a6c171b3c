"""Spec problems and the one error type that carries all of them.

Validation never stops at the first problem: every stage appends
:class:`Problem` records and the caller raises a single :class:`SpecError`.
Each problem knows where it came from (file:line:col, or the ``--set`` flag
that introduced the value) so the message points at what to edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Origin", "Problem", "SpecError"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Origin:
    """Where a value came from: a file position or a command-line override."""

    file: str
    line: int | None = None  # 1-based
    col: int | None = None  # 1-based
    override: str | None = None  # e.g. "--set train.seed=3"

    def __str__(self) -> str:
        if self.override is not None:
            return self.override
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.col or 1}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with a spec: where, what, and what to do about it."""

    path: str  # dotted field path, "" for the document itself
    message: str
    hint: str | None = None
    origin: Origin | None = None
    severity: Literal["error", "warning"] = "error"
    task: int | None = None  # sweep task index, when the problem is task-specific

    def format(self) -> str:
        where = f"{self.origin}: " if self.origin else ""
        task = f" [sweep task {self.task}]" if self.task is not None else ""
        text = f"{where}{self.severity}: {self.subject()}{task}{': ' if self.subject() or task else ''}{self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def subject(self) -> str:
        """The field the problem is about; "<document>" for the spec as a whole; "" for a problem
        that is about no place in the spec (e.g. the same spec already running)."""
        return self.path or ("<document>" if self.origin is not None else "")

    def to_json(self) -> dict[str, object]:
        o = self.origin
        return {
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
            "task": self.task,
            "file": o.file if o else None,
            "line": o.line if o else None,
            "col": o.col if o else None,
            "override": o.override if o else None,
        }


class SpecError(Exception):
    """A spec (or overrides) that cannot be run; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(
            (_printable(p) for p in problems),
            key=lambda p: (p.origin.file if p.origin else "", p.origin.line or 0 if p.origin else 0, p.path),
        )
        super().__init__(self.format())

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def format(self) -> str:
        n = len([p for p in self.problems if p.severity == "error"])
        head = f"{n} problem{'s' if n != 1 else ''} in spec"
        return head + ":\n" + "\n".join(p.format() for p in self.problems)


def _safe(text: str | None) -> str | None:
    if text is None or not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _printable(p: Problem) -> Problem:
    """The problem with lone surrogates (undecodable argv bytes, bad escapes) escaped, so it can be printed."""
    path, message, hint = _safe(p.path), _safe(p.message), _safe(p.hint)
    if (path, message, hint) == (p.path, p.message, p.hint):
        return p
    return Problem(path=path or "", message=message or "", hint=hint, origin=p.origin, severity=p.severity, task=p.task)
