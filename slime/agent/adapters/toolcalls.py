"""The tool-call text format the adapters parse out of generated text (Qwen/Hermes style).

A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; ``arguments`` may be an
object, a string holding one, or absent. Any number of blocks, with free text around them.
A block that breaks the rules is an *invalid* call: reported with reason and raw text, never raised,
and its text stays in the message verbatim. ``raw_arguments`` is the arguments text as the model
wrote it (canonical shape), so sending it back re-renders the same tokens and the next prompt
extends the trajectory instead of forking it; otherwise it is ``json.dumps(arguments)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CALL_END",
    "CALL_START",
    "InvalidToolCall",
    "ParsedOutput",
    "ToolCall",
    "format_tool_call",
    "parse_tool_calls",
]

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
# The body as the tiny model's template renders it; group 2 is the raw arguments.
_CANONICAL = re.compile(r'\s*\{"name": ("(?:[^"\\]|\\.)*"), "arguments": (.*)\}\s*', re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str


@dataclass(frozen=True)
class InvalidToolCall:
    id: str
    name: str | None  # when it could be recovered from the broken body
    raw: str  # the whole block as generated, tags included
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "raw": self.raw, "error": self.error}


@dataclass
class ParsedOutput:
    """Generated text split into plain text, valid calls and invalid calls (in order)."""

    parts: list[str | ToolCall | InvalidToolCall] = field(default_factory=list)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def invalid_tool_calls(self) -> list[InvalidToolCall]:
        return [p for p in self.parts if isinstance(p, InvalidToolCall)]

    @property
    def content(self) -> str:
        """The text without the valid call blocks (invalid blocks stay verbatim)."""
        return "".join(p if isinstance(p, str) else p.raw for p in self.parts if not isinstance(p, ToolCall))


def _check_body(body: str) -> tuple[str, dict[str, Any], str] | str:
    """``(name, arguments, raw_arguments)`` of a block body, or the reason it is invalid."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call is not valid JSON: {exc}"
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return 'tool call has no "name" (a non-empty string)'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return f"arguments of {name!r} are a string that is not valid JSON: {exc}"
    if not isinstance(args, dict):
        return f"arguments of {name!r} must be a JSON object, got {type(args).__name__}"
    m = _CANONICAL.fullmatch(body)
    raw = m.group(2) if m and json.loads(m.group(1)) == name and _loads_or_none(m.group(2)) == args else None
    return name, args, raw if raw is not None else json.dumps(args, ensure_ascii=False)


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def parse_tool_calls(text: str, new_id: Callable[[], str]) -> ParsedOutput:
    """Split ``text`` into plain text and tool calls; ``new_id()`` names each call."""
    out = ParsedOutput()
    pos = 0
    while True:
        start = text.find(CALL_START, pos)
        if start < 0:
            break
        if start > pos:
            out.parts.append(text[pos:start])
        body_start = start + len(CALL_START)
        end = text.find(CALL_END, body_start)
        if end < 0:
            raw = text[start:]
            found = _NAME.search(raw)
            out.parts.append(
                InvalidToolCall(
                    new_id(), found.group(1) if found else None, raw, f"{CALL_START} is never closed with {CALL_END}"
                )
            )
            return out
        raw = text[start : end + len(CALL_END)]
        checked = _check_body(text[body_start:end])
        if isinstance(checked, str):
            found = _NAME.search(raw)
            out.parts.append(InvalidToolCall(new_id(), found.group(1) if found else None, raw, checked))
        else:
            name, args, raw_args = checked
            out.parts.append(ToolCall(new_id(), name, args, raw_args))
        pos = end + len(CALL_END)
    if pos < len(text):
        out.parts.append(text[pos:])
    return out


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The block a model should generate to call ``name`` (what the tiny template renders)."""
    body = {"name": name, "arguments": arguments}
    return f"{CALL_START}\n{json.dumps(body, ensure_ascii=False)}\n{CALL_END}"
