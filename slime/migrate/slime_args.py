"""A spec's values under THUDM/slime's argument names, for plug-ins written for slime.

slime passes its argparse namespace to plug-ins (``async def reward(args, sample)``), which read
settings such as ``args.n_samples_per_prompt``. :func:`slime_args` gives those names for a resolved
slime/v1 spec: every ``slime_flags.DIRECT`` flag read back from its path, plus flags derived from
several values (``use_kl_loss``, ``rm_type``, ``custom_rm_path``, ...).
Guaranteed: each name holds what the spec runs with (tuples become lists, as argparse gives).
Not given: slime options with no slime/v1 field, and run-time values (router address, rollout ids).
"""

from __future__ import annotations

from typing import Any

import msgspec

from slime.migrate.slime_flags import DIRECT
from slime.spec.types import Spec

__all__ = ["slime_args"]

_RM_TYPE = {"math": "math", "dapo": "dapo", "deepscaler": "deepscaler", "f1": "f1", "remote": "remote_rm"}


def _at(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return list(node) if isinstance(node, tuple) else node


def slime_args(spec: Spec) -> dict[str, Any]:
    """slime's argument name (``rollout_batch_size``) -> the value this spec runs with."""
    data = msgspec.to_builtins(spec)  # encoded names ('lambda'), tuples as lists
    out = {flag[2:].replace("-", "_"): _at(data, path) for flag, (path, _) in DIRECT.items()}
    a, r, t = spec.algorithm, spec.reward, spec.train
    module, _, fn = (r.custom or "").partition(":")
    out.update(
        use_kl_loss=a.kl_loss_coef > 0,
        kl_loss_coef=a.kl_loss_coef,
        calculate_per_token_loss=a.loss_agg == "token_mean",
        disable_grpo_std_normalization=a.normalize_std is False,
        rm_type=_RM_TYPE.get(r.type),
        custom_rm_path=f"{module}.{fn}" if r.custom else None,
        reward_key=r.key,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        train_backend=t.backend,
        optimizer=t.optimizer.name,
        lr_decay_style=t.optimizer.lr_schedule,
        adam_beta1=t.optimizer.betas[0],
        adam_beta2=t.optimizer.betas[1],
        save_hf=t.checkpoint.save_hf,
        load=t.checkpoint.load or t.checkpoint.dir,
        update_weight_mode="delta" if spec.rollout.weight_sync == "delta" else "full",
    )
    return out
