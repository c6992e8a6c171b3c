"""The megatron train backend's plug-in profile: its spec section ``train.megatron`` (torch-free)."""

from __future__ import annotations

from typing import Annotated

from slime.spec.plugin import Profile, V1Move
from slime.spec.sections import D, Prob, Scalar, Section


class MegatronOptions(Section, kw_only=True):
    """megatron-core settings the spec does not decide itself."""

    args: Annotated[
        dict[str, Scalar],
        D("megatron-core options passed through (e.g. 'recompute-granularity': full); checked at validate."),
    ] = {}
    optimizer_offload: Annotated[
        Prob,
        D(
            "Fraction of the optimizer state and its step kept on the host (megatron-core's hybrid CPU/GPU "
            "Adam; 1.0 is slime's --optimizer-cpu-offload); needs train.optimizer.distributed."
        ),
    ] = 0.0


PROFILE = Profile(
    summary="megatron-core on GPUs: tensor, pipeline, context and expert parallel",
    implementation="slime.backends.megatron.backend:MegatronTrainBackend",
    options=MegatronOptions,
    options_doc="megatron-core settings (only with train.backend: megatron).",
    hooks="slime.backends.megatron.hooks",
    v1_moves=(V1Move(old="train.backend_args", new="args"),),
    derived={"train.optimizer.distributed": ("train.backend",)},
)
