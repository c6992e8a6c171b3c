"""OpenAI chat completions (``POST /v1/chat/completions``) for the adapter server.

Accepts ``messages`` (text content, assistant ``tool_calls``), function ``tools``, ``tool_choice``
auto/none and the sampling keys; unknown keys are ignored (clients send many), values the engine
cannot honour (``n > 1``, penalties, forced tool choice, images) are a 400. Replies follow the API;
``arguments`` is the JSON text exactly as the model wrote it. Extension: a malformed tool call is
listed in ``message.invalid_tool_calls`` and its text stays in ``content``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from slime.agent.adapters.fields import bad, function_tool, opt_bool, opt_int, sampling_params, sse, text_of, tool_list
from slime.agent.adapters.server import ChatProtocol, ChatRequest, Generation, assistant_message

__all__ = ["OpenAIProtocol"]

# The engines seed a torch.Generator, whose manual_seed takes this range (the built-in
# engine's sampling.SEED_MIN/SEED_MAX; not imported, to keep torch out of the adapter).
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    410: "invalid_request_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
}


def _tool_calls(raw: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad(field, "must be a list")
    out = []
    for i, call in enumerate(raw):
        f = f"{field}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f, "must be {'id', 'type': 'function', 'function': {'name', 'arguments'}}")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise bad(f"{f}.function.arguments", "must be a JSON string")
        out.append(
            {"id": str(call.get("id") or ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}
        )
    return out


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        f = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f, "must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"{f}.role", f"must be system, developer, user, assistant or tool, got {role!r}")
        msg: dict[str, Any] = {"role": role, "content": text_of(m.get("content"), f"{f}.content")}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{f}.tool_calls")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad(f"{f}.tool_call_id", "a tool message needs the id of the call it answers")
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _tool(t: Any, field: str) -> dict[str, Any]:
    fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
    return function_tool(
        fn,
        field,
        schema_key="parameters",
        schema_field=f"{field}.function.parameters",
        shape="{'type': 'function', 'function': {'name', 'description', 'parameters'}}",
    )


class OpenAIProtocol(ChatProtocol):
    name = "openai"
    path = "/v1/chat/completions"
    call_id_prefix = "call_"
    error_types = _ERROR_TYPES

    def error_body(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": self.error_type(status), "param": None, "code": code}}

    def parse(self, body: dict[str, Any]) -> ChatRequest:
        messages = _messages(body.get("messages"))
        tools = tool_list(body.get("tools"), _tool)
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise bad("tool_choice", "only 'auto' and 'none' are supported (the engine cannot force a tool call)")
        n = opt_int(body, "n", 1)
        if n not in (None, 1):
            raise bad("n", "only n=1 is supported; send several requests")
        for key in ("presence_penalty", "frequency_penalty"):
            if body.get(key) not in (None, 0, 0.0):
                raise bad(key, "penalties are not supported by the rollout engine")
        sampling = sampling_params(
            body,
            max_tokens_keys=("max_completion_tokens", "max_tokens"),
            max_temperature=2.0,
            stop_key="stop",
            stop_allow_str=True,
            top_k=False,
        )
        seed = body.get("seed")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_MIN <= seed <= _SEED_MAX:
                raise bad("seed", f"must be an integer in [-2**63, 2**64-1] ({_SEED_MIN} to {_SEED_MAX}), got {seed!r}")
            sampling["sampling_seed"] = seed
        stream = opt_bool(body, "stream")
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        return ChatRequest(
            messages=messages,
            tools=None if choice == "none" else (tools or None),
            sampling=sampling,
            model=str(body.get("model") or ""),
            stream=stream,
            options={"include_usage": include_usage},
        )

    @staticmethod
    def _message(gen: Generation) -> dict[str, Any]:
        msg = assistant_message(gen.parsed)
        if gen.parsed.tool_calls and not gen.parsed.content:
            msg["content"] = None  # the API's form of "only tool calls"
        return msg

    @staticmethod
    def _finish(gen: Generation) -> str:
        if gen.parsed.tool_calls:
            return "tool_calls"
        return gen.finish_reason

    @staticmethod
    def _usage(gen: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        }

    def reply(self, req: ChatRequest, gen: Generation, model: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{gen.record.turn_id}-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model or model,
            "system_fingerprint": f"weights-{gen.weight_version}",
            "choices": [
                {"index": 0, "message": self._message(gen), "finish_reason": self._finish(gen), "logprobs": None}
            ],
            "usage": self._usage(gen),
        }

    def stream_events(self, req: ChatRequest, gen: Generation, model: str) -> Iterator[bytes]:
        head = {
            "id": f"chatcmpl-{gen.record.turn_id}-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model or model,
            "system_fingerprint": f"weights-{gen.weight_version}",
        }
        msg = self._message(gen)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

        first: dict[str, Any] = {"role": "assistant", "content": msg["content"] or ""}
        if "invalid_tool_calls" in msg:
            first["invalid_tool_calls"] = msg["invalid_tool_calls"]
        yield chunk(first)
        for i, call in enumerate(msg.get("tool_calls", [])):
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
        yield chunk({}, self._finish(gen))
        if req.options.get("include_usage"):
            yield sse({**head, "choices": [], "usage": self._usage(gen)})
        yield sse("[DONE]")
