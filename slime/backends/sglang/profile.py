"""The SGLang rollout backend's plug-in profile: its spec section ``rollout.sglang`` (torch-free)."""

from __future__ import annotations

from typing import Annotated

from slime.spec.plugin import Profile, V1Move
from slime.spec.sections import D, Scalar, Section


class SglangOptions(Section, kw_only=True):
    """SGLang server settings the spec does not decide itself."""

    args: Annotated[dict[str, Scalar], D("SGLang server flags passed through (e.g. 'mem-fraction-static': 0.7).")] = {}
    router_args: Annotated[
        dict[str, Scalar], D("sglang-router flags (refused: no router is in the request path).")
    ] = {}


PROFILE = Profile(
    summary="SGLang servers on GPUs",
    implementation="slime.backends.sglang.backend:SGLangRolloutBackend",
    options=SglangOptions,
    options_doc="SGLang settings (only with rollout.backend: sglang).",
    hooks="slime.backends.sglang.hooks",
    v1_moves=(
        V1Move(old="rollout.engine_args", new="args", when_selected=True),
        V1Move(old="rollout.router_args", new="router_args"),
    ),
    derived={"rollout.weight_sync": ("rollout.backend", "rollout.colocate", "train.parallel.pipeline")},
)
