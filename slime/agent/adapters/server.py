"""The adapter HTTP server: an OpenAI or Anthropic API in front of one rollout engine.

Per request: find the session from the bearer token / ``x-api-key``, translate the body, render the
prompt with the chat template, generate with log-probs, parse tool calls (malformed ones flagged,
never an error), record the turn in the session's trajectory tree, reply (JSON or one-burst SSE).
The server runs its own event loop in a daemon thread, so sessions are touched by one thread only;
``open_session``/``close_session`` are thread-safe. aiohttp: the engine client already needs it.
Not provided: token streaming, ``n > 1``, forced tool choice, log-probs in replies, images.
See docs/design-notes.md (slime.agent.adapters.server) for status codes and version handling.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from slime.agent.adapters.sessions import AdapterError, SessionRegistry, SessionResult, TurnRecord
from slime.agent.adapters.toolcalls import ParsedOutput, parse_tool_calls
from slime.agent.trajectory import Turn
from slime.backends.rollout.client import EngineClient, EngineError, EngineUnavailable
from slime.core.http_server import BackgroundHTTPServer

__all__ = ["AdapterServer", "ChatProtocol", "ChatRequest", "Generation", "start_adapter"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024  # the largest request body accepted (413 past it)


@dataclass
class ChatRequest:
    """A request translated to the chat-template form (protocol independent)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # [{"type": "function", "function": {...}}]
    sampling: dict[str, Any]  # SGLang sampling params (max_new_tokens, temperature, stop, ...)
    model: str = ""
    stream: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # protocol-specific flags


@dataclass
class Generation:
    """One generated reply, parsed and recorded."""

    turn_id: str
    parsed: ParsedOutput
    finish_reason: str  # "stop" | "length"
    stop_matched: str | None  # the stop string that ended generation, if one did
    prompt_tokens: int
    completion_tokens: int
    weight_version: str | None
    record: TurnRecord


