"""Reward functions: the ``REWARDS`` registry, a factory, and batch scoring.

Built-in types (``reward.type`` in a spec):

- ``exact``  normalised string equality of the final answer and the label
- ``math``   last ``\\boxed{}`` (or last number) compared after normalisation
- ``dapo``   slime's DAPO grader: +1/-1, the last ``Answer:`` in the last 300 characters
- ``deepscaler`` slime's deepscaler rule: a ``\\boxed{}`` answer after ``</think>``, else 0
- ``f1``     SQuAD token F1 of the final answer and the label
- ``remote`` POST to a reward server (``url``), with bounded retries
- ``custom`` a user ``"package.module:function"`` (sync or async; ``f(sample)`` or slime's ``f(args, sample)``)

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
    from slime.rl.rewards.custom import SlimeArgs
    from slime.spec.types import Spec

__all__ = ["REWARDS", "batch_rewards", "make_reward_fn", "reward_from_spec"]

REWARDS = Registry(
    "reward",
    {
        "exact": "slime.rl.rewards.string_match:exact_reward",
        "math": "slime.rl.rewards.math_answer:math_reward",
        "dapo": "slime.rl.rewards.dapo:dapo_reward",
        "deepscaler": "slime.rl.rewards.deepscaler:deepscaler_reward",
        "f1": "slime.rl.rewards.string_match:f1_reward",
        "remote": "slime.rl.rewards.remote:RemoteReward",
        "custom": "slime.rl.rewards.custom:load_custom_reward",
    },
)
_BUILTIN_FNS = ("exact", "math", "dapo", "deepscaler", "f1")


def make_reward_fn(
    type: str,  # the spec field's name, hence the builtin's shadowing
    *,
    custom: str | None = None,
    url: str | None = None,
    timeout_s: float = 30.0,
    max_retries: int = 5,
    key: str | None = None,
    args: SlimeArgs | None = None,
) -> RewardFn:
    """The async reward function for a spec's ``reward`` section (:func:`reward_from_spec` passes it all).

    ``url`` (with ``timeout_s``, ``max_retries``) is for ``remote`` only, ``custom`` for ``custom``
    only and ``key`` for those two; giving one to another type is an error, so a typo in the type
    cannot silently score with the wrong function. ``args`` is what a custom function written in
    slime's ``(args, sample)`` convention receives.
    """
    if key is not None and type in _BUILTIN_FNS:  # they return numbers; registered names may return dicts
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
    if type in _BUILTIN_FNS:
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
