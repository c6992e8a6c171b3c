"""The built-in engine: continuous batched decoding with per-token log-probs.

Requests come from any thread (:meth:`Engine.submit` returns a ``Future``); one scheduler thread owns the
model: it applies aborts and weight updates, admits waiting requests into free cache slots and runs one
decode step per iteration. Guaranteed: log-probs are ``log_softmax(logits / T)`` in fp32 (trainer parity
to rounding); stops, ``text`` and ``finish_reason`` as SGLang; an abort returns what was generated; weight
updates wait for running requests; ``sampling_seed`` makes a request independent of its batch; input
log-probs (``logprob_start_len``) come from one forward at admission. Not provided: prefix caching,
streaming, n > 1, penalties. Scheduling: docs/design-notes.md.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .decoder import LeanDecoder
from .sampling import BatchSampling, SamplingParams, sample_next
from .weights import WeightLoadError, load_hf_weights, load_named_tensors

__all__ = ["Completion", "Engine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """The finished result of one request."""

    rid: str
    output_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: dict
    prompt_tokens: int
    weight_version: str
    e2e_latency: float
    # SGLang's input_token_logprobs: (log-prob, token id) for input_ids[logprob_start_len:], the first None
    input_logprobs: list[tuple[float | None, int]] | None = None


def _logprob_start(value: int | None, n: int) -> int | None:
    """SGLang's ``logprob_start_len`` as an index into an ``n``-token input (-1: the last token), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"logprob_start_len must be an integer >= -1, got {value!r}")
    if value >= n:
        raise ValueError(
            f"logprob_start_len ({value}) is not below the number of input tokens ({n}); "
            "request a lower logprob_start_len"
        )
    return n - 1 if value == -1 else value


@dataclass(eq=False)
class _Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    future: Future
    max_new: int
    stop_ids: frozenset
    created: float = field(default_factory=time.perf_counter)
    slot: int = -1
    stop_window: int = 0
    burst_end: bool = False  # the last of a batch submitted together: admit without waiting for more
    logprob_start: int | None = None  # score input_ids[logprob_start:] (SGLang's logprob_start_len); None: no
    input_logprobs: list[tuple[float | None, int]] | None = None


