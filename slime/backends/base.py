"""The two backend interfaces and their registries.

A *train backend* owns one trainer rank's model and optimizer (torch: plain
data parallel; megatron: tensor/pipeline/context/data parallel). A *rollout
backend* owns the inference engines' processes; generation itself always goes
through ``slime.backends.rollout.client.EngineClient`` speaking SGLang's native
HTTP API, so the built-in engine and real SGLang share one client code path.

The interfaces are deliberately small (after THUDM/slime's actor/rollout
split) and take the typed, resolved ``Spec``, never dicts. Backends are found
by name in ``TRAIN_BACKENDS`` / ``ROLLOUT_BACKENDS``, imported lazily.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from slime.core.registry import Registry

if TYPE_CHECKING:  # heavy imports only for type checkers
    import torch

    from slime.spec.layout import Layout, Slot
    from slime.spec.types import Spec

__all__ = ["ROLLOUT_BACKENDS", "TRAIN_BACKENDS", "RankInfo", "RolloutBackend", "TrainBackend", "TrainBatch"]


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

    def data_parallel_coords(self) -> tuple[int, int]:
        """``(dp_rank, dp_size)`` of this rank after ``init``: ranks with the same dp_rank must be given
        the same ``TrainBatch`` (one model replica). Plain data parallel: ``(rank, world_size)``."""
        info = getattr(self, "rank_info", None)
        if info is None:
            raise RuntimeError(
                f"{type(self).__name__}.data_parallel_coords() needs init() first "
                "(or an override that knows the model-parallel layout)"
            )
        return info.rank, info.world_size


class RolloutBackend(ABC):
    """The inference engines of one job."""

    @abstractmethod
    def start(
        self, spec: Spec, layout: Layout, placement: Any, model_dir: Path, *, log_dir: Path | None = None
    ) -> list[str]:
        """Start every engine (bounded wait for health); return their base URLs.

        ``log_dir``: where this run's engine logs go, if the backend writes any."""

    @abstractmethod
    def update_weights(self, source: Path, version: int) -> None:
        """Make every engine serve the weights in ``source`` (HF dir), tagged ``version``."""

    @abstractmethod
    def health(self) -> dict[str, bool]:
        """URL → healthy."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every engine this backend started (by PID / actor handle only)."""


TRAIN_BACKENDS = Registry(
    "train backend",
    {
        "torch": "slime.backends.train.torch_backend:TorchTrainBackend",
        "megatron": "slime.backends.megatron.backend:MegatronTrainBackend",
    },
)

ROLLOUT_BACKENDS = Registry(
    "rollout backend",
    {
        "builtin": "slime.backends.rollout.builtin.backend:BuiltinRolloutBackend",
        "sglang": "slime.backends.sglang.backend:SGLangRolloutBackend",
    },
)
