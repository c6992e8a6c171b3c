"""Fill every derived value so the resolved spec shows exactly what will run.

Nothing here is silent: each ``None`` documented as "derived" in
``slime.spec.types`` becomes a concrete value, and relative paths become
absolute (relative to the spec file's directory) so the job can run from any
working directory. Derivations never raise; impossible combinations are left
for ``slime.spec.rules`` to report.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from msgspec.structs import replace

from slime.spec.plugin import KINDS, hook, profiles, selected
from slime.spec.types import Algorithm, AsyncTrain, Critic, Model, Rollout, Spec, Train

__all__ = ["BUILTIN_CONTEXT", "DERIVED_FROM", "count_jsonl_rows", "model_config", "resolve", "variable_count_reason"]

# Which written fields each derived value is computed from (besides itself, when written).
# slime.spec.partial uses it to tell which rules an invalid field can affect; a test checks it
# against resolve() by changing each input and watching which derived values move.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "model.max_context_len": ("model.builtin", "model.path"),
    "model.tokenizer": ("model.path",),
    "model.critic_path": ("algorithm.estimator", "model.path"),
    "train.nodes": ("cluster.nodes",),
    "train.gpus_per_node": ("cluster.gpus_per_node",),
    "train.parallel.expert_tensor": ("train.parallel.tensor",),
    "train.parallel.sequence_parallel": ("train.parallel.tensor",),
    "rollout.gpus": (
        "rollout.colocate",
        "cluster.gpus_per_node",
        "train.nodes",
        "train.gpus_per_node",
        "rollout.external",
    ),
    "rollout.num_engines": ("cluster.gpus_per_node", "rollout.gpus", "rollout.gpus_per_engine", "rollout.external"),
    "rollout.num_rollouts": ("rollout.epochs", "data.prompts", "rollout.batch_size"),
    "rollout.over_sampling_batch_size": ("rollout.batch_size",),
    "train.async.buffer_groups": ("train.async.max_staleness", "rollout.batch_size"),
    "train.global_batch_size": ("rollout.batch_size", "rollout.n_samples_per_prompt", "train.num_steps_per_rollout"),
    "train.num_steps_per_rollout": (
        "rollout.batch_size",
        "rollout.n_samples_per_prompt",
        "train.global_batch_size",
        "rollout.dynamic_sampling",
        "rollout.partial",
        "agent",
        "debug.mode",
    ),
    "algorithm.eps_clip_high": ("algorithm.eps_clip",),
    "algorithm.normalize_std": ("rollout.n_samples_per_prompt", "algorithm.estimator"),
    "algorithm.critic": ("algorithm.estimator",),
    "logging.wandb.group": ("name",),
    "data.eval": ("rollout.max_response_len", "rollout.top_p", "rollout.top_k"),
}

# What the plug-ins' own resolve hooks derive, from their profiles; the selected one's section is filled
# with its defaults (``_plugins``), so a section depends on the field that selects the plug-in.
for _kind, (_, _section, _attr) in KINDS.items():
    for _p in profiles(_kind).values():
        if _p.options is not None:
            DERIVED_FROM[f"{_section}.{_p.name}"] = (f"{_section}.{_attr}",)
        for _path, _inputs in _p.derived.items():
            DERIVED_FROM[_path] = tuple(dict.fromkeys(DERIVED_FROM.get(_path, ()) + _inputs))

# The built-in tiny model's max_position_embeddings (slime.models.tiny).
BUILTIN_CONTEXT = 256
_GROUP_ESTIMATORS = ("grpo", "gspo", "cispo")
_COUNT_LIMIT_BYTES = 64 << 20  # count rows of prompt files up to this size at resolve time


def _abs(path: str | None, base: Path) -> str | None:
    if path is None or "://" in path:
        return path
    p = Path(os.path.expanduser(path))
    return str(p if p.is_absolute() else (base / p).resolve())


@functools.lru_cache(maxsize=64)
def model_config(path: str | None) -> dict | None:
    """The HF config.json of a local checkpoint dir, or None if it is not readable here."""
    if not path:
        return None
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def count_jsonl_rows(path: str) -> int | None:
    try:
        p = Path(path)
        if p.suffix == ".parquet":  # the row count is in the footer; pyarrow comes with the runtime extra
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(p).metadata.num_rows)
        if p.stat().st_size > _COUNT_LIMIT_BYTES:
            return None
        with p.open("rb") as fh:
            return sum(1 for line in fh if line.strip())
    except (OSError, ImportError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
        return None


def variable_count_reason(spec: Spec) -> str | None:
    """Why a rollout's sample count is not always batch_size x n_samples_per_prompt (None: it is)."""
    r = spec.rollout
    if r.dynamic_sampling is not None:
        return "rollout.dynamic_sampling keeps only the groups that pass its filter"
    if r.partial:
        return "rollout.partial trains groups continued from earlier rollouts"
    if spec.agent is not None:
        return "agent episodes that fork give several samples"
    if spec.debug.mode == "train_only":
        return "debug.mode train_only trains on saved rollouts"
    return None


