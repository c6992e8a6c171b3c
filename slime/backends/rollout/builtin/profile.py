"""The built-in rollout engine's plug-in profile: its spec section ``rollout.builtin`` (torch-free)."""

from __future__ import annotations

from typing import Annotated

from slime.spec.plugin import Profile, V1Move
from slime.spec.sections import D, Scalar, Section


class BuiltinOptions(Section, kw_only=True):
    """Options of the built-in engine."""

    args: Annotated[
        dict[str, Scalar],
        D(
            "Engine options: max_running_requests, context_length, dtype, num_threads, max_prefill_tokens, "
            "max_cache_bytes."
        ),
    ] = {}


PROFILE = Profile(
    summary="the embedded engine, CPU or GPU, one device per engine",
    implementation="slime.backends.rollout.builtin.backend:BuiltinRolloutBackend",
    options=BuiltinOptions,
    options_doc="Built-in engine options (only with rollout.backend: builtin).",
    default=True,
    cpu=True,
    streams=True,
    teacher=True,
    hooks="slime.backends.rollout.builtin.hooks",
    v1_moves=(V1Move(old="rollout.engine_args", new="args", when_selected=True),),
    derived={"rollout.weight_sync": ("rollout.backend",)},
)
