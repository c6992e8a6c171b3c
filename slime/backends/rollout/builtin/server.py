"""HTTP front end of the built-in engine, speaking a subset of SGLang's native API.

The rollout client drives real SGLang and this server through the same code, so shapes follow
SGLang's ``http_server.py``: ``/generate`` (single or batch; ``input_token_logprobs`` from
``logprob_start_len``, scoring with ``max_new_tokens: 0``), health, cache flush, weight loads and
versions, server info, ``/abort_request``, the RL control endpoints of ``rl_control.py``. Errors are
HTTP 400 (500 if unexpected) with SGLang's ``{"error": {"message": ...}}`` body; the server keeps
running. Not implemented (400): streaming, multimodal, LoRA, top-logprobs, constrained decoding. With the
job's secret every path but ``/health`` needs it (401/403); weights load only from the run dir. aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import sys
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Must precede the torch import: sleeping OpenMP waiters, even on a GPU node (slime.core.worker_env).
    from slime.core.worker_env import apply_worker_env

    apply_worker_env(os.environ, omp_passive=True)

from aiohttp import web

from slime.core.auth import bearer_middleware, job_secret
from slime.core.http_server import BackgroundHTTPServer

from .generator import Completion, Engine
from .rl_control import ControlError, RLControl
from .sampling import SamplingParams

__all__ = ["EngineServer", "build_app", "main", "start_server"]

log = logging.getLogger(__name__)

_GENERATE_KEYS = {
    "input_ids",
    "text",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "stream",
    "return_text_in_logprobs",
}
# SGLang fields that change nothing here when left at these values.
_GENERATE_NEUTRAL = {
    "top_logprobs_num": (None, 0),
    "token_ids_logprob": (None,),
    "image_data": (None,),
    "audio_data": (None,),
    "video_data": (None,),
    "input_embeds": (None,),
    "lora_path": (None,),
    "custom_logit_processor": (None,),
    "return_hidden_states": (None, False),
    "modalities": (None,),
    "session_params": (None,),
}
_GENERATE_IGNORED = {
    "log_metrics",
    "data_parallel_rank",
    "priority",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "extra_key",
    "no_logs",
    "routed_dp_rank",
    "background",
}


class BadRequest(ValueError):
    pass


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def _json_object(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


async def _all_done(futures: list[Future]) -> list[Any]:
    """The results of the engine's ``futures``, waking this event loop once when the last is done.

    ``asyncio.wrap_future`` per item would wake the loop through its self-pipe once per sample (a
    quickstart rollout: 128 wake-ups, each contending for the GIL with the engine thread)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    finished = itertools.count(1)  # next() is atomic under the GIL: exactly one callback sees the last count

    def settle() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def one_done(_: Future) -> None:
        if next(finished) == len(futures) and not loop.is_closed():  # closed: a shutdown, nobody to wake
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # closed between the check and the call
                pass

    for f in futures:
        f.add_done_callback(one_done)
    await waiter
    return [f.result() for f in futures]  # an engine failure raises here, as gather did


def _per_item(value: Any, n: int, name: str, batched: bool, default: Any) -> list:
    if value is None:
        return [default] * n
    if batched and isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries but the batch has {n} inputs")
        return value
    return [value] * n


