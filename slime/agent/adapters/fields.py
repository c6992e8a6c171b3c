"""Small validators for request bodies: every failure is a 400 naming the field.

Also the request parts both protocols share once their names are mapped:
``tool_list``/``function_tool`` (tool definitions -> the chat template's
function form) and ``sampling_params`` (body fields -> SGLang sampling params).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from slime.agent.adapters.sessions import AdapterError

__all__ = [
    "bad",
    "function_tool",
    "opt_bool",
    "opt_int",
    "opt_number",
    "opt_str_list",
    "sampling_params",
    "sse",
    "text_of",
    "tool_list",
]


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


def tool_list(raw: Any, entry: Callable[[Any, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """``tools`` of a request: ``entry(tool, field)`` translates each one (``[]`` when absent)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("tools", "must be a list")
    return [entry(t, f"tools[{i}]") for i, t in enumerate(raw)]


_EMPTY_SCHEMA = {"type": "object", "properties": {}}


def function_tool(spec: Any, field: str, *, schema_key: str, schema_field: str, shape: str) -> dict[str, Any]:
    """``spec`` (a dict with ``name``, ``description`` and the schema under ``schema_key``) as a
    chat-template function tool; a bad shape is a 400 on ``field``, a bad schema on ``schema_field``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad(field, f"must be {shape}")
    schema = spec.get(schema_key, dict(_EMPTY_SCHEMA))
    if not isinstance(schema, dict):
        raise bad(schema_field, "must be a JSON Schema object")
    return {
        "type": "function",
        "function": {"name": spec["name"], "description": spec.get("description", ""), "parameters": schema},
    }


def sampling_params(
    body: dict,
    *,
    max_tokens_keys: tuple[str, ...],
    max_temperature: float,
    stop_key: str,
    stop_allow_str: bool,
    top_k: bool,
) -> dict[str, Any]:
    """SGLang sampling params from a request: the first of ``max_tokens_keys`` present gives
    ``max_new_tokens``; ``temperature`` in [0, max_temperature], ``top_p`` in [0, 1], ``top_k``
    (when the protocol has it) and the stop strings under ``stop_key``."""
    out: dict[str, Any] = {}
    for key in max_tokens_keys:
        v = opt_int(body, key, 1)
        if v is not None:
            out["max_new_tokens"] = v
            break
    for key, hi in (("temperature", max_temperature), ("top_p", 1.0)):
        v = opt_number(body, key, 0.0, hi)
        if v is not None:
            out[key] = v
    if top_k:
        k = opt_int(body, "top_k", 1)
        if k is not None:
            out["top_k"] = k
    stop = opt_str_list(body, stop_key, allow_str=stop_allow_str)
    if stop:
        out["stop"] = stop
    return out
