"""The toy engine's rules, derived values and preview."""

from __future__ import annotations

import shlex

from msgspec.structs import replace


def replicas_fit(s):
    r = s.rollout
    if r.toy.replicas > r.gpus_per_engine:
        yield (
            "rollout.toy.replicas",
            f"{r.toy.replicas} replicas do not fit an engine of {r.gpus_per_engine} GPU(s)",
            "at most one replica per GPU",
        )


RULES = (replicas_fit,)


def resolve(spec):
    if spec.rollout.weight_sync is None:
        spec = replace(spec, rollout=replace(spec.rollout, weight_sync="disk"))
    return spec


def preview(spec):
    r = spec.rollout
    argv = ["toy-serve", "--replicas", str(r.toy.replicas)]
    for key, value in r.toy.args.items():
        argv += [f"--{key}", str(value)]
    return "toy engine commands", " ".join(shlex.quote(a) for a in argv)
