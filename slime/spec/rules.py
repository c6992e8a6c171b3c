"""Cross-field rules of RL training, checked on the resolved spec.

Each rule is a small function yielding ``(path, message, hint)``; ``check`` runs them all (these,
then the selected plug-ins' own: ``slime.spec.plugin``) and never stops early. The formulas follow
THUDM/slime's argument checks, except that where slime derives or drops a value silently (e.g. a
rollout GPU remainder) we reject it. No plug-in is named here: what one refuses, it says itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

from slime.spec.layout import LayoutError, plan_layout
from slime.spec.plugin import KINDS, Finding, Rule, hook, profiles, selected
from slime.spec.resolve import model_config, starts_engines, variable_count_reason
from slime.spec.types import BUILTIN_FILTERS, AsyncTrain, SandboxSpec, Spec, Tis

RULES: list[Rule] = []
WARNINGS: list[Rule] = []
RAW_RULES: list[Rule] = []  # run on the spec as written, before derived values are filled in
RAW_WARNINGS: list[Rule] = []  # warnings about what was written (resolve() changes it)

__all__ = [
    "RAW_RULES",
    "RAW_WARNINGS",
    "RULES",
    "WARNINGS",
    "all_rules",
    "attention_heads",
    "check",
    "check_raw",
    "over_context",
]


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
            "sequence parallelism does nothing with tensor 1; the trainer turns it off, and the resolved spec "
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
def warmup_fraction(s: Spec) -> Iterator[Finding]:
    """A warm-up given as a fraction needs the run's length, and is one of two ways to give it."""
    o, path = s.train.optimizer, "train.optimizer.warmup_fraction"
    if o.warmup_fraction is None:
        return
    if s.rollout.num_rollouts is None or s.train.num_steps_per_rollout is None:
        yield (
            path,
            "a warm-up fraction needs the run's optimizer steps, and rollout.num_rollouts is not known here",
            "set rollout.num_rollouts (or rollout.epochs with a readable data.prompts), or give warmup_steps",
        )
    elif o.warmup_steps != int(o.warmup_fraction * s.rollout.num_rollouts * s.train.num_steps_per_rollout):
        # resolve derives warmup_steps from the fraction: another value was written by hand
        yield (path, f"both warmup_fraction and warmup_steps ({o.warmup_steps}) are given", "keep one of them")


@rule
def plugin_sections(s: Spec) -> Iterator[Finding]:
    """A plug-in's section is read only when that plug-in is the one selected."""
    for kind, (_, section, attr) in KINDS.items():
        chosen = getattr(getattr(s, section), attr)
        for name, p in profiles(kind).items():
            if p.options is not None and name != chosen and getattr(getattr(s, section), name) is not None:
                yield (
                    f"{section}.{name}",
                    f"{section}.{name} holds settings of the {name} {kind.replace('_', ' ')}, but {section}.{attr} "
                    f"is {chosen!r}: nothing would read them",
                    f"remove {section}.{name}, or set {section}.{attr}: {name}",
                )


def _gpu_only(s: Spec) -> Iterator[tuple[str, str, str]]:
    """(field, 'the <name> <kind>', the CPU-capable names) for each selected backend that needs GPUs."""
    for kind in ("train_backend", "rollout_backend"):
        p, (_, section, attr) = selected(s, kind), KINDS[kind]
        if not p.cpu:
            cpu = " or ".join(n for n, q in profiles(kind).items() if q.cpu)
            yield f"{section}.{attr}", f"{p.name} {kind.replace('_', ' ')}", cpu