class ChatProtocol:
    """The protocol-specific part of the server: request translation and reply shapes.

    Everything else (session lookup, rendering, generation, tool-call parsing,
    recording the turn, errors) is the server's one path for every protocol.
    A subclass sets ``name``, ``path`` (the POST route), ``call_id_prefix``,
    ``error_types`` (HTTP status -> the API's error type) and implements
    ``parse``, ``reply``, ``stream_events`` and ``error_body``.
    """

    name = ""
    path = ""
    call_id_prefix = ""
    error_types: Mapping[int, str] = {}

    def new_call_id(self) -> str:
        return f"{self.call_id_prefix}{uuid.uuid4().hex[:24]}"

    def error_type(self, status: int) -> str:
        return self.error_types.get(status, "invalid_request_error")

    def parse(self, body: dict[str, Any]) -> ChatRequest:
        raise NotImplementedError

    def reply(self, req: ChatRequest, gen: Generation, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def stream_events(self, req: ChatRequest, gen: Generation, model: str) -> Iterator[bytes]:
        raise NotImplementedError

    def error_body(self, status: int, code: str, message: str) -> dict[str, Any]:
        raise NotImplementedError


def _surrogate(text: str) -> str | None:
    """The first lone surrogate in ``text`` (JSON allows ``"\\ud800"``; no tokenizer takes it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def unencodable_field(body: Any) -> tuple[str, str] | None:
    """``(field, character)`` of a string (value or key) in ``body`` holding a lone surrogate, or None."""
    stack: list[tuple[str, Any]] = [("request body", body)]  # iterative: bodies may nest ~1000 deep
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            if (char := _surrogate(value)) is not None:
                return field, char
        elif isinstance(value, dict):
            for key in value:
                if isinstance(key, str) and (char := _surrogate(key)) is not None:
                    return f"{field} (a key)", char
            top = field == "request body"
            stack.extend((key if top else f"{field}.{key}", item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{field}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def version_number(version: str | None) -> int:
    """The engine's weight version as the trajectory's int (non-integers -> -1, as the runtime does)."""
    try:
        return int(version) if version is not None else -1
    except ValueError:
        return -1


def session_token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get("x-api-key", "").strip()
    return key or None


def _load_tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, (str, Path)):
        from slime.models.tokenizer import load_tokenizer

        return load_tokenizer(tokenizer)
    if not hasattr(tokenizer, "apply_chat_template"):
        raise TypeError(f"tokenizer must be a Hugging Face tokenizer or its directory, got {type(tokenizer).__name__}")
    return tokenizer


def _protocol(name: str) -> Any:
    from slime.agent.adapters import PROTOCOLS

    return PROTOCOLS.get(name)()


class AdapterServer(BackgroundHTTPServer):
    """An OpenAI- or Anthropic-compatible server over one engine (see the module docstring)."""

    what = "agent adapter server"

    def __init__(
        self,
        protocol: str,
        engine: str | EngineClient,
        tokenizer: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_turns: int | None = None,
        model_name: str = "slime-policy",
        max_new_tokens: int | None = None,
        sampling_defaults: Mapping[str, Any] | None = None,
        sampling_overrides: Mapping[str, Any] | None = None,
        drift_threshold: int = 8,
        engine_timeout_s: float = 600.0,
    ) -> None:
        self.protocol = _protocol(protocol)
        self.protocol_name = protocol
        self.engine_url = engine.base_url if isinstance(engine, EngineClient) else str(engine)
        # A private client: its aiohttp session belongs to this server's loop.
        self.engine = EngineClient(self.engine_url, timeout_s=engine_timeout_s)
        self.tokenizer = _load_tokenizer(tokenizer)
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.model_name = model_name
        self.sampling_defaults = dict(sampling_defaults or {})
        self.sampling_overrides = dict(sampling_overrides or {})
        self.sessions = SessionRegistry(default_max_turns=max_turns, drift_threshold=drift_threshold)
        super().__init__(host, port, thread_name=f"agent-adapter-{protocol}")

    # ----------------------------------------------------------------- lifecycle
    def build_app(self) -> web.Application:
        # Chat requests are text: 8 MiB is ~2M tokens, far past any context; larger bodies get a 413.
        app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self.protocol.path, self._handle)
        app.router.add_get("/health", self._health)
        return app

    async def aclose(self) -> None:
        await self.engine.close()

    # ------------------------------------------------------- sessions (thread-safe)
    def _submit(self, coro: Any) -> Any:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the agent adapter server is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _open(self, session_id: str, kwargs: dict[str, Any]) -> str:
        return self.sessions.open(session_id, **kwargs)

    def open_session(
        self,
        session_id: str | None = None,
        *,
        max_turns: int | None = None,
        metadata: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        """Open a session; returns ``(session_id, token)``. The agent's API key is the token.

        ``max_turns`` overrides the server's cap; ``sampling`` (SGLang sampling
        params) overrides what the agent asks for on every turn of the session, so
        the rollout side decides how the policy samples (e.g. the training temperature).
        """
        sid = session_id or uuid.uuid4().hex
        kwargs = {"max_turns": max_turns, "metadata": metadata, "sampling": sampling}
        return sid, self._submit(self._open(sid, kwargs)).result()

    async def aopen_session(
        self,
        session_id: str | None = None,
        *,
        max_turns: int | None = None,
        metadata: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        sid = session_id or uuid.uuid4().hex
        kwargs = {"max_turns": max_turns, "metadata": metadata, "sampling": sampling}
        return sid, await asyncio.wrap_future(self._submit(self._open(sid, kwargs)))

    def close_session(self, session_id: str, *, drain_timeout_s: float | None = None) -> SessionResult:
        """Refuse new turns, wait for in-flight ones, return the session's trajectories."""
        return self._submit(self.sessions.close(session_id, drain_timeout_s=drain_timeout_s)).result()

    async def aclose_session(self, session_id: str, *, drain_timeout_s: float | None = None) -> SessionResult:
        return await asyncio.wrap_future(self._submit(self.sessions.close(session_id, drain_timeout_s=drain_timeout_s)))

    # ------------------------------------------------------------------ requests
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except AdapterError as exc:
            return web.json_response(self.protocol.error_body(exc.status, exc.code, exc.message), status=exc.status)
        except web.HTTPException:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one bad request must not take the server down
            log.exception("agent adapter: unhandled error in %s", request.path)
            return web.json_response(
                self.protocol.error_body(500, "internal_error", f"internal error: {exc!r}"), status=500
            )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "protocol": self.protocol_name, "open_sessions": len(self.sessions)})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sess = self.sessions.lookup(session_token(request.headers))
        try:
            text = await request.text()
        except UnicodeDecodeError as exc:
            raise AdapterError(f"request body is not valid JSON: {exc}") from None
        # Parsing, the chat template and tokenising a multi-MB prompt take seconds of CPU:
        # off the event loop, so other sessions (and /health) are not stalled meanwhile.
        req, prompt_ids = await asyncio.to_thread(self._prepare, text)
        turn_id = sess.admit()  # no await between the state check and the in-flight count
        try:
            gen = await self._generate(sess, turn_id, req, prompt_ids)
        finally:
            sess.release()
        if req.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for event in self.protocol.stream_events(req, gen, self.model_name):
                await resp.write(event)
            await resp.write_eof()
            return resp
        return web.json_response(self.protocol.reply(req, gen, self.model_name))

    def _prepare(self, text: str) -> tuple[ChatRequest, list[int]]:
        """The request body -> (translated request, prompt ids); runs in a worker thread."""
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AdapterError(f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise AdapterError("request body nests too deeply to parse (over ~1000 levels of arrays/objects)") from None
        if not isinstance(body, dict):
            raise AdapterError(f"request body must be a JSON object, got {type(body).__name__}")
        bad_text = unencodable_field(body)
        if bad_text is not None:
            field, char = bad_text
            raise AdapterError(
                f"{field}: contains {char!r}, a lone surrogate that is not valid Unicode text "
                "(JSON \\ud800-\\udfff escapes must come in pairs)",
                code="invalid_request",
            )
        req = self.protocol.parse(body)
        # Several threads may render at once. A fast tokenizer is only unsafe to share when a call changes
        # its truncation/padding state ("Already borrowed"); ours never ask for truncation or padding.
        return req, self._render(req)

    def _render(self, req: ChatRequest) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                req.messages, tools=req.tools or None, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # noqa: BLE001 - jinja errors, template raise_exception(), missing keys
            raise AdapterError(
                f"the chat template cannot render these messages: {exc}", code="template_error"
            ) from None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise AdapterError("the rendered prompt is empty", code="template_error")
        return list(ids)

    def _sampling(self, req: ChatRequest, sess: Any) -> dict[str, Any]:
        params = {**self.sampling_defaults, **req.sampling, **self.sampling_overrides, **sess.sampling}
        if self.max_new_tokens is not None:
            params["max_new_tokens"] = min(int(params.get("max_new_tokens", self.max_new_tokens)), self.max_new_tokens)
        return params

    async def _generate(self, sess: Any, turn_id: str, req: ChatRequest, prompt_ids: list[int]) -> Generation:
        try:
            res = await self.engine.generate(
                prompt_ids,
                self._sampling(req, sess),
                return_logprob=True,
                rid=f"{sess.session_id}-{turn_id}-{uuid.uuid4().hex[:8]}",
            )
        except EngineUnavailable as exc:
            raise AdapterError(
                f"the rollout engine is unreachable: {exc}", status=503, code="engine_unavailable"
            ) from None
        except EngineError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                raise AdapterError(
                    f"the rollout engine rejected the request: {exc.message}", code="engine_rejected"
                ) from None
            raise AdapterError(f"the rollout engine failed: {exc}", status=502, code="engine_error") from None
        if res.aborted:
            raise AdapterError(
                "generation was aborted by the engine (e.g. a weight update); retry",
                status=503,
                code="generation_aborted",
            )
        if res.logprobs is None:
            raise AdapterError("the engine returned no log-probs", status=502, code="engine_error")
        parsed = parse_tool_calls(res.text, self.protocol.new_call_id)
        message = assistant_message(parsed)
        finish = "length" if res.truncated else "stop"
        stop_matched = res.matched if isinstance(res.matched, str) else None
        turn = Turn(
            prompt_token_ids=prompt_ids,
            response_token_ids=list(res.output_ids),
            response_logprobs=list(res.logprobs),
            weight_version=version_number(res.weight_version),
            messages=[*req.messages, message],
            truncated=res.truncated,
            turn_id=turn_id,
        )
        record = sess.record(
            turn,
            {
                "weight_version": res.weight_version,
                "finish_reason": finish,
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(res.output_ids),
                "content": parsed.content,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.tool_calls],
                "invalid_tool_calls": [c.to_dict() for c in parsed.invalid_tool_calls],
                "protocol": self.protocol_name,
            },
        )
        return Generation(
            turn_id, parsed, finish, stop_matched, len(prompt_ids), len(res.output_ids), res.weight_version, record
        )


def assistant_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The reply as a chat-template message (what the agent will send back next turn)."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
            for c in parsed.tool_calls
        ]
    if parsed.invalid_tool_calls:
        msg["invalid_tool_calls"] = [c.to_dict() for c in parsed.invalid_tool_calls]
    return msg


def start_adapter(protocol: str, engine: str | EngineClient, tokenizer: Any, **kwargs: Any) -> AdapterServer:
    """Build and start an :class:`AdapterServer`; returns once it listens (``.url``)."""
    return AdapterServer(protocol, engine, tokenizer, **kwargs).start()