class Engine:
    """Model + tokenizer + scheduler. Use :meth:`start` for a background thread,
    or :meth:`generate` to run requests synchronously in the calling thread."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        device: str = "cpu",
        dtype: str = "auto",
        max_running_requests: int = 256,
        context_length: int | None = None,
        seed: int | None = None,
        batch_window_s: float = 0.002,
        batch_window_max_s: float = 0.1,
        max_prefill_tokens: int = 16384,
        num_threads: int | None = None,
        max_cache_bytes: int | None = None,
        onednn: bool = True,
    ) -> None:
        from slime.models.lean_lm import load_causal_lm
        from slime.models.tokenizer import load_engine_tokenizer

        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.model_path = str(model_path)
        self.device = torch.device(device)
        torch_dtype = (
            torch.float32
            if dtype == "auto" and self.device.type == "cpu"
            else ("auto" if dtype == "auto" else getattr(torch, dtype))
        )
        self.tokenizer_path = str(tokenizer_path or model_path)  # model.tokenizer, when it is another dir
        self.tokenizer = load_engine_tokenizer(self.tokenizer_path)
        self.hf_model = load_causal_lm(self.model_path, dtype=torch_dtype).to(self.device)
        self.hf_model.eval().requires_grad_(False)
        cfg = self.hf_model.config
        max_pos = int(getattr(cfg, "max_position_embeddings", 4096))
        self.context_length = min(max_pos, int(context_length)) if context_length else max_pos
        self.max_slots = int(max_running_requests)
        if self.max_slots < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self._check_cache_budget(max_cache_bytes)
        self.decoder = LeanDecoder(self.hf_model, max_slots=self.max_slots, max_len=self.context_length, onednn=onednn)
        self.vocab_size = self.decoder.vocab_size
        self.sampling = BatchSampling(self.max_slots, self.vocab_size, self.device, seed, max_draws=self.context_length)
        self.eos_ids = self._eos_ids()
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        plain = not getattr(self.tokenizer, "clean_up_tokenization_spaces", False)
        self._rust_decode = backend.decode if backend is not None and plain else None
        self.weight_version = "default"
        self.batch_window_s = batch_window_s
        self.batch_window_max_s = batch_window_max_s
        self.max_prefill_tokens = max_prefill_tokens

        self._init_scheduler_state()
        self._init_slot_tensors()

    def _init_scheduler_state(self) -> None:
        """Queues, free slots and counters shared between submitters and the scheduler thread."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: deque[_Request] = deque()
        self._aborts: list[tuple[str | None, str]] = []
        self._commands: deque[tuple] = deque()
        self._rids: set[str] = set()
        self._running: dict[int, _Request] = {}
        self._free = list(range(self.max_slots))
        heapq.heapify(self._free)
        self._stop_str_slots: set[int] = set()
        self._hi = 0  # slots [0, hi) cover every running request
        self._max_pos = 0  # largest position being fed
        self._same_pos = True  # every running request is at that position (no mask needed)
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Scheduler counters (benchmarks, tests): prefill batches run and decode steps taken.
        self.prefills = 0
        self.decode_steps = 0

    def _init_slot_tensors(self) -> None:
        # Per-slot decoding state lives in tensors so a step needs no per-row Python.
        S, dev = self.max_slots, self.device
        self._arange = torch.arange(S, device=dev)
        self._tok = torch.zeros(S, dtype=torch.long, device=dev)  # token fed next
        self._pos = torch.zeros(S, dtype=torch.long, device=dev)  # its position
        self._active = torch.zeros(S, dtype=torch.long, device=dev)
        self._ngen = torch.zeros(S, dtype=torch.long, device=dev)  # tokens generated
        self._max_new = torch.zeros(S, dtype=torch.long, device=dev)
        self._stop_tab = torch.full((S, 4), -1, dtype=torch.long, device=dev)
        self._hist_tok = torch.zeros(S, self.context_length, dtype=torch.long, device=dev)
        self._hist_lp = torch.zeros(S, self.context_length, dtype=torch.float32, device=dev)

    # ------------------------------------------------------------- public API
    def submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        rid: str | None = None,
        *,
        burst_end: bool = False,
        logprob_start_len: int | None = None,
    ) -> Future:
        """Queue one request; raises ValueError for invalid input (nothing queued). ``burst_end``: this
        request ends a batch submitted together, so an idle engine starts on it without waiting for more.
        ``logprob_start_len``: also return the input tokens' log-probs from there (SGLang's; -1: the last)."""
        if not isinstance(input_ids, list) or not input_ids:
            raise ValueError("input_ids must be a non-empty list of token ids")
        for t in input_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(f"input_ids contains {t!r}; token ids must be integers in [0, {self.vocab_size})")
        # A scoring-only request (max_new_tokens 0) never decodes: the whole context is its own.
        if len(input_ids) >= self.context_length + (params.max_new_tokens == 0):
            raise ValueError(
                f"the input has {len(input_ids)} tokens; the context length is {self.context_length} "
                "(prompt + at least one new token must fit)"
            )
        rid = uuid.uuid4().hex if rid is None else rid
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}")
        start = _logprob_start(logprob_start_len, len(input_ids))
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_ids
        req = _Request(
            rid=rid,
            input_ids=list(input_ids),
            params=params,
            future=Future(),
            max_new=min(params.max_new_tokens, self.context_length - len(input_ids)),
            stop_ids=frozenset(stop_ids),
            burst_end=burst_end,
            logprob_start=start,
        )
        if params.stop:
            req.stop_window = max(len(self.tokenizer.encode(s, add_special_tokens=False)) for s in params.stop) + 2
        with self._lock:
            if rid in self._rids:
                raise ValueError(f"a request with rid {rid!r} is already in flight")
            self._rids.add(rid)
            self._waiting.append(req)
        self._wake.set()
        return req.future

    def abort(
        self, rid: str | None = None, *, abort_all: bool = False, message: str = "Aborted by /abort_request"
    ) -> None:
        """Finish every request whose rid starts with ``rid`` (SGLang's scheduler matches the same way),
        or all, at the next step, keeping its partial output: tokens and log-probs so far."""
        with self._lock:
            self._aborts.append((None if abort_all else rid, message))
        self._wake.set()

    def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        load_format: str | None = None,
        abort_all: bool = False,
    ) -> Future:
        """Load an HF checkpoint once running requests finish; the future gives (success, message)."""
        return self._command(("disk", str(model_path), load_format), weight_version, abort_all)

    def update_weights_from_tensors(
        self, named_tensors, *, weight_version: str | None = None, abort_all: bool = False
    ) -> Future:
        """In-memory update (colocated trainer): ``(hf_name, tensor)`` pairs, a subset allowed."""
        return self._command(("tensors", list(named_tensors)), weight_version, abort_all)

    def _command(self, what: tuple, weight_version: str | None, abort_all: bool) -> Future:
        fut: Future = Future()
        if abort_all:
            self.abort(abort_all=True, message="Aborted for a weight update")
        with self._lock:
            self._commands.append((what, weight_version, fut))
        self._wake.set()
        if self._thread is None:  # no scheduler thread: drain and apply here
            while not fut.done():
                self.step()
        return fut

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], rids: list[str] | None = None
    ) -> list[Completion]:
        """Run a batch to completion (in this thread unless the background thread runs)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        futs: list[Future] = []
        names = rids or [uuid.uuid4().hex for _ in prompts]
        try:
            for i, (p, sp, rid) in enumerate(zip(prompts, plist, names)):
                futs.append(self.submit(p, sp, rid, burst_end=i == len(prompts) - 1))
        except ValueError:
            for rid in names[: len(futs)]:  # all or nothing: drop what was queued
                self.abort(rid, message="another prompt of the batch was rejected")
            if self._thread is None:
                self._apply_aborts()
            raise
        if self._thread is None:
            while not all(f.done() for f in futs):
                self.step()
        return [f.result() for f in futs]

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="builtin-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.abort(abort_all=True, message="Engine stopped")
        self._apply_aborts()

    def in_flight(self, rid: str) -> bool:
        """Whether a request with exactly this rid is queued or running."""
        with self._lock:
            return rid in self._rids

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_running(self) -> int:
        return len(self._running)

    # -------------------------------------------------------------- scheduler
    def _loop(self) -> None:
        while not self._stopping:
            if not self._running and not self._waiting and not self._commands and not self._aborts:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            if not self._running and self._waiting and not self._commands:
                self._collect()
            try:
                self.step()
            except Exception as exc:  # keep serving; fail only what was running
                log.exception("built-in engine step failed")
                self._fail_running(exc)

    def _collect(self) -> None:
        """Idle engine: let a burst of concurrent requests arrive so one prefill takes them all.

        Waits while requests keep arriving less than ``batch_window_s`` apart, at
        most ``batch_window_max_s`` after the first, or until the slots are full.
        """
        first = self._waiting[0].created
        while not self._stopping and len(self._waiting) < len(self._free):
            if self._waiting[-1].burst_end:  # a whole batch arrived: nothing more to wait for
                return
            now = time.perf_counter()
            quiet_until = self._waiting[-1].created + self.batch_window_s
            if now >= quiet_until or now >= first + self.batch_window_max_s:
                return
            time.sleep(min(quiet_until, first + self.batch_window_max_s) - now)

    def step(self) -> None:
        """One scheduler iteration (see the module docstring)."""
        self._apply_aborts()
        if self._commands:
            if self._running:
                self._decode_step()  # drain before the update; admit nothing new
                return
            self._apply_command(self._commands.popleft())
            return
        if self._waiting and self._free:
            self._admit()
        if self._running:
            self._decode_step()

    def _apply_aborts(self) -> None:
        with self._lock:
            aborts, self._aborts = self._aborts, []
        for rid, message in aborts:
            with self._lock:
                doomed = [r for r in self._waiting if rid is None or r.rid.startswith(rid)]
                for r in doomed:
                    self._waiting.remove(r)
            hit = [r for r in self._running.values() if rid is None or r.rid.startswith(rid)]
            reason = {"type": "abort", "message": message, "status_code": None, "err_type": None}
            self._finish_many([(r, dict(reason)) for r in doomed + hit])
            if hit:
                self._refresh_bounds()

    def _apply_command(self, cmd) -> None:
        what, version, fut = cmd
        try:
            if what[0] == "disk":
                n = load_hf_weights(self.hf_model, what[1], what[2])
                source = what[1]
            else:
                n = load_named_tensors(self.hf_model, what[1])
                source = "tensors"
            self.decoder.refresh_weights()
        except WeightLoadError as exc:
            fut.set_result((False, str(exc)))
            return
        except Exception as exc:  # unexpected: report, keep serving
            log.exception("weight update failed")
            fut.set_result((False, f"weight update failed: {exc!r}"))
            return
        if what[0] == "disk":
            self.model_path = source
        msg = f"Succeeded to update model weights ({n} tensors from {source})."
        if version is not None:
            self.weight_version = str(version)
            msg += f" Weight version updated to {version}."
        fut.set_result((True, msg))

    def _admit(self) -> None:
        batch: list[_Request] = []
        budget = self.max_prefill_tokens
        with self._lock:
            while self._waiting and len(batch) < len(self._free):
                r = self._waiting[0]
                if batch and len(r.input_ids) > budget:
                    break
                self._waiting.popleft()
                budget -= len(r.input_ids)
                batch.append(r)
        scored = [r for r in batch if r.logprob_start is not None]
        if scored:
            self._score_inputs(scored)
        ready = []
        for r in batch:
            if r.max_new <= 0:
                self._finish(r, {"type": "length", "length": r.params.max_new_tokens})
                continue
            r.slot = heapq.heappop(self._free)
            self._running[r.slot] = r
            if r.params.stop:
                self._stop_str_slots.add(r.slot)
            ready.append(r)
        if not ready:
            return
        self.sampling.set_rows([r.slot for r in ready], [r.params for r in ready], [r.max_new for r in ready])
        dev = self.device
        lengths = [len(r.input_ids) for r in ready]
        lp = max(lengths)
        # Padded in Python and converted once: a tensor per row would cost more than the padding.
        tokens = torch.tensor([r.input_ids + [0] * (lp - n) for r, n in zip(ready, lengths)], dtype=torch.long)
        slots = torch.tensor([r.slot for r in ready], device=dev)
        lengths_t = torch.tensor(lengths, device=dev)
        width = max(len(r.stop_ids) for r in ready)
        if width > self._stop_tab.shape[1]:
            grown = torch.full((self.max_slots, width), -1, dtype=torch.long, device=dev)
            grown[:, : self._stop_tab.shape[1]] = self._stop_tab
            self._stop_tab = grown
        width = self._stop_tab.shape[1]
        tab = torch.tensor([sorted(r.stop_ids) + [-1] * (width - len(r.stop_ids)) for r in ready], dtype=torch.long)
        logits = self.decoder.prefill(slots, tokens.to(dev), lengths_t)
        self.prefills += 1
        nxt, logp = sample_next(logits, self.sampling, rows=slots)
        self._tok[slots] = nxt
        self._pos[slots] = lengths_t
        self._active[slots] = 1
        self._ngen[slots] = 0
        self._max_new[slots] = torch.tensor([r.max_new for r in ready], device=dev)
        self._stop_tab[slots] = tab.to(dev)
        self._append(slots, slots, nxt, logp)
        self._refresh_bounds()

    @torch.inference_mode()
    def _score_inputs(self, reqs: list[_Request]) -> None:
        """Each request's ``input_logprobs``: SGLang's input_token_logprobs for ``input_ids[k:]``, the first
        None (no logit at ``k`` predicts token ``k``), token ``t > k`` scored by the logits at ``t - 1`` over
        the request's temperature (raw when greedy, as sampled log-probs are). One forward of the
        right-padded batch through the HF-layout model: causal attention keeps the padding out of every
        real position, so no mask is needed."""
        todo = [r for r in reqs if r.logprob_start < len(r.input_ids) - 1]
        for r in reqs:
            r.input_logprobs = [(None, r.input_ids[r.logprob_start])]
        if not todo:
            return
        width = max(len(r.input_ids) for r in todo)
        ids = torch.tensor([r.input_ids + [0] * (width - len(r.input_ids)) for r in todo], device=self.device)
        hidden = self.hf_model.model(ids).last_hidden_state
        for i, r in enumerate(todo):
            k, n = r.logprob_start, len(r.input_ids)
            logits = self.hf_model.lm_head(hidden[i, k : n - 1]).float()
            if not r.params.greedy and r.params.temperature != 1.0:
                logits = logits / r.params.temperature
            targets = ids[i, k + 1 : n, None]
            lps = torch.log_softmax(logits, dim=-1).gather(1, targets).squeeze(1).tolist()
            r.input_logprobs += zip(lps, r.input_ids[k + 1 :])

    def _decode_step(self) -> None:
        hi = self._hi
        logits = self.decoder.decode(self._tok[:hi], self._pos[:hi], self._max_pos + 1, self._same_pos)
        self.decode_steps += 1
        nxt, logp = sample_next(logits, self.sampling)
        self._tok[:hi] = nxt
        self._pos[:hi] += self._active[:hi]
        self._max_pos += 1
        self._append(slice(0, hi), self._arange[:hi], nxt, logp)

    def _append(self, sel, rows: torch.Tensor, nxt: torch.Tensor, logp: torch.Tensor) -> None:
        """Record one new token for each slot in ``rows`` (also given as ``sel``, a
        slice or the same index tensor) and finish the ones that hit a limit.

        Vectorised so a step costs O(1) Python work plus O(rows that finish).
        """
        cols = self._ngen[sel]
        self._hist_tok[rows, cols] = nxt
        self._hist_lp[rows, cols] = logp
        active = self._active[sel]
        ngen = cols + active
        self._ngen[sel] = ngen
        hit_len = ngen >= self._max_new[sel]
        hit_stop = (nxt[:, None] == self._stop_tab[sel]).any(dim=1)
        done = (active > 0) & (hit_len | hit_stop)
        flagged = torch.stack((rows, hit_len.long(), nxt), 1)[done].tolist()
        items = []
        for slot, is_len, token in flagged:
            r = self._running[slot]
            # SGLang checks the length limit before stop tokens.
            reason = {"type": "length", "length": r.max_new} if is_len else {"type": "stop", "matched": token}
            items.append((r, reason))
        self._finish_many(items)
        finished = bool(flagged)
        items = []
        for slot in list(self._stop_str_slots):
            r = self._running[slot]
            n = int(self._ngen[slot])
            tail = self._detok(self._hist_tok[slot, max(0, n - r.stop_window) : n].tolist(), False)
            for stop in r.params.stop:
                if stop in tail:
                    items.append((r, {"type": "stop", "matched": stop}))
                    break
        if items:
            self._finish_many(items)
        if finished or items:
            self._refresh_bounds()

    def _refresh_bounds(self) -> None:
        """Recompute the slot range, the longest position and whether all rows share it."""
        if self._running:
            self._hi = max(self._running) + 1
            live = self._pos[: self._hi][self._active[: self._hi] > 0]
            lo, hi = torch.aminmax(live)
            self._max_pos, self._same_pos = int(hi), bool(lo == hi)
        else:
            self._hi, self._max_pos, self._same_pos = 0, 0, True

    def _finish(self, r: _Request, reason: dict) -> None:
        self._finish_many([(r, reason)])

    def _finish_many(self, items: list[tuple[_Request, dict]]) -> None:
        """Complete these requests: free their slots with one tensor write per field (not
        one per request), then resolve each future with its tokens and log-probs."""
        if not items:
            return
        outputs: dict[int, tuple[list[int], list[float]]] = {}
        held = [r for r, _ in items if r.slot >= 0]
        if held:
            slots = [r.slot for r in held]
            idx = torch.tensor(slots, device=self.device)
            counts = self._ngen[idx].tolist()
            width = max(counts)
            toks = self._hist_tok[idx, :width].tolist()
            lps = self._hist_lp[idx, :width].tolist()
            for field_ in (self._active, self._pos, self._tok, self._ngen):
                field_[idx] = 0
            self.sampling.clear_rows(slots)
            for r, n, t, lp in zip(held, counts, toks, lps):
                outputs[id(r)] = (t[:n], lp[:n])
                self._running.pop(r.slot, None)
                self._stop_str_slots.discard(r.slot)
                heapq.heappush(self._free, r.slot)
                r.slot = -1
            # Bounds may now be loose (never wrong); callers refresh once per batch of finishes.
        with self._lock:
            for r, _ in items:
                self._rids.discard(r.rid)
        for r, reason in items:
            if r.future.done():
                continue
            out_ids, out_lps = outputs.get(id(r), ([], []))
            ids = out_ids
            trim = not r.params.no_stop_trim and reason["type"] == "stop"
            if trim and isinstance(reason["matched"], int):
                ids = ids[:-1]
            text = self._detok(ids, r.params.skip_special_tokens)
            if trim and isinstance(reason["matched"], str):
                cut = text.find(reason["matched"])
                if cut >= 0:
                    text = text[:cut]
            r.future.set_result(
                Completion(
                    rid=r.rid,
                    output_ids=out_ids,
                    logprobs=out_lps,
                    text=text,
                    finish_reason=reason,
                    prompt_tokens=len(r.input_ids),
                    weight_version=self.weight_version,
                    e2e_latency=time.perf_counter() - r.created,
                    input_logprobs=r.input_logprobs,
                )
            )

    def _fail_running(self, exc: Exception) -> None:
        self._finish_many(
            [(r, {"type": "abort", "message": f"engine error: {exc!r}"}) for r in list(self._running.values())]
        )
        self._refresh_bounds()

    def _detok(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Decode like ``tokenizer.decode``; calls the Rust tokenizer directly when that is all
        ``decode`` would do (no clean-up pass), skipping its Python overhead per request."""
        if self._rust_decode is not None:
            return self._rust_decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _check_cache_budget(self, budget: int | None) -> None:
        """Refuse sizes whose static KV cache would not fit, naming the knobs to turn."""
        dtype = next(self.hf_model.parameters()).dtype
        need = LeanDecoder.cache_bytes(self.hf_model.config, self.max_slots, self.context_length, dtype)
        if budget is None:
            if self.device.type == "cuda":
                budget = int(torch.cuda.mem_get_info(self.device)[0] * 0.5)
            else:
                budget = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.25)
        if need > budget:
            gib = 1 << 30
            raise ValueError(
                f"the KV cache for {self.max_slots} running requests x {self.context_length} tokens needs "
                f"{need / gib:.1f} GiB, more than the {budget / gib:.1f} GiB allowed; lower max_running_requests "
                "(--max-running-requests) or context_length (--context-length)"
            )

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen = getattr(self.hf_model, "generation_config", None)
        for src in (
            getattr(gen, "eos_token_id", None),
            getattr(self.hf_model.config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        ):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(x) for x in src)
        return ids