def starts_engines(spec: Spec) -> bool:
    """Whether the job starts rollout engines: not to train on saved rollouts (debug train_only), nor for a
    kind SFTJob without eval sets (its engines only generate the held-out replies)."""
    return spec.debug.mode != "train_only" and not (spec.kind == "SFTJob" and not spec.data.eval)


def resolve(spec: Spec, base_dir: Path) -> Spec:
    """``spec`` with relative paths made absolute and every derived value filled in (see ``DERIVED_FROM``)."""
    spec = _absolute_paths(spec, base_dir)  # first: everything after may read files
    m = _model(spec)
    t = _train(spec)
    r = _rollout(spec, t)
    t = _batches(spec, t, r)
    spec = replace(spec, model=m, train=t, rollout=r, algorithm=_algorithm(spec))
    return _plugins(spec)


def _plugins(spec: Spec) -> Spec:
    """Each selected plug-in's section filled with its defaults, then its own derived values."""
    if spec.rollout.external and spec.rollout.weight_sync is None:  # an engine's own derivation does not apply
        spec = replace(spec, rollout=replace(spec.rollout, weight_sync="disk"))
    for kind, (_, section, _attr) in KINDS.items():
        p = selected(spec, kind)
        part = getattr(spec, section)
        if p.options is not None and getattr(part, p.name) is None:
            spec = replace(spec, **{section: replace(part, **{p.name: p.options()})})
        if (derive := hook(p, "resolve")) is not None:
            spec = derive(spec)
    if spec.rollout.weight_sync is None:
        spec = replace(spec, rollout=replace(spec.rollout, weight_sync="disk"))
    return spec


def _absolute_paths(spec: Spec, base_dir: Path) -> Spec:
    """Paths relative to the spec file made absolute; eval sets inherit the rollout's sampling limits."""
    m, t, r, d = spec.model, spec.train, spec.rollout, spec.data
    m = replace(
        m,
        path=_abs(m.path, base_dir),
        ref_path=m.ref_path if m.ref_path == "initial" else _abs(m.ref_path, base_dir),
        critic_path=_abs(m.critic_path, base_dir),
        tokenizer=_abs(m.tokenizer, base_dir),
    )
    d = replace(
        d,
        prompts=_abs(d.prompts, base_dir),
        eval=tuple(
            replace(
                e,
                path=_abs(e.path, base_dir),
                max_response_len=e.max_response_len if e.max_response_len is not None else r.max_response_len,
                top_p=e.top_p if e.top_p is not None else r.top_p,
                top_k=e.top_k if e.top_k is not None else r.top_k,
            )
            for e in d.eval
        ),
    )
    ckpt = replace(t.checkpoint, dir=_abs(t.checkpoint.dir, base_dir), load=_abs(t.checkpoint.load, base_dir))
    logging = replace(
        spec.logging,
        dir=_abs(spec.logging.dir, base_dir),
        wandb=replace(spec.logging.wandb, group=spec.logging.wandb.group or spec.name),
    )
    return replace(
        spec,
        model=m,
        data=d,
        train=replace(t, checkpoint=ckpt),
        logging=logging,
        debug=replace(spec.debug, load_rollouts=_abs(spec.debug.load_rollouts, base_dir)),
        algorithm=_opd_teacher(spec.algorithm, base_dir),
    )


def _opd_teacher(a: Algorithm, base_dir: Path) -> Algorithm:
    if a.opd is None:
        return a
    return replace(a, opd=replace(a.opd, teacher=_abs(a.opd.teacher, base_dir)))


