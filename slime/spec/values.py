"""Turn parsed YAML (file or ``--set``) into plain JSON-like data, reporting what cannot be.

``normalise`` walks the data once: timestamps and ``!!str`` scalars become the strings written,
keys become strings, and anything else JSON Schema cannot judge (``!!binary``, ``!!set``, custom
tags, ``.nan``/``.inf``, strings with NUL) is a :class:`Problem` at its path and origin, replaced
by :data:`INVALID` so the schema stage does not report it again.
Guaranteed: the result holds only dict/list/str/int/float/bool/None and :data:`INVALID`; the input
is not modified.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Set
from typing import Any

from slime.spec.errors import Problem
from slime.spec.schema import dotted, origin_of
from slime.spec.yamlmarks import Marks, Path

__all__ = ["INVALID", "normalise"]


class _Invalid:
    """Stands in for a value already reported; fails every schema type check."""

    def __repr__(self) -> str:
        return "<invalid>"

    def __copy__(self) -> _Invalid:
        return self

    def __deepcopy__(self, memo: dict) -> _Invalid:
        return self


INVALID = _Invalid()
_STR_TAG = "tag:yaml.org,2002:str"


def _tag_of(value: Any) -> str | None:
    tag = getattr(value, "tag", None)
    return getattr(tag, "value", tag) if tag is not None else None


def _text(value: str) -> str | None:
    """``value`` as a plain str; escaped surrogate pairs ("\\ud83d\\ude00", as JSON writes astral
    characters) joined into the character; None if a lone surrogate remains."""
    value = str(value)
    if not any("\ud800" <= ch <= "\udfff" for ch in value):
        return value
    try:
        return value.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return None


def normalise(data: Any, marks: Marks, *, task: int | None = None) -> tuple[Any, list[Problem]]:
    """Plain data for the schema stage, plus a problem for every value YAML allowed but a spec cannot use."""
    problems: list[Problem] = []

    def bad(path: Path, message: str, hint: str) -> _Invalid:
        problems.append(
            Problem(path=dotted(path), message=message, hint=hint, origin=origin_of(path, marks), task=task)
        )
        return INVALID

    def walk(value: Any, path: Path) -> Any:
        if value is None or isinstance(value, bool) or value is INVALID:
            return value
        if isinstance(value, int):
            if -(1 << 63) <= value < (1 << 63):
                return int(value)
            return bad(path, f"{value} does not fit in 64 bits", "use a smaller integer")
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return bad(path, f"{value!r} is not a finite number", "write a finite number (not .nan or .inf)")
        if isinstance(value, str):
            text = _text(value)
            if text is None:
                return bad(
                    path,
                    "the string has an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)",
                    "write the character itself, or a \\U0001XXXX escape",
                )
            if "\x00" in text:
                return bad(path, "the string contains a NUL character (\\0)", "remove the \\0 escape")
            return text
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                key = _text(k if isinstance(k, str) else str(k))
                if key is None:
                    bad(path, "a key has an unpaired UTF-16 surrogate escape", "write the character itself")
                    continue
                out[key] = walk(v, path + (key,))
            return out
        if isinstance(value, (list, tuple)):
            return [walk(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, (datetime.date, datetime.time)):
            # YAML 1.1 timestamps (``2024-01-01``): the user wrote text, keep it as text.
            return value.isoformat(sep=" ") if isinstance(value, datetime.datetime) else value.isoformat()
        tag = _tag_of(value)
        if tag == _STR_TAG and hasattr(value, "value"):
            return walk(str(value.value), path)
        if isinstance(value, (bytes, bytearray)):
            return bad(path, "binary values (!!binary) are not supported", "write the value as a plain string")
        if isinstance(value, Set) or (tag or "").endswith(":set"):
            return bad(path, "YAML sets (!!set) are not supported", "write a list: [a, b]")
        if tag is not None:
            return bad(path, f"the YAML tag {tag!r} is not supported", "remove the tag; specs use plain YAML values")
        return bad(path, f"unsupported YAML value of type {type(value).__name__}", "write a plain YAML value")

    return walk(data, ()), problems
