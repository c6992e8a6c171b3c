"""The spec ``slime-submit smoke`` runs: the user's resolved spec, scaled down to the embedded CPU default.

:func:`scale_down` builds a new :class:`~slime.spec.types.Spec` from a resolved, validated one and
returns it in a :class:`SmokePlan` with every :class:`Change` (field, before, after, why) and what
the changes leave untested. Pure, but for ``cluster.cpus_per_node`` (derived from this machine).
Changed: placement, model, trainer, engines, size and logging; kept: data, reward, algorithm,
optimizer, agent and sampling settings; secrets that do not resolve here are dropped and listed.
Not guaranteed: that a spec passing the smoke fits its GPUs or that its engines accept their
settings (:func:`untested` lists what is left out).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import fields, replace

from slime.spec.plugin import KINDS, default_profile, hook, profiles, selected
from slime.spec.resolve import resolve
from slime.spec.types import Parallel, Spec

__all__ = [
    "MAX_EVAL_PROMPTS",
    "MAX_EVAL_SAMPLES",
    "MAX_PROMPTS",
    "MAX_SAMPLES",
    "MAX_SFT_STEPS",
    "TINY_CONTEXT",
    "Change",
    "SmokePlan",
    "scale_down",
    "untested",
]

MAX_PROMPTS = 4  # rollout.batch_size
MAX_SAMPLES = 4  # rollout.n_samples_per_prompt
MAX_SFT_STEPS = 2
MAX_EVAL_PROMPTS = 8
MAX_EVAL_SAMPLES = 2
MAX_RESPONSE = 64  # when prompt + response do not fit the tiny context
TINY_CONTEXT = 256  # slime.spec.resolve.BUILTIN_CONTEXT (the tiny model's max_position_embeddings)


@dataclass(frozen=True)
class Change:
    """One field the smoke changed: ``path`` (dotted, as in ``--set``), its value before and after, why."""

    path: str
    before: Any
    after: Any
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "before": _plain(self.before), "after": _plain(self.after), "reason": self.reason}


@dataclass(frozen=True)
class SmokePlan:
    spec: Spec  # the scaled-down spec, resolved (the caller validates it by loading SmokePlan.yaml)
    changes: tuple[Change, ...]
    untested: tuple[str, ...]
    rollouts: int

    @property
    def yaml(self) -> str:
        """The scaled, resolved spec as YAML (loading it resolves it again to the same values)."""
        import io

        from ruamel.yaml import YAML

        y = YAML(typ="safe", pure=True)
        y.default_flow_style = False
        buf = io.StringIO()
        y.dump(_plain(self.spec), buf)
        return buf.getvalue()


def _plain(value: Any) -> Any:
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct | tuple | dict) else value


# ----------------------------------------------------------------------------- edits
Edit = tuple[str, Any, str]  # (dotted path, new value, reason)


def _plugins(s: Spec) -> Iterator[Edit]:
    """Each kind's default plug-in (the embedded CPU default); the others' sections dropped, the
    selected ones' own smoke edits."""
    for kind, (_, section, attr) in KINDS.items():
        target, chosen = default_profile(kind), selected(s, kind)
        yield f"{section}.{attr}", target.name, f"the embedded default {kind.replace('_', ' ')} (runs on this CPU)"
        if target.options is not None:  # unchanged here; resolving fills its defaults, which the list must show
            own = f"{section}.{target.name}"
            yield own, _get(s, _parts(own)), f"the {target.name} {kind.replace('_', ' ')}'s settings: its defaults"
        for name, p in profiles(kind).items():
            if p.options is not None and name != target.name:
                yield f"{section}.{name}", None, f"settings of the {name} {kind.replace('_', ' ')}"
        yield from hook(chosen, "smoke_edits", lambda _: ())(s)


def _cluster() -> Iterator[Edit]:
    yield "cluster.nodes", 1, "one machine"
    yield "cluster.gpus_per_node", 0, "CPU only: the embedded trainer and engine"
    yield "cluster.fake_gpus", False, "no GPU slots to fake on a CPU-only run"
    yield "cluster.cpus_per_node", None, "derived from this machine"
    yield "cluster.network_interface", None, "an interface of the cluster's nodes, not of this machine"


def _model(s: Spec) -> Iterator[Edit]:
    m = s.model
    if m.path is not None:
        yield "model.path", None, "your checkpoint does not fit a CPU smoke; the built-in tiny model runs instead"
    yield "model.builtin", "tiny", "the embedded default's model"
    yield "model.tokenizer", None, "the tiny model's own (one token per character)"
    yield "model.max_context_len", None, f"derived: the tiny model's {TINY_CONTEXT} tokens"
    yield "model.critic_path", None, "the critic starts from the tiny policy"
    if m.ref_path not in (None, "initial"):
        yield "model.ref_path", "initial", "your reference checkpoint is for your model; the tiny model's is its start"


