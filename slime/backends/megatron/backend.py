"""The megatron-core train backend: one trainer rank of a TP x PP x CP x EP x DP layout.

``init`` builds this rank's pipeline stage from the HF checkpoint (``config.py``, ``attention.py``,
``convert.py``) under megatron's DDP and distributed optimizer. Every rank of one model replica (same
data-parallel index, ``config.rank_coords``) must receive the same ``TrainBatch``. Micro-batches come
from ``slime.rl.micro_batches`` and the RL losses from ``slime.rl.train_loss``, both shared with the torch
backend. Weights out: ``weights_out.py``; checkpoints: ``checkpoint.py``; roles, SFT and context parallel:
:class:`MegatronTrainBackend`. What was verified where: ``slime/backends/megatron/README.md``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from slime.backends.base import RankInfo, TrainBackend, TrainBatch
from slime.backends.megatron import checkpoint, convert, hf_io, weights_out
from slime.backends.megatron import config as mcfg
from slime.backends.megatron.logprobs import vocab_parallel_logprobs
from slime.backends.megatron.transformer_config import build_transformer_config
from slime.rl.losses import critic_values, sft_loss
from slime.rl.micro_batches import pad_to_multiple, plan_micro_batches
from slime.rl.train_loss import policy_loss_of, value_loss_of, wants_entropy

if TYPE_CHECKING:
    from slime.spec.types import Spec

__all__ = ["MegatronTrainBackend"]


def _per_token(t: torch.Tensor | None, T: int) -> torch.Tensor | None:
    """Per-token tensors use the [B, T-1] alignment; accept [B, T] by dropping column 0."""
    if t is None or t.shape[-1] == T - 1:
        return t
    if t.shape[-1] == T:
        return t[:, 1:]
    raise ValueError(f"per-token tensor has {t.shape[-1]} columns; expected {T - 1} (tokens[:, 1:] alignment)")


def megatron_optimizer(train: Any, model: Any, *, lr: float | None = None) -> Any:
    """megatron-core's optimizer for ``train`` over ``model``; its CPU-offload path (train.megatron.
    optimizer_offload) goes through the precision-aware one, whose config checks Transformer Engine."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    kwargs = mcfg.optimizer_config_kwargs(train, lr=lr)
    if kwargs.get("optimizer_cpu_offload") and not mcfg.has_transformer_engine():
        raise mcfg.MegatronConfigError(
            [
                (
                    "train.megatron.optimizer_offload",
                    "optimizer offload runs megatron-core's precision-aware optimizer, which needs Transformer "
                    "Engine, and transformer_engine is not installed on this node",
                    "install transformer-engine in the job's environment (slime's images have it), or set "
                    "train.megatron.optimizer_offload: 0",
                )
            ]
        )
    kwargs["params_dtype"] = getattr(torch, kwargs["params_dtype"])
    return get_megatron_optimizer(OptimizerConfig(**kwargs), [model])