def _model(spec: Spec) -> Model:
    m = spec.model
    cfg = model_config(m.path)
    if m.max_context_len is None:
        if m.builtin:
            m = replace(m, max_context_len=BUILTIN_CONTEXT)
        elif cfg and isinstance(cfg.get("max_position_embeddings"), int):
            m = replace(m, max_context_len=cfg["max_position_embeddings"])
    if m.tokenizer is None and m.path:
        m = replace(m, tokenizer=m.path)
    if spec.algorithm.estimator == "ppo" and m.critic_path is None:
        m = replace(m, critic_path=m.path)
    return m


def _train(spec: Spec) -> Train:
    c, t = spec.cluster, spec.train
    return replace(
        t,
        nodes=t.nodes if t.nodes is not None else c.nodes,
        gpus_per_node=t.gpus_per_node if t.gpus_per_node is not None else c.gpus_per_node,
        # sequence parallelism is off at tensor 1 (rules.py warns)
        parallel=replace(
            t.parallel,
            expert_tensor=t.parallel.expert_tensor or t.parallel.tensor,
            sequence_parallel=t.parallel.sequence_parallel and t.parallel.tensor > 1,
        ),
    )


def _rollout(spec: Spec, t: Train) -> Rollout:
    """Rollout GPUs, engines, weight sync and rollout count; ``t``: the resolved train section."""
    c, r = spec.cluster, spec.rollout
    actor_gpus = t.nodes * t.gpus_per_node
    gpus = r.gpus
    if gpus is None and not starts_engines(spec):
        gpus = 0
    if gpus is None and (r.colocate or c.gpus_per_node == 0):
        gpus = actor_gpus if c.gpus_per_node else 0
    num_engines = r.num_engines
    if num_engines is None and r.external:  # engines the job does not start: one per address
        num_engines = len(r.external)
    if num_engines is None:
        if c.gpus_per_node == 0:
            num_engines = 1
        elif gpus and gpus >= r.gpus_per_engine:
            num_engines = gpus // r.gpus_per_engine
    if r.external and gpus is None:  # no GPUs of the job for engines it does not start
        gpus = 0
    num_rollouts = r.num_rollouts
    if num_rollouts is None and r.epochs is not None:
        rows = count_jsonl_rows(spec.data.prompts)
        if rows is not None:
            num_rollouts = max(1, rows // r.batch_size) * r.epochs
    return replace(
        r,
        gpus=gpus,
        num_engines=num_engines,
        num_rollouts=num_rollouts,
        over_sampling_batch_size=r.over_sampling_batch_size or r.batch_size,
    )


def _batches(spec: Spec, t: Train, r: Rollout) -> Train:
    """``global_batch_size`` and ``num_steps_per_rollout``, each from the other and the samples per rollout."""
    samples = r.batch_size * r.n_samples_per_prompt
    gbs, steps = t.global_batch_size, t.num_steps_per_rollout
    if gbs is None and steps is None:
        steps = 1
    if gbs is None and steps and samples % steps == 0:
        gbs = samples // steps
    if steps is None and gbs and samples % gbs == 0:
        steps = samples // gbs
    if steps is None and gbs and variable_count_reason(spec) is not None:
        steps = max(1, round(samples / gbs))  # a nominal count: the runtime sizes each rollout's steps
    o = t.optimizer
    # a hand-written warmup_steps is kept (the warm-up rule refuses the pair); no length: the rule refuses it
    if o.warmup_fraction is not None and not o.warmup_steps and r.num_rollouts and steps:
        o = replace(o, warmup_steps=int(o.warmup_fraction * r.num_rollouts * steps))
    a = t.async_
    if isinstance(a, AsyncTrain) and a.mode == "fully" and a.buffer_groups is None:  # what the bound lets a step use
        a = replace(a, buffer_groups=a.max_staleness * r.batch_size)
    return replace(t, global_batch_size=gbs, num_steps_per_rollout=steps, optimizer=o, async_=a)


def _algorithm(spec: Spec) -> Algorithm:
    a, n = spec.algorithm, spec.rollout.n_samples_per_prompt
    return replace(
        a,
        eps_clip_high=a.eps_clip_high if a.eps_clip_high is not None else a.eps_clip,
        normalize_std=a.normalize_std if a.normalize_std is not None else (n > 1 and a.estimator in _GROUP_ESTIMATORS),
        critic=a.critic if a.critic is not None or a.estimator != "ppo" else Critic(),
    )
