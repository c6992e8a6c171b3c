"""Small validators for request bodies: every failure is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

from slime.agent.adapters.sessions import AdapterError

__all__ = ["bad", "opt_bool", "opt_int", "opt_number", "opt_str_list", "sse", "text_of"]


def bad(field: str, message: str) -> AdapterError:
    return AdapterError(f"{field}: {message}", code="invalid_request")


def opt_number(body: dict, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise bad(key, f"must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def opt_int(body: dict, key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise bad(key, f"must be an integer >= {lo}, got {v!r}")
    return v


def opt_bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(key, f"must be true or false, got {v!r}")
    return v


def opt_str_list(body: dict, key: str, *, allow_str: bool) -> list[str]:
    v = body.get(key)
    if v is None:
        return []
    if allow_str and isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise bad(key, "must be a list of non-empty strings" + (" or a string" if allow_str else ""))
    return list(v)


def text_of(content: Any, field: str, *, part_type: str = "text") -> str:
    """Text of a string content or a list of text parts/blocks (other part types are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(field, f"must be a string or a list of {part_type} parts, got {type(content).__name__}")
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != part_type or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad(f"{field}[{i}]", f"only {part_type!r} parts with a string 'text' are supported, got {kind!r}")
        out.append(part["text"])
    return "".join(out)


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"{head}data: {payload}\n\n".encode()
