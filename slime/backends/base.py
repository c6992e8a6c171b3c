"""The two backend interfaces and their registries: everything the runtime calls on a backend.

A train backend owns one trainer rank's model and optimizer; a rollout backend owns the engines'
processes and makes the weight sender (the trainer's end of a collective weight sync). Generation
always goes through ``slime.backends.rollout.client.EngineClient`` (SGLang's native HTTP API).
The interfaces are small (after THUDM/slime's actor/rollout split) and take the typed, resolved
``Spec``; the runtime uses backends only through them (import-linter enforces it). Backends are
found by name in ``TRAIN_BACKENDS`` / ``ROLLOUT_BACKENDS``, imported lazily.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from slime.core.registry import Registry
from slime.spec.plugin import profiles

if TYPE_CHECKING:  # heavy imports only for type checkers
    import torch

    from slime.spec.layout import Layout, Slot
    from slime.spec.types import Spec

__all__ = [
    "ROLLOUT_BACKENDS",
    "TRAIN_BACKENDS",
    "RankInfo",
    "RolloutBackend",
    "TrainBackend",
    "TrainBatch",
    "WeightSender",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Where one trainer rank sits in the job."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    device: str  # "cpu" or "cuda:0" (after CUDA_VISIBLE_DEVICES narrowing)
    slot: Slot | None = None


@dataclass(kw_only=True, slots=True)
class TrainBatch:
    """A padded batch for one rank: tokens ``[B, T]``, ``response_mask`` marks trained tokens.

    ``log_probs`` are per-token log-probs aligned with ``tokens[:, 1:]`` (position t predicts t+1);
    every per-token tensor here uses that same ``[B, T-1]`` alignment.

    ``tis_weights`` (set by the runtime with ``algorithm.tis``) multiply each token's policy loss
    (``slime.rl.losses.policy_loss``); backends pass them on and never compute them.

    ``kind`` selects the loss: ``"rl"`` (the spec's policy loss, or the value loss on a critic) or
    ``"sft"`` (masked NLL of the response tokens, used by the SFT warm-up with
    ``algorithm.sft_warmup_lr`` and its own optimizer state; ``advantages`` unused).
    """

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None
    tis_weights: torch.Tensor | None = None  # truncated importance weights of the policy loss (algorithm.tis)
    teacher_log_probs: torch.Tensor | None = None  # algorithm.opd: the teacher's, at the rollout temperature
    kind: Literal["rl", "sft"] = "rl"

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, rows: torch.Tensor | slice) -> TrainBatch:
        """The rows ``rows`` of every tensor (a new batch; tensors are views or copies)."""

        def pick(t):
            return None if t is None else t[rows]

        return TrainBatch(
            tokens=self.tokens[rows],
            attention_mask=self.attention_mask[rows],
            response_mask=self.response_mask[rows],
            advantages=pick(self.advantages),
            old_log_probs=pick(self.old_log_probs),
            ref_log_probs=pick(self.ref_log_probs),
            returns=pick(self.returns),
            old_values=pick(self.old_values),
            rollout_log_probs=pick(self.rollout_log_probs),
            tis_weights=pick(self.tis_weights),
            teacher_log_probs=pick(self.teacher_log_probs),
            kind=self.kind,
        )


class TrainBackend(ABC):
    """One trainer rank (actor or critic)."""

    @abstractmethod
    def init(self, spec: Spec, rank: RankInfo, model_dir: Path, *, role: Literal["actor", "critic", "ref"]) -> None:
        """Build the model from an HF-format dir, the optimizer, and join the process group."""

    @abstractmethod
    def log_probs(self, batch: TrainBatch, *, temperature: float) -> torch.Tensor:
        """Per-token log-probs ``[B, T-1]`` of ``batch.tokens`` (logits divided by temperature)."""

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values ``[B, T-1]`` (never temperature-scaled). Only critics implement it."""
        raise NotImplementedError(f"{type(self).__name__} is not a critic")

    @abstractmethod
    def train_step(self, batch: TrainBatch, *, step: int) -> dict[str, float]:
        """One optimizer step over ``batch`` (micro-batched inside); returns metrics (reduced over ranks)."""

    @abstractmethod
    def export_weights(self, out_dir: Path) -> Path:
        """Write the current policy as an HF-format checkpoint dir engines can load; return it.

        Called on every rank at once (model-parallel backends gather shards); which ranks write is
        the backend's business. ``out_dir`` must be on storage every trainer node and engine sees."""

    @abstractmethod
    def save(self, ckpt_dir: Path) -> None:
        """Save model, optimizer and RNG state of this rank into ``ckpt_dir`` (the caller makes it atomic)."""

    @abstractmethod
    def load(self, ckpt_dir: Path) -> None:
        """Restore what ``save`` wrote."""

    @abstractmethod
    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` of the whole policy, for a collective weight sync from rank 0.

        Iterate on every rank at once (model-parallel backends gather shards inside, collectively);
        rank 0's pairs are complete. A tied ``lm_head`` is left out (engines re-tie it). A backend
        that cannot give rank 0 the whole model raises ``ValueError`` saying what to change."""

    @abstractmethod
    def data_parallel_coords(self) -> tuple[int, int]:
        """``(dp_rank, dp_size)`` of this rank after ``init``: ranks with the same dp_rank must be given
        the same ``TrainBatch`` (one model replica). Plain data parallel: ``(rank, world_size)``."""


class WeightSender(ABC):
    """Trainer rank 0's end of a collective weight sync with every engine (group rank 0).

    Made by ``RolloutBackend.weight_sender()`` in the driver and pickled to trainer rank 0, which
    calls :meth:`connect` once and :meth:`update` per weight version. The other trainer ranks only
    iterate ``TrainBackend.hf_weights()`` alongside (model-parallel gathers)."""

    @abstractmethod
    async def connect(self, master_address: str, master_port: int, *, backend: str) -> None:
        """Form the group with the engines; this process is rank 0 at ``master_address:master_port``.
        ``backend``: ``nccl`` (CUDA tensors) or ``gloo`` (CPU)."""

    @abstractmethod
    async def update(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> int:
        """Broadcast every tensor to every engine, which then serves ``version``; returns the count."""


class RolloutBackend(ABC):
    """The inference engines of one job.

    Colocated runs (``rollout.colocate``): the runtime calls :meth:`release_memory` after each
    rollout and, around the next weight update, ``resume_memory(["weights"])`` before it and
    ``resume_memory(["kv_cache", "cuda_graph"])`` after it (resumed weights hold garbage until
    reloaded)."""

    urls: list[str]  # every engine's base URL, in engine order (set by start)

    @abstractmethod
    def start(
        self, spec: Spec, layout: Layout, placement: Any, model_dir: Path, *, log_dir: Path | None = None
    ) -> list[str]:
        """Start every engine (bounded wait for health); return their base URLs.

        ``log_dir``: where this run's engine logs go, if the backend writes any."""

    def prefill_engines(self) -> dict[str, int]:
        """The engines (after ``start``) that only prefill, URL → KV bootstrap port: the rollout manager pairs
        each request to another engine with one of these; weight updates and control calls reach all."""
        return {}

    @abstractmethod
    def update_weights(self, source: Path, version: int) -> None:
        """Make every engine serve the weights in ``source`` (HF dir), tagged ``version``."""

    @abstractmethod
    def weight_sync_ranks(self) -> list[int]:
        """Ranks each engine takes in a collective weight-update group (its GPUs; 1 on CPU), in URL order."""

    @abstractmethod
    def weight_sender(self) -> WeightSender:
        """The trainer's end of a collective weight sync to these engines (``rollout.weight_sync: nccl``)."""

    @abstractmethod
    def release_memory(self, tags: list[str] | None = None) -> list[dict]:
        """Every engine frees ``tags`` (None = all: weights, KV cache, CUDA graphs); their replies."""

    @abstractmethod
    def resume_memory(self, tags: list[str] | None = None) -> None:
        """Every engine takes back ``tags`` (None = all)."""

    @abstractmethod
    def health(self) -> dict[str, bool]:
        """URL → healthy."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every engine this backend started (by PID / actor handle only)."""

    def start_teacher(self, spec: Spec, layout: Layout, placement: Any, teacher_dir: Path) -> str:
        """``algorithm.opd.type: engine``: start one engine serving the teacher on ``layout.teacher``; its URL.

        Called on a backend object of its own, so its ``stop`` stops the teacher and no weight sync reaches
        it. Backends without a teacher engine keep this default (the spec rules refuse them first)."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve an on-policy distillation teacher")


def _registry(kind: str) -> Registry:
    """Implementations by plug-in name, from the installed profiles (``slime.spec.plugin``)."""
    return Registry(kind.replace("_", " "), {n: p.implementation for n, p in profiles(kind).items()})


TRAIN_BACKENDS = _registry("train_backend")
ROLLOUT_BACKENDS = _registry("rollout_backend")
