"""The embedded train backend: plain PyTorch data parallel over Hugging Face checkpoints.

One instance is one trainer rank with one role (``actor``, ``critic`` or ``ref``: see
:class:`TorchTrainBackend`). Ranks join one ``torch.distributed`` group (gloo on CPU, NCCL on CUDA).
Micro-batches come from ``slime.rl.micro_batches`` and the RL losses from ``slime.rl.train_loss``, both
shared with the megatron backend. Guaranteed: ``save``/``load`` round-trip model, optimizer and RNG state
exactly; ``log_probs`` returns fp32 on the CPU with zeros at padding; the learning rate of RL step
``step`` is ``optim.lr_at(step)``, so the schedule depends only on the step count the runtime passes in.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from slime.backends.base import RankInfo, TrainBackend, TrainBatch
from slime.backends.train.optim import build_adamw, lr_at, set_lr
from slime.diagnosis.beats import beat
from slime.rl.losses import entropy_from_logits, logprobs_from_logits, sft_loss
from slime.rl.micro_batches import plan_micro_batches
from slime.rl.train_loss import policy_loss_of, value_loss_of, wants_entropy

if TYPE_CHECKING:
    from slime.spec.types import Spec

__all__ = ["TorchTrainBackend"]

# Metrics that are already fractions of the global mean (summed over micro-batches and ranks);
# every other metric is a per-micro-batch mean, weighted by the micro-batch's share of tokens.
_ADDITIVE = frozenset({"loss", "pg_loss", "kl_loss", "entropy", "value_loss", "sft_loss"})
_PER_TOKEN = (
    "advantages",
    "old_log_probs",
    "ref_log_probs",
    "returns",
    "old_values",
    "rollout_log_probs",
    "tis_weights",
)
_HF_SIDE_FILES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


class TorchTrainBackend(TrainBackend):
    """``train.backend: torch``.

    Roles: ``actor`` is the causal LM of :func:`slime.models.lean_lm.load_causal_lm` (a plain-torch module
    with HF's tensor names for the Llama family, else ``AutoModelForCausalLM``) trained with the spec's
    policy loss, or for ``TrainBatch.kind == "sft"`` the masked NLL of the SFT warm-up (its own AdamW at
    ``algorithm.sft_warmup_lr``); ``critic`` is ``ValueModel`` (same backbone + value head) trained with
    the clipped value loss, its values never temperature-scaled; ``ref`` is a frozen policy used only for
    ``log_probs`` (KL).

    Precision: parameters and optimizer state are fp32; on CUDA, ``bf16``/``fp16`` run the forward under
    ``torch.autocast``. On CPU everything is fp32 (CPU bf16 matmuls are slower than fp32 and would break
    the 1e-3 log-prob parity with the engine).
    """

    rank_info: RankInfo

    # ------------------------------------------------------------------ setup
    def init(
        self, spec: Spec, rank: RankInfo, model_dir: Path, *, role: Literal["actor", "critic", "ref"] = "actor"
    ) -> None:
        from slime.backends.train.critic import ValueModel
        from slime.models.lean_lm import load_causal_lm

        if role not in ("actor", "critic", "ref"):
            raise ValueError(f"role must be actor, critic or ref, got {role!r}")
        self.spec, self.rank_info, self.role, self.model_dir = spec, rank, role, Path(model_dir)
        self.device = torch.device(rank.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        precision = spec.train.precision
        self.autocast_dtype = (
            {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision) if self.device.type == "cuda" else None
        )
        if role == "critic":
            self.model = ValueModel.from_pretrained(self.model_dir)
        else:
            self.model = load_causal_lm(self.model_dir, dtype=torch.float32)
        self.model.to(self.device)
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.optimizer = None
        self.sft_optimizer = None
        if role == "ref":
            self.model.eval().requires_grad_(False)
            return
        self._join_group(rank)
        opt = spec.train.optimizer
        self.base_lr = spec.algorithm.critic.lr if role == "critic" and spec.algorithm.critic else opt.lr
        self.optimizer = build_adamw(
            self.model.parameters(), lr=self.base_lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
        self.total_steps = (spec.rollout.num_rollouts or 1) * (spec.train.num_steps_per_rollout or 1)

    def _join_group(self, rank: RankInfo) -> None:
        import datetime

        import torch.distributed as dist

        from slime.diagnosis.phases import collective_timeout_s

        if rank.world_size <= 1 or dist.is_initialized():
            return
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{rank.master_addr}:{rank.master_port}",
            rank=rank.rank,
            world_size=rank.world_size,
            # cluster.stall_timeout_s: a rank that never joins a collective ends the step with a message
            timeout=datetime.timedelta(seconds=collective_timeout_s(self.spec.cluster.stall_timeout_s)),
        )

    @property
    def world_size(self) -> int:
        return self.rank_info.world_size if self.role != "ref" else 1

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t)
        return t

    # ---------------------------------------------------------------- forward
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _micro_batches(self, batch: TrainBatch) -> list[torch.Tensor]:
        t = self.spec.train
        lengths = [max(1, int(n)) for n in batch.attention_mask.sum(dim=1).tolist()]
        max_tokens = t.dynamic_batch.max_tokens_per_gpu if t.dynamic_batch.enabled else None
        plan = plan_micro_batches(lengths, micro_batch_size=t.micro_batch_size, max_tokens_per_gpu=max_tokens)
        return [torch.tensor(rows, dtype=torch.long) for rows in plan.batches]

    def _trimmed(self, batch: TrainBatch, rows: torch.Tensor) -> tuple[TrainBatch, int]:
        """Rows ``rows`` cut to their longest real length (right padding), moved to the device."""
        mb = batch.select(rows)
        length = max(2, int(mb.attention_mask.sum(dim=1).max()))
        cut = TrainBatch(
            tokens=mb.tokens[:, :length],
            attention_mask=mb.attention_mask[:, :length],
            response_mask=mb.response_mask[:, : length - 1],
            kind=mb.kind,
        )
        for name in _PER_TOKEN:
            value = getattr(mb, name)
            if value is not None:
                setattr(cut, name, value[:, : length - 1].to(self.device))
        cut.tokens = cut.tokens.to(self.device)
        cut.attention_mask = cut.attention_mask.to(self.device)
        cut.response_mask = cut.response_mask.to(self.device)
        return cut, length

    def _logits(self, mb: TrainBatch) -> torch.Tensor:
        with self._autocast():
            out = self.model(input_ids=mb.tokens, attention_mask=mb.attention_mask)
        return out.logits[:, :-1].float()

    def log_probs(self, batch: TrainBatch, *, temperature: float) -> torch.Tensor:
        if self.role == "critic":
            raise RuntimeError("log_probs is not defined on a critic rank; use values()")
        return self._forward_only(
            batch, lambda mb: logprobs_from_logits(self._logits(mb), mb.tokens[:, 1:], temperature)
        )

    def values(self, batch: TrainBatch) -> torch.Tensor:
        if self.role != "critic":
            raise NotImplementedError(f"values() needs a critic rank, this one is {self.role!r}")
        # Value of the state at position t scores the prediction of token t+1: drop the last position.
        return self._forward_only(batch, lambda mb: self._values(mb))

    def _values(self, mb: TrainBatch) -> torch.Tensor:
        with self._autocast():
            v = self.model(mb.tokens, mb.attention_mask)
        return v[:, :-1].float()

    def _forward_only(self, batch: TrainBatch, fn) -> torch.Tensor:
        B, T = batch.tokens.shape
        out = torch.zeros(B, T - 1, dtype=torch.float32)
        self.model.eval()
        with torch.no_grad():
            for rows in self._micro_batches(batch):
                mb, length = self._trimmed(batch, rows)
                per_token = fn(mb).float()
                valid = mb.attention_mask[:, 1:].bool()
                out[rows, : length - 1] = torch.where(valid, per_token, 0.0).cpu()
        return out

    # ------------------------------------------------------------------ train
    def train_step(self, batch: TrainBatch, *, step: int) -> dict[str, float]:
        """One optimizer step over ``batch``: each micro-batch's loss is divided by the *global* number of
        trained tokens (or sequences, for ``seq_mean_token_mean``), gradients are summed over micro-batches
        and all-reduced (summed) across ranks, so N ranks compute the gradient of one process over the
        whole batch (tested)."""
        opt, lr, loss_fn = self._step_plan(batch, step)
        set_lr(opt, lr)
        self.model.train()
        opt.zero_grad(set_to_none=True)
        sums = self._accumulate_grads(batch, loss_fn)
        self._all_reduce_grads()
        params = [p for p in self.model.parameters() if p.requires_grad]
        clip = self.spec.train.optimizer.clip_grad
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        opt.step()
        metrics = self._reduce_metrics(sums)
        metrics.update(grad_norm=float(grad_norm), lr=float(lr))
        return metrics

    def _step_plan(self, batch: TrainBatch, step: int):
        """The optimizer, learning rate and per-micro-batch loss of this step (SFT warm-up, critic or policy)."""
        if self.role == "ref":
            raise RuntimeError("train_step called on a frozen reference model")
        sft_job = self.spec.kind == "SFTJob"  # the SFT loss with the spec's optimizer and schedule (checkpointed)
        if batch.kind == "sft" and self.role != "actor":
            raise RuntimeError("the SFT loss trains the actor only")
        if batch.kind == "sft" and not sft_job:
            return self._sft_opt(), self.spec.algorithm.sft_warmup_lr, self._sft_loss
        o = self.spec.train.optimizer
        lr = lr_at(
            step,
            lr=self.base_lr,
            min_lr=min(o.min_lr, self.base_lr),
            warmup_steps=o.warmup_steps,
            total_steps=self.total_steps,
            schedule=o.lr_schedule,
        )
        if batch.kind == "sft":
            return self.optimizer, lr, self._sft_loss
        if self.role == "critic":
            if batch.returns is None or batch.old_values is None:
                raise ValueError("a critic train_step needs TrainBatch.returns and old_values")
            return self.optimizer, lr, self._value_loss
        if batch.advantages is None:
            raise ValueError("TrainBatch.advantages is required for an RL train_step")
        return self.optimizer, lr, self._policy_loss

    def _accumulate_grads(self, batch: TrainBatch, loss_fn) -> dict[str, float]:
        """Backward every micro-batch's share of the global loss; return the rank's weighted metric sums."""
        seq_agg = self.spec.algorithm.loss_agg == "seq_mean_token_mean" and batch.kind == "rl"
        mask = batch.response_mask.bool()
        count = torch.tensor([float(mask.sum()), float(mask.any(dim=1).sum())], dtype=torch.float64, device=self.device)
        self._all_reduce(count)
        global_tokens = max(float(count[0]), 1.0)
        global_seqs = max(float(count[1]), 1.0)
        sums: dict[str, float] = {}
        for rows in self._micro_batches(batch):
            mb, _ = self._trimmed(batch, rows)
            m = mb.response_mask.bool()
            if seq_agg:
                # Per-sequence means, then a mean over the *global* number of sequences.
                scale = float(m.any(dim=1).sum()) / global_seqs
                loss, metrics = loss_fn(mb, None)
                loss = loss * scale
            else:
                scale = 1.0
                loss, metrics = loss_fn(mb, global_tokens)
            loss.backward()
            share = float(m.sum()) / global_tokens
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (scale if k in _ADDITIVE else share)
        return sums

    def _sft_opt(self):
        if self.sft_optimizer is None:
            o = self.spec.train.optimizer
            self.sft_optimizer = build_adamw(
                self.model.parameters(),
                lr=self.spec.algorithm.sft_warmup_lr,
                betas=o.betas,
                eps=o.eps,
                weight_decay=o.weight_decay,
            )
        return self.sft_optimizer

    def _policy_loss(self, mb: TrainBatch, num_tokens: float | None):
        a = self.spec.algorithm
        logits = self._logits(mb)
        temperature = self.spec.rollout.temperature
        logp = logprobs_from_logits(logits, mb.tokens[:, 1:], temperature)
        entropy = entropy_from_logits(logits, temperature) if wants_entropy(a) else None
        return policy_loss_of(
            a,
            logp,
            mb.old_log_probs,
            mb.advantages,
            mb.response_mask,
            entropy=entropy,
            ref_logp=mb.ref_log_probs,
            tis_weights=mb.tis_weights,
            num_tokens=num_tokens,
        )

    def _value_loss(self, mb: TrainBatch, num_tokens: float | None):
        values = self._values(mb)
        return value_loss_of(
            self.spec.algorithm, values, mb.old_values, mb.returns, mb.response_mask, num_tokens=num_tokens
        )

    def _sft_loss(self, mb: TrainBatch, num_tokens: float | None):
        logp = logprobs_from_logits(self._logits(mb), mb.tokens[:, 1:], 1.0)
        loss = sft_loss(logp, mb.response_mask, num_tokens=num_tokens)
        return loss, {"sft_loss": loss.detach()}

    def _all_reduce_grads(self) -> None:
        if self.world_size <= 1:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # every rank must contribute every tensor, even if unused locally
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self._all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def _reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        vec = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        if keys:
            self._all_reduce(vec)
        return {k: float(v) for k, v in zip(keys, vec.cpu().tolist())}

    def data_parallel_coords(self) -> tuple[int, int]:
        return self.rank_info.rank, self.rank_info.world_size  # plain data parallel: every rank a replica

    # --------------------------------------------------------------- weights
    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF model's own tensors (every rank holds the whole policy); a tied ``lm_head`` is left out."""
        for name, t in self.model.state_dict().items():
            if not (self.tied and name == "lm_head.weight"):
                yield name, t.detach()

    def export_weights(self, out_dir: Path) -> Path:
        from safetensors.torch import save_file

        if self.role == "critic":
            raise RuntimeError("export_weights exports the policy; this rank is a critic")
        out = Path(out_dir)
        if self.rank_info.rank != 0:
            return out  # data-parallel replicas hold the same weights: rank 0 writes them
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        if self.tied:
            state.pop("lm_head.weight", None)  # shares storage with the embeddings; HF re-ties on load
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        beat("weight sync")
        for f in self.model_dir.iterdir():
            if f.is_file() and f.suffix in _HF_SIDE_FILES and not f.name.endswith(".index.json"):
                shutil.copy2(f, out / f.name)
        return out

    def _file(self, ckpt_dir: Path) -> Path:
        return Path(ckpt_dir) / f"{self.role}-rank{self.rank_info.rank}.pt"

    def save(self, ckpt_dir: Path) -> None:
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
            },
        }
        torch.save(state, self._file(ckpt_dir))
        beat("checkpoint save")

    def load(self, ckpt_dir: Path) -> None:
        path = self._file(ckpt_dir)
        if not path.is_file():
            raise FileNotFoundError(
                f"checkpoint {ckpt_dir} has no {path.name} (was it saved with the same number of trainer ranks?)"
            )
        try:
            state = torch.load(path, map_location=self.device, weights_only=False)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:  # what truncated files raise
            from slime.core.errors import CheckpointError

            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:300]
            raise CheckpointError(
                f"cannot load {path}: truncated, corrupted or unreadable ({type(exc).__name__}: {first})"
            ) from None
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        rng = state.get("rng") or {}
        if rng.get("torch") is not None:
            torch.set_rng_state(rng["torch"].cpu())
        if rng.get("python") is not None:
            random.setstate(rng["python"])
        if rng.get("cuda") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu())