class MegatronTrainBackend(TrainBackend):
    """``train.backend: megatron``.

    One rank joins the job's process group (NCCL on GPU), sets megatron-core's model-parallel groups from
    ``train.parallel``, builds a ``GPTModel`` for its pipeline stage with the chosen attention (Transformer
    Engine, else SDPA), loads only its stage's HF tensors and its TP slice, wraps it for bf16
    (``Float16Module``) and data parallel, and builds megatron's distributed optimizer (fp32 master weights
    sharded over data-parallel ranks) with the spec's LR schedule.

    Roles: ``actor`` (policy loss), ``ref`` (frozen, log-probs only) and ``critic`` (PPO value model:
    ``critic.py``'s value head on the same GPTModel, ``values`` + the shared value loss, learning rate
    ``algorithm.critic.lr``). ``TrainBatch.kind == "sft"`` (the SFT warm-up) trains the masked NLL with a
    second optimizer at ``algorithm.sft_warmup_lr``; it is not checkpointed (the warm-up precedes RL), and
    whichever optimizer takes over reloads its fp32 copies from the current weights.

    Outputs: ``log_probs`` returns ``[B, T-1]`` on every rank (the last pipeline stage broadcasts).
    ``export_weights`` and the weight sync give HF names and full tensors (the export's directory must be
    on storage all trainer nodes share); ``save``/``load`` use megatron's distributed checkpointing of the
    model and the RL optimizer, plus a per-rank file for the scheduler and RNG state.

    Context parallel (``train.parallel.context``): all ranks of one CP group get the same batch; each
    micro-batch is padded to a multiple of ``2 * cp`` and every rank runs its two load-balanced chunks
    (``context_parallel.py``) with targets shifted before the split; per-token log-probs, entropies and
    values are gathered back over the CP group, so every CP rank computes the same full loss and metrics.
    """

    # ------------------------------------------------------------------ setup
    def init(self, spec: Spec, rank: RankInfo, model_dir: Path, *, role: str = "actor") -> None:
        """Join the groups, build this stage's ``GPTModel`` from the HF checkpoint, and its optimizer.

        Not supported (clear errors here): fp8. Runs on CUDA (CPU only in tests).
        """
        if role not in ("actor", "critic", "ref"):
            raise ValueError(f"role must be actor, critic or ref, got {role!r}")
        self.spec, self.role, self.model_dir, self.rank_info = spec, role, Path(model_dir), rank
        requested, overrides = self._check_layout(rank)
        self._join_groups(rank)
        self.config = self._transformer_config(requested, overrides)
        model = self._build_gpt()
        if spec.train.precision in ("bf16", "fp16"):
            from megatron.core.transformer.module import Float16Module

            model = Float16Module(self.config, model)
        self.optimizer = self.scheduler = self.sft_optimizer = self._active = None
        if role == "ref":
            model.eval().requires_grad_(False)
            self.model = model
            return
        self._build_optimizer(model)

    def _check_layout(self, rank: RankInfo) -> tuple[str, dict[str, Any]]:
        """Read the parallel layout and the model's shape, choose the attention, refuse what cannot run;
        return the requested attention backend and the ``TransformerConfig`` overrides of ``backend_args``."""
        par = self.spec.train.parallel
        self.tp, self.pp, self.cp = par.tensor, par.pipeline, par.context
        self.ep, self.etp = par.expert, par.expert_tensor or par.tensor
        self.shape = mcfg.ModelShape.from_hf_config(json.loads((self.model_dir / "config.json").read_text()))
        ours, overrides = mcfg.split_backend_args(self.spec.train.megatron.args)
        requested = str(ours.get("attention_backend", "auto"))
        self.attention = mcfg.choose_attention_backend(requested, self.shape)
        mcfg.check_parallel(
            self.shape,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            sequence_parallel=par.sequence_parallel and self.tp > 1,
            world_size=rank.world_size,
            attention_backend=self.attention,
        )
        return requested, overrides

    def _join_groups(self, rank: RankInfo) -> None:
        """The job's process group (NCCL on GPU), megatron-core's model-parallel groups, the seeds."""
        import datetime

        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        from slime.diagnosis.phases import collective_timeout_s

        self.device = torch.device(rank.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo",
                init_method=f"tcp://{rank.master_addr}:{rank.master_port}",
                rank=rank.rank,
                world_size=rank.world_size,
                # cluster.stall_timeout_s: a hung collective ends with a message, not after NCCL's 30 minutes
                timeout=datetime.timedelta(seconds=collective_timeout_s(self.spec.cluster.stall_timeout_s)),
            )
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(
                tensor_model_parallel_size=self.tp,
                pipeline_model_parallel_size=self.pp,
                context_parallel_size=self.cp,
                expert_model_parallel_size=self.ep,
                expert_tensor_parallel_size=self.etp,
            )
        self.coords = mcfg.rank_coords(rank.rank, rank.world_size, tp=self.tp, pp=self.pp, cp=self.cp)
        torch.manual_seed(self.spec.train.seed)
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(self.spec.train.seed)

    def _transformer_config(self, requested: str, overrides: dict[str, Any]):
        # perform_initialization stays on even though the HF weights overwrite the init: with it
        # off, megatron-core 0.16 never tags TP-split weights (tensor_model_parallel), and the
        # gradient norm (hence clipping) then drops the shards of TP ranks > 0.
        base = {} if self.device.type == "cuda" else {"use_cpu_initialization": True}
        return build_transformer_config(
            mcfg.transformer_config_kwargs(
                self.shape,
                tp=self.tp,
                pp=self.pp,
                cp=self.cp,
                ep=self.ep,
                etp=self.etp,
                sequence_parallel=self.spec.train.parallel.sequence_parallel and self.tp > 1,
                precision=self.spec.train.precision,
                attention_backend=self.attention,
                mcore_attention=mcfg.mcore_attention_backend(requested),
                overrides={**base, **overrides},
            )
        )

    def _build_gpt(self) -> torch.nn.Module:
        """This pipeline stage's ``GPTModel`` (a critic's with the value head), the HF weights loaded."""
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel

        from slime.backends.megatron.attention import layer_spec, state_dict_naming

        self.first_stage, self.last_stage = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        critic = self.role == "critic"
        model_shape = dataclasses.replace(self.shape, tie_embeddings=False) if critic else self.shape
        model = GPTModel(
            config=self.config,
            transformer_layer_spec=layer_spec(self.attention, self.config),
            pre_process=self.first_stage,
            post_process=self.last_stage,
            **mcfg.gpt_model_kwargs(model_shape, tp=self.tp),
        )
        if critic and self.last_stage:
            from slime.backends.megatron.critic import ValueHead

            model.output_layer = ValueHead(self.config)
        self.naming = state_dict_naming(self.attention)
        self._load_hf_into(model, self.model_dir)
        model.to(self.device)
        self.gpt = model
        self.moe_meter = None
        if self.shape.moe is not None:
            from slime.backends.megatron.moe_metrics import LoadBalancingMeter

            self.moe_meter = LoadBalancingMeter(model)
        return model

    def _load_hf_into(self, model: torch.nn.Module, model_dir: Path) -> None:
        """Read only this rank's tensors (its stage's layers, its experts) and load its TP/EP slice."""
        from megatron.core import parallel_state as ps

        per = self.shape.num_layers // self.pp
        critic = self.role == "critic"
        tied = self.shape.tie_embeddings or critic  # the critic's output layer is its value head
        stage = dataclasses.replace(self.shape.stage(self.coords.pp * per, per), tie_embeddings=tied)
        ep_rank = ps.get_expert_model_parallel_rank() if self.ep > 1 else 0
        stage, experts = convert.local_experts(stage, self.ep, ep_rank)
        wanted = [convert.global_expert_name(n, experts) for n in convert.iter_hf_names(stage)]
        hf = hf_io.read_tensors(model_dir, wanted)
        missing = [n for n in wanted if n not in hf]
        if missing:
            raise convert.ConversionError(f"{model_dir}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
        local = {convert.local_expert_name(n, experts): v for n, v in hf.items()}
        full = convert.hf_to_megatron(local, stage, tp=self.tp, naming=self.naming)
        if not self.first_stage:
            full.pop("embedding.word_embeddings.weight")
        if not self.last_stage:
            full.pop("decoder.final_layernorm.weight")
            full.pop("output_layer.weight", None)
        elif self.shape.tie_embeddings and self.pp > 1 and not critic:
            full["output_layer.weight"] = convert.hf_to_megatron(local, stage, tp=self.tp)[
                "embedding.word_embeddings.weight"
            ]
        etp_rank = ps.get_expert_tensor_parallel_rank() if self.etp > 1 else 0
        state = {
            n: convert.shard_param(n, v, self.etp, etp_rank)
            if convert.is_expert_param(n)
            else convert.shard_param(n, v, self.tp, self.coords.tp)
            for n, v in full.items()
        }
        result = model.load_state_dict(state, strict=False)
        missing = [
            k
            for k in result.missing_keys
            if not k.endswith("_extra_state") and not (critic and k == "output_layer.weight")
        ]
        if missing or result.unexpected_keys:
            raise convert.ConversionError(
                f"GPTModel stage {self.coords.pp} did not match the converted weights: "
                f"missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}"
            )

    def _build_optimizer(self, module: torch.nn.Module) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        t = self.spec.train
        self.model = DistributedDataParallel(
            self.config, DistributedDataParallelConfig(**mcfg.ddp_config_kwargs(t)), module
        )
        lr = self.spec.algorithm.critic.lr if self.role == "critic" and self.spec.algorithm.critic else None
        self.optimizer = megatron_optimizer(t, self.model, lr=lr)
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, **mcfg.scheduler_kwargs(t, self.spec.rollout.num_rollouts, lr=lr)
        )
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.no_sync_func = self.model.no_sync

    def _warmup(self, kind: str) -> bool:
        """An SFT warm-up step (its own optimizer, constant lr); a ``kind: SFTJob`` trains the SFT loss with
        the spec's optimizer and schedule, checkpointed like RL's."""
        return kind == "sft" and self.spec.kind != "SFTJob"

    def _optimizer_for(self, kind: str):
        """The RL optimizer, or the SFT warm-up's own one (constant ``algorithm.sft_warmup_lr``)."""
        kind = "sft" if self._warmup(kind) else "rl"
        if kind == "sft" and self.sft_optimizer is None:
            self.sft_optimizer = megatron_optimizer(self.spec.train, self.model, lr=self.spec.algorithm.sft_warmup_lr)
        opt = self.sft_optimizer if kind == "sft" else self.optimizer
        if self._active is not None and self._active is not opt:
            opt.reload_model_params()  # the other optimizer moved the weights: refresh this one's fp32 copies
        self._active = opt
        self.config.grad_scale_func = opt.scale_loss
        return opt

    def data_parallel_coords(self) -> tuple[int, int]:
        return self.coords.dp, self.coords.dp_size

    # ------------------------------------------------------------------ forward/backward
    def _micro_batches(self, batch: TrainBatch) -> tuple[list[dict[str, torch.Tensor]], Any]:
        T = batch.tokens.shape[1]
        lengths = batch.attention_mask.sum(dim=1).tolist()
        dyn = self.spec.train.dynamic_batch
        plan = plan_micro_batches(
            [max(1, int(n)) for n in lengths],
            micro_batch_size=self.spec.train.micro_batch_size,
            max_tokens_per_gpu=dyn.max_tokens_per_gpu if dyn.enabled else None,
        )
        # Sequence parallel splits each CP rank's part over TP; CP needs 2 * cp equal chunks.
        multiple = (8 * self.tp if self.config.sequence_parallel else 8) * (2 * self.cp if self.cp > 1 else 1)
        per_token = {
            k: _per_token(getattr(batch, k), T)
            for k in (
                "response_mask",
                "advantages",
                "old_log_probs",
                "ref_log_probs",
                "returns",
                "old_values",
                "tis_weights",
            )
        }
        out = []
        for idx in plan.batches:
            rows = torch.tensor(idx)
            L = pad_to_multiple(max(int(lengths[i]) for i in idx), multiple)
            tokens = torch.zeros(len(idx), L, dtype=torch.long)
            n = min(L, T)
            tokens[:, :n] = batch.tokens[rows, :n]
            mb = {"tokens": tokens}
            if self.cp > 1:
                from slime.backends.megatron.context_parallel import split_seq

                labels = torch.zeros_like(tokens)  # shifted before the split: no target lives on another rank
                labels[:, :-1] = tokens[:, 1:]
                pos = torch.arange(L).unsqueeze(0).expand_as(tokens)
                for key, value in (("cp_tokens", tokens), ("cp_labels", labels), ("cp_pos", pos)):
                    mb[key] = split_seq(value, self.cp, self.coords.cp).contiguous()
            for key, value in per_token.items():
                if value is not None:
                    padded = torch.zeros(len(idx), L - 1, dtype=value.dtype)
                    padded[:, : n - 1] = value[rows, : n - 1]
                    mb[key] = padded
            mb["rows"] = rows
            out.append({k: v.to(self.device, non_blocking=True) if k != "rows" else v for k, v in mb.items()})
        return self._same_count_for_experts(out), plan

    def _same_count_for_experts(self, mbs: list[dict]) -> list[dict]:
        """Expert-parallel ranks exchange tokens inside every MoE layer, forward and backward, so every rank of
        an expert-parallel group (they are different data-parallel ranks) must run as many micro-batches:
        pad with copies of the first one whose loss weight is zero (``dummy``: no log-probs, no metrics)."""
        if self.ep == 1 or not mbs:
            return mbs
        from megatron.core import parallel_state as ps

        most = torch.tensor([len(mbs)], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
        dummy = {k: (v if k == "rows" else v[:1]) for k, v in mbs[0].items()}
        dummy["rows"] = mbs[0]["rows"][:1]
        dummy["dummy"] = True
        if "response_mask" in dummy:
            dummy["response_mask"] = torch.zeros_like(dummy["response_mask"])
        return mbs + [dummy] * (int(most.item()) - len(mbs))

    def _forward(self, model, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.moe_meter is not None:
            self.moe_meter.paused = bool(mb.get("dummy"))
        if self.cp > 1:  # megatron's rotary embedding picks the same two chunks of positions itself
            return model(mb["cp_tokens"], mb["cp_pos"], None)
        tokens = mb["tokens"]
        pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
        return model(tokens, pos, None)

    def _cp_gather(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """This CP rank's per-position values ``[b, s_local]`` → the whole sequence ``[b, L]``."""
        if t is None or self.cp == 1:
            return t
        from megatron.core import parallel_state as ps

        from slime.backends.megatron.context_parallel import gather_seq

        return gather_seq(t.contiguous(), ps.get_context_parallel_group(), dim=1)

    def _logp(self, logits: torch.Tensor, mb: dict[str, torch.Tensor], temperature: float, with_entropy: bool):
        """Log-probs (and entropy) ``[b, L-1]`` of ``tokens[:, 1:]``, whole sequence on every CP rank."""
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group() if self.tp > 1 else None
        if self.cp == 1:
            tokens = mb["tokens"]
            return vocab_parallel_logprobs(
                logits[:, :-1],
                tokens[:, 1:],
                vocab_size=self.shape.vocab_size,
                temperature=temperature,
                group=group,
                with_entropy=with_entropy,
            )
        logp, ent = vocab_parallel_logprobs(
            logits,
            mb["cp_labels"],
            vocab_size=self.shape.vocab_size,
            temperature=temperature,
            group=group,
            with_entropy=with_entropy,
        )
        logp, ent = self._cp_gather(logp), self._cp_gather(ent)
        return logp[:, :-1], None if ent is None else ent[:, :-1]

    def _run(self, mbs: list[dict], loss_func, *, forward_only: bool) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def step_func(data_iterator, model):
            mb = next(data_iterator)
            return self._forward(model, mb), partial(loss_func, mb)

        get_forward_backward_func()(
            forward_step_func=step_func,
            data_iterator=iter(mbs),
            model=[self.model],
            num_microbatches=len(mbs),
            seq_length=max(mb["tokens"].shape[1] for mb in mbs),
            micro_batch_size=max(len(mb["rows"]) for mb in mbs),
            forward_only=forward_only,
        )

    def _from_last_stage(self, obj: Any) -> Any:
        """Broadcast a picklable object from the last pipeline stage to the others."""
        if self.pp == 1:
            return obj
        from megatron.core import parallel_state as ps

        box = [obj]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return box[0]

    def log_probs(self, batch: TrainBatch, *, temperature: float) -> torch.Tensor:
        B, T = batch.tokens.shape
        mbs, _ = self._micro_batches(batch)
        out = torch.zeros(B, T - 1, dtype=torch.float32)

        def loss_func(mb, logits):
            logp, _ = self._logp(logits, mb, temperature, False)
            n = min(T - 1, logp.shape[1])
            if not mb.get("dummy"):
                out[mb["rows"], :n] = logp[:, :n].float().cpu()
            return torch.zeros((), device=logits.device), {}

        self.model.eval()
        with torch.no_grad():
            self._run(mbs, loss_func, forward_only=True)
        return self._from_last_stage(out)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values ``[B, T-1]`` (position t values the state before token t+1); not temperature-scaled."""
        if self.role != "critic":
            raise NotImplementedError(f"this rank is a {self.role!r}, not a critic")
        B, T = batch.tokens.shape
        mbs, _ = self._micro_batches(batch)
        out = torch.zeros(B, T - 1, dtype=torch.float32)

        def loss_func(mb, head):
            v = self._cp_gather(critic_values(head))[:, :-1]
            n = min(T - 1, v.shape[1])
            if not mb.get("dummy"):
                out[mb["rows"], :n] = v[:, :n].float().cpu()
            return torch.zeros((), device=head.device), {}

        self.model.eval()
        with torch.no_grad():
            self._run(mbs, loss_func, forward_only=True)
        return self._from_last_stage(out)

    def train_step(self, batch: TrainBatch, *, step: int) -> dict[str, float]:
        """One optimizer step over ``batch``: each micro-batch's loss is weighted so that the sum over
        micro-batches and data-parallel ranks is the loss of the whole global batch."""
        from megatron.core import parallel_state as ps

        self._check_train_batch(batch)
        sft = batch.kind == "sft"
        mbs, plan = self._micro_batches(batch)
        seq_agg = self.spec.algorithm.loss_agg == "seq_mean_token_mean" and not sft
        dp_group = ps.get_data_parallel_group()
        global_count = self._global_count(batch, seq_agg, dp_group)
        # megatron divides by the micro-batch count and averages gradients over dp: undo both. (It also
        # multiplies by cp and divides by dp * cp in the gradient all-reduce; each CP rank back-propagates
        # only its own positions' share of this replicated loss, and those shares add up over the CP group.)
        n_mb, dp = len(mbs), ps.get_data_parallel_world_size()
        sums: dict[str, float] = {}

        def loss_func(mb, output):
            if mb.get("dummy"):  # zero gradient, but the backward's expert collectives still run
                return output.float().sum() * 0.0, {}
            loss, metrics = self._mb_loss(mb, output, batch.kind)
            m = mb["response_mask"].bool()
            weight = float(m.any(dim=1).sum() if seq_agg else m.sum()) / global_count
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * weight
            return loss * weight * n_mb * dp, {}

        opt = self._optimizer_for(batch.kind)
        self.model.train()
        self.model.zero_grad_buffer()
        opt.zero_grad()
        start = time.perf_counter()
        self._run(mbs, loss_func, forward_only=False)
        ok, grad_norm, _ = opt.step()
        if ok and not self._warmup(batch.kind):
            self.scheduler.step(increment=1)
        metrics = self._reduce_metrics(sums, dp_group)
        if self.moe_meter is not None:
            metrics["moe_load_balancing_loss"] = self.moe_meter.take(self.device)
        metrics.update(
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=float(opt.param_groups[0]["lr"]),
            step_skipped=float(not ok),
            micro_batches=float(n_mb),
            oversized_samples=float(len(plan.oversized)),
            step_time_s=time.perf_counter() - start,
        )
        return metrics

    def _check_train_batch(self, batch: TrainBatch) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"train_step called on a {self.role!r} rank (no optimizer)")
        critic, sft = self.role == "critic", batch.kind == "sft"
        if sft and self.role != "actor":
            raise RuntimeError("the SFT warm-up trains the actor only")
        if critic and (batch.returns is None or batch.old_values is None):
            raise ValueError("a critic train_step needs TrainBatch.returns and TrainBatch.old_values")
        if not critic and not sft and batch.advantages is None:
            raise ValueError("TrainBatch.advantages is required for train_step")

    def _global_count(self, batch: TrainBatch, seq_agg: bool, dp_group) -> float:
        """Trained tokens (or, for ``seq_mean_token_mean``, trained sequences) over all data-parallel ranks."""
        mask = _per_token(batch.response_mask, batch.tokens.shape[1]).bool()
        count = (mask.any(dim=1).sum() if seq_agg else mask.sum()).to(self.device, torch.float32)
        dist.all_reduce(count, group=dp_group)
        return max(count.item(), 1.0)

    def _mb_loss(self, mb: dict[str, torch.Tensor], output: torch.Tensor, kind: str):
        """The unweighted loss of one micro-batch and its metrics: SFT NLL, the critic's value loss, or the
        policy loss (``slime.rl.train_loss``, shared with the torch backend)."""
        a, m = self.spec.algorithm, mb["response_mask"]
        if kind == "sft":
            logp, _ = self._logp(output, mb, 1.0, False)
            loss = sft_loss(logp, m)
            return loss, {"sft_loss": loss.detach()}
        if self.role == "critic":
            values = self._cp_gather(critic_values(output))[:, :-1]
            return value_loss_of(a, values, mb["old_values"], mb["returns"], m)
        logp, ent = self._logp(output, mb, self.spec.rollout.temperature, wants_entropy(a))
        return policy_loss_of(
            a,
            logp,
            mb.get("old_log_probs"),
            mb["advantages"],
            m,
            entropy=ent,
            ref_logp=mb.get("ref_log_probs"),
            tis_weights=mb.get("tis_weights"),
        )

    def _reduce_metrics(self, sums: dict[str, float], dp_group) -> dict[str, float]:
        keys = sorted(self._from_last_stage(sorted(sums)))
        vec = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64, device=self.device)
        if keys:
            dist.all_reduce(vec, group=dp_group)
        vec = self._from_last_stage(vec.cpu())
        return {k: float(v) for k, v in zip(keys, vec.tolist())}

    # ------------------------------------------------------------------ weights out
    def hf_weights(self):
        """``TrainBackend.hf_weights``: rank 0 holds only the first pipeline stage, so pp > 1 is refused."""
        if self.pp > 1:
            raise ValueError(
                "rollout.weight_sync: nccl with train.parallel.pipeline > 1 is not implemented "
                "(rank 0 holds only the first stage); use weight_sync: disk"
            )
        return self.iter_hf_weights()

    def iter_hf_weights(self):
        """Yield this stage's ``(hf_name, full tensor)`` pairs, every expert included; every rank must iterate
        (TP, expert-TP and expert-parallel all-gathers)."""
        yield from self._hf_named(self.gpt.state_dict().items())

    def _hf_named(self, pairs):
        """Megatron ``(name, local shard)`` pairs → HF ``(name, full tensor)`` pairs (collective)."""
        return weights_out.iter_hf(
            pairs, self.shape, tp=self.tp, etp=self.etp, ep=self.ep, pp=self.pp, pp_rank=self.coords.pp
        )

    def export_weights(self, out_dir: Path) -> Path:
        if self.role == "critic":
            raise NotImplementedError("the critic is not served by engines; use save() to checkpoint it")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.spec.train.precision, torch.float32)
        pairs = ((n, t.to(dtype)) for n, t in self.iter_hf_weights())
        return weights_out.write_hf(Path(out_dir), pairs, self.coords, pp=self.pp, model_dir=self.model_dir)

    # ------------------------------------------------------------------ checkpoints
    def save(self, ckpt_dir: Path) -> None:
        """Model and optimizer (megatron distributed checkpoint; the distributed optimizer's own shards
        included) plus this rank's scheduler and RNG states, under ``ckpt_dir/<role>/`` (actor and critic
        save side by side in one checkpoint)."""
        checkpoint.save_rank(Path(ckpt_dir) / self.role, **self._checkpointed())

    def load(self, ckpt_dir: Path) -> None:
        checkpoint.load_rank(Path(ckpt_dir) / self.role, what=str(ckpt_dir), **self._checkpointed())

    def _checkpointed(self) -> dict[str, Any]:
        """What ``save`` writes and ``load`` restores (SFT warm-up optimizer excluded: see the module doc)."""
        return {"gpt": self.gpt, "optimizer": self.optimizer, "scheduler": self.scheduler, "device": self.device}
