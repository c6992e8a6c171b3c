"""The SGLang backend's rules, derived values, smoke edits and preview (torch-free; SGLang is not imported).

What an SGLang server would refuse at start is refused at validate: flags it does not have (the pinned
version's table, server_args.json) and flags slime-submit sets itself, an engine's tensor parallelism
(gpus_per_engine / pp-size) against the model's heads, the expert-parallel size, a context the
requests do not fit, and router settings nothing reads.
"""

from __future__ import annotations

from collections.abc import Iterator

from msgspec.structs import replace

from slime.backends.sglang.flags import (
    EP_FLAGS,
    PP_FLAGS,
    engine_pp,
    engine_tp,
    normalize_flag,
    reserved_hint,
    sglang_reserved,
    unknown_flag,
)
from slime.spec.plugin import Finding
from slime.spec.resolve import model_config
from slime.spec.rules import attention_heads, over_context

__all__ = ["RULES", "engine_roles", "preview", "resolve", "smoke_edits", "untested"]


def checkpoint_model(s) -> Iterator[Finding]:
    if s.model.path is None:
        yield (
            "rollout.backend",
            f"SGLang engines serve an HF checkpoint directory, but the model is model.builtin: {s.model.builtin}",
            "set model.path, or use an engine that serves the built-in model (rollout.backend)",
        )


def no_router(s) -> Iterator[Finding]:
    if s.rollout.sglang.router_args:
        pd = " (the rollout manager pairs prefill and decode engines itself)" if s.rollout.sglang.pd else ""
        yield (
            "rollout.sglang.router_args",
            "the rollout manager sends requests straight to the engines and spreads them itself; the "
            f"sglang-router is not in the request path, so router settings would do nothing{pd}",
            "remove rollout.sglang.router_args",
        )


def prefill_decode(s) -> Iterator[Finding]:
    """slime's PD rules: a decode engine remains, engines the job starts, mooncake_tcp picks no RDMA device;
    requests are paired by the rollout manager's client, which agent episodes do not use."""
    r = s.rollout
    pd = r.sglang.pd
    if pd is None:
        return
    if r.external:
        yield (
            "rollout.sglang.pd",
            "prefill/decode groups are engines the job starts; rollout.external engines are not (slime refuses "
            "--prefill-num-servers with --rollout-external-engine-addrs too)",
            "remove rollout.sglang.pd, or rollout.external",
        )
        return
    if s.agent is not None:
        yield (
            "rollout.sglang.pd",
            "agent episodes reach an engine through an adapter server that sends each request to one engine; "
            "prefill/decode groups need every request paired across a prefill and a decode engine",
            "remove rollout.sglang.pd, or the agent section",
        )
    engines = (r.gpus or 0) // r.gpus_per_engine
    if engines and pd.prefill_engines >= engines:
        yield (
            "rollout.sglang.pd.prefill_engines",
            f"{pd.prefill_engines} prefill engine(s) leave no decode engine: rollout.gpus {r.gpus} / "
            f"gpus_per_engine {r.gpus_per_engine} = {engines} engine(s) in all",
            f"set prefill_engines below {engines}, or raise rollout.gpus",
        )
    if pd.ib_device and pd.transfer == "mooncake_tcp":
        yield (
            "rollout.sglang.pd.ib_device",
            "the mooncake_tcp transfer moves KV caches over TCP: SGLang drops the InfiniBand device",
            "remove ib_device, or use transfer: mooncake",
        )


def role_args(s) -> Iterator[Finding]:
    """A role's own flags: known, not set by slime-submit, and not the engine's shape (shared by both roles)."""
    pd = s.rollout.sglang.pd
    for role, args in (("prefill", pd.prefill_args), ("decode", pd.decode_args)) if pd else ():
        for key in args:
            path, norm = f"rollout.sglang.pd.{role}_args.{key}", normalize_flag(key)
            if (hit := sglang_reserved(key)) is not None:
                yield (
                    path,
                    f"slime-submit sets --{hit} itself from the spec and the layout",
                    f"remove it (change {reserved_hint(hit)} instead)",
                )
            elif norm in PP_FLAGS or norm in EP_FLAGS:
                yield (
                    path,
                    f"--{norm} shapes every engine (prefill and decode engines share one shape)",
                    "set it in rollout.sglang.args",
                )
            elif (problem := unknown_flag(key)) is not None:
                yield (path, *problem)


def pd_flags_need_pd(s) -> Iterator[Finding]:
    """SGLang's disaggregation-* flags act only on a prefill or decode server."""
    if s.rollout.sglang.pd is None:
        for key in s.rollout.sglang.args:
            if normalize_flag(key).startswith("disaggregation-") and sglang_reserved(key) is None:
                yield (
                    f"rollout.sglang.args.{key}",
                    "a prefill/decode (PD) setting, but the engines are regular ones: nothing would read it",
                    "remove it, or set rollout.sglang.pd",
                )


def reserved_args(s) -> Iterator[Finding]:
    for key in s.rollout.sglang.args:
        if (hit := sglang_reserved(key)) is not None:
            abbr = "" if hit == normalize_flag(key) else f" (--{normalize_flag(key)} abbreviates it)"
            yield (
                f"rollout.sglang.args.{key}",
                f"slime-submit sets --{hit} itself from the spec and the layout{abbr}",
                f"remove it (change {reserved_hint(hit)} instead)",
            )


def sglang_flags_known(s) -> Iterator[Finding]:
    """Each key a launch_server flag of the pinned SGLang (server_args.json), written in full."""
    for key in s.rollout.sglang.args:
        if sglang_reserved(key) is None and (problem := unknown_flag(key)) is not None:
            yield (f"rollout.sglang.args.{key}", *problem)


