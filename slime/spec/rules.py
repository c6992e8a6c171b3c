"""Cross-field rules of RL training, checked on the resolved spec.

Each rule is a small function yielding ``(path, message, hint)``; ``check``
runs them all and never stops early. The formulas follow THUDM/slime's
argument checks (see the README's rule table), except that where slime derives
or drops a value silently (e.g. a rollout GPU remainder) we reject it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Literal

import msgspec

from slime.spec.engine_flags import (
    BUILTIN_ENGINE_ARGS,
    EP_FLAGS,
    builtin_engine_arg,
    normalize_flag,
    reserved_hint,
    sglang_reserved,
)
from slime.spec.layout import LayoutError, plan_layout
from slime.spec.megatron_model import ATTENTION_BACKENDS, MegatronConfigError, ModelShape, parallel_findings
from slime.spec.resolve import model_config, variable_count_reason
from slime.spec.types import BUILTIN_FILTERS, Cluster, SandboxSpec, Spec, Tis

Finding = tuple[str, str, str | None]
Rule = Callable[[Spec], Iterator[Finding]]
RULES: list[Rule] = []
WARNINGS: list[Rule] = []
RAW_RULES: list[Rule] = []  # run on the spec as written, before derived values are filled in
RAW_WARNINGS: list[Rule] = []  # warnings about what was written (resolve() changes it)
_SLURM_RESTARTS = ("on_preflight_failure", "max_requeues", "max_failures", "signal_grace_s")

__all__ = ["RAW_RULES", "RAW_WARNINGS", "RULES", "WARNINGS", "all_rules", "check", "check_raw"]


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def warning(fn: Rule) -> Rule:
    WARNINGS.append(fn)
    return fn


def raw_rule(fn: Rule) -> Rule:
    RAW_RULES.append(fn)
    return fn


def raw_warning(fn: Rule) -> Rule:
    RAW_WARNINGS.append(fn)
    return fn


@raw_warning
def sequence_parallel_without_tensor(s: Spec) -> Iterator[Finding]:
    p = s.train.parallel
    if p.sequence_parallel and p.tensor == 1:
        yield (
            "train.parallel.sequence_parallel",
            "sequence parallelism does nothing with tensor 1; megatron turns it off, and the resolved spec "
            "says sequence_parallel: false",
            "remove it, or set train.parallel.tensor > 1",
        )


@raw_rule
def rollout_count(s: Spec) -> Iterator[Finding]:
    r = s.rollout
    if r.num_rollouts is not None and r.epochs is not None:
        yield (
            "rollout.epochs",
            f"both rollout.num_rollouts ({r.num_rollouts}) and rollout.epochs ({r.epochs}) "
            "are given; num_rollouts would silently win",
            "keep one of them",
        )


def _seconds(limit: str) -> int:
    """SLURM --time text (already pattern-checked) in seconds."""
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, sec = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def _gpu(spec: Spec) -> bool:
    return spec.cluster.gpus_per_node > 0


def _world(spec: Spec) -> int:
    t = spec.train
    return t.nodes * t.gpus_per_node if _gpu(spec) else (t.nodes or 1)


@rule
def model_source(s: Spec) -> Iterator[Finding]:
    if (s.model.path is None) == (s.model.builtin is None):
        yield (
            "model",
            "give exactly one of model.path or model.builtin",
            "set model.path to an HF checkpoint dir, or model.builtin: tiny for the embedded default",
        )


@rule
def local_launcher(s: Spec) -> Iterator[Finding]:
    c = s.cluster
    if c.launcher != "local":
        return
    if c.nodes != 1:
        yield (
            "cluster.nodes",
            f"the local launcher runs on this one machine, got cluster.nodes={c.nodes}",
            "set cluster.nodes: 1, or cluster.launcher: slurm",
        )
    for name in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(c, name) is not None:
            yield (
                f"cluster.{name}",
                f"cluster.{name} is SLURM-only but cluster.launcher is 'local'",
                f"remove cluster.{name}, or set cluster.launcher: slurm",
            )
    if c.exclude:
        yield (
            "cluster.exclude",
            "cluster.exclude is SLURM-only but cluster.launcher is 'local'",
            "remove it, or set cluster.launcher: slurm",
        )
    if c.container is not None:
        yield (
            "cluster.container",
            "containers are started by the SLURM launcher (pyxis) only",
            "remove cluster.container, or set cluster.launcher: slurm",
        )
    for name in ("time_limit", "mem"):
        if getattr(c, name) is not None:
            yield (
                f"cluster.{name}",
                f"cluster.{name} is a SLURM limit; the local launcher does not apply it",
                f"remove cluster.{name}, or set cluster.launcher: slurm",
            )
    # Restart settings: a local run is never requeued (a stopped one stays stopped with exit 75). Their
    # defaults carry no intent; a value written otherwise would be accepted and ignored.
    for f in msgspec.structs.fields(Cluster):
        if f.name in _SLURM_RESTARTS and getattr(c, f.name) != f.default:
            yield (
                f"cluster.{f.name}",
                f"cluster.{f.name} is a SLURM restart setting; a local run is never requeued",
                f"remove cluster.{f.name}, or set cluster.launcher: slurm",
            )
    if s.sweep is not None and (s.sweep.max_parallel or 1) > 1:
        yield (
            "sweep.max_parallel",
            f"the local launcher runs sweep tasks one after another, not {s.sweep.max_parallel} at once",
            "remove sweep.max_parallel, or set cluster.launcher: slurm",
        )


@rule
def time_limit(s: Spec) -> Iterator[Finding]:
    c = s.cluster
    if c.time_limit is None:
        return
    limit = _seconds(c.time_limit)
    if limit == 0:
        yield ("cluster.time_limit", f"time_limit {c.time_limit!r} is zero", "e.g. '04:00:00'")
    elif c.signal_grace_s >= limit:
        yield (
            "cluster.signal_grace_s",
            f"signal_grace_s {c.signal_grace_s} is not below the time limit "
            f"{c.time_limit!r} ({limit} s): the job would be told to checkpoint before it starts",
            "raise cluster.time_limit or lower cluster.signal_grace_s",
        )


@rule
def env_and_secrets(s: Spec) -> Iterator[Finding]:
    import re

    for key in s.cluster.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            yield (
                f"cluster.env.{key}",
                f"'{key}' is not a valid environment variable name",
                "use letters, digits and underscores, not starting with a digit",
            )
    for key, ref in s.cluster.secrets.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            yield (
                f"cluster.secrets.{key}",
                f"'{key}' is not a valid environment variable name",
                "the secret's name is the variable it is exported as inside the job",
            )
        if (ref.env is None) == (ref.file is None):
            yield (
                f"cluster.secrets.{key}",
                "a secret needs exactly one of {env: VAR} or {file: PATH}",
                "secrets are references; never put the value in the spec",
            )
        if key in s.cluster.env:
            yield (f"cluster.secrets.{key}", f"'{key}' is both a plain env var and a secret", "keep only the secret")


@rule
def devices(s: Spec) -> Iterator[Finding]:
    if not _gpu(s):
        if s.train.backend == "megatron":
            yield (
                "train.backend",
                "the megatron backend needs GPUs but cluster.gpus_per_node is 0",
                "set cluster.gpus_per_node, or train.backend: torch",
            )
        if s.rollout.backend == "sglang":
            yield (
                "rollout.backend",
                "the sglang backend needs GPUs but cluster.gpus_per_node is 0",
                "set cluster.gpus_per_node, or rollout.backend: builtin",
            )
        if s.train.gpus_per_node:
            yield (
                "train.gpus_per_node",
                f"train.gpus_per_node={s.train.gpus_per_node} on a CPU-only cluster",
                "set cluster.gpus_per_node, or train.gpus_per_node: 0",
            )
        if s.rollout.gpus:
            yield (
                "rollout.gpus",
                f"rollout.gpus={s.rollout.gpus} on a CPU-only cluster",
                "set cluster.gpus_per_node, or remove rollout.gpus",
            )
        if s.train.precision != "fp32":
            yield (
                "train.precision",
                f"train.precision {s.train.precision} on a CPU-only cluster: the trainer computes in fp32 on CPU",
                "set train.precision: fp32, or give the job GPUs",
            )
        return
    if s.train.gpus_per_node == 0:
        yield (
            "train.gpus_per_node",
            "train.gpus_per_node is 0 on a GPU cluster",
            "give the actor at least one GPU per train node",
        )
    if s.rollout.backend == "sglang" and s.model.path is None:
        yield (
            "rollout.backend",
            f"SGLang engines serve an HF checkpoint directory, but the model is model.builtin: {s.model.builtin}",
            "set model.path, or rollout.backend: builtin",
        )


@rule
def fake_gpus(s: Spec) -> Iterator[Finding]:
    """``cluster.fake_gpus`` runs GPU slots on CPU: only where there are GPU slots and the backends run on CPU."""
    c = s.cluster
    if not c.fake_gpus:
        return
    if c.gpus_per_node == 0:
        yield (
            "cluster.fake_gpus",
            "cluster.fake_gpus with cluster.gpus_per_node 0: there are no GPU slots to fake",
            "remove cluster.fake_gpus (a CPU-only job needs no opt-in)",
        )
        return
    if s.train.backend == "megatron":  # its CPU path needs megatron-core's CUDA calls redirected (tests only)
        yield (
            "train.backend",
            "the megatron backend needs CUDA; with cluster.fake_gpus its ranks would run on CPU",
            "use train.backend: torch on fake GPUs, or remove cluster.fake_gpus on real GPU nodes",
        )
    if s.rollout.backend == "sglang":
        yield (
            "rollout.backend",
            "SGLang engines need CUDA; cluster.fake_gpus runs GPU slots on CPU",
            "use rollout.backend: builtin on fake GPUs, or remove cluster.fake_gpus on real GPU nodes",
        )
    if s.train.precision != "fp32":
        yield (
            "train.precision",
            f"train.precision {s.train.precision} with cluster.fake_gpus: the trainer computes in fp32 on CPU",
            "set train.precision: fp32, or remove cluster.fake_gpus on real GPU nodes",
        )


@rule
def parallel_sizes(s: Spec) -> Iterator[Finding]:
    p = s.train.parallel
    world = _world(s)
    mp = p.tensor * p.pipeline * p.context
    if world % mp:
        # at a field that was set (so the file:line or --set shown is one of the sizes in the product)
        name = next(n for n in ("tensor", "pipeline", "context") if getattr(p, n) > 1)
        yield (
            f"train.parallel.{name}",
            f"tensor {p.tensor} x pipeline {p.pipeline} x context {p.context} = {mp} "
            f"does not divide the {world} trainer GPUs (train.nodes x train.gpus_per_node)",
            "choose parallel sizes whose product divides the trainer GPU count",
        )
        return
    # megatron-core >= 0.9 lays experts out on their own grid (parallel_state.initialize_model_parallel):
    # expert_tensor x expert x pipeline must divide the world; expert parallelism folds over data x context.
    etp = p.expert_tensor or p.tensor
    ep_grid = etp * p.expert * p.pipeline
    if world % ep_grid:
        yield (
            "train.parallel.expert",
            f"expert_tensor {etp} x expert {p.expert} x pipeline {p.pipeline} = {ep_grid} does not divide the "
            f"{world} trainer GPUs (megatron-core's expert grid)",
            "pick expert (and expert_tensor) sizes whose product with pipeline divides the trainer GPU count",
        )
    if (mp > 1 or p.expert > 1 or etp > 1) and s.train.backend == "torch":
        yield (
            "train.parallel",
            "the torch backend is data-parallel only (tensor/pipeline/context/expert must be 1)",
            "use train.backend: megatron for model parallelism",
        )


_TE_ONLY_MOE = dict.fromkeys(("moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion"), True)


@rule
def megatron_model(s: Spec) -> Iterator[Finding]:
    """What the megatron backend checks at launch, run here when model.path/config.json is readable."""
    if s.train.backend != "megatron":
        return
    requested = s.train.backend_args.get("attention-backend", s.train.backend_args.get("attention_backend"))
    if requested is not None and requested not in ATTENTION_BACKENDS:
        key = "attention-backend" if "attention-backend" in s.train.backend_args else "attention_backend"
        yield (
            f"train.backend_args.{key}",
            f"attention backend {requested!r} is not one of {', '.join(ATTENTION_BACKENDS)}",
            "flash/fused/unfused/local/auto are megatron-core's names; te and sdpa pick a layer spec directly",
        )
    cfg = model_config(s.model.path)
    if cfg is None:
        return
    try:
        shape = ModelShape.from_hf_config(cfg)
    except MegatronConfigError as exc:
        for message in exc.problems:
            yield ("model.path", f"{message} ({s.model.path}/config.json)", "use train.backend: torch for this model")
        return
    p = s.train.parallel
    yield from parallel_findings(
        shape,
        tp=p.tensor,
        pp=p.pipeline,
        cp=p.context,
        ep=p.expert,
        etp=p.expert_tensor,
        sequence_parallel=p.sequence_parallel,
        attention_backend=None if requested in (None, "auto", "flash") else str(requested),
    )
    if shape.mla and requested in ("local", "unfused"):
        yield (
            "train.backend_args.attention-backend",
            f"attention-backend {requested}: megatron-core's local DotProductAttention cannot take multi-latent "
            "attention's different key and value head sizes",
            "use auto or sdpa",
        )
    for key, value in s.train.backend_args.items():
        if shape.moe and _TE_ONLY_MOE.get(key.replace("-", "_")) and value not in (False, None):
            yield (
                f"train.backend_args.{key}",
                f"'{key}' needs Transformer Engine layer specs, which the megatron backend does not map for MoE "
                "models (its experts run one by one as SequentialMLP)",
                "remove it",
            )
    if requested in ("te", "fused") and (shape.moe or shape.mla):
        yield (
            "train.backend_args.attention-backend",
            f"attention-backend {requested} uses Transformer Engine layer specs, which are not mapped for "
            f"{shape.family} (MoE / multi-latent attention) models",
            "use auto or sdpa",
        )


@rule
def sglang_expert_parallel(s: Spec) -> Iterator[Finding]:
    """SGLang runs an engine's MoE layers on ep x (tp / ep) ranks and gives each EP rank experts / ep experts
    (it asserts both divide); a wrong --ep-size fails only when the engine starts, after the queue wait."""
    r = s.rollout
    if r.backend != "sglang":
        return
    pp = next((v for k, v in r.engine_args.items() if _flag(k) in ("pp-size", "pipeline-parallel-size")), 1)
    tp = r.gpus_per_engine // pp if isinstance(pp, int) and pp >= 1 and r.gpus_per_engine % pp == 0 else None
    cfg = model_config(s.model.path) or {}
    experts = next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in cfg), None)
    for key, ep in r.engine_args.items():
        if _flag(key) not in EP_FLAGS:
            continue
        path = f"rollout.engine_args.{key}"
        if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
            yield (path, f"SGLang's expert-parallel size must be a positive integer, got {ep!r}", None)
        elif tp is not None and tp % ep:
            yield (
                path,
                f"SGLang's expert-parallel size {ep} does not divide the engine's tensor-parallel size {tp} "
                "(rollout.gpus_per_engine / pp-size): its MoE layers run on ep x tp/ep ranks",
                f"choose an ep-size that divides {tp}",
            )
        elif isinstance(experts, int) and experts % ep:
            yield (
                path,
                f"SGLang's expert-parallel size {ep} does not divide the model's {experts} experts",
                "choose an ep-size that divides the expert count",
            )


def _flag(key: str) -> str:
    return key.strip().lstrip("-").replace("_", "-")


def _attention_heads(cfg: dict | None) -> tuple[int | None, int | None]:
    """(attention heads, key/value heads) from an HF config.json, or (None, None)."""
    heads = (cfg or {}).get("num_attention_heads")
    if not isinstance(heads, int) or heads < 1:
        return None, None
    groups = cfg.get("num_key_value_heads")
    return heads, groups if isinstance(groups, int) and groups >= 1 else heads


# TransformerConfig options the spec already decides: a train.backend_args entry for one of them would
# silently disagree with the rest of the job (the process groups, the weight converter, the rules here).
_SPEC_OWNED_BACKEND_ARGS = {
    "tensor_model_parallel_size": "train.parallel.tensor",
    "pipeline_model_parallel_size": "train.parallel.pipeline",
    "context_parallel_size": "train.parallel.context",
    "expert_model_parallel_size": "train.parallel.expert",
    "expert_tensor_parallel_size": "train.parallel.expert_tensor",
    "sequence_parallel": "train.parallel.sequence_parallel",
    "bf16": "train.precision",
    "fp16": "train.precision",
    "params_dtype": "train.precision",
    "pipeline_dtype": "train.precision",
    **dict.fromkeys(
        (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "layernorm_epsilon",
            "add_qkv_bias",
            "add_bias_linear",
            "normalization",
            "gated_linear_unit",
            "activation_func",
            "num_moe_experts",
            "moe_router_topk",
            "moe_ffn_hidden_size",
            "moe_layer_freq",
            "moe_router_score_function",
            "moe_router_pre_softmax",
            "moe_router_enable_expert_bias",
            "moe_router_num_groups",
            "moe_router_group_topk",
            "moe_router_topk_scaling_factor",
            "moe_shared_expert_intermediate_size",
            "moe_shared_expert_gate",
            "qk_layernorm",
            "multi_latent_attention",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_head_dim",
            "qk_pos_emb_head_dim",
            "v_head_dim",
            "rotary_base",
            "rope_type",
        ),
        "the model's config.json",
    ),
}


@rule
def backend_args(s: Spec) -> Iterator[Finding]:
    if s.train.backend == "torch":
        for key in s.train.backend_args:
            yield (
                f"train.backend_args.{key}",
                "train.backend_args are Megatron flags; the torch backend takes none",
                "remove it, or use train.backend: megatron",
            )
        return
    for key in s.train.backend_args:
        owner = _SPEC_OWNED_BACKEND_ARGS.get(key.replace("-", "_"))
        if owner is not None:
            yield (
                f"train.backend_args.{key}",
                f"'{key}' is decided by {owner}; a backend_args value would silently disagree with the rest of the job",
                f"remove it and set {owner}" if owner.startswith("train.") else "remove it",
            )


@rule
def batch_sizes(s: Spec) -> Iterator[Finding]:
    t, r = s.train, s.rollout
    samples = r.batch_size * r.n_samples_per_prompt
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < r.batch_size:
        yield (
            "rollout.over_sampling_batch_size",
            f"over_sampling_batch_size {r.over_sampling_batch_size} < batch_size {r.batch_size}",
            "it must be at least rollout.batch_size",
        )
    variable = variable_count_reason(s)
    if variable is not None:
        if t.global_batch_size is None:
            yield (
                "train.global_batch_size",
                f"the samples per rollout vary ({variable}), so the optimizer steps are sized by "
                "train.global_batch_size, which is not set (num_steps_per_rollout does not divide "
                f"{samples} samples)",
                "set train.global_batch_size: the target samples per optimizer step",
            )
        return  # the runtime splits whatever count a rollout has (no divisibility to check)
    if t.global_batch_size is None or t.num_steps_per_rollout is None:
        by = (
            f"global_batch_size {t.global_batch_size}"
            if t.global_batch_size is not None
            else f"num_steps_per_rollout {t.num_steps_per_rollout}"
        )
        yield (
            "train.global_batch_size",
            f"rollout.batch_size {r.batch_size} x n_samples_per_prompt "
            f"{r.n_samples_per_prompt} = {samples} samples is not divisible by {by}",
            "choose a global_batch_size (or num_steps_per_rollout) that divides the samples per rollout",
        )
        return
    if t.global_batch_size * t.num_steps_per_rollout != samples:
        yield (
            "train.global_batch_size",
            f"global_batch_size {t.global_batch_size} x num_steps_per_rollout "
            f"{t.num_steps_per_rollout} != {samples} samples per rollout",
            "set only one of the two",
        )
    p = t.parallel
    world = _world(s)
    mp = p.tensor * p.pipeline * p.context
    if world % mp:
        return
    dp = world // mp
    if dp == 0:
        return  # no trainer GPUs: the devices rule reports it
    unit = dp if t.dynamic_batch.enabled else t.micro_batch_size * dp
    if t.global_batch_size % unit:
        what = (
            f"data-parallel size {dp}"
            if t.dynamic_batch.enabled
            else f"micro_batch_size {t.micro_batch_size} x data-parallel size {dp} = {unit}"
        )
        yield (
            "train.global_batch_size",
            f"global_batch_size {t.global_batch_size} is not divisible by {what}",
            f"make global_batch_size a multiple of {unit}",
        )


@rule
def data_path(s: Spec) -> Iterator[Finding]:
    """Dynamic sampling, over-sampling and partial rollout: each needs what makes it do something."""
    r = s.rollout
    ds, over = r.dynamic_sampling, (r.over_sampling_batch_size or r.batch_size) > r.batch_size
    if ds is not None and ":" not in ds.filter and ds.filter not in BUILTIN_FILTERS:
        yield (
            "rollout.dynamic_sampling.filter",
            f"unknown group filter {ds.filter!r}; built-in: {', '.join(BUILTIN_FILTERS)}",
            "use a built-in name or 'package.module:function'",
        )
    if ds is not None and r.n_samples_per_prompt == 1:
        yield (
            "rollout.dynamic_sampling.filter",
            "a group filter compares the samples of a prompt group, but n_samples_per_prompt is 1 "
            "(nonzero_std would drop every group and the rollout would never fill)",
            "set rollout.n_samples_per_prompt > 1, or remove rollout.dynamic_sampling",
        )
    if over and ds is None and not r.partial:
        yield (
            "rollout.over_sampling_batch_size",
            f"over_sampling_batch_size {r.over_sampling_batch_size} > batch_size {r.batch_size} draws more prompt "
            "groups than a rollout trains on; with neither a filter nor partial rollout the extra groups would be "
            "generated and thrown away",
            "set rollout.dynamic_sampling.filter or rollout.partial: true, or remove over_sampling_batch_size",
        )
    if r.partial and ds is None and not over:
        yield (
            "rollout.partial",
            "partial rollout continues the requests aborted once enough groups passed; with neither a filter nor "
            "over_sampling_batch_size > batch_size every drawn group is trained and nothing is ever aborted",
            "set rollout.dynamic_sampling or over_sampling_batch_size > batch_size, or remove rollout.partial",
        )
    if r.partial and s.agent is not None:
        yield (
            "rollout.partial",
            "partial rollout is not implemented for agent episodes (a multi-turn episode cannot be continued "
            "from a cut response)",
            "remove rollout.partial",
        )
    if r.partial_mask_offpolicy and not r.partial:
        yield (
            "rollout.partial_mask_offpolicy",
            "partial_mask_offpolicy masks the tokens of continued partial responses, but rollout.partial is false",
            "set rollout.partial: true, or remove partial_mask_offpolicy",
        )


@rule
def debug_modes(s: Spec) -> Iterator[Finding]:
    d = s.debug
    if d.mode == "train_only" and d.load_rollouts is None:
        yield (
            "debug.load_rollouts",
            "debug.mode train_only trains on saved rollouts, but debug.load_rollouts is not set",
            "point it at a run's tasks/<i>/rollouts directory (written with debug.save_rollouts: true)",
        )
    if d.load_rollouts is not None and d.mode != "train_only":
        yield (
            "debug.load_rollouts",
            f"debug.load_rollouts is only read in debug.mode train_only (mode is {d.mode!r})",
            "set debug.mode: train_only, or remove load_rollouts",
        )
    if d.mode == "train_only" and s.data.eval:
        yield (
            "data.eval",
            "debug.mode train_only starts no engines, so the eval sets could not be generated",
            "remove data.eval (--set 'data.eval=[]'), or use debug.mode: normal",
        )
    if d.mode == "rollout_only" and s.algorithm.sft_warmup_steps > 0:
        yield (
            "algorithm.sft_warmup_steps",
            "debug.mode rollout_only starts no trainer ranks, so the SFT warm-up cannot run",
            "set algorithm.sft_warmup_steps: 0 (or point model.path at a warmed-up checkpoint)",
        )


@rule
def dynamic_batch(s: Spec) -> Iterator[Finding]:
    db = s.train.dynamic_batch
    if db.enabled and db.max_tokens_per_gpu is None:
        yield (
            "train.dynamic_batch.max_tokens_per_gpu",
            "dynamic batching needs max_tokens_per_gpu",
            "set train.dynamic_batch.max_tokens_per_gpu (e.g. 2 x (max_prompt_len + max_response_len))",
        )


@rule
def rollout_gpus(s: Spec) -> Iterator[Finding]:
    r = s.rollout
    if not _gpu(s):
        return
    if not r.colocate and not r.gpus:
        yield (
            "rollout.gpus",
            "a disaggregated layout (rollout.colocate: false) needs rollout.gpus",
            "set rollout.gpus to the GPUs the engines get, or rollout.colocate: true",
        )
        return
    if r.gpus == 0:
        yield (
            "rollout.gpus",
            "rollout.gpus is 0 on a GPU cluster: no rollout engine would start",
            "remove rollout.gpus (colocated engines get the trainer's GPUs) or give the engines GPUs",
        )
        return
    heads, groups = _attention_heads(model_config(s.model.path))
    if (
        heads
        and r.backend == "sglang"
        and r.gpus_per_engine > 1
        and (heads % r.gpus_per_engine or (groups % r.gpus_per_engine and r.gpus_per_engine % groups))
    ):
        yield (
            "rollout.gpus_per_engine",
            f"an engine's tensor parallelism of {r.gpus_per_engine} (gpus_per_engine) "
            f"does not fit the model's {heads} attention heads / {groups} key/value heads: SGLang needs the "
            "heads divisible by it, and the key/value heads divisible by it or it by them",
            "choose gpus_per_engine accordingly",
        )
    if r.gpus and r.gpus % r.gpus_per_engine:
        yield (
            "rollout.gpus",
            f"rollout.gpus {r.gpus} is not divisible by gpus_per_engine {r.gpus_per_engine} "
            f"({r.gpus % r.gpus_per_engine} GPU(s) would sit idle)",
            f"use a multiple of {r.gpus_per_engine} rollout GPUs",
        )
    gpn = s.cluster.gpus_per_node
    if r.gpus_per_engine > gpn and r.gpus_per_engine % gpn:
        yield (
            "rollout.gpus_per_engine",
            f"an engine of {r.gpus_per_engine} GPUs is larger than a node ({gpn} GPUs) and must span whole nodes",
            f"use a multiple of {gpn}",
        )
    if r.num_engines is not None and r.gpus and r.num_engines != r.gpus // r.gpus_per_engine:
        yield (
            "rollout.num_engines",
            f"num_engines {r.num_engines} != rollout.gpus {r.gpus} / gpus_per_engine {r.gpus_per_engine}",
            "remove num_engines (it is derived) or make them agree",
        )


@rule
def layout_fits(s: Spec) -> Iterator[Finding]:
    try:
        plan_layout(s)
    except LayoutError as exc:
        yield (exc.path, str(exc), exc.hint)
    except (TypeError, ZeroDivisionError):
        return  # an earlier rule already reported the missing count


@rule
def sampling(s: Spec) -> Iterator[Finding]:
    r = s.rollout
    if r.temperature <= 0:
        yield (
            "rollout.temperature",
            f"temperature must be > 0 for RL sampling, got {r.temperature}",
            "use e.g. 1.0 (greedy decoding is only for eval sets)",
        )
    ctx = s.model.max_context_len
    if ctx is not None and r.max_prompt_len >= ctx:
        yield (
            "rollout.max_prompt_len",
            f"max_prompt_len {r.max_prompt_len} must be below the model's context length {ctx}",
            f"set rollout.max_prompt_len <= {ctx - 1}",
        )
    if (r.num_rollouts is None) and (r.epochs is None):
        yield ("rollout.num_rollouts", "give rollout.num_rollouts or rollout.epochs", "e.g. num_rollouts: 100")
    if r.num_rollouts == 0:  # a warm-up-only run: its one result is final_model/
        if s.algorithm.sft_warmup_steps == 0:
            yield (
                "rollout.num_rollouts",
                "num_rollouts 0 runs only the SFT warm-up, and algorithm.sft_warmup_steps is 0: nothing would run",
                "set rollout.num_rollouts >= 1, or algorithm.sft_warmup_steps > 0 for a warm-up-only run",
            )
        if not s.train.checkpoint.save_hf:
            yield (
                "train.checkpoint.save_hf",
                "a warm-up-only run (rollout.num_rollouts: 0) keeps the warmed-up model only as final_model/, "
                "which save_hf: false turns off",
                "set train.checkpoint.save_hf: true",
            )
    if s.rollout.weight_sync == "delta":
        if r.colocate:
            yield (
                "rollout.weight_sync",
                "delta weight sync ships changed tensors over disk; not for colocated runs",
                "use weight_sync: disk when colocated",
            )
    if r.weight_sync == "nccl":  # on a CPU-only cluster the same collective sync runs over gloo
        if r.colocate:
            yield (
                "rollout.weight_sync",
                "weight_sync nccl broadcasts to engines on their own GPUs; colocated engines share the trainer's GPUs",
                "remove weight_sync (derived) or use disk when colocated",
            )


@rule
def engine_support(s: Spec) -> Iterator[Finding]:
    """Settings the rollout engines (as the runtime drives them) cannot honour."""
    r = s.rollout
    if r.router_args:
        yield (
            "rollout.router_args",
            "the rollout manager sends requests straight to the engines and spreads them itself; the "
            "sglang-router is not in the request path, so router settings would do nothing",
            "remove rollout.router_args",
        )
    if r.backend == "builtin" and r.gpus_per_engine > 1:
        n = r.gpus_per_engine
        yield (
            "rollout.gpus_per_engine",
            f"the built-in engine runs on one device; gpus_per_engine {n} would leave {n - 1} of each engine's "
            f"{n} GPUs idle",
            "set rollout.gpus_per_engine: 1 (more GPUs give more engines), or rollout.backend: sglang",
        )


@rule
def engine_args_known(s: Spec) -> Iterator[Finding]:
    """The engine arguments the launch would refuse (one table: slime.spec.engine_flags)."""
    r = s.rollout
    for key in r.engine_args:
        if r.backend == "sglang" and (hit := sglang_reserved(key)) is not None:
            abbr = "" if hit == normalize_flag(key) else f" (--{normalize_flag(key)} abbreviates it)"
            yield (
                f"rollout.engine_args.{key}",
                f"slime-submit sets --{hit} itself from the spec and the layout{abbr}",
                f"remove it (change {reserved_hint(hit)} instead)",
            )
        elif r.backend == "builtin" and builtin_engine_arg(key) is None:
            yield (
                f"rollout.engine_args.{key}",
                f"'{key}' is not an option of the built-in engine",
                f"valid: {', '.join(BUILTIN_ENGINE_ARGS)} (SGLang flags need rollout.backend: sglang)",
            )


@rule
def weight_sync_support(s: Spec) -> Iterator[Finding]:
    """Weight-sync modes the runtime cannot carry out for this layout."""
    r, pipeline = s.rollout, s.train.parallel.pipeline
    if r.weight_sync == "delta" and r.backend == "builtin":
        yield (
            "rollout.weight_sync",
            "delta weight sync is implemented for SGLang engines only; the built-in engine would load every "
            "tensor from disk each time",
            "use weight_sync: disk (or remove it) with rollout.backend: builtin",
        )
    if r.weight_sync == "nccl" and pipeline > 1:
        yield (
            "rollout.weight_sync",
            f"weight_sync nccl broadcasts the policy from trainer rank 0, which holds only the first of "
            f"{pipeline} pipeline stages",
            "use weight_sync: disk, or remove weight_sync (derived: disk when pipeline > 1)",
        )


@rule
def algorithm(s: Spec) -> Iterator[Finding]:
    a, m = s.algorithm, s.model
    if (a.kl_coef > 0 or a.kl_loss_coef > 0) and m.ref_path is None:
        which = "kl_coef" if a.kl_coef > 0 else "kl_loss_coef"
        yield (
            f"algorithm.{which}",
            f"algorithm.{which} > 0 needs a reference model",
            "set model.ref_path ('initial' anchors to the starting policy), or the coefficient to 0",
        )
    if a.kl_coef > 0 and a.kl_loss_coef > 0:
        yield (
            "algorithm.kl_loss_coef",
            "KL in the reward (kl_coef) and in the loss (kl_loss_coef) are exclusive",
            "set one of them to 0",
        )
    if a.dual_clip_c is not None and a.dual_clip_c <= 1:
        yield ("algorithm.dual_clip_c", f"dual clip needs c > 1, got {a.dual_clip_c}", "e.g. 3.0, or remove it")
    if a.dual_clip_c is not None and a.estimator == "cispo":
        yield (  # slime.rl.losses refuses it at the first step; found by the smoke property test
            "algorithm.dual_clip_c",
            "dual clip does not apply to cispo: its importance weight is already a clipped constant",
            "remove algorithm.dual_clip_c, or use another estimator",
        )
    if a.critic is not None and a.estimator != "ppo":
        yield ("algorithm.critic", f"a critic is only used by ppo, not {a.estimator}", "remove algorithm.critic")
    if s.rollout.n_samples_per_prompt == 1 and a.normalize_std:
        yield (
            "algorithm.normalize_std",
            "std normalisation of group advantages needs n_samples_per_prompt > 1",
            "set normalize_std: false or sample more per prompt",
        )
    yield from _importance_sampling(s)


_TIS_DEFAULTS = Tis()


def _importance_sampling(s: Spec) -> Iterator[Finding]:
    a = s.algorithm
    if a.tis.enabled and a.use_rollout_logprobs:
        yield (
            "algorithm.use_rollout_logprobs",
            "algorithm.use_rollout_logprobs and algorithm.tis are exclusive (as in slime): with the rollout "
            "log-probs as the old log-probs, the importance weight would be 1",
            "set algorithm.tis.enabled: false, or use_rollout_logprobs: false",
        )
    if a.tis.clip_low >= a.tis.clip:
        yield (
            "algorithm.tis.clip_low",
            f"algorithm.tis.clip_low ({a.tis.clip_low}) must be below algorithm.tis.clip ({a.tis.clip})",
            "e.g. clip_low: 0.0, clip: 2.0 (slime's defaults)",
        )
    if not a.tis.enabled:  # clamps of an importance weight nothing computes: set, they would be ignored
        for name in ("clip", "clip_low"):
            value, default = getattr(a.tis, name), getattr(_TIS_DEFAULTS, name)
            if value != default:
                yield (
                    f"algorithm.tis.{name}",
                    f"algorithm.tis.{name} is {value}, but algorithm.tis.enabled is false: no importance weight "
                    "is computed, so nothing would clamp at it",
                    f"set algorithm.tis.enabled: true, or remove tis.{name} (default {default})",
                )


@rule
def async_training(s: Spec) -> Iterator[Finding]:
    if not s.train.async_:
        return
    if s.rollout.colocate:
        yield (
            "train.async",
            "async training generates the next rollout while the trainer steps, so the engines need slots of "
            "their own, but rollout.colocate is true",
            "set rollout.colocate: false (with rollout.gpus for the engines on a GPU cluster), or train.async: false",
        )
    cpus = s.cluster.cpus_per_node
    if not _gpu(s) and cpus is not None and cpus < 2:
        yield (
            "train.async",
            f"async training on CPU splits each node's cores between trainer and engines, but "
            f"cluster.cpus_per_node is {cpus}",
            "give the nodes at least 2 CPUs (cluster.cpus_per_node), or train.async: false",
        )


@rule
def reward(s: Spec) -> Iterator[Finding]:
    rw = s.reward
    if rw.type == "custom" and not rw.custom:
        yield ("reward.custom", "reward.type custom needs reward.custom", "e.g. custom: 'my_pkg.rewards:score'")
    if rw.type != "custom" and rw.custom:
        yield ("reward.custom", f"reward.custom is set but reward.type is '{rw.type}'", "set type: custom")
    if rw.type == "remote" and not rw.url:
        yield ("reward.url", "reward.type remote needs reward.url", "e.g. url: http://reward-host:8000/score")
    if rw.type != "remote" and rw.url:
        yield ("reward.url", f"reward.url is set but reward.type is '{rw.type}'", "set type: remote, or remove url")
    if rw.key is not None and rw.type not in ("custom", "remote"):
        yield (
            "reward.key",
            f"reward.key picks the reward out of a dict, but the '{rw.type}' reward returns a number",
            "remove reward.key (it is for custom and remote rewards)",
        )


@rule
def data_sets(s: Spec) -> Iterator[Finding]:
    seen: dict[str, int] = {}
    for i, e in enumerate(s.data.eval):
        if e.name in seen:
            yield (
                f"data.eval[{i}].name",
                f"eval set name '{e.name}' is also used by data.eval[{seen[e.name]}]; "
                "metric keys eval/<name>/... would collide",
                "give every eval set a distinct name",
            )
        seen.setdefault(e.name, i)
        too_big = sorted({k for k in e.pass_at_k if k > e.n_samples_per_prompt})
        if too_big:
            yield (
                f"data.eval[{i}].pass_at_k",
                f"pass@{too_big[0]} needs at least {too_big[0]} samples per prompt, but n_samples_per_prompt is "
                f"{e.n_samples_per_prompt}",
                f"raise data.eval[{i}].n_samples_per_prompt to {too_big[-1]}, or drop k > {e.n_samples_per_prompt}",
            )
        if len(set(e.pass_at_k)) != len(e.pass_at_k):
            yield (f"data.eval[{i}].pass_at_k", f"pass_at_k {list(e.pass_at_k)} repeats a k", "list each k once")


@rule
def optimizer(s: Spec) -> Iterator[Finding]:
    o = s.train.optimizer
    if o.min_lr > o.lr:
        yield ("train.optimizer.min_lr", f"min_lr {o.min_lr} is above lr {o.lr}", "set min_lr <= lr")
    if o.distributed and s.train.backend == "torch":
        yield (
            "train.optimizer.distributed",
            "the torch backend keeps a full optimizer copy on every data-parallel rank; it cannot shard it",
            "remove train.optimizer.distributed (derived: false with torch), or use train.backend: megatron",
        )


@rule
def agent(s: Spec) -> Iterator[Finding]:
    ag = s.agent
    if ag is None:
        return
    sb = ag.sandbox
    yield from _sandbox_fields_honoured(sb)
    if sb.backend == "e2b":
        if not sb.api_key_secret:
            yield (
                "agent.sandbox.api_key_secret",
                "the e2b sandbox needs an API key by secret reference",
                "add cluster.secrets.E2B_API_KEY: {env: E2B_API_KEY} and api_key_secret: E2B_API_KEY",
            )
        elif sb.api_key_secret not in s.cluster.secrets:
            yield (
                "agent.sandbox.api_key_secret",
                f"'{sb.api_key_secret}' is not a cluster.secrets entry",
                f"known secrets: {', '.join(s.cluster.secrets) or 'none'}",
            )


def _sandbox_fields_honoured(sb: SandboxSpec) -> Iterator[Finding]:
    """Sandbox fields one backend cannot honour are refused, never ignored."""
    if sb.backend == "e2b":
        template = "the VM's size comes from its E2B template and cannot be set per sandbox"
        if sb.work_mb is not None:
            yield (
                "agent.sandbox.work_mb",
                f"the e2b backend cannot cap /work: {template}",
                "remove work_mb, or build an E2B template with the disk you need and name it in agent.sandbox.image",
            )
        if sb.total_memory_mb is not None:
            yield (
                "agent.sandbox.total_memory_mb",
                f"the e2b backend cannot cap a sandbox's total memory: {template}",
                "remove total_memory_mb, or build an E2B template with --memory-mb and name it in agent.sandbox.image",
            )
        if sb.allow_unisolated:
            yield (
                "agent.sandbox.allow_unisolated",
                "allow_unisolated is a fallback of the local backend; an e2b sandbox is always a separate VM",
                "remove allow_unisolated",
            )
    elif sb.image is not None:
        yield (
            "agent.sandbox.image",
            "image names an E2B template; the local backend runs tools on this machine's own /usr",
            "remove image, or use backend: e2b",
        )


def _over_context(s: Spec) -> str | None:
    r, ctx = s.rollout, s.model.max_context_len
    if ctx is not None and r.max_prompt_len + r.max_response_len > ctx:
        return (
            f"max_prompt_len + max_response_len = {r.max_prompt_len + r.max_response_len} exceeds the "
            f"model's context length {ctx}"
        )
    return None


@rule
def context_fits_sglang(s: Spec) -> Iterator[Finding]:
    # SGLang refuses a request whose prompt + max_new_tokens exceeds the context (unless started with
    # --allow-auto-truncate); every rollout request asks for max_response_len new tokens.
    if s.rollout.backend == "sglang" and (over := _over_context(s)):
        yield (
            "rollout.max_response_len",
            f"{over}: SGLang would refuse long prompts",
            "lower max_response_len or max_prompt_len so that they fit the context",
        )


@warning
def long_responses(s: Spec) -> Iterator[Finding]:
    if s.rollout.backend != "sglang" and (over := _over_context(s)):
        yield ("rollout.max_response_len", f"{over}; the built-in engine stops responses at the context", None)


def check_raw(spec: Spec) -> list[tuple[Literal["error", "warning"], Finding]]:
    """Rules about what was written (before ``resolve`` fills derived values), with their severity."""
    out: list[tuple[Literal["error", "warning"], Finding]] = [("error", f) for fn in RAW_RULES for f in fn(spec)]
    return out + [("warning", f) for fn in RAW_WARNINGS for f in fn(spec)]


def all_rules(*, check_paths: bool | Literal["warn"] = False) -> list[tuple[Literal["error", "warning"], Rule]]:
    """Every rule of the resolved spec with its severity (``check`` runs these); ``check_paths``:
    local files must exist (True), or a missing one is only a warning (``"warn"``, for previews)."""
    out: list[tuple[Literal["error", "warning"], Rule]] = [("error", fn) for fn in RULES]
    out += [("warning", fn) for fn in WARNINGS]
    if check_paths:
        out.append(("warning" if check_paths == "warn" else "error", _paths))
    return out


def check(
    spec: Spec, *, check_paths: bool | Literal["warn"] = False
) -> list[tuple[Literal["error", "warning"], Finding]]:
    """Run every rule; with ``check_paths`` also check that local files exist (see :func:`all_rules`)."""
    return [(severity, f) for severity, fn in all_rules(check_paths=check_paths) for f in fn(spec)]


def _paths(s: Spec) -> Iterator[Finding]:
    files = [("data.prompts", s.data.prompts)] + [(f"data.eval[{i}].path", e.path) for i, e in enumerate(s.data.eval)]
    for path, value in files:
        if value and not os.path.isfile(value):
            yield (path, f"file not found: {value}", "fix the path (relative paths are relative to the spec file)")
    for path, value in (("model.path", s.model.path), ("model.ref_path", s.model.ref_path)):
        if value and value != "initial" and not os.path.isdir(value):
            yield (path, f"checkpoint directory not found: {value}", "point it at an HF-format checkpoint dir")
    saved = s.debug.load_rollouts
    if saved and not os.path.isdir(saved):
        yield ("debug.load_rollouts", f"directory not found: {saved}", "point it at a run's tasks/<i>/rollouts dir")