def _train(s: Spec, samples: int) -> Iterator[Edit]:
    t = s.train
    yield "train.nodes", None, "derived: one node"
    yield "train.gpus_per_node", None, "derived: one CPU rank"
    for f in fields(Parallel):  # every model-parallel size back to 1 (one CPU rank)
        yield f"train.parallel.{f.encode_name}", f.default, "one CPU rank: data parallel only"
    yield "train.precision", "fp32", "CPU training is fp32"
    yield "train.optimizer.distributed", None, "derived by the embedded trainer"
    yield "train.checkpoint.dir", None, "checkpoints go into the smoke's run dir"
    yield "train.checkpoint.load", None, "your checkpoint is for your model"
    steps = t.num_steps_per_rollout or 1
    if samples % steps:
        steps = 1
    yield "train.num_steps_per_rollout", steps, "the same optimizer steps per rollout where they divide the samples"
    gbs = samples // steps
    yield "train.global_batch_size", gbs, f"{samples} samples per rollout / {steps} step(s)"
    mbs = max(d for d in range(1, min(t.micro_batch_size, gbs) + 1) if gbs % d == 0)
    yield "train.micro_batch_size", mbs, "at most your micro-batch size, dividing the smaller global batch"


def _rollout(s: Spec, rollouts: int, prompts: int, n: int) -> Iterator[Edit]:
    r = s.rollout
    yield "rollout.gpus", None, "derived: no GPUs"
    yield "rollout.gpus_per_engine", 1, "the embedded engine runs on one device"
    yield "rollout.num_engines", None, "derived: one engine on CPU"
    yield "rollout.num_rollouts", rollouts, "a smoke run"
    yield "rollout.epochs", None, "rollout.num_rollouts decides"
    yield "rollout.batch_size", prompts, f"at most {MAX_PROMPTS} prompts per rollout"
    yield "rollout.n_samples_per_prompt", n, f"at most {MAX_SAMPLES} samples per prompt"
    over = r.over_sampling_batch_size or r.batch_size
    yield (
        "rollout.over_sampling_batch_size",
        None if over == r.batch_size else max(prompts, math.ceil(over * prompts / r.batch_size)),
        "in the same proportion to rollout.batch_size",
    )
    if r.dynamic_sampling is not None and r.dynamic_sampling.filter == "nonzero_std":
        # a 2-step warm-up of the tiny model gives mostly flat groups: the plain filter could drop them all
        # and leave no sample to train, sync or checkpoint (a custom filter is kept: it is what you test)
        yield (
            "rollout.dynamic_sampling.filter",
            "nonzero_std_with_fallback",
            "the same filter, but flat groups are trained on when no other passed (the tiny model's rewards "
            "are mostly equal), so every stage has samples",
        )
    if r.max_prompt_len + r.max_response_len > TINY_CONTEXT:
        response = min(r.max_response_len, MAX_RESPONSE)
        why = f"prompt + response must fit the tiny model's {TINY_CONTEXT}-token context"
        yield "rollout.max_response_len", response, why
        yield "rollout.max_prompt_len", min(r.max_prompt_len, TINY_CONTEXT - response), why


def _rest(s: Spec, logging_dir: str) -> Iterator[Edit]:
    for i, e in enumerate(s.data.eval):
        yield f"data.eval[{i}].max_prompts", min(e.max_prompts or MAX_EVAL_PROMPTS, MAX_EVAL_PROMPTS), "a short eval"
        yield (
            f"data.eval[{i}].n_samples_per_prompt",
            min(e.n_samples_per_prompt, MAX_EVAL_SAMPLES),
            f"at most {MAX_EVAL_SAMPLES} samples per eval prompt",
        )
    a = s.algorithm
    yield (
        "algorithm.sft_warmup_steps",
        min(a.sft_warmup_steps, MAX_SFT_STEPS),
        "the warm-up's code path, not its effect",
    )
    yield "logging.dir", logging_dir, "the smoke's own directory"
    yield "logging.wandb.mode", "disabled", "a smoke run creates no W&B run"
    yield "cluster.env", {**s.cluster.env, "WANDB_MODE": "disabled"}, "$WANDB_MODE would override logging.wandb.mode"
    yield "logging.progress", False, "the smoke prints its own report"


