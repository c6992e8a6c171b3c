"""Typed contracts for the user plug-ins of the RL loop.

Each plug-in kind (``RewardFn``, ``GroupRewardFn``, ``GenerateFn``, ``RolloutFn``,
``DynamicFilter``) is a :class:`typing.Protocol`, so type checkers see the contract, and
:func:`check_plugin` turns a wrong plug-in (not callable, sync where async is required, wrong
arity) into one clear error at load time instead of a traceback deep inside a rollout.
Not guaranteed: :func:`check_plugin` inspects signatures only; return types are checked where the
value is used (e.g. rewards go through ``float``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from slime.rl.sample import Sample

__all__ = [
    "DynamicFilter",
    "FilterResult",
    "GenerateFn",
    "GroupRewardFn",
    "PluginContractError",
    "PluginKind",
    "RewardFn",
    "RolloutContext",
    "RolloutFn",
    "accepts_positional",
    "check_plugin",
    "is_async_callable",
    "maybe_await",
]


@runtime_checkable
class RolloutContext(Protocol):
    """What the runtime hands to generate plug-ins as ``ctx`` (the runtime's concrete, frozen one is
    ``slime.agent.context.GenerateContext``, built by the rollout manager).

    ``clients``: one ``EngineClient`` per engine (prompt group ``g`` uses ``clients[g % n]``);
    ``tokenizer``: the run's Hugging Face tokenizer; ``spec``: the resolved ``Spec``;
    ``reward_fn``: the run's reward."""

    @property
    def clients(self) -> Sequence[Any]: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def spec(self) -> Any: ...

    @property
    def reward_fn(self) -> RewardFn: ...


class RewardFn(Protocol):
    async def __call__(self, sample: Sample, /) -> float: ...


class GroupRewardFn(Protocol):
    async def __call__(self, samples: Sequence[Sample], /) -> list[float]: ...


class GenerateFn(Protocol):
    async def __call__(
        self, ctx: RolloutContext, sample: Sample, sampling_params: Mapping[str, Any], /
    ) -> Sample | list[Sample]: ...


class RolloutFn(Protocol):
    def __call__(
        self, ctx: Any, rollout_id: int, data_source: Any, /, *, evaluation: bool = False
    ) -> list[list[Sample]] | Awaitable[list[list[Sample]]]: ...


class FilterResult(NamedTuple):
    keep: bool
    reason: str = ""


class DynamicFilter(Protocol):
    def __call__(self, samples: Sequence[Sample], /) -> tuple[bool, str]: ...


PluginKind = Literal["reward", "group_reward", "generate", "rollout", "dynamic_filter"]

# kind -> (async required: True/False/None = either, positional arity, shape for messages)
_CONTRACTS: dict[str, tuple[bool | None, int, str]] = {
    "reward": (True, 1, "async def f(sample) -> float"),
    "group_reward": (True, 1, "async def f(samples) -> list[float]"),
    "generate": (True, 3, "async def f(ctx, sample, sampling_params) -> Sample | list[Sample]"),
    "rollout": (None, 3, "def f(ctx, rollout_id, data_source, *, evaluation=False)"),
    "dynamic_filter": (False, 1, "def f(samples) -> tuple[bool, str]"),
}


class PluginContractError(TypeError):
    """A plug-in whose signature does not match its contract."""


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and objects with an ``async def __call__``."""
    if inspect.iscoroutinefunction(fn):
        return True
    # instances whose class defines ``async def __call__``
    return inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))  # noqa: B004


def accepts_positional(fn: Callable[..., Any], n: int) -> bool:
    """True if ``fn`` can be called with ``n`` positional arguments (by its signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: give them the benefit
        return True
    try:
        sig.bind(*([None] * n))
    except TypeError:
        return False
    return True


def check_plugin(fn: object, kind: PluginKind, *, name: str = "") -> None:
    """Raise :class:`PluginContractError` if ``fn`` cannot serve as a ``kind`` plug-in.

    ``name`` (e.g. the spec field or dotted path) is included in the message.
    """
    if kind not in _CONTRACTS:
        raise ValueError(f"unknown plug-in kind {kind!r}; valid: {', '.join(_CONTRACTS)}")
    must_be_async, arity, shape = _CONTRACTS[kind]
    label = f"{kind} plug-in {name!r}" if name else f"{kind} plug-in"
    if not callable(fn):
        raise PluginContractError(f"{label} is not callable (got {type(fn).__name__}); expected {shape}")
    if must_be_async is True and not is_async_callable(fn):
        raise PluginContractError(f"{label} must be a coroutine function; expected {shape}")
    if must_be_async is False and is_async_callable(fn):
        raise PluginContractError(f"{label} must be a plain (sync) function; expected {shape}")
    if not accepts_positional(fn, arity):
        raise PluginContractError(f"{label} cannot be called with {arity} positional argument(s); expected {shape}")


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if it is awaitable (lets sync and async plug-ins share call sites)."""
    if inspect.isawaitable(value):
        return await value
    return value
