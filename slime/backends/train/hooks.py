"""The torch train backend's rules and derived values: data parallel only, one optimizer copy per rank."""

from __future__ import annotations

from collections.abc import Iterator

from msgspec.structs import replace

from slime.spec.plugin import Finding

__all__ = ["RULES", "resolve"]


def data_parallel_only(s) -> Iterator[Finding]:
    p = s.train.parallel
    etp = p.expert_tensor or p.tensor
    if p.tensor * p.pipeline * p.context > 1 or p.expert > 1 or etp > 1:
        yield (
            "train.parallel",
            "the torch backend is data-parallel only (tensor/pipeline/context/expert must be 1)",
            "use a model-parallel train backend (train.backend) for model parallelism",
        )


def unsharded_optimizer(s) -> Iterator[Finding]:
    if s.train.optimizer.distributed:
        yield (
            "train.optimizer.distributed",
            "the torch backend keeps a full optimizer copy on every data-parallel rank; it cannot shard it",
            "remove train.optimizer.distributed (derived: false with torch), or use a sharding train backend",
        )


RULES = (data_parallel_only, unsharded_optimizer)


def resolve(spec):
    """``train.optimizer.distributed``: false (a full copy per rank)."""
    o = spec.train.optimizer
    if o.distributed is None:
        spec = replace(spec, train=replace(spec.train, optimizer=replace(o, distributed=False)))
    return spec
