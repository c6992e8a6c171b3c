"""The smoke's engine check from the CLI: when it runs, the spec it runs, and its stages.

With ``train.backend: megatron``, a readable ``model.path/config.json`` and megatron-core installed,
``slime-submit smoke`` (not ``--fast``) also runs ``python -m slime.backends.smoke_check``: the
user's model family (scaled down) on the Megatron backend over gloo, their parallel layout folded to
at most :data:`MAX_RANKS` ranks (:func:`fold_parallel`: every size > 1 kept at 2 while the world
allows; megatron options with GPU-only kernels set to their CPU path). :func:`engine_plan` lists every
change from the user's spec, exactly. Torch-free: the check runs in its own process. Not run: SGLang
(the built-in engine's weight loader stands in).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from slime.spec.resolve import model_config

__all__ = [
    "MAX_RANKS",
    "EnginePlan",
    "Fold",
    "engine_plan",
    "engine_untested",
    "fold_parallel",
    "run_engine_check",
    "skip_reason",
]

MAX_RANKS = 4  # gloo ranks on a CI machine's CPUs
_PRIORITY = ("tensor", "expert", "pipeline", "context")  # kept first when the world cannot hold them all
TIMEOUT_S = 540


@dataclass(frozen=True)
class Fold:
    """The folded layout: sizes, ranks, what was kept (at 2) and what was folded to 1 (and why)."""

    parallel: dict[str, Any]
    world: int
    kept: tuple[str, ...]
    folded: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"parallel": self.parallel, "world": self.world, "kept": list(self.kept), "folded": list(self.folded)}


def _world(sizes: dict[str, int], etp: int) -> int:
    """Ranks megatron needs: the attention grid (TP x PP x CP) and the expert grid (ETP x EP x PP) both divide
    it (powers of two here, so the larger one)."""
    attention = sizes["tensor"] * sizes["pipeline"] * sizes["context"]
    return max(attention, etp * sizes["expert"] * sizes["pipeline"])


def fold_parallel(p: Any, max_world: int = MAX_RANKS) -> Fold:
    """``p`` (train.parallel) folded to at most ``max_world`` ranks: each size > 1 becomes 2 while the world
    allows, in the order tensor, expert, pipeline, context; the others become 1."""
    sizes = dict.fromkeys(_PRIORITY, 1)
    kept, folded = [], []
    spec_etp = p.expert_tensor if p.expert_tensor is not None else p.tensor
    for dim in _PRIORITY:
        n = getattr(p, dim)
        if n <= 1:
            continue
        trial = {**sizes, dim: 2}
        if _world(trial, 1) <= max_world:
            sizes = trial
            kept.append(f"{dim} {n}" + (" -> 2" if n != 2 else ""))
        else:
            folded.append(f"{dim} {n} -> 1 (with it the ranks would exceed {max_world})")
    if spec_etp > 1 and p.expert > 1:  # (without experts expert_tensor is unused)
        folded.append(
            f"expert_tensor {spec_etp} -> 1 (its uneven token all-gather needs NCCL; gloo's needs equal sizes)"
        )
    parallel = {**sizes, "expert_tensor": 1, "sequence_parallel": bool(p.sequence_parallel and sizes["tensor"] > 1)}
    return Fold(parallel, _world(sizes, 1), tuple(kept), tuple(folded))


def skip_reason(spec: Any) -> str | None:
    """Why the engine check cannot run for ``spec`` here, or None when it can."""
    if spec.train.backend != "megatron":
        return f"train.backend {spec.train.backend}: the tiny-dense path is the engine path"
    if model_config(spec.model.path) is None:
        where = f"{spec.model.path}/config.json" if spec.model.path else "model.path"
        return f"{where} is not readable here: the family's tiny model is built from it"
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return "megatron-core is not installed here (pip install 'slime-submit[megatron]')"
    return None


@dataclass(frozen=True)
class EnginePlan:
    fold: Fold
    spec: Any  # the user's spec with the changes below (model.path set by the check)
    changes: tuple[tuple[str, Any, Any, str], ...]  # (field, before, after, why)


# megatron options whose GPU-only kernels have no CPU path: (needs the change, the CPU value, why)
_GPU_ONLY_ARGS: dict[str, tuple[Any, Any, str]] = {
    "moe_enable_deepep": (bool, False, "DeepEP's dispatch runs on NVIDIA GPUs only (all-to-all stands in)"),
    "moe_token_dispatcher_type": (
        lambda v: v == "flex",
        "alltoall",
        "the flex dispatcher is DeepEP's or HybridEP's, GPU only (all-to-all moves the same tokens)",
    ),
}
_OFFLOAD_WHY = "the host-offloaded optimizer is megatron's precision-aware one, which needs Transformer Engine on CUDA"


def _cpu_megatron(m: Any) -> tuple[Any, list[tuple[str, Any, Any, str]]]:
    """``train.megatron`` with its GPU-only options set to what runs on a CPU, and those changes."""
    from msgspec.structs import replace

    if m is None:
        return m, []
    args, changes = dict(m.args), []
    for key, value in m.args.items():
        needs, cpu, why = _GPU_ONLY_ARGS.get(key.replace("-", "_"), (None, None, ""))
        if needs is not None and needs(value):
            args[key] = cpu
            changes.append((f"train.megatron.args.{key}", value, cpu, why))
    if m.optimizer_offload:
        changes.append(("train.megatron.optimizer_offload", m.optimizer_offload, 0.0, _OFFLOAD_WHY))
    return replace(m, args=args, optimizer_offload=0.0), changes


def engine_plan(spec: Any, model_dir: Path) -> EnginePlan:
    """The spec the engine check trains with and every field it changed (before, after, why)."""
    from msgspec.structs import replace

    t = spec.train
    fold = fold_parallel(t.parallel)
    par = replace(t.parallel, **fold.parallel)
    opt = replace(t.optimizer, clip_grad=0.0, warmup_steps=0)
    megatron, gpu_only = _cpu_megatron(getattr(t, "megatron", None))
    train = replace(t, parallel=par, precision="fp32", optimizer=opt)
    if gpu_only:
        train = replace(train, megatron=megatron)
    out = replace(spec, train=train, model=replace(spec.model, path=str(model_dir)))
    why = {
        "model.path": "a tiny random model of your family, scaled from your config.json",
        "train.precision": "CPU training is fp32",
        "train.optimizer.clip_grad": "megatron's clipping kernel needs CUDA (the gradient norm is still checked)",
        "train.optimizer.warmup_steps": "the check's one step gets the peak learning rate (a warm-up starts at 0)",
    }
    pairs = [("model.path", spec.model.path, str(model_dir))]
    pairs += [(f"train.{k}", getattr(t, k), getattr(train, k)) for k in ("precision",)]
    pairs += [(f"train.optimizer.{k}", getattr(t.optimizer, k), getattr(opt, k)) for k in ("clip_grad", "warmup_steps")]
    changes = [(f, b, a, why[f]) for f, b, a in pairs if b != a]
    for f in msgspec.structs.fields(par):
        before, after = getattr(t.parallel, f.name), getattr(par, f.name)
        if before != after:
            changes.append((f"train.parallel.{f.encode_name}", before, after, f"folded to {fold.world} CPU rank(s)"))
    return EnginePlan(fold, out, tuple(changes + gpu_only))


def run_engine_check(spec: Any, plan: EnginePlan, out: Path, *, tolerance: float, verbose: bool) -> dict[str, Any]:
    """Run the check of ``plan`` (made with model dir ``out/model``) in its own process; its result (stages,
    seconds, reward label)."""
    out.mkdir(parents=True, exist_ok=True)
    request = {
        "spec": msgspec.to_builtins(plan.spec),
        "config": model_config(spec.model.path),
        "tokenizer_sources": [s for s in (spec.model.tokenizer, spec.model.path) if s],
        "out": str(out),
        "world": plan.fold.world,
        "layout": plan.fold.to_json(),
        "tolerance": tolerance,
        "timeout_s": TIMEOUT_S,
        "optimizer": "distributed optimizer" if plan.spec.train.optimizer.distributed else "optimizer",
        "stages": {
            "convert": "HF -> Megatron conversion",
            "train": "train step (your engine)",
            "export": "weight export",
        },
    }
    path = out / "request.json"
    path.write_text(json.dumps(request, indent=1) + "\n")
    log = out / "engine-check.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "slime.backends.smoke_check", str(path)],
            stdout=None if verbose else f,
            stderr=subprocess.STDOUT if not verbose else None,
            timeout=TIMEOUT_S + 60,
        )
    try:
        result = json.loads((out / "engine-check.json").read_text())
    except (OSError, ValueError):
        detail = f"the engine check exited {proc.returncode} without a result; see {log}"
        result = {"stages": [{"stage": "engine check", "status": "failed", "detail": detail}], "seconds": None}
    return result


def engine_untested(spec: Any, plan: EnginePlan) -> tuple[str, ...]:
    """What the engine check leaves out (it replaces the generic Megatron and model lines of the list)."""
    t, m = spec.train, spec.model
    model_type = (model_config(m.path) or {}).get("model_type")
    out = [
        f"your model ({m.path}) at full size: its weights, context length and memory (the check ran a tiny "
        f"{model_type} of the same architecture)"
    ]
    sizes = ", ".join(f"{c[0].removeprefix('train.parallel.')} {c[1]}" for c in plan.changes if "parallel" in c[0])
    gpu_only = [c[0].removeprefix("train.megatron.") for c in plan.changes if c[0].startswith("train.megatron.")]
    out.append(
        "Megatron-core "
        + (f"at your parallel sizes ({sizes}; the check ran {plan.fold.world} gloo rank(s)), " if sizes else "")
        + f"precision {t.precision}, gradient clipping"
        + (f", your GPU-only options ({', '.join(gpu_only)})" if gpu_only else "")
        + " and NCCL"
    )
    return tuple(out)
