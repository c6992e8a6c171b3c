"""The ``custom`` reward: a user function named ``"package.module:function"``.

The function takes one :class:`~slime.rl.sample.Sample` and returns a number
(``bool`` counts as 1.0/0.0). It may be ``async def`` (awaited on the event
loop) or a plain function, which runs in a worker thread (``asyncio.to_thread``)
so that a scorer doing blocking I/O does not stall concurrent generation. A
plain function must therefore be thread-safe.

Guaranteed: a bad path, a non-callable, a function that cannot take one
positional argument, or a non-numeric/non-finite return value raises a clear
error naming the path; an exception the function raises becomes a
:class:`RewardFunctionError` (a user error, exit 2) naming the path, the exception and the
innermost frame of the user's code. Not guaranteed: CPU-bound sync scorers run in parallel
(threads share the GIL).
"""

from __future__ import annotations

import asyncio
import math
import os
import sysconfig
import traceback
from collections.abc import Callable
from typing import Any

from slime.core.registry import load_object
from slime.rl.plugins import (
    PluginContractError,
    RewardFn,
    accepts_positional,
    is_async_callable,
    maybe_await,
)
from slime.rl.sample import Sample

__all__ = ["RewardFunctionError", "RewardValueError", "load_custom_reward", "wrap_reward"]


class RewardValueError(ValueError):
    """A reward function returned something that is not a finite number."""


class RewardFunctionError(ValueError):
    """A reward function raised: the user's code failed, not the runtime (exit 2, not "a bug")."""


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


# Frames in these are not the user's: the interpreter's library, installed packages, slime itself.
_SLIME_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
_LIB_DIRS = [sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
_NOT_USER = tuple({_norm(p) + os.sep for p in (*_LIB_DIRS, _SLIME_DIR) if p})


def _user_frame(exc: BaseException, fn: Callable[..., Any]) -> str:
    """`` (at file:line in function)``: the innermost frame of the user's code (the function's own
    file counts even when installed), else the innermost frame."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if not frames:
        return ""
    code = getattr(fn, "__code__", None)
    home = _norm(code.co_filename) if code is not None else None
    mine = [
        f
        for f in frames
        if not f.filename.startswith("<") and (_norm(f.filename) == home or not _norm(f.filename).startswith(_NOT_USER))
    ]
    f = (mine or frames)[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def _raised(exc: Exception, fn: Callable[..., Any], name: str) -> RewardFunctionError:
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return RewardFunctionError(
        f"reward function {name!r} raised {what}{_user_frame(exc, fn)}; "
        "fix the function (it must return a number for every sample)"
    )


def _to_reward(value: Any, name: str) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise RewardValueError(
            f"reward function {name!r} returned {type(value).__name__} {value!r:.80}; it must return a number"
        ) from None
    if not math.isfinite(reward):
        raise RewardValueError(f"reward function {name!r} returned {reward}; rewards must be finite")
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
            try:
                value = await fn(sample)
            except Exception as exc:  # the user's bug, reported as such (not a runtime traceback)
                raise _raised(exc, fn, name) from exc
            return _to_reward(value, name)

    else:

        async def reward(sample: Sample) -> float:
            try:
                value = await maybe_await(await asyncio.to_thread(fn, sample))
            except Exception as exc:  # the user's bug, reported as such (not a runtime traceback)
                raise _raised(exc, fn, name) from exc
            return _to_reward(value, name)

    reward.__qualname__ = reward.__name__ = f"reward[{name}]"
    return reward


def load_custom_reward(path: str) -> RewardFn:
    """Import ``"package.module:function"`` and wrap it; ``UnknownPlugin`` if it is absent."""
    return wrap_reward(load_object(path), path)
