"""Trainer ranks as Ray actors, and the driver-side group that drives them in lock step.

``TrainerRank`` hosts one ``TrainBackend`` (actor or critic; plus a frozen reference) and computes
what needs the model: old/ref log-probs, KL, advantages, optimizer steps. ``TrainerGroup`` places
the ranks, joins them into one process group and fans every call out to all ranks at once
(collectives need every rank), sharding samples along a ``step_plan.StepPlan``. Tensors go rank to
rank as Ray object refs; the driver only fetches metrics, already reduced (rank 0's). Actor and
critic rank ``i`` hold the same shard. Weight sync over NCCL/gloo: every rank walks
``hf_weights()``, rank 0 broadcasts. Details: docs/design-notes.md.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.diagnosis import fault_dump
from slime.diagnosis.beats import beat

if TYPE_CHECKING:
    from slime.backends.base import WeightSender
    from slime.runtime.step_plan import ShardScores, StepPlan
    from slime.spec.layout import Layout, Slot
    from slime.spec.types import Spec

__all__ = ["TrainerGroup", "TrainerRank"]


def _free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _device_name(device: str) -> str:
    """The accelerator's marketing name (``NVIDIA H100 80GB HBM3``: what the MFU peak table matches), or
    the CPU's model name."""
    import platform

    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _save_log_probs(samples: list[dict], log_probs, directory: str, rollout_id: int, dp_rank: int) -> None:
    """Each sample's row of ``log_probs`` ``[B, T-1]`` over its response tokens, as this rank's sidecar."""
    from slime.runtime.rollout.saved import write_trainer

    rows = []
    for i, s in enumerate(samples):
        end = len(s["tokens"]) - 1  # position t scores token t+1
        lps = log_probs[i, end - int(s["response_length"]) : end].double().tolist()
        rows.append({"row": s.get("row"), "group_index": s.get("group_index"), "index": s.get("index")})
        rows[-1]["trainer_log_probs"] = lps
    write_trainer(directory, rollout_id, dp_rank, rows)


