"""Anthropic messages (``POST /v1/messages``) for the adapter server.

Translates ``system``, ``messages`` (text, ``tool_use``, ``tool_result`` blocks), ``tools`` and the
sampling keys to chat-template messages (``tool_result`` -> ``tool`` messages, ``tool_use`` -> the
assistant's ``tool_calls``), and replies with ``content`` blocks in generation order and a
``stop_reason``. Unknown keys are ignored; other block types (images, thinking) are a 400.
Extension: malformed tool calls go to a top-level ``invalid_tool_calls`` and their text stays in a
``text`` block. Streaming sends the documented event sequence, in one burst after generation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from slime.agent.adapters.fields import bad, function_tool, opt_bool, sampling_params, sse, text_of, tool_list
from slime.agent.adapters.server import ChatProtocol, ChatRequest, Generation
from slime.agent.adapters.toolcalls import ToolCall

__all__ = ["AnthropicProtocol"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    410: "invalid_request_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
}


def _blocks(content: Any, f: str) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """``(field, type, block)`` for each content block (a string is one text block)."""
    if isinstance(content, str):
        yield f, "text", {"type": "text", "text": content}
        return
    if not isinstance(content, list):
        raise bad(f, "must be a string or a list of content blocks")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        yield f"{f}[{j}]", kind, block if isinstance(block, dict) else {}


def _block_text(block: dict[str, Any], f: str) -> str:
    if not isinstance(block.get("text"), str):
        got = f"got {type(block['text']).__name__}" if "text" in block else "it is missing"
        raise bad(f"{f}.text", f"must be a string ({got})")
    return block["text"]


def _user_turn(content: Any, f: str) -> list[dict[str, Any]]:
    tools, texts = [], []
    for bf, kind, block in _blocks(content, f):
        if kind == "text":
            texts.append(_block_text(block, bf))
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad(f"{bf}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
            text = text_of(block.get("content"), f"{bf}.content")
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            raise bad(bf, f"user blocks must be 'text' or 'tool_result', got {kind!r}")
    out = list(tools)
    if texts or not tools:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant_turn(content: Any, f: str) -> dict[str, Any]:
    texts, calls = [], []
    for bf, kind, block in _blocks(content, f):
        if kind == "text":
            texts.append(_block_text(block, bf))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise bad(bf, "a tool_use block needs 'name' (string) and 'input' (object)")
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {"name": block["name"], "arguments": block.get("input", {})},
                }
            )
        else:
            raise bad(bf, f"assistant blocks must be 'text' or 'tool_use', got {kind!r}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = text_of(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    for i, m in enumerate(raw):
        f = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{f}.role", "must be 'user' or 'assistant' (the system prompt goes in 'system')")
        if m["role"] == "user":
            out.extend(_user_turn(m.get("content"), f"{f}.content"))
        else:
            out.append(_assistant_turn(m.get("content"), f"{f}.content"))
    return out


def _tool(t: Any, field: str) -> dict[str, Any]:
    return function_tool(
        t,
        field,
        schema_key="input_schema",
        schema_field=f"{field}.input_schema",
        shape="{'name', 'description', 'input_schema'}",
    )


class AnthropicProtocol(ChatProtocol):
    name = "anthropic"
    path = "/v1/messages"
    call_id_prefix = "toolu_"
    error_types = _ERROR_TYPES

    def error_body(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type(status), "message": message, "code": code}}

    def parse(self, body: dict[str, Any]) -> ChatRequest:
        messages = _messages(body)
        tools = tool_list(body.get("tools"), _tool)
        choice = body.get("tool_choice")
        kind = choice.get("type") if isinstance(choice, dict) else choice
        if kind not in (None, "auto", "none"):
            raise bad(
                "tool_choice",
                "only {'type': 'auto'} and {'type': 'none'} are supported (the engine cannot force a tool call)",
            )
        sampling = sampling_params(
            body,
            max_tokens_keys=("max_tokens",),
            max_temperature=1.0,
            stop_key="stop_sequences",
            stop_allow_str=False,
            top_k=True,
        )
        return ChatRequest(
            messages=messages,
            tools=None if kind == "none" else (tools or None),
            sampling=sampling,
            model=str(body.get("model") or ""),
            stream=opt_bool(body, "stream"),
        )

    @staticmethod
    def _blocks(gen: Generation) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        for part in gen.parsed.parts:
            if isinstance(part, ToolCall):
                blocks.append({"type": "tool_use", "id": part.id, "name": part.name, "input": part.arguments})
            else:
                text = part if isinstance(part, str) else part.raw
                if blocks and blocks[-1]["type"] == "text":
                    blocks[-1]["text"] += text
                elif text:
                    blocks.append({"type": "text", "text": text})
        return blocks

    @staticmethod
    def _stop(gen: Generation) -> tuple[str, str | None]:
        if gen.parsed.tool_calls:
            return "tool_use", None
        if gen.finish_reason == "length":
            return "max_tokens", None
        if gen.stop_matched is not None:
            return "stop_sequence", gen.stop_matched
        return "end_turn", None

    def _message(
        self, req: ChatRequest, gen: Generation, model: str, content: list[dict[str, Any]], final: bool
    ) -> dict[str, Any]:
        stop_reason, stop_seq = self._stop(gen) if final else (None, None)
        msg = {
            "id": f"msg_{gen.record.turn_id}_{uuid.uuid4().hex[:16]}",
            "type": "message",
            "role": "assistant",
            "model": req.model or model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_seq,
            "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens if final else 0},
        }
        if final and gen.parsed.invalid_tool_calls:
            msg["invalid_tool_calls"] = [c.to_dict() for c in gen.parsed.invalid_tool_calls]
        return msg

    def reply(self, req: ChatRequest, gen: Generation, model: str) -> dict[str, Any]:
        return self._message(req, gen, model, self._blocks(gen), final=True)

    def stream_events(self, req: ChatRequest, gen: Generation, model: str) -> Iterator[bytes]:
        start = self._message(req, gen, model, [], final=False)
        yield sse({"type": "message_start", "message": start}, "message_start")
        for i, block in enumerate(self._blocks(gen)):
            if block["type"] == "text":
                yield sse(
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    "content_block_start",
                )
                yield sse(
                    {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}},
                    "content_block_delta",
                )
            else:
                yield sse(
                    {"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                    "content_block_start",
                )
                yield sse(
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(block["input"], ensure_ascii=False),
                        },
                    },
                    "content_block_delta",
                )
            yield sse({"type": "content_block_stop", "index": i}, "content_block_stop")
        stop_reason, stop_seq = self._stop(gen)
        delta: dict[str, Any] = {"stop_reason": stop_reason, "stop_sequence": stop_seq}
        if gen.parsed.invalid_tool_calls:
            delta["invalid_tool_calls"] = [c.to_dict() for c in gen.parsed.invalid_tool_calls]
        yield sse(
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": gen.completion_tokens}},
            "message_delta",
        )
        yield sse({"type": "message_stop"}, "message_stop")
