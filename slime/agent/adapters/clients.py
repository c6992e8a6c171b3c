"""Minimal agent-side API clients (OpenAI chat completions, Anthropic messages) over aiohttp.

The default agent loop talks to an adapter exactly like an agent using the
vendors' SDKs would (same paths, headers, bodies, reply shapes), without
depending on those SDKs. A client keeps the conversation in its protocol's own
message shape; :class:`AgentReply` is the protocol-independent view of one
reply. Non-2xx replies raise :class:`AgentAPIError` with the HTTP status and
the error ``code`` from the body. No retries: a refused turn (cap reached,
session closed) must end the episode, not be repeated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["AgentAPIError", "AgentReply", "AnthropicChatClient", "CallRequest", "OpenAIChatClient", "make_client"]


class AgentAPIError(RuntimeError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class CallRequest:
    id: str
    name: str
    arguments: dict[str, Any] | None  # None when the arguments string is not a JSON object


@dataclass
class AgentReply:
    text: str
    tool_calls: list[CallRequest]
    invalid_tool_calls: list[dict[str, Any]]
    finish: str
    usage: dict[str, int] = field(default_factory=dict)


async def _post(http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict:
    async with http.post(url, json=body, headers=headers) as resp:
        text = await resp.text()
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError:
            data = {}
        if resp.status >= 300:
            err = data.get("error") if isinstance(data, dict) else None
            err = err if isinstance(err, dict) else {}
            raise AgentAPIError(
                resp.status, str(err.get("code") or err.get("type") or "error"), str(err.get("message") or text[:300])
            )
        return data


class OpenAIChatClient:
    protocol = "openai"

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        model: str = "slime-policy",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.http, self.url, self.model = http, base_url.rstrip("/") + "/v1/chat/completions", model
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.extra = dict(extra or {})
        self.messages: list[dict[str, Any]] = []

    def start(self, user: str, system: str | None = None) -> None:
        self.messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]

    async def complete(self, tools: list[Any]) -> AgentReply:
        body = {"model": self.model, "messages": self.messages, **self.extra}
        if tools:
            body["tools"] = [t.openai_schema() for t in tools]
        data = await _post(self.http, self.url, self.headers, body)
        choice = data["choices"][0]
        msg = choice["message"]
        calls = []
        for c in msg.get("tool_calls") or []:
            try:
                args = json.loads(c["function"]["arguments"])
            except (json.JSONDecodeError, TypeError):
                args = None
            calls.append(CallRequest(c["id"], c["function"]["name"], args if isinstance(args, dict) else None))
        # Send back exactly what the server returned (arguments unparsed), as OpenAI agents do.
        echo = {"role": "assistant", "content": msg.get("content")}
        if msg.get("tool_calls"):
            echo["tool_calls"] = msg["tool_calls"]
        self.messages.append(echo)
        return AgentReply(
            msg.get("content") or "",
            calls,
            list(msg.get("invalid_tool_calls") or []),
            choice.get("finish_reason", ""),
            data.get("usage", {}),
        )

    def add_tool_results(self, results: list[tuple[CallRequest, str]]) -> None:
        for call, output in results:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": output})


class AnthropicChatClient:
    protocol = "anthropic"

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        model: str = "slime-policy",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.http, self.url, self.model = http, base_url.rstrip("/") + "/v1/messages", model
        self.headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
        self.extra = dict(extra or {})
        self.system: str | None = None
        self.messages: list[dict[str, Any]] = []

    def start(self, user: str, system: str | None = None) -> None:
        self.system = system
        self.messages = [{"role": "user", "content": user}]

    async def complete(self, tools: list[Any]) -> AgentReply:
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, **self.extra}
        body.setdefault("max_tokens", 1024)
        if self.system:
            body["system"] = self.system
        if tools:
            body["tools"] = [t.anthropic_schema() for t in tools]
        data = await _post(self.http, self.url, self.headers, body)
        blocks = data.get("content") or []
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        calls = [
            CallRequest(b["id"], b["name"], b.get("input") if isinstance(b.get("input"), dict) else None)
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        self.messages.append({"role": "assistant", "content": blocks or text})
        return AgentReply(
            text,
            calls,
            list(data.get("invalid_tool_calls") or []),
            data.get("stop_reason") or "",
            data.get("usage", {}),
        )

    def add_tool_results(self, results: list[tuple[CallRequest, str]]) -> None:
        self.messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": output} for call, output in results
                ],
            }
        )


def make_client(
    protocol: str, http: aiohttp.ClientSession, base_url: str, api_key: str, **kwargs: Any
) -> OpenAIChatClient | AnthropicChatClient:
    if protocol == "openai":
        return OpenAIChatClient(http, base_url, api_key, **kwargs)
    if protocol == "anthropic":
        return AnthropicChatClient(http, base_url, api_key, **kwargs)
    raise ValueError(f"unknown agent protocol {protocol!r}; valid: anthropic, openai")