def _secrets(s: Spec, missing: frozenset[str]) -> Iterator[Edit]:
    kept = {k: v for k, v in s.cluster.secrets.items() if k not in missing}
    if missing & set(s.cluster.secrets):
        yield (
            "cluster.secrets",
            kept,
            f"not set here: {', '.join(sorted(missing))} (a smoke needs no production secret)",
        )


# ----------------------------------------------------------------------------- applying edits
def _parts(path: str) -> list[str | int]:
    out: list[str | int] = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        out.append(name)
        if index:
            out.append(int(index.rstrip("]")))
    return out


def _attr(struct: msgspec.Struct, encoded: str) -> str:
    """The Python attribute of a field written ``encoded`` in the spec (``lambda`` -> ``lam``)."""
    return next(f.name for f in fields(struct) if f.encode_name == encoded)


def _get(obj: Any, parts: list[str | int]) -> Any:
    for p in parts:
        obj = obj[p] if isinstance(p, int) else getattr(obj, _attr(obj, p))
    return obj


def _put(obj: Any, parts: list[str | int], value: Any) -> Any:
    head, rest = parts[0], parts[1:]
    if isinstance(head, int):
        items = list(obj)
        items[head] = _put(items[head], rest, value) if rest else value
        return tuple(items)
    name = _attr(obj, head)
    return replace(obj, **{name: _put(getattr(obj, name), rest, value) if rest else value})


def scale_down(
    spec: Spec, *, rollouts: int = 2, logging_dir: str, tasks: int = 1, missing_secrets: frozenset[str] = frozenset()
) -> SmokePlan:
    """The smoke's version of the resolved ``spec`` (see the module doc): ``rollouts`` >= 1; ``tasks``:
    how many sweep tasks the spec had (this is one of them); ``missing_secrets``: the ``cluster.secrets``
    whose reference does not resolve here (dropped: a smoke needs no production secret)."""
    if rollouts < 1:
        raise ValueError(f"a smoke run needs at least 1 rollout, got {rollouts}")
    r = spec.rollout
    prompts, n = min(r.batch_size, MAX_PROMPTS), min(r.n_samples_per_prompt, MAX_SAMPLES)
    edits = [
        *_plugins(spec),
        *_cluster(),
        *_model(spec),
        *_train(spec, prompts * n),
        *_rollout(spec, rollouts, prompts, n),
        *_rest(spec, logging_dir),
        *_secrets(spec, missing_secrets),
    ]
    out = spec
    for path, value, _ in edits:
        out = _put(out, _parts(path), value)
    # Derived values reset above are derived again for the new setting (resolve reads no file for
    # the built-in model: every path is already absolute); a change is what differs afterwards.
    out = resolve(out, Path("/"))
    changes = []
    for path, _, reason in edits:
        before, after = _get(spec, _parts(path)), _get(out, _parts(path))
        if before != after:
            changes.append(Change(path, before, after, reason))
    left_out = tuple(f"secret {n} (not set here; the smoke ran without it)" for n in sorted(missing_secrets))
    return SmokePlan(
        spec=out, changes=tuple(changes), untested=untested(spec, tasks=tasks) + left_out, rollouts=rollouts
    )


# ----------------------------------------------------------------------------- what it leaves out
def untested(spec: Spec, *, tasks: int = 1) -> tuple[str, ...]:
    """What a smoke of ``spec`` cannot show, given what it changes (plain sentences, most important first)."""
    t, r, c, m = spec.train, spec.rollout, spec.cluster, spec.model
    out: list[str] = []
    if m.path is not None:
        out.append(f"your model ({m.path}): its config, tokenizer, chat template, context length and memory")
    for kind in KINDS:
        out += hook(selected(spec, kind), "untested", lambda _: ())(spec)
    if r.weight_sync == "nccl":
        out.append("NCCL itself: the same collective weight sync ran over gloo")
    elif r.weight_sync == "delta":
        out.append("delta weight sync (disk sync ran instead)")
    if c.nodes > 1 or c.gpus_per_node > 0:
        out.append(
            f"{c.nodes} node(s) x {c.gpus_per_node} GPU(s): the GPU preflight, placement, multi-node Ray and "
            "collectives"
        )
    if t.checkpoint.load or t.checkpoint.dir:
        out.append("your checkpoint directory and train.checkpoint.load")
    if spec.logging.wandb.mode != "disabled":
        out.append("W&B logging")
    if tasks > 1:
        out.append(f"the other {tasks - 1} sweep task(s)")
    out.append("full-size batches and lengths, learning itself, throughput and memory")
    return tuple(out)
