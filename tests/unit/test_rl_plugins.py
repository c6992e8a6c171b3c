"""Plug-in contracts: check_plugin accepts the right shapes and names what is wrong."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from slime.rl.plugins import (
    FilterResult,
    PluginContractError,
    RolloutContext,
    check_plugin,
    maybe_await,
)
from slime.rl.sample import Sample


async def good_reward(sample: Sample) -> float:
    return 1.0


def sync_reward(sample: Sample) -> float:
    return 1.0


async def two_arg_reward(args: Any, sample: Sample) -> float:  # slime's old (args, sample) shape
    return 1.0


async def good_generate(ctx: Any, sample: Sample, sampling_params: Mapping[str, Any]) -> Sample:
    return sample


def good_rollout(ctx: Any, rollout_id: int, data_source: Any, *, evaluation: bool = False) -> list[list[Sample]]:
    return []


async def async_rollout(ctx: Any, rollout_id: int, data_source: Any, *, evaluation: bool = False) -> list[list[Sample]]:
    return []


def good_filter(samples: Sequence[Sample]) -> FilterResult:
    rewards = {s.reward for s in samples}
    return FilterResult(len(rewards) > 1, "all rewards equal" if len(rewards) <= 1 else "")


class AsyncCallable:
    async def __call__(self, samples: Sequence[Sample]) -> list[float]:
        return [0.0 for _ in samples]


def test_good_plugins_pass() -> None:
    check_plugin(good_reward, "reward")
    check_plugin(AsyncCallable(), "group_reward")
    check_plugin(good_generate, "generate")
    check_plugin(good_rollout, "rollout")
    check_plugin(async_rollout, "rollout")
    check_plugin(good_filter, "dynamic_filter")


def test_wrong_plugins_get_clear_errors() -> None:
    with pytest.raises(PluginContractError, match="reward plug-in 'pkg:sync_reward' must be a coroutine"):
        check_plugin(sync_reward, "reward", name="pkg:sync_reward")
    with pytest.raises(PluginContractError, match="cannot be called with 1 positional argument"):
        check_plugin(two_arg_reward, "reward")
    with pytest.raises(PluginContractError, match="is not callable \\(got int\\)"):
        check_plugin(3, "generate")
    with pytest.raises(PluginContractError, match="must be a plain \\(sync\\) function"):
        check_plugin(good_reward, "dynamic_filter")
    with pytest.raises(PluginContractError, match="cannot be called with 3"):
        check_plugin(good_reward, "rollout")
    with pytest.raises(ValueError, match="unknown plug-in kind 'rewards'"):
        check_plugin(good_reward, "rewards")  # type: ignore[arg-type]


def test_filter_result_is_a_keep_reason_tuple() -> None:
    samples = [Sample(reward=1.0), Sample(reward=1.0)]
    keep, reason = good_filter(samples)
    assert (keep, reason) == (False, "all rewards equal")
    assert good_filter([Sample(reward=0.0), Sample(reward=1.0)]) == (True, "")


def test_rollout_context_protocol_and_maybe_await() -> None:
    class Ctx:
        clients = ()
        tokenizer = object()
        spec = object()
        reward_fn = good_reward

    assert isinstance(Ctx(), RolloutContext)
    assert not isinstance(object(), RolloutContext)
    # the runtime's concrete context (built by the rollout manager) satisfies the plug-ins' contract
    from slime.agent.context import GenerateContext
    from slime.backends.rollout.client import EngineClient

    ctx = GenerateContext(
        clients=(EngineClient("http://127.0.0.1:1"),), tokenizer=object(), spec=object(), reward_fn=good_reward
    )
    assert isinstance(ctx, RolloutContext)
    with pytest.raises(ValueError, match="at least one engine client"):
        GenerateContext(clients=(), tokenizer=object(), spec=object(), reward_fn=good_reward)

    async def run() -> tuple[Any, Any]:
        return await maybe_await(good_reward(Sample())), await maybe_await(2.0)

    assert asyncio.run(run()) == (1.0, 2.0)