class TrainerRank:
    """Ray actor body: one rank of the actor or critic group."""

    def __init__(
        self, spec: Spec, role: str, rank: int, world_size: int, *, threads: int, gpu_slot: bool, slot: str = ""
    ) -> None:
        import torch

        from slime.backends.base import TRAIN_BACKENDS
        from slime.placement import normal_priority

        normal_priority()
        fault_dump.arm()  # the watchdog's stack dump where py-spy cannot read this process
        torch.set_num_threads(max(1, threads))
        self.spec, self.role, self.rank, self.world_size = spec, role, rank, world_size
        self.gpu_slot, self.slot = gpu_slot, slot
        self.device = "cpu"  # set by init(): a GPU slot without CUDA fails there, as a typed InfraError
        self.backend_cls = TRAIN_BACKENDS.get(spec.train.backend)
        self.backend = self.backend_cls()
        self.ref = None
        self.teacher = None  # algorithm.opd type trainer: the teacher, frozen like the reference (engine: none)
        self.batch = None
        self._weight_sender: WeightSender | None = None  # rank 0: connected on the first push
        self._loop = None

    # ---------------------------------------------------------------- setup
    def address(self) -> tuple[str, int]:
        import ray

        ip = ray.util.get_node_ip_address()
        return ip, _free_port(ip)

    def init(self, master_addr: str, master_port: int, model_dir: str) -> tuple[int, int]:
        from slime.backends.base import RankInfo
        from slime.placement import slot_device

        what = f"{self.role} rank {self.rank}" + (f" (slot {self.slot})" if self.slot else "")
        self.device = slot_device(self.gpu_slot, fake_gpus=self.spec.cluster.fake_gpus, what=what)
        self.rank_info = RankInfo(
            rank=self.rank,
            world_size=self.world_size,
            master_addr=master_addr,
            master_port=master_port,
            device=self.device,
        )
        self.backend.init(self.spec, self.rank_info, Path(model_dir), role=self.role)  # type: ignore[arg-type]
        beat("engine start")  # the engine-start phase also loads the trainer ranks: one more is up
        return self.backend.data_parallel_coords()

    def init_ref(self, ref_dir: str) -> None:
        self.ref = self.backend_cls()
        self.ref.init(self.spec, self.rank_info, Path(ref_dir), role="ref")

    def init_teacher(self, teacher_dir: str) -> None:
        """``algorithm.opd``: load the teacher on this rank (it forwards, never trains)."""
        self.teacher = self.backend_cls()
        self.teacher.init(self.spec, self.rank_info, Path(teacher_dir), role="ref")

    def _all_reduce(self, t, op: str = "sum"):
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t

    # ---------------------------------------------------------------- SFT
    def sft_step(self, samples: list[dict], step: int) -> dict[str, float]:
        from slime.runtime.train_data import collate

        return self.backend.train_step(collate(samples, kind="sft"), step=step)

    def sft_eval(self, samples: list[dict]) -> dict[str, float]:
        """Held-out SFT loss: the mean NLL of these samples' trained tokens, over every rank's samples (ranks of
        one model replica count theirs alike, so the ratio is the data-parallel one)."""
        import torch

        from slime.runtime.train_data import collate

        batch = collate(samples, kind="sft")
        logp = self.backend.log_probs(batch, temperature=1.0)
        mask = batch.response_mask
        sums = torch.tensor([float(-(logp * mask).sum()), float(mask.sum())], dtype=torch.float64)
        self._all_reduce(sums)
        return {"loss": float(sums[0]) / max(1.0, float(sums[1]))}

    # ---------------------------------------------------------------- RL
    def values(self, samples: list[dict]):
        """Critic values of this rank's samples; the batch (with them as ``old_values``) is kept for
        ``train_critic``."""
        from slime.runtime.train_data import collate

        batch = collate(samples)
        batch.old_values = self.backend.values(batch)
        self.batch = batch
        return batch.old_values

    def prepare(
        self, samples: list[dict], scores: ShardScores | list[float], values=None, sidecar: tuple | None = None
    ) -> tuple[dict[str, float], Any]:
        """Old/ref log-probs, KL, importance weights and advantages for this rank's samples; keeps the batch
        for ``train``. ``scores``: the samples' sequence scores, or what this rank computes them from (the
        driver sends a ``ShardScores``). ``sidecar``: ``(directory, rollout id, dp rank)`` to save the old
        log-probs in (``saved.write_trainer``). Returns ``(metrics, returns)``: PPO returns for the critic,
        else None (two Ray returns)."""
        import torch

        from slime.rl.masked import zero_masked
        from slime.runtime.step_plan import ShardScores
        from slime.runtime.train_data import collate, rank_scores, token_advantages

        t0 = time.perf_counter()
        a, temperature = self.spec.algorithm, self.spec.rollout.temperature
        if isinstance(scores, ShardScores):
            scores = rank_scores(scores, estimator=a.estimator, normalize_std=bool(a.normalize_std))
        batch = collate(samples)
        mask = batch.response_mask
        batch.old_log_probs = self.backend.log_probs(batch, temperature=temperature)
        if sidecar is not None:
            _save_log_probs(samples, batch.old_log_probs, *sidecar)
        metrics = self._rollout_mismatch(batch)  # before old_log_probs may become the rollout's
        sums = torch.zeros(5, dtype=torch.float64)  # token count, ref-KL sum, reward-KL sum, |adv| sum, OPD-KL sum
        sums[0] = mask.sum()
        kl = self._ref_kl(batch, temperature, sums) if self.ref is not None else None
        student = batch.old_log_probs  # the trainer's, before use_rollout_logprobs may swap them
        if a.use_rollout_logprobs:
            batch.old_log_probs = batch.rollout_log_probs  # the ratio is taken against the sampling policy
        adv, returns = token_advantages(
            torch.tensor(scores, dtype=torch.float32),
            mask,
            estimator=a.estimator,
            kl=kl,
            kl_coef=a.kl_coef,
            values=values,
            gamma=a.gamma,
            lambd=a.lam,
            all_reduce=self._all_reduce,
        )
        if a.opd is not None:  # on-policy distillation: the teacher's log-probs at the rollout temperature
            adv, opd_kl = self._opd(batch, student, adv, temperature)
            sums[4] = opd_kl.sum()
        batch.advantages, batch.returns = adv, returns
        self.batch = batch
        sums[3] = zero_masked(adv.abs(), mask).sum()
        self._all_reduce(sums)
        n = max(1.0, float(sums[0]))
        if a.opd is not None:
            metrics["train/opd_kl"] = float(sums[4]) / n
        metrics["train/tokens"] = float(sums[0])
        metrics["train/adv_abs_mean"] = float(sums[3]) / n  # over every rank's tokens
        if self.ref is not None:
            metrics["train/ref_kl"] = float(sums[1]) / n
        metrics["time/prepare_s"] = time.perf_counter() - t0
        return metrics, (returns if a.estimator == "ppo" else None)

    def _ref_kl(self, batch, temperature: float, sums):
        """The reference log-probs; adds the loss's and the reward's KL sums to ``sums``; returns the k1 KL."""
        from slime.rl.kl import compute_kl
        from slime.rl.masked import zero_masked

        a, mask = self.spec.algorithm, batch.response_mask
        batch.ref_log_probs = self.ref.log_probs(batch, temperature=temperature)
        sums[1] = zero_masked(compute_kl(batch.old_log_probs, batch.ref_log_probs, a.kl_loss_type), mask).sum()
        kl = compute_kl(batch.old_log_probs, batch.ref_log_probs, "k1")
        sums[2] = zero_masked(kl, mask).sum()
        return kl

    def _opd(self, batch, student, adv, temperature: float):
        """``(advantages with the teacher's KL penalty, per-token KL)``; keeps ``batch.teacher_log_probs``:
        the teacher on this rank forwards (type trainer), or the teacher engine's came with the samples."""
        from slime.rl.opd import opd_advantages

        opd = self.spec.algorithm.opd
        if self.teacher is not None:
            batch.teacher_log_probs = self.teacher.log_probs(batch, temperature=temperature)
        elif batch.teacher_log_probs is None:
            raise ValueError(
                f"algorithm.opd (type {opd.type}) needs the teacher's log-probs, but these samples have none "
                "(type engine: the rollout manager asks the teacher engine; saved rollouts from a run without it "
                "have none)"
            )
        return opd_advantages(adv, student, batch.teacher_log_probs, batch.response_mask, opd.kl_coef)

    def _rollout_mismatch(self, batch) -> dict[str, float]:
        """Trainer vs engine on the sampled tokens (reduced over ranks): ``train/logprob_diff[_max]``, the
        importance ratio ``exp(old - rollout)`` (``train/is_ratio_{mean,max,min}``) and ``train/rollout_kl``;
        with ``algorithm.tis`` also the batch's truncated weights and ``train/tis_clipfrac``.

        ``train/rollout_kl`` estimates KL(engine's sampling policy || trainer's policy) from the tokens the
        engine sampled: the mean over response tokens of k3 = exp(old - rollout) - 1 - (old - rollout), which
        is unbiased for that KL under the engine's sampling and never negative (``slime.rl.kl.k3`` with the
        engine as the sampling policy, computed here in float64 so that a fp32-sized mismatch is not lost to
        rounding; the log-ratio is clamped to +-20). 0 only where the trainer gives every sampled token the
        engine's log-prob; weights, temperature or numerics that differ make it grow."""
        import torch

        from slime.rl.losses import importance_ratio, truncated_importance_weights
        from slime.rl.masked import zero_masked

        a, mask = self.spec.algorithm, batch.response_mask
        if batch.rollout_log_probs is None:
            if a.tis.enabled or a.use_rollout_logprobs:
                what = "algorithm.tis" if a.tis.enabled else "algorithm.use_rollout_logprobs"
                raise ValueError(f"{what} needs the engine's rollout log-probs, but these samples have none")
            return {}
        ratio = importance_ratio(batch.old_log_probs, batch.rollout_log_probs, mask)
        sums = torch.zeros(5, dtype=torch.float64)  # |diff| sum, ratio sum, clipped count, token count, k3 sum
        sums[0] = zero_masked((batch.old_log_probs - batch.rollout_log_probs).abs(), mask).sum()
        sums[1], sums[3] = zero_masked(ratio, mask).sum(), mask.sum()
        # k3 in float64 with expm1: in float32, exp(d) - 1 - d of a ~1e-7 mismatch rounds to +-1e-8 noise.
        d = (batch.old_log_probs.double() - batch.rollout_log_probs.double()).clamp(-20.0, 20.0)
        sums[4] = zero_masked((torch.expm1(d) - d).clamp_min(0.0), mask).sum()
        m = mask.bool()
        extremes = torch.tensor([0.0, -math.inf, -math.inf], dtype=torch.float64)  # max |diff|, max ratio, -min
        if m.any():
            extremes[0] = (batch.old_log_probs - batch.rollout_log_probs).abs()[m].max()
            extremes[1], extremes[2] = ratio[m].max(), -ratio[m].min()
        if a.tis.enabled:
            batch.tis_weights = truncated_importance_weights(ratio, clip=a.tis.clip, clip_low=a.tis.clip_low)
            sums[2] = zero_masked((batch.tis_weights != ratio).float(), mask).sum()
        self._all_reduce(sums)
        self._all_reduce(extremes, "max")
        n = max(1.0, float(sums[3]))
        out = {
            "train/logprob_diff": float(sums[0]) / n,
            "train/logprob_diff_max": float(extremes[0]),
            "train/is_ratio_mean": float(sums[1]) / n,
            "train/rollout_kl": float(sums[4]) / n,
        }
        if sums[3] > 0:  # some rank had trained tokens
            out["train/is_ratio_max"], out["train/is_ratio_min"] = float(extremes[1]), -float(extremes[2])
        if a.tis.enabled:
            out["train/tis_clipfrac"] = float(sums[2]) / n
        return out

    def train(self, steps: int | list[int], first_step: int) -> list[dict[str, float]]:
        """Optimizer steps on the batch of the last ``prepare``: ``steps`` equal parts, or parts of these sizes."""
        if self.batch is None:
            raise RuntimeError("train() called before prepare()")
        return self._train_steps(self.batch, steps, first_step)

    def train_critic(self, returns, steps: int | list[int], first_step: int) -> list[dict]:
        """The value-loss steps on the batch of the last ``values`` call, towards the actor's ``returns``."""
        if self.batch is None:
            raise RuntimeError("train_critic() called before values()")
        self.batch.returns = returns
        return self._train_steps(self.batch, steps, first_step)

    def _train_steps(self, batch, steps: int | list[int], first_step: int) -> list[dict[str, float]]:
        sizes = [batch.size // steps] * steps if isinstance(steps, int) else list(steps)
        if sum(sizes) != batch.size:
            raise ValueError(f"step sizes {sizes} do not add up to this rank's {batch.size} samples")
        out, start = [], 0
        for s, size in enumerate(sizes):
            t0 = time.perf_counter()
            m = self.backend.train_step(batch.select(slice(start, start + size)), step=first_step + s)
            m["step_time_s"] = time.perf_counter() - t0
            out.append(m)
            beat("train step")
            start += size
        self.batch = None
        return out

    # ---------------------------------------------------------------- weights, checkpoints
    def export(self, out_dir: str) -> str:
        return str(self.backend.export_weights(Path(out_dir)))

    def push_weights(self, version: int, sender: WeightSender) -> int:
        """Broadcast the policy to every engine as ``version`` (call on all ranks); rank 0 returns the count.

        Rank 0 connects ``sender`` (made by the rollout backend) on the first push and keeps it."""
        import asyncio

        named = self.backend.hf_weights()
        if self.rank != 0:
            for _ in named:  # take part in the model-parallel gathers
                pass
            return 0
        if self._weight_sender is None:
            import ray

            ip = ray.util.get_node_ip_address()
            self._loop = asyncio.new_event_loop()
            backend = "nccl" if self.device.startswith("cuda") else "gloo"
            self._loop.run_until_complete(sender.connect(ip, _free_port(ip), backend=backend))
            self._weight_sender = sender
        return self._loop.run_until_complete(self._weight_sender.update(named, version=version))

    def save(self, ckpt_dir: str) -> None:
        self.backend.save(Path(ckpt_dir))

    def load(self, ckpt_dir: str) -> None:
        self.backend.load(Path(ckpt_dir))

    def where(self) -> dict[str, Any]:
        import os

        import ray

        return {
            "rank": self.rank,
            "role": self.role,
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": self.device,
            "device_name": _device_name(self.device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }


class TrainerGroup:
    """The ranks of one role, driven together."""

    def __init__(self, spec: Spec, layout: Layout, placement: Any, role: str, slots: tuple[Slot, ...]) -> None:
        import ray

        from slime.placement import placement_options, torch_threads

        self.role = role
        cls = ray.remote(TrainerRank)
        self.ranks = [
            cls.options(**placement_options(layout, placement, slot)).remote(
                spec,
                role,
                i,
                len(slots),
                threads=torch_threads(layout, slot, "train", spec.cluster.cpus_per_node),
                gpu_slot=slot.gpu is not None,
                slot=str(slot),
            )
            for i, slot in enumerate(slots)
        ]
        self.coords: list[tuple[int, int]] = []

    def init(self, model_dir: Path) -> None:
        import ray

        addr, port = ray.get(self.ranks[0].address.remote())
        self.coords = ray.get([r.init.remote(addr, port, str(model_dir)) for r in self.ranks])

    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank at once; results in rank order."""
        import ray

        return ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    def submit(self, method: str, per_rank: list[tuple], *, num_returns: int = 1) -> list[Any]:
        """Start ``method(*per_rank[i])`` on rank i; returns the object refs (a list per rank when
        ``num_returns`` > 1). Refs passed as arguments reach the rank as their values."""
        return [getattr(r, method).options(num_returns=num_returns).remote(*a) for r, a in zip(self.ranks, per_rank)]

    @property
    def dp_size(self) -> int:
        return self.coords[0][1]

    def plan(self, lengths: list[int], target: int, *, balance_tokens: bool = False) -> StepPlan:
        """The optimizer steps for samples of these token lengths (``step_plan.plan_steps``)."""
        from slime.runtime.step_plan import plan_steps

        return plan_steps(lengths, dp_size=self.dp_size, target=target, balance_tokens=balance_tokens)

    def shards(self, items: Sequence[Any], plan: StepPlan) -> list[list[Any]]:
        """Each rank's items along ``plan`` (ranks of one model replica get the same)."""
        return [plan.take(items, d) for d, _ in self.coords]

    # ---------------------------------------------------------------- the loop's calls
    def sft_step(self, shards: list[list[dict]], step: int) -> dict[str, float]:
        import ray

        return ray.get(self.submit("sft_step", [(sh, step) for sh in shards]))[0]

    def sft_eval(self, shards: list[list[dict]]) -> dict[str, float]:
        import ray

        return ray.get(self.submit("sft_eval", [(sh,) for sh in shards]))[0]

    def values(self, shards: list[list[dict]]) -> list[Any]:
        """Critic: refs to each rank's values (they stay in the object store for the actor ranks)."""
        return self.submit("values", [(sh,) for sh in shards])

    def prepare(
        self,
        shards: list[list[dict]],
        scores: list[ShardScores],
        values: list[Any] | None,
        sidecars: tuple[Path, int] | None = None,
    ):
        """Actor: ``(metrics refs, returns refs)``, one each per rank; ``values``: the critic's refs.
        ``sidecars``: ``(directory, rollout id)``: the first rank of each replica saves its old log-probs."""
        args = []
        for i, (sh, sc) in enumerate(zip(shards, scores)):
            dp = self.coords[i][0]
            # the replica's lowest rank (megatron: its tp/cp/pp 0); every rank of a replica has the same
            first = next(j for j, c in enumerate(self.coords) if c[0] == dp) == i
            sidecar = (str(sidecars[0]), sidecars[1], dp) if sidecars is not None and first else None
            args.append((sh, sc, values[i] if values else None, sidecar))
        refs = self.submit("prepare", args, num_returns=2)
        return [m for m, _ in refs], [r for _, r in refs]

    def train(self, plan: StepPlan, first_step: int) -> list[Any]:
        return self.submit("train", [(plan.sizes(d), first_step) for d, _ in self.coords])

    def train_critic(self, returns: list[Any], plan: StepPlan, first_step: int) -> list[Any]:
        return self.submit(
            "train_critic", [(ret, plan.sizes(d), first_step) for ret, (d, _) in zip(returns, self.coords)]
        )

    def export(self, out_dir: Path) -> None:
        self.call("export", str(out_dir))

    def push_weights(self, version: int, sender: WeightSender) -> None:
        self.call("push_weights", version, sender)

    def kill(self) -> None:
        import ray

        for r in self.ranks:
            ray.kill(r)
        self.ranks = []
