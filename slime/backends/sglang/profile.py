"""The SGLang rollout backend's plug-in profile: its spec section ``rollout.sglang`` (torch-free)."""

from __future__ import annotations

from typing import Annotated, Literal

from slime.spec.plugin import Profile, V1Move
from slime.spec.sections import D, Scalar, Section


class PrefillDecode(Section, kw_only=True):
    """Prefill/decode disaggregation: the first engines only prefill, the rest decode (--prefill-num-servers)."""

    prefill_engines: Annotated[
        int, D("Engines that only prefill (the first ones in the layout); the others decode (at least one).", ge=1)
    ]
    # 0.5.23 also offers ascend and mori (other accelerators) and fake (benchmarks; prefill refuses it)
    transfer: Annotated[
        Literal["mooncake", "nixl", "mooncake_tcp"],
        D("How a prefill engine's KV cache reaches a decode engine (SGLang's --disaggregation-transfer-backend)."),
    ] = "mooncake"
    ib_device: Annotated[
        str | None,
        D("InfiniBand device(s) for the transfer, e.g. mlx5_0 (--disaggregation-ib-device; default: SGLang picks)."),
    ] = None
    prefill_args: Annotated[
        dict[str, Scalar], D("SGLang server flags of the prefill engines only (after rollout.sglang.args).")
    ] = {}
    decode_args: Annotated[
        dict[str, Scalar], D("SGLang server flags of the decode engines only (after rollout.sglang.args).")
    ] = {}


class SglangOptions(Section, kw_only=True):
    """SGLang server settings the spec does not decide itself."""

    args: Annotated[dict[str, Scalar], D("SGLang server flags passed through (e.g. 'mem-fraction-static': 0.7).")] = {}
    router_args: Annotated[
        dict[str, Scalar], D("sglang-router flags (refused: no router is in the request path).")
    ] = {}
    pd: Annotated[
        PrefillDecode | None,
        D("Prefill/decode disaggregation: engine groups by role, KV caches moved between them (default: off)."),
    ] = None


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
