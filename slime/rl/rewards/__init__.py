"""Reward functions: the ``REWARDS`` registry, a factory, and batch scoring.

Built-in types (``reward.type`` in a spec):

- ``exact``  normalised string equality of the final answer and the label
- ``math``   last ``\\boxed{}`` (or last number) compared after normalisation
- ``f1``     SQuAD token F1 of the final answer and the label
- ``remote`` POST to a reward server (``url``), with bounded retries
- ``custom`` a user ``"package.module:function"`` (sync or async)

Every reward the factory returns is an async ``RewardFn``: ``await fn(sample) ->
float``. Names registered later with ``REWARDS.register(name, "pkg.mod:fn")``
are wrapped like ``custom`` functions, and a ``"pkg.mod:fn"`` string given as the
type is treated as ``custom``. Importing this package imports neither torch nor
aiohttp; the remote reward imports aiohttp when it is first used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from slime.core.registry import Registry
from slime.rl.plugins import RewardFn
from slime.rl.sample import Sample

if TYPE_CHECKING:
    from slime.spec.types import Reward

__all__ = ["REWARDS", "batch_rewards", "make_reward_fn", "reward_fn_for"]

REWARDS = Registry(
    "reward",
    {
        "exact": "slime.rl.rewards.string_match:exact_reward",
        "math": "slime.rl.rewards.math_answer:math_reward",
        "f1": "slime.rl.rewards.string_match:f1_reward",
        "remote": "slime.rl.rewards.remote:RemoteReward",
        "custom": "slime.rl.rewards.custom:load_custom_reward",
    },
)
_BUILTIN_FNS = ("exact", "math", "f1")


def make_reward_fn(
    type: str,  # the spec field's name, hence the builtin's shadowing
    *,
    custom: str | None = None,
    url: str | None = None,
    timeout_s: float = 30.0,
    max_retries: int = 5,
) -> RewardFn:
    """The async reward function for a spec's ``reward`` section.

    ``url`` (with ``timeout_s``, ``max_retries``) is for ``remote`` only and
    ``custom`` for ``custom`` only; giving either to another type is an error, so
    a typo in the type cannot silently score with the wrong function.
    """
    if type == "remote":
        if not url:
            raise ValueError("reward.type 'remote' needs reward.url (the reward server's http(s) URL)")
        remote = REWARDS.get("remote")(url, timeout_s=timeout_s, max_retries=max_retries)
        return cast(RewardFn, remote)
    if url is not None:
        raise ValueError(f"reward.url is only used with reward.type 'remote', not {type!r}")
    if type == "custom":
        if not custom:
            raise ValueError("reward.type 'custom' needs reward.custom: 'package.module:function'")
        return cast(RewardFn, REWARDS.get("custom")(custom))
    if custom is not None:
        raise ValueError(f"reward.custom is only used with reward.type 'custom', not {type!r}")
    if type in _BUILTIN_FNS:
        return cast(RewardFn, REWARDS.get(type))
    from slime.rl.rewards.custom import wrap_reward

    return wrap_reward(REWARDS.get(type), type)  # registered name or "pkg.mod:fn"; else UnknownPlugin


def reward_fn_for(reward: Reward) -> RewardFn:
    """:func:`make_reward_fn` for a spec's ``reward`` section (its fields that apply to its type)."""
    return make_reward_fn(
        reward.type,
        custom=reward.custom if reward.type == "custom" else None,
        url=reward.url if reward.type == "remote" else None,
        timeout_s=reward.timeout_s,
        max_retries=reward.max_retries,
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
