"""Sampling parameters (SGLang's native names) and the batched token sampler.

``SamplingParams.from_dict`` accepts the subset of SGLang's ``sampling_params`` this engine
implements and rejects the rest naming the key, so a client never silently gets other behaviour
than from SGLang; keys it knows but does not implement pass only at their neutral value.
Log-probs follow SGLang: ``log_softmax(logits / temperature)`` in fp32 *before* top-p/top-k (raw
logits when greedy). Sampling inverts each row's CDF with one uniform draw, far cheaper on CPU than
``torch.multinomial`` or Gumbel noise over the vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BatchSampling", "SamplingParams", "sample_next"]

# Known to SGLang, not implemented here: allowed only at these neutral values.
_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "n": 1,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
    "custom_params": None,
    "lora_path": None,
}
_IGNORED = {"spaces_between_special_tokens"}  # detokenisation detail; harmless to ignore
# What torch.Generator.manual_seed accepts; a seed outside it would fail in the engine
# step, aborting every request batched with it, so it is refused at validation.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def _num(d: dict, key: str, default, kind):
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sampling_params.{key} must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"sampling_params.{key} must be an integer, got {value!r}")
        return int(value)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{key} must be finite, got {value!r}")
    return value


def _bool(d: dict, key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"sampling_params.{key} must be true or false, got {value!r}")
    return value


_KNOWN = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
}


def _check_keys(d: dict) -> None:
    """Refuse unknown keys, and SGLang-only keys away from their neutral value."""
    for key, value in d.items():
        if key in _KNOWN or key in _IGNORED:
            continue
        if key in _NEUTRAL:
            if value is not None and value != _NEUTRAL[key]:
                raise ValueError(
                    f"sampling_params.{key}={value!r} is not supported by the built-in engine "
                    f"(only the neutral value {_NEUTRAL[key]!r}); use the SGLang backend for it"
                )
            continue
        raise ValueError(f"unknown sampling_params key {key!r}; supported: {', '.join(sorted(_KNOWN))}")


def _stop_strings(d: dict) -> tuple[str, ...]:
    stop = d.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"sampling_params.stop must be a non-empty string or a list of them, got {stop!r}")
    for s in stop:  # a lone surrogate cannot be encoded to match against the output
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"sampling_params.stop {s!r} holds a lone surrogate, not valid Unicode text") from None
    return tuple(stop)


def _stop_token_ids(d: dict) -> tuple[int, ...]:
    stop_ids = d.get("stop_token_ids") or ()
    if isinstance(stop_ids, int) and not isinstance(stop_ids, bool):
        stop_ids = (stop_ids,)
    if not isinstance(stop_ids, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_ids
    ):
        raise ValueError(f"sampling_params.stop_token_ids must be a list of token ids, got {stop_ids!r}")
    return tuple(stop_ids)


def _seed(d: dict) -> int | None:
    seed = d.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX):
        raise ValueError(
            f"sampling_params.sampling_seed must be an integer in [-2**63, 2**64-1] "
            f"({SEED_MIN} to {SEED_MAX}), got {seed!r}"
        )
    return seed


@dataclass(frozen=True)
class SamplingParams:
    """One request's decoding settings (SGLang names and defaults)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def from_dict(cls, d: Any) -> SamplingParams:
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a JSON object, got {type(d).__name__}")
        _check_keys(d)
        max_new = _num(d, "max_new_tokens", 128, int)
        if max_new < 0:
            raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {max_new}")
        temperature = _num(d, "temperature", 1.0, float)
        if temperature < 0:
            raise ValueError(f"sampling_params.temperature must be >= 0, got {temperature}")
        top_p = _num(d, "top_p", 1.0, float)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
        top_k = _num(d, "top_k", -1, int)
        if top_k == 0 or top_k < -1:
            raise ValueError(f"sampling_params.top_k must be -1 (off) or >= 1, got {top_k}")
        stop = _stop_strings(d)
        stop_ids = _stop_token_ids(d)
        seed = _seed(d)
        return cls(
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            stop_token_ids=stop_ids,
            ignore_eos=_bool(d, "ignore_eos", False),
            skip_special_tokens=_bool(d, "skip_special_tokens", True),
            no_stop_trim=_bool(d, "no_stop_trim", False),
            sampling_seed=seed,
        )