@rule
def devices(s: Spec) -> Iterator[Finding]:
    if not _gpu(s):
        for field, what, cpu_names in _gpu_only(s):
            yield (
                field,
                f"the {what} needs GPUs but cluster.gpus_per_node is 0",
                f"set cluster.gpus_per_node, or {field}: {cpu_names}",
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
    for field, what, cpu_names in _gpu_only(s):
        yield (
            field,
            f"the {what} needs CUDA; cluster.fake_gpus runs GPU slots on CPU",
            f"use {field}: {cpu_names} on fake GPUs, or remove cluster.fake_gpus on real GPU nodes",
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
            f"{world} trainer GPUs (the expert grid of expert-parallel training)",
            "pick expert (and expert_tensor) sizes whose product with pipeline divides the trainer GPU count",
        )


def attention_heads(cfg: dict | None) -> tuple[int | None, int | None]:
    """(attention heads, key/value heads) from an HF config.json, or (None, None)."""
    heads = (cfg or {}).get("num_attention_heads")
    if not isinstance(heads, int) or heads < 1:
        return None, None
    groups = cfg.get("num_key_value_heads")
    return heads, groups if isinstance(groups, int) and groups >= 1 else heads


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
def gpus_for_no_engines(s: Spec) -> Iterator[Finding]:
    """GPUs given to engines a job never starts would sit idle in its allocation."""
    if s.rollout.gpus and not starts_engines(s) and s.cluster.gpus_per_node:
        why = "debug.mode train_only" if s.debug.mode == "train_only" else "a kind SFTJob without data.eval"
        yield (
            "rollout.gpus",
            f"{why} starts no engines, so rollout.gpus={s.rollout.gpus} would reserve GPUs nothing uses",
            "remove rollout.gpus" + ("" if s.debug.mode == "train_only" else " (or add data.eval sets to generate)"),
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
    # external engines take none of the job's GPUs (rule external_engines); no engines, none (gpus_for_no_engines)
    if not _gpu(s) or r.external or not starts_engines(s):
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
def memory_fits(s: Spec) -> Iterator[Finding]:
    """Each role fits its GPU and a node's RAM (``slime.fit``: with a readable config.json and a known GPU)."""
    if s.cluster.gpu is not None:  # nothing to import (cold start) otherwise
        from slime.fit.check import fit_errors

        yield from fit_errors(s)


@warning
def memory_headroom(s: Spec) -> Iterator[Finding]:
    if s.cluster.gpu is not None:
        from slime.fit.check import fit_warnings

        yield from fit_warnings(s)


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
def weight_sync_support(s: Spec) -> Iterator[Finding]:
    """Weight-sync modes the runtime cannot carry out for this layout (an engine refuses its own)."""
    r, pipeline = s.rollout, s.train.parallel.pipeline
    if r.weight_sync == "nccl" and pipeline > 1:
        yield (
            "rollout.weight_sync",
            f"weight_sync nccl broadcasts the policy from trainer rank 0, which holds only the first of "
            f"{pipeline} pipeline stages",
            "use weight_sync: disk, or remove weight_sync (derived: disk when pipeline > 1)",
        )


@rule
def opd_teacher(s: Spec) -> Iterator[Finding]:
    """On-policy distillation: a teacher engine the job cannot start, a teacher of another vocabulary."""
    opd, r = s.algorithm.opd, s.rollout
    if opd is None:
        return
    if opd.type == "engine" and not selected(s, "rollout_backend").teacher:
        able = sorted(n for n, p in profiles("rollout_backend").items() if p.teacher)
        yield (
            "algorithm.opd.type",
            f"a teacher engine is started for rollout.backend {' or '.join(able)} only, not {r.backend} (its "
            "teacher server is not rendered or placed yet)",
            f"use type: trainer (the teacher forwards on the trainer ranks), or rollout.backend: {able[0]}",
        )
    if opd.type == "engine" and r.external:
        yield (
            "algorithm.opd.type",
            "a teacher engine shares engine 0's slot, and with rollout.external the job starts no engine",
            "use type: trainer (the teacher forwards on the trainer ranks)",
        )
    teacher, student = model_config(opd.teacher), model_config(s.model.path)
    vocab = [c.get("vocab_size") if c else None for c in (teacher, student)]
    if None not in vocab and vocab[0] != vocab[1]:
        yield (
            "algorithm.opd.teacher",
            f"the teacher's vocabulary has {vocab[0]} tokens, the student's (model.path) {vocab[1]}: its log-probs "
            "would score other tokens than the student sampled",
            "distil from a teacher with the student's tokenizer",
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
    n = s.rollout.num_rollouts
    if a.critic is not None and n is not None and a.critic.warmup_rollouts >= n:
        yield (
            "algorithm.critic.warmup_rollouts",
            f"critic-only warm-up of {a.critic.warmup_rollouts} rollout(s) leaves none of rollout.num_rollouts "
            f"({n}) to train the actor",
            f"set algorithm.critic.warmup_rollouts below {n}, or raise rollout.num_rollouts",
        )
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


_FULLY = "train.async mode fully"


@rule
def fully_async(s: Spec) -> Iterator[Finding]:
    """``train.async: {mode: fully}``: what it runs with (the built-in engine's stream) and what it refuses."""
    a, r = s.train.async_, s.rollout
    if not isinstance(a, AsyncTrain):
        return
    if a.mode != "fully":
        for name, default in (("max_staleness", 1), ("buffer_groups", None)):
            if getattr(a, name) != default:
                yield (
                    f"train.async.{name}",
                    "applies only to train.async mode fully",
                    f"remove {name}, or set mode: fully",
                )
        return
    if not selected(s, "rollout_backend").streams or r.external:
        streaming = sorted(n for n, p in profiles("rollout_backend").items() if p.streams)
        yield (
            "train.async.mode",
            f"{_FULLY} aborts and continues in-flight requests around each weight update; that is built for "
            f"rollout.backend {' or '.join(streaming)} only, not yet for "
            f"{'external engines' if r.external else r.backend}",
            f"use train.async: true (one step ahead), or rollout.backend: {streaming[0]}",
        )
    if s.debug.mode != "normal":
        yield (
            "train.async.mode",
            f"{_FULLY} needs engines and a trainer; debug.mode is {s.debug.mode}",
            "remove train.async",
        )
    if s.agent is not None:
        yield ("train.async.mode", f"{_FULLY} cannot abort agent episodes at a weight update", "use train.async: true")
    over = (r.over_sampling_batch_size or r.batch_size) != r.batch_size
    for name, on in (("dynamic_sampling", r.dynamic_sampling is not None), ("over_sampling_batch_size", over)):
        if on:
            yield (
                f"rollout.{name}",
                f"{_FULLY} trains on groups as they finish; no rollout to filter or over-draw",
                f"remove rollout.{name}",
            )
    for name in ("partial", "partial_mask_offpolicy"):
        if getattr(r, name):
            yield (
                f"rollout.{name}",
                f"{_FULLY} always continues the groups a weight update aborted",
                f"remove rollout.{name}",
            )
    if a.buffer_groups is not None and a.buffer_groups < r.batch_size:
        yield (
            "train.async.buffer_groups",
            f"a step trains on rollout.batch_size ({r.batch_size}) groups; the buffer holds {a.buffer_groups}",
            f"set buffer_groups >= {r.batch_size}, or leave it derived",
        )


@rule
def external_engines(s: Spec) -> Iterator[Finding]:
    """``rollout.external``: what engines the job did not start cannot do, and the token's reference."""
    r = s.rollout
    if not r.external:
        for name in ("external_frozen", "external_token_secret"):
            if getattr(r, name):
                yield (f"rollout.{name}", "applies only to external engines", "remove it, or set rollout.external")
        return
    fix = "remove rollout.external to let the job start its engines"
    if len(set(r.external)) < len(r.external):
        yield ("rollout.external", "an address is listed twice", "list each engine once")
    if r.colocate:
        yield ("rollout.colocate", "external engines cannot share the trainer's GPUs", f"set colocate: false, or {fix}")
    if r.gpus:
        yield ("rollout.gpus", f"external engines take no GPUs of the job, got {r.gpus}", f"remove it, or {fix}")
    if r.num_engines != len(r.external):
        yield (
            "rollout.num_engines",
            f"{r.num_engines} engine(s) but {len(r.external)} external address(es)",
            "remove rollout.num_engines (derived: one engine per address)",
        )
    if not r.external_frozen and r.weight_sync != "disk":
        yield (
            "rollout.weight_sync",
            f"weight_sync {r.weight_sync} to external engines is not supported; they load each update from disk",
            "use weight_sync: disk (on a file system both see), or rollout.external_frozen: true",
        )
    if s.model.path is None:
        yield ("model.path", "external engines serve a checkpoint the preflight names", "set model.path to it")
    if r.external_token_secret and r.external_token_secret not in s.cluster.secrets:
        yield (
            "rollout.external_token_secret",
            f"'{r.external_token_secret}' is not a cluster.secrets entry",
            f"add cluster.secrets.{r.external_token_secret}: {{file: PATH}} (or {{env: VAR}})",
        )
    if s.agent is not None:
        yield ("agent", "agentic rollouts on external engines are not supported yet", fix)


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


def over_context(s: Spec) -> str | None:
    r, ctx = s.rollout, s.model.max_context_len
    if ctx is not None and r.max_prompt_len + r.max_response_len > ctx:
        return (
            f"max_prompt_len + max_response_len = {r.max_prompt_len + r.max_response_len} exceeds the "
            f"model's context length {ctx}"
        )
    return None


def check_raw(spec: Spec) -> list[tuple[Literal["error", "warning"], Finding]]:
    """Rules about what was written (before ``resolve`` fills derived values), with their severity."""
    out: list[tuple[Literal["error", "warning"], Finding]] = [("error", f) for fn in RAW_RULES for f in fn(spec)]
    return out + [("warning", f) for fn in RAW_WARNINGS for f in fn(spec)]


def all_rules(*, check_paths: bool | Literal["warn"] = False) -> list[tuple[Literal["error", "warning"], Rule]]:
    """Every rule of the resolved spec with its severity (``check`` runs these); ``check_paths``:
    local files must exist (True), or a missing one is only a warning (``"warn"``, for previews)."""
    out: list[tuple[Literal["error", "warning"], Rule]] = [("error", fn) for fn in RULES]
    out += [("warning", fn) for fn in WARNINGS]
    out += [("error", _plugin_rules("RULES")), ("warning", _plugin_rules("WARNINGS"))]
    if check_paths:
        out.append(("warning" if check_paths == "warn" else "error", _paths))
    return out


def _plugin_rules(name: str) -> Rule:
    """The rules (``RULES`` or ``WARNINGS`` of its hooks) of each plug-in the spec selects."""

    def run(s: Spec) -> Iterator[Finding]:
        for kind in KINDS:
            for fn in hook(selected(s, kind), name, ()):
                yield from fn(s)

    run.__name__ = f"plugin_{name.lower()}"
    return run


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
    opd = s.algorithm.opd
    teacher = [("algorithm.opd.teacher", opd.teacher)] if opd is not None else []
    for path, value in (("model.path", s.model.path), ("model.ref_path", s.model.ref_path), *teacher):
        if value and value != "initial" and not os.path.isdir(value):
            yield (path, f"checkpoint directory not found: {value}", "point it at an HF-format checkpoint dir")
    saved = s.debug.load_rollouts
    if saved and not os.path.isdir(saved):
        yield ("debug.load_rollouts", f"directory not found: {saved}", "point it at a run's tasks/<i>/rollouts dir")


from slime.spec import sft_rules as _sft_rules  # noqa: E402,F401  (registers the kind SFTJob rules)
