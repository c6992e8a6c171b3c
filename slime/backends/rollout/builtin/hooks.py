"""The built-in engine's rules and derived values: one device per engine, its own options, disk sync."""

from __future__ import annotations

from collections.abc import Iterator

from msgspec.structs import replace

from slime.backends.rollout.builtin.args import BUILTIN_ENGINE_ARGS, builtin_engine_arg
from slime.spec.plugin import Finding
from slime.spec.rules import over_context

__all__ = ["RULES", "WARNINGS", "resolve"]


def one_device(s) -> Iterator[Finding]:
    n = s.rollout.gpus_per_engine
    if n > 1:
        yield (
            "rollout.gpus_per_engine",
            f"the built-in engine runs on one device; gpus_per_engine {n} would leave {n - 1} of each engine's "
            f"{n} GPUs idle",
            "set rollout.gpus_per_engine: 1 (more GPUs give more engines), or an engine with tensor parallelism",
        )


def known_args(s) -> Iterator[Finding]:
    for key in s.rollout.builtin.args:
        if builtin_engine_arg(key) is None:
            yield (
                f"rollout.builtin.args.{key}",
                f"'{key}' is not an option of the built-in engine",
                f"valid: {', '.join(BUILTIN_ENGINE_ARGS)}",
            )


def no_delta(s) -> Iterator[Finding]:
    if s.rollout.weight_sync == "delta":
        yield (
            "rollout.weight_sync",
            "delta weight sync is not implemented for the built-in engine; it would load every tensor from "
            "disk each time",
            "use weight_sync: disk (or remove it)",
        )


def long_responses(s) -> Iterator[Finding]:
    if over := over_context(s):
        yield ("rollout.max_response_len", f"{over}; the built-in engine stops responses at the context", None)


RULES = (one_device, known_args, no_delta)
WARNINGS = (long_responses,)


def resolve(spec):
    """``rollout.weight_sync``: disk."""
    if spec.rollout.weight_sync is None:
        spec = replace(spec, rollout=replace(spec.rollout, weight_sync="disk"))
    return spec