class BatchSampling:
    """Per-slot sampling settings held as tensors so a step samples all rows at once.

    A seeded row's uniforms are drawn from its own ``torch.Generator`` when the
    row is admitted (all it can use, ``draws`` values) and kept in a table, so a
    step picks them with one gather instead of one generator call per row. A
    generator yields the same stream whether it is read one value at a time or
    ``n`` at once, so samples are those of sequential per-step draws.
    """

    def __init__(
        self, max_slots: int, vocab_size: int, device: torch.device, seed: int | None, max_draws: int = 256
    ) -> None:
        self.vocab_size = vocab_size
        self.max_slots = max_slots
        self.max_draws = int(max_draws)
        self.temperature = torch.ones(max_slots, device=device)
        self.greedy = torch.zeros(max_slots, dtype=torch.bool, device=device)
        self.top_p = torch.ones(max_slots, device=device)
        self.top_k = torch.full((max_slots,), vocab_size, dtype=torch.long, device=device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(0 if seed is None else int(seed))
        if seed is None:
            self.generator.seed()
        # Seeded rows: their pre-drawn uniforms and the index of the next one to use.
        self.seeded = torch.zeros(max_slots, dtype=torch.bool, device=device)
        self.uniforms = torch.zeros(max_slots, 1, device=device)
        self.next_draw = torch.zeros(max_slots, dtype=torch.long, device=device)
        # Counts over occupied slots decide which (costly) branches a step needs.
        self.n_active = 0
        self.n_greedy = 0
        self.n_filtered = 0
        self.n_scaled = 0  # rows whose temperature is not 1 (others skip the division)
        self.n_seeded = 0
        self._active = [False] * max_slots
        self._filtered = [False] * max_slots
        self._scaled = [False] * max_slots
        self._greedy = [False] * max_slots
        self._seeded = [False] * max_slots
        self.device = device

    def set_row(self, slot: int, p: SamplingParams, draws: int | None = None) -> None:
        self.set_rows([slot], [p], None if draws is None else [draws])

    def set_rows(self, slots: list[int], params: list[SamplingParams], draws: list[int] | None = None) -> None:
        """Occupy ``slots`` with these settings; row ``i`` will sample at most ``draws[i]``
        tokens (default ``max_draws``). One tensor write per field for the whole batch."""
        if not slots:
            return
        for slot in slots:
            self.clear_row(slot)
        draws = [self.max_draws] * len(slots) if draws is None else [max(1, int(d)) for d in draws]
        dev = self.device
        idx = torch.tensor(slots, device=dev)
        greedy = [p.greedy for p in params]
        self.greedy[idx] = torch.tensor(greedy, device=dev)
        self.temperature[idx] = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], device=dev)
        self.top_p[idx] = torch.tensor([p.top_p for p in params], device=dev)
        self.top_k[idx] = torch.tensor(
            [self.vocab_size if p.top_k < 0 else min(p.top_k, self.vocab_size) for p in params], device=dev
        )
        seeded_slots, streams = [], []
        for slot, p, g, n in zip(slots, params, greedy, draws):
            filtered = not g and (p.top_p < 1.0 or 0 < p.top_k < self.vocab_size)
            scaled = not g and p.temperature != 1.0
            seeded = p.sampling_seed is not None and not g
            self._filtered[slot], self._greedy[slot], self._active[slot] = filtered, g, True
            self._scaled[slot], self._seeded[slot] = scaled, seeded
            self.n_scaled += scaled
            self.n_filtered += filtered
            self.n_greedy += g
            self.n_seeded += seeded
            self.n_active += 1
            if seeded:
                gen = torch.Generator(device=dev)
                gen.manual_seed(p.sampling_seed)
                seeded_slots.append(slot)
                streams.append((gen, n))
        if seeded_slots:
            width = max(n for _, n in streams)
            if width > self.uniforms.shape[1]:
                grown = torch.zeros(self.max_slots, width, device=dev)
                grown[:, : self.uniforms.shape[1]] = self.uniforms
                self.uniforms = grown
            # Extra values drawn past a row's own count are never read; the generator is private.
            rows = torch.stack([torch.rand(width, generator=gen, device=dev) for gen, _ in streams])
            sidx = torch.tensor(seeded_slots, device=dev)
            self.uniforms[sidx, :width] = rows
            self.seeded[sidx] = True
            self.next_draw[sidx] = 0

    def clear_row(self, slot: int) -> None:
        self.clear_rows([slot])

    def clear_rows(self, slots: list[int]) -> None:
        unseed = []
        for slot in slots:
            self.n_filtered -= self._filtered[slot]
            self.n_greedy -= self._greedy[slot]
            self.n_active -= self._active[slot]
            self.n_scaled -= self._scaled[slot]
            self.n_seeded -= self._seeded[slot]
            if self._seeded[slot]:
                unseed.append(slot)
            self._filtered[slot] = self._greedy[slot] = self._active[slot] = False
            self._scaled[slot] = self._seeded[slot] = False
        if unseed:
            self.seeded[torch.tensor(unseed, device=self.device)] = False


def sample_next(
    logits: torch.Tensor, bs: BatchSampling, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of fp32 ``logits`` [n, V]; return (tokens, log-probs).

    Row ``i`` uses the settings of slot ``rows[i]``, or of slot ``i`` when
    ``rows`` is None (a decode step over slots ``0..n-1``; rows of free slots are
    computed and ignored).
    """
    n = logits.shape[0]
    idx = rows if rows is not None else slice(0, n)
    if bs.n_greedy == bs.n_active:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
        return tokens, logp
    scaled = logits / bs.temperature[idx][:, None] if bs.n_scaled else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = logprobs.exp()
    if bs.n_filtered:
        probs = _filter(probs, bs.top_p[idx], bs.top_k[idx])
    cdf = torch.cumsum(probs, dim=-1)
    # Drawn for every row even when all are seeded, so the engine stream (unseeded rows)
    # advances the same way whatever the mix.
    u = torch.rand((n, 1), generator=bs.generator, device=logits.device)
    if bs.n_seeded:
        # Seeded rows use their own stream, so their samples do not depend on the batch.
        seeded = bs.seeded[idx]
        draw = bs.next_draw[idx]
        slots = rows if rows is not None else torch.arange(n, device=logits.device)
        own = bs.uniforms[slots, draw.clamp(max=bs.uniforms.shape[1] - 1)]
        u = torch.where(seeded[:, None], own[:, None], u)
        bs.next_draw[idx] = draw + seeded
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=logits.shape[1] - 1)
    if bs.n_greedy:
        tokens = torch.where(bs.greedy[idx], logits.argmax(dim=-1), tokens)
    logp = logprobs.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logp


def _filter(probs: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k and nucleus (SGLang's rule)."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    ranks = torch.arange(probs.shape[1], device=probs.device)[None, :]
    drop = ranks >= top_k[:, None]
    drop |= (torch.cumsum(sorted_p, dim=-1) - sorted_p) > top_p[:, None]
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p)