class _Handlers:
    def __init__(self, engine: Engine, weights_root: str | Path | None = None) -> None:
        self.engine = engine
        self.control = RLControl(engine)
        self.weights_root = None if weights_root is None else Path(weights_root).resolve()

    # ---------------------------------------------------------------- generate
    def _prompts(self, body: dict) -> tuple[bool, list[list[int]]]:
        """(batched, token ids per input) from ``input_ids`` or ``text``."""
        has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
        if has_ids == has_text:
            raise BadRequest("give exactly one of 'input_ids' or 'text'")
        if has_ids:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise BadRequest("input_ids must be a non-empty list of token ids or a list of such lists")
            batched = isinstance(ids[0], list)
            prompts = ids if batched else [ids]
            for i, p in enumerate(prompts):
                if (
                    not isinstance(p, list)
                    or not p
                    or not all(isinstance(t, int) and not isinstance(t, bool) for t in p)
                ):
                    raise BadRequest(
                        f"input_ids[{i}] must be a non-empty list of integers"
                        if batched
                        else "input_ids must be a non-empty list of integers"
                    )
        else:
            text = body["text"]
            batched = isinstance(text, list)
            texts = text if batched else [text]
            if not texts or not all(isinstance(t, str) and t for t in texts):
                raise BadRequest("text must be a non-empty string or a list of them")
            prompts = [self.engine.tokenizer.encode(t) for t in texts]
        return batched, prompts

    def _parse_generate(
        self, body: dict
    ) -> tuple[bool, list[list[int]], list[SamplingParams], list, list[bool], list[int | None]]:
        unknown = set(body) - _GENERATE_KEYS - set(_GENERATE_NEUTRAL) - _GENERATE_IGNORED
        if unknown:
            raise BadRequest(f"unknown /generate field(s) {sorted(unknown)}; supported: {sorted(_GENERATE_KEYS)}")
        for key, ok in _GENERATE_NEUTRAL.items():
            if body.get(key) not in ok:
                raise BadRequest(f"/generate field {key!r}={body[key]!r} is not supported by the built-in engine")
        if body.get("stream"):
            raise BadRequest("stream=true is not supported by the built-in engine")
        batched, prompts = self._prompts(body)
        n = len(prompts)
        raw_params = _per_item(body.get("sampling_params"), n, "sampling_params", batched, {})
        try:
            params = [SamplingParams.from_dict(p) for p in raw_params]
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        rid = body.get("rid")
        if rid is not None and not isinstance(rid, (str, list)):
            raise BadRequest("rid must be a string (for a batch: a list with one id per input, or a string)")
        if not batched and rid is not None and not isinstance(rid, str):
            raise BadRequest("rid must be a string")
        # A batch with one string rid: items are f"{rid}_{i}", as SGLang names them (GenerateReqInput).
        rids = (
            [f"{rid}_{i}" for i in range(n)]
            if batched and isinstance(rid, str)
            else _per_item(rid, n, "rid", batched, None)
        )
        want_lp = _per_item(body.get("return_logprob"), n, "return_logprob", batched, False)
        if not all(isinstance(x, bool) for x in want_lp):
            raise BadRequest("return_logprob must be true/false (or one per input)")
        starts = _per_item(body.get("logprob_start_len"), n, "logprob_start_len", batched, None)
        # As SGLang: without return_logprob the start is ignored; with it, unset means -1 (the last input token).
        starts = [(-1 if k is None else k) if lp else None for k, lp in zip(starts, want_lp)]
        return batched, prompts, params, rids, want_lp, starts

    def _render(self, c: Completion, return_logprob: bool, lp_text: bool) -> dict:
        meta = {
            "id": c.rid,
            "finish_reason": c.finish_reason,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": len(c.output_ids),
            "cached_tokens": 0,
            "weight_version": c.weight_version,
            "e2e_latency": c.e2e_latency,
        }
        if return_logprob:
            tok = self.engine.tokenizer
            meta["output_token_logprobs"] = [
                [lp, t, tok.decode([t]) if lp_text else None] for lp, t in zip(c.logprobs, c.output_ids)
            ]
            if c.input_logprobs is not None:  # SGLang's shape: one per input_ids[logprob_start_len:]
                meta["input_token_logprobs"] = [
                    [lp, t, tok.decode([t]) if lp_text else None] for lp, t in c.input_logprobs
                ]
        return {"text": c.text, "output_ids": c.output_ids, "meta_info": meta}

    async def generate(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        batched, prompts, params, rids, want_lp, starts = self._parse_generate(body)
        await self.control.admit_generate()  # paused: wait; memory released: refuse
        # Name every request so a disconnect or a rejected batch item can abort the rest.
        rids = [rid if rid is not None else uuid.uuid4().hex for rid in rids]
        futures, submitted = [], []
        try:
            # No burst_end: a rollout sends its groups as concurrent batch requests, so a batch's last
            # item need not be the last arrival; the engine's short quiet window (batch_window_s) lets
            # them all into one prefill.
            for p, sp, rid, start in zip(prompts, params, rids, starts):
                futures.append(self.engine.submit(p, sp, rid, logprob_start_len=start))
                submitted.append(rid)
        except ValueError as exc:
            for rid in submitted:
                self.engine.abort(rid, message="another input of the batch was rejected")
            raise BadRequest(str(exc)) from None
        self.control.in_flight += 1
        try:
            results = await _all_done(futures)
        except asyncio.CancelledError:
            # Client went away: free the engine's slots (SGLang does the same).
            for rid in submitted:
                self.engine.abort(rid, message="client disconnected")
            raise
        finally:
            self.control.in_flight -= 1
        lp_text = bool(body.get("return_text_in_logprobs"))
        out = [self._render(c, lp, lp_text) for c, lp in zip(results, want_lp)]
        return web.json_response(out if batched else out[0])

    # ------------------------------------------------------------------ others
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine.alive else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        if not self.engine.alive or self.control.released - {"cuda_graph"} or self.control.weights_stale:
            return web.Response(status=503)
        start_id = self.engine.tokenizer.bos_token_id or 0
        try:
            fut = self.engine.submit([start_id], SamplingParams(max_new_tokens=1, temperature=0.0))
            await asyncio.wait_for(asyncio.wrap_future(fut), timeout=20)
        except (TimeoutError, ValueError):
            return web.Response(status=503)
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\nThe built-in engine keeps no prefix cache.\n")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path (a checkpoint directory) is required")
        if self.weights_root is not None and not Path(path).resolve().is_relative_to(self.weights_root):
            return _error(f"model_path must be inside this job's run dir {self.weights_root}", status=403)
        version = body.get("weight_version")
        if version is not None and not isinstance(version, (str, int)):
            raise BadRequest("weight_version must be a string")
        abort_all = body.get("abort_all_requests", False)
        if not isinstance(abort_all, bool):
            raise BadRequest("abort_all_requests must be true or false")
        fut = self.engine.update_weights_from_disk(
            path,
            weight_version=None if version is None else str(version),
            load_format=body.get("load_format"),
            abort_all=abort_all,
        )
        ok, message = await asyncio.wrap_future(fut)
        if ok:
            self.control.weights_loaded()
        return web.json_response(
            {"success": ok, "message": message, "num_paused_requests": 0}, status=200 if ok else 400
        )

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            raise BadRequest("new_version (a non-empty string) is required")
        if body.get("abort_all_requests"):
            self.engine.abort(abort_all=True, message="Aborted for a weight version update")
        self.engine.weight_version = version
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def get_model_info(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response(
            {
                "model_path": e.model_path,
                "tokenizer_path": e.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": e.weight_version,
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.engine.weight_version})

    async def get_server_info(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response(
            {
                "model_path": e.model_path,
                "context_length": e.context_length,
                "max_running_requests": e.max_slots,
                "device": str(e.device),
                "weight_version": e.weight_version,
                "internal_states": [{"num_running_reqs": e.num_running}],
                "version": "slime-builtin",
                "memory_occupation": self.control.occupation(),
            }
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        rid, abort_all = body.get("rid"), body.get("abort_all", False)
        if not isinstance(abort_all, bool):
            raise BadRequest("abort_all must be true or false")
        if not abort_all and (not isinstance(rid, str) or not rid):
            raise BadRequest("give a request id in 'rid' (a string) or set abort_all=true")
        # As SGLang: a rid that is not in flight is a no-op; one that is aborts every rid it prefixes.
        if abort_all or self.engine.in_flight(rid):
            self.engine.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    def control_route(self, name: str):
        """A JSON-in/JSON-out handler for the ``RLControl`` method ``name`` (an empty body is ``{}``)."""
        method = getattr(self.control, name)

        async def handler(request: web.Request) -> web.Response:
            body = await _json_object(request) if request.can_read_body else {}
            reply = await method(body)
            return web.json_response(reply, status=200 if reply.get("success") else 400)

        return handler


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except (BadRequest, ControlError) as exc:
        return _error(str(exc))
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # never take the server down for one request
        log.exception("unhandled error in %s", request.path)
        return _error(f"internal error: {exc!r}", status=500)


def build_app(engine: Engine, *, secret: str | None = None, weights_root: str | Path | None = None) -> web.Application:
    """``secret``: every request but ``/health`` needs ``Authorization: Bearer <secret>`` (401/403);
    ``weights_root``: ``/update_weights_from_disk`` loads only from inside it (403)."""
    h = _Handlers(engine, weights_root)
    middlewares = [bearer_middleware(secret)] if secret else []
    app = web.Application(middlewares=[*middlewares, _errors], client_max_size=256 * 1024 * 1024)
    app.router.add_route("POST", "/generate", h.generate)
    app.router.add_route("PUT", "/generate", h.generate)
    app.router.add_get("/health", h.health)
    app.router.add_get("/health_generate", h.health_generate)
    app.router.add_route("GET", "/flush_cache", h.flush_cache)
    app.router.add_route("POST", "/flush_cache", h.flush_cache)
    app.router.add_post("/update_weights_from_disk", h.update_weights_from_disk)
    app.router.add_post("/update_weight_version", h.update_weight_version)
    app.router.add_get("/get_model_info", h.get_model_info)
    app.router.add_get("/get_weight_version", h.get_weight_version)
    app.router.add_get("/get_server_info", h.get_server_info)
    app.router.add_post("/abort_request", h.abort_request)
    for name in (
        "init_weights_update_group",
        "update_weights_from_distributed",
        "destroy_weights_update_group",
        "pause_generation",
        "continue_generation",
        "release_memory_occupation",
        "resume_memory_occupation",
        "weights_checker",
    ):
        app.router.add_post(f"/{name}", h.control_route(name))
    return app


class EngineServer(BackgroundHTTPServer):
    """A running server: an engine scheduler thread plus an aiohttp loop thread."""

    what = "built-in engine"

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: str | None = None,
        weights_root: str | Path | None = None,
    ) -> None:
        self.engine = engine
        self.secret, self.weights_root = secret, weights_root
        super().__init__(host, port, thread_name="builtin-http")

    def build_app(self) -> web.Application:
        return build_app(self.engine, secret=self.secret, weights_root=self.weights_root)

    def start(self, timeout: float = 30.0) -> EngineServer:
        self.engine.start()
        return super().start(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is running, close the listener and join both threads."""
        self.engine.stop()
        super().stop(timeout)


def start_server(
    model_path: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    seed: int | None = None,
    secret: str | None = None,
    weights_root: str | Path | None = None,
    **engine_kwargs: Any,
) -> EngineServer:
    """Load the model and serve it from background threads; returns once listening.

    ``port=0`` picks a free port (read it from ``.port`` / ``.url``). Call
    ``.stop()`` to shut down. ``secret``/``weights_root``: see :func:`build_app`.
    Extra keyword arguments go to :class:`Engine`.
    """
    engine = Engine(model_path, seed=seed, **engine_kwargs)
    return EngineServer(engine, host, port, secret=secret, weights_root=weights_root).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m slime.backends.rollout.builtin.server",
        description="Serve a model with the built-in engine (SGLang native API subset).",
    )
    ap.add_argument("--model-path", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--tokenizer-path", default=None, help="tokenizer directory (default: the model's)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=None, help="engine sampling seed (repeatable runs)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, checkpoint dtype on GPU), float32, bfloat16")
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--context-length", type=int, default=None)
    ap.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (Path(args.model_path) / "config.json").is_file():
        print(
            f"error: --model-path {args.model_path!r} is not a Hugging Face checkpoint directory (no config.json)",
            file=sys.stderr,
        )
        return 2
    try:
        server = start_server(
            args.model_path,
            host=args.host,
            port=args.port,
            seed=args.seed,
            tokenizer_path=args.tokenizer_path,
            device=args.device,
            dtype=args.dtype,
            max_running_requests=args.max_running_requests,
            context_length=args.context_length,
            num_threads=args.num_threads,
            secret=job_secret(),  # $SLIME_JOB_SECRET_FILE names it (slime.core.auth); unset: no auth
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server.engine.weight_version = args.weight_version
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"built-in engine serving {args.model_path} at {server.url}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
