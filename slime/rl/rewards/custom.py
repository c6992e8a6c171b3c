"""The ``custom`` reward: a user function named ``"package.module:function"``.

The function takes one :class:`~slime.rl.sample.Sample` and returns a number
(``bool`` counts as 1.0/0.0). It may be ``async def`` (awaited on the event
loop) or a plain function, which runs in a worker thread (``asyncio.to_thread``)
so that a scorer doing blocking I/O does not stall concurrent generation. A
plain function must therefore be thread-safe.

Guaranteed: a bad path, a non-callable, a function that cannot take one
positional argument, or a non-numeric/non-finite return value raises a clear
error naming the path. Not guaranteed: CPU-bound sync scorers run in parallel
(threads share the GIL).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from slime.registry import load_object
from slime.rl.plugins import (
    PluginContractError,
    RewardFn,
    accepts_positional,
    is_async_callable,
    maybe_await,
)
from slime.rl.sample import Sample

__all__ = ["RewardValueError", "load_custom_reward", "wrap_reward"]


class RewardValueError(ValueError):
    """A reward function returned something that is not a finite number."""


def _to_reward(value: Any, name: str) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise RewardValueError(
            f"reward function {name!r} returned {type(value).__name__} {value!r:.80}; "
            "it must return a number"
        ) from None
    if not math.isfinite(reward):
        raise RewardValueError(
            f"reward function {name!r} returned {reward}; rewards must be finite"
        )
    return reward


def wrap_reward(fn: Callable[..., Any], name: str) -> RewardFn:
    """Turn a sync or async ``fn(sample) -> number`` into an async ``RewardFn`` returning float."""
    if not callable(fn):
        raise PluginContractError(f"reward {name!r} is not callable (got {type(fn).__name__})")
    if not accepts_positional(fn, 1):
        raise PluginContractError(
            f"reward {name!r} cannot be called with one argument; expected def f(sample) -> float"
        )
    if is_async_callable(fn):

        async def reward(sample: Sample) -> float:
            return _to_reward(await fn(sample), name)

    else:

        async def reward(sample: Sample) -> float:
            return _to_reward(await maybe_await(await asyncio.to_thread(fn, sample)), name)

    reward.__qualname__ = reward.__name__ = f"reward[{name}]"
    return reward


def load_custom_reward(path: str) -> RewardFn:
    """Import ``"package.module:function"`` and wrap it; ``UnknownPlugin`` if it is absent."""
    return wrap_reward(load_object(path), path)
