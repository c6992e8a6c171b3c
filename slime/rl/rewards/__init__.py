"""Reward functions: the ``REWARDS`` registry, a factory, and batch scoring.

:data:`BUILTIN_REWARDS` are the ``reward.type`` names this package registers as entry points of group
``slime_submit.rewards``; installed packages add names the same way (``name = "pkg.mod:function"``), and
``REWARDS.register(name, "pkg.mod:fn")`` adds more at run time; such names, and a ``"pkg.mod:fn"`` given
as the type, are wrapped like ``custom`` functions. Every reward the factory returns is an async
``RewardFn``: ``await fn(sample) -> float``. Importing this package imports neither torch nor aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING, cast

from slime.core.registry import Registry
from slime.rl.plugins import RewardFn
from slime.rl.sample import Sample
from slime.spec.plugin import group_entry_points

if TYPE_CHECKING:
    from slime.rl.rewards.custom import SlimeArgs
    from slime.spec.types import Spec

__all__ = [
    "BUILTIN_REWARDS",
    "ENTRY_POINT_GROUP",
    "REWARDS",
    "batch_rewards",
    "make_reward_fn",
    "reward_from_spec",
    "reward_registry",
]

ENTRY_POINT_GROUP = "slime_submit.rewards"
# The built-in names are this distribution's entry points (pyproject.toml): one table, which the spec's
# reward.type choices are composed from too (slime.spec.types).
BUILTIN_REWARDS: dict[str, str] = {
    ep.name: ep.value
    for ep in group_entry_points(ENTRY_POINT_GROUP)
    if ep.dist is not None and ep.dist.name == "slime-submit"
}
_FACTORIES = frozenset({"remote", "custom"})  # built-ins that build a reward from reward.url / reward.custom


def reward_registry(installed: Iterable[EntryPoint] | None = None) -> Registry:
    """:data:`BUILTIN_REWARDS` plus the ``installed`` entry points (default: those of :data:`ENTRY_POINT_GROUP`);
    a built-in name wins over an installed one of the same name."""
    eps = group_entry_points(ENTRY_POINT_GROUP) if installed is None else installed
    return Registry("reward", {**{ep.name: ep.value for ep in eps}, **BUILTIN_REWARDS})


REWARDS = reward_registry()


def make_reward_fn(
    type: str,  # the spec field's name, hence the builtin's shadowing
    *,
    custom: str | None = None,
    url: str | None = None,
    timeout_s: float = 30.0,
    max_retries: int | None = None,
    key: str | None = None,
    args: SlimeArgs | None = None,
) -> RewardFn:
    """The async reward function for a spec's ``reward`` section (:func:`reward_from_spec` passes it all).

    ``url`` (with ``timeout_s`` and ``max_retries``, which has no default but the spec's) is for ``remote``
    only, ``custom`` for ``custom`` only and ``key`` for those two; giving one to another type is an error,
    so a typo in the type cannot silently score with the wrong function. ``args`` is what a custom function written in
    slime's ``(args, sample)`` convention receives.
    """
    scorer = type in BUILTIN_REWARDS and type not in _FACTORIES
    if key is not None and scorer:  # they return numbers; registered names may return dicts
        raise ValueError(f"reward.key is only used with reward.type 'custom' or 'remote', not {type!r}")
    if type == "remote":
        if not url:
            raise ValueError("reward.type 'remote' needs reward.url (the reward server's http(s) URL)")
        remote = REWARDS.get("remote")(url, timeout_s=timeout_s, max_retries=max_retries, key=key)
        return cast(RewardFn, remote)
    if url is not None:
        raise ValueError(f"reward.url is only used with reward.type 'remote', not {type!r}")
    if type == "custom":
        if not custom:
            raise ValueError("reward.type 'custom' needs reward.custom: 'package.module:function'")
        return cast(RewardFn, REWARDS.get("custom")(custom, args=args, key=key))
    if custom is not None:
        raise ValueError(f"reward.custom is only used with reward.type 'custom', not {type!r}")
    if scorer:
        return cast(RewardFn, REWARDS.get(type))
    from slime.rl.rewards.custom import wrap_reward

    # a registered name or "pkg.mod:fn"; else UnknownPlugin
    return wrap_reward(REWARDS.get(type), type, args=args, key=key)


def reward_from_spec(spec: Spec) -> RewardFn:
    """The reward function of a (resolved) spec, including the slime-named ``args`` for slime-style plug-ins."""
    from slime.migrate.slime_args import slime_args
    from slime.rl.rewards.custom import SlimeArgs

    r = spec.reward
    return make_reward_fn(
        r.type,
        custom=r.custom if r.type == "custom" else None,
        url=r.url if r.type == "remote" else None,
        timeout_s=r.timeout_s,
        max_retries=r.max_retries,
        key=r.key,
        args=SlimeArgs(**slime_args(spec)),
    )


async def batch_rewards(
    fn: RewardFn,
    samples: Sequence[Sample],
    concurrency: int = 64,
    *,
    assign: bool = True,
) -> list[float]:
    """Score ``samples`` with at most ``concurrency`` calls in flight; results in input order.

    With ``assign`` (default) each ``sample.reward`` is set too. If any call
    fails, the others are cancelled and the first error is raised (no sample is
    assigned a reward in that case).
    """
    if not (isinstance(concurrency, int) and concurrency >= 1):
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    gate = asyncio.Semaphore(concurrency)

    async def one(sample: Sample) -> float:
        async with gate:
            return float(await fn(sample))

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(s)) for s in samples]
    except ExceptionGroup as eg:
        raise eg.exceptions[0] from None  # one clear error, not a group
    rewards = [t.result() for t in tasks]
    if assign:
        for sample, reward in zip(samples, rewards, strict=True):
            sample.reward = reward
    return rewards