def sglang_pipeline(s) -> Iterator[Finding]:
    """SGLang runs an engine on tp x pp GPUs: launch passes --tp-size gpus_per_engine / pp-size."""
    r = s.rollout
    if (hit := engine_pp(r.sglang.args)) is not None and engine_tp(r.gpus_per_engine, r.sglang.args) is None:
        key, pp = hit
        yield (
            f"rollout.sglang.args.{key}",
            f"SGLang's pipeline-parallel size must be a positive integer dividing rollout.gpus_per_engine "
            f"{r.gpus_per_engine} (an engine runs on tp x pp GPUs), got {pp!r}",
            f"choose a {key} that divides {r.gpus_per_engine}",
        )


def _tp_of(r) -> str:
    pp = engine_pp(r.sglang.args)
    return f"gpus_per_engine {r.gpus_per_engine}" + (f" / {pp[0]} {pp[1]}" if pp else "")


def engine_heads(s) -> Iterator[Finding]:
    r = s.rollout
    tp = engine_tp(r.gpus_per_engine, r.sglang.args)
    if s.cluster.gpus_per_node == 0 or tp is None or tp <= 1:
        return
    heads, groups = attention_heads(model_config(s.model.path))
    if heads and (heads % tp or (groups % tp and tp % groups)):
        yield (
            "rollout.gpus_per_engine",
            f"an engine's tensor parallelism of {tp} ({_tp_of(r)}) "
            f"does not fit the model's {heads} attention heads / {groups} key/value heads: SGLang needs the "
            "heads divisible by it, and the key/value heads divisible by it or it by them",
            "choose gpus_per_engine accordingly",
        )


def sglang_expert_parallel(s) -> Iterator[Finding]:
    """SGLang runs an engine's MoE layers on ep x (tp / ep) ranks and gives each EP rank experts / ep experts
    (it asserts both divide); a wrong --ep-size fails only when the engine starts, after the queue wait."""
    r = s.rollout
    tp = engine_tp(r.gpus_per_engine, r.sglang.args)
    cfg = model_config(s.model.path) or {}
    experts = next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in cfg), None)
    for key, ep in r.sglang.args.items():
        if normalize_flag(key) not in EP_FLAGS:
            continue
        path = f"rollout.sglang.args.{key}"
        if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
            yield (path, f"SGLang's expert-parallel size must be a positive integer, got {ep!r}", None)
        elif tp is not None and tp % ep:
            yield (
                path,
                f"SGLang's expert-parallel size {ep} does not divide the engine's tensor-parallel size {tp} "
                f"({_tp_of(r)}): its MoE layers run on ep x tp/ep ranks",
                f"choose an ep-size that divides {tp}",
            )
        elif isinstance(experts, int) and experts % ep:
            yield (
                path,
                f"SGLang's expert-parallel size {ep} does not divide the model's {experts} experts",
                "choose an ep-size that divides the expert count",
            )


def context_fits(s) -> Iterator[Finding]:
    # SGLang refuses a request whose prompt + max_new_tokens exceeds the context (unless started with
    # --allow-auto-truncate); every rollout request asks for max_response_len new tokens.
    if over := over_context(s):
        yield (
            "rollout.max_response_len",
            f"{over}: SGLang would refuse long prompts",
            "lower max_response_len or max_prompt_len so that they fit the context",
        )


def engine_roles(spec) -> tuple[str, ...]:
    """Each engine's role in layout order: 'prefill' / 'decode' with ``rollout.sglang.pd``, else none (regular)."""
    r = spec.rollout
    pd = r.sglang.pd if r.sglang is not None else None
    if pd is None or not r.gpus or r.external:
        return ()
    n = r.gpus // r.gpus_per_engine
    return tuple("prefill" if i < pd.prefill_engines else "decode" for i in range(n))


RULES = (
    checkpoint_model,
    no_router,
    prefill_decode,
    role_args,
    pd_flags_need_pd,
    reserved_args,
    sglang_flags_known,
    sglang_pipeline,
    engine_heads,
    sglang_expert_parallel,
    context_fits,
)


def resolve(spec):
    """``rollout.weight_sync``: nccl for engines on their own GPUs without pipeline stages, else disk."""
    r = spec.rollout
    if r.weight_sync is None:
        # nccl needs the whole policy on trainer rank 0: not so with pipeline stages
        collective = not r.colocate and spec.train.parallel.pipeline == 1
        spec = replace(spec, rollout=replace(r, weight_sync="nccl" if collective else "disk"))
    return spec


def smoke_edits(spec) -> Iterator[tuple[str, object, str]]:
    if spec.rollout.weight_sync == "delta":
        yield "rollout.weight_sync", "disk", "delta sync is implemented for SGLang engines only"


def untested(spec) -> Iterator[str]:
    r = spec.rollout
    yield (
        f"SGLang engines: gpus_per_engine {r.gpus_per_engine} (engine tensor x pipeline parallelism)"
        + (f", sglang.args {', '.join(r.sglang.args)}" if r.sglang and r.sglang.args else "")
        + ", CUDA graphs and memory fractions"
    )
    if r.sglang and r.sglang.pd:
        yield f"prefill/decode engine groups ({r.sglang.pd.transfer} KV transfer): the smoke runs regular engines"


def preview(spec) -> tuple[str, str]:
    from slime.backends.sglang.launch import render_engine_commands

    return "SGLang engine commands; node addresses are filled in at run time", render_engine_commands(spec)
