"""Save and load one megatron trainer rank's state: megatron-core's distributed checkpoint of the model
and the RL optimizer (each rank writes its slice, no gather), plus a per-rank file with the LR
scheduler and RNG states.

Guaranteed: a load after a save restores parameters, Adam's moments and step counts, the
scheduler's step and every RNG stream, so the next step is the one the saving run would have taken
(tested on CPU under TP, EP with the distributed optimizer, and actor beside critic). Not
guaranteed: loading under another model-parallel layout (``dp_reshardable`` reshards over data
parallel only), and the SFT warm-up optimizer (not saved: the warm-up precedes RL).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slime.diagnosis.beats import beat

__all__ = ["load_rank", "restore_adam_steps", "save_rank"]

# dp_reshardable: each rank saves its own slice of the distributed optimizer's buffers, with no
# gather (megatron-core's recommended format); a resume must keep the model-parallel layout.
SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(gpt: Any, optimizer: Any, *, loading: bool) -> dict:
    # a new metadata dict per call: megatron-core stores the current data-parallel group into the dict it is
    # given (ensure_metadata_has_dp_cp_group), and a shared one would carry that group to later process groups
    state = {"model": gpt.sharded_state_dict(metadata=dict(SHARDING))}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(state["model"], is_loading=loading, metadata=dict(SHARDING))
    return state


def _rank_file(ckpt: Path) -> Path:
    return ckpt / f"rank{dist.get_rank():05d}.pt"


def save_rank(ckpt: Path, *, gpt: Any, optimizer: Any, scheduler: Any, device: torch.device) -> None:
    """Write this rank's part of the checkpoint under ``ckpt`` (every rank of the group calls it)."""
    from megatron.core import dist_checkpointing, tensor_parallel

    (ckpt / "megatron").mkdir(parents=True, exist_ok=True)  # dist_checkpointing wants it to exist
    dist.barrier()
    dist_checkpointing.save(_sharded_state(gpt, optimizer, loading=False), str(ckpt / "megatron"))
    beat("checkpoint save")
    cuda = device.type == "cuda"
    extra = {
        "rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "cuda_rng": torch.cuda.get_rng_state() if cuda else None,
        "cuda_rng_tracker": tensor_parallel.get_cuda_rng_tracker().get_states() if cuda else None,
        "scheduler": scheduler.state_dict() if scheduler else None,
    }
    torch.save(extra, _rank_file(ckpt))
    beat("checkpoint save")


def load_rank(ckpt: Path, *, gpt: Any, optimizer: Any, scheduler: Any, device: torch.device, what: str) -> None:
    """Load what :func:`save_rank` wrote under ``ckpt``; ``what`` names the checkpoint in the error when this
    rank's file is missing (saved by another role layout or number of ranks)."""
    from megatron.core import dist_checkpointing, tensor_parallel

    rank_file = _rank_file(ckpt)
    if not rank_file.is_file():
        raise FileNotFoundError(
            f"checkpoint {what} has no {ckpt.name}/{rank_file.name} (saved by another role layout or "
            "number of trainer ranks?)"
        )
    loaded = dist_checkpointing.load(_sharded_state(gpt, optimizer, loading=True), str(ckpt / "megatron"))
    with torch.no_grad():  # fp32 main params of the distributed optimizer are views of the parameters
        gpt.load_state_dict(loaded["model"])
        if optimizer is not None:
            optimizer.load_state_dict(loaded["optimizer"])
            restore_adam_steps(optimizer)
    extra = torch.load(rank_file, weights_only=False)
    torch.set_rng_state(extra["rng"])
    random.setstate(extra["python_rng"])
    if extra["cuda_rng"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(extra["cuda_rng"])
        tensor_parallel.get_cuda_rng_tracker().set_states(extra["cuda_rng_tracker"])
    if scheduler is not None and extra["scheduler"] is not None:
        # megatron's load_state_dict *adds* the saved step count to the current one (it expects a fresh
        # scheduler): start from 0 so that a reload after training lands on the saved step
        scheduler.num_steps = 0
        scheduler.load_state_dict(extra["scheduler"])


def restore_adam_steps(optimizer: Any) -> None:
    """megatron-core 0.16.1's distributed optimizer keeps torch Adam's step count only in its checkpoint's
    ``param_groups``. After a load (torch Adam, i.e. without Apex/TE) every parameter's ``state["step"]`` is
    one tensor shared by all parameters, holding the in-memory count rather than the checkpoint's, and
    torch's foreach Adam then increments it once per parameter: Adam's bias correction continues from a
    wrong step and a resumed run diverges. Give
    every parameter its own step tensor with the group's restored count (no-op when the group has none,
    e.g. Apex/TE FusedAdam, which keeps it there)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        for group in getattr(inner, "param_groups", ()):
            if "step" not in group:
                continue
            for p in group["params"]:
                state = inner.state.get(p)
                if state and torch.is_tensor(state.get("step")):
                    state["step"] = torch.full_like(state["step"], float(group["step"]))
