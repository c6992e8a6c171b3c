"""The ``custom`` reward: a user function named ``"package.module:function"``.

Called as slime-submit's ``f(sample)`` or, when the signature needs two arguments, THUDM/slime's
``f(args, sample)`` with a :class:`SlimeArgs` namespace. It returns a number (bool counts) or a dict
read at ``reward.key``; a plain function runs in a worker thread (so must be thread-safe), an
``async def`` on the event loop. Guaranteed: bad paths, signatures and return values raise clear
errors naming the path; an exception inside becomes :class:`RewardFunctionError` (exit 2); imports
of THUDM/slime's own packages are refused. Not guaranteed: CPU-bound sync scorers run in parallel
(the GIL); slime's ``--group-rm`` batch form is not supported.
"""

from __future__ import annotations

import asyncio
import math
import os
import sysconfig
import traceback
import types
from collections.abc import Callable, Mapping
from typing import Any

from slime.core.registry import UnknownPlugin, load_object
from slime.rl.plugins import (
    PluginContractError,
    RewardFn,
    accepts_positional,
    is_async_callable,
    maybe_await,
)
from slime.rl.sample import Sample

__all__ = ["RewardFunctionError", "RewardValueError", "SlimeArgs", "load_custom_reward", "wrap_reward"]


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


class SlimeArgs(types.SimpleNamespace):
    """slime's argument namespace for plug-ins written for THUDM/slime: the spec's values, slime's names."""

    def __getattr__(self, name: str) -> Any:  # called only for a name the namespace does not hold
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"args.{name}: slime's option {name!r} has no slime/v2 field, so the args handed to plug-ins written "
            "for slime do not hold it; read it another way (e.g. from sample.metadata or an environment variable)"
        )


def _pick(value: Any, name: str, key: str | None) -> Any:
    if not isinstance(value, Mapping):
        return value
    if key is None:
        raise RewardValueError(
            f"reward function {name!r} returned a dict ({', '.join(map(str, value))}); set reward.key to the "
            "entry holding the reward (slime's --reward-key)"
        )
    if key not in value:
        raise RewardValueError(
            f"reward function {name!r} returned a dict without reward.key {key!r} (it has: "
            f"{', '.join(map(str, value))})"
        )
    return value[key]


def _to_reward(value: Any, name: str, key: str | None = None) -> float:
    value = _pick(value, name, key)
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


def _bind(fn: Callable[..., Any], name: str, args: SlimeArgs | None) -> Callable[[Sample], Any]:
    """``fn`` as a one-argument call, in whichever convention its signature has (see the module docstring)."""
    if accepts_positional(fn, 1):
        return fn
    if accepts_positional(fn, 2):
        if args is None:
            raise PluginContractError(
                f"reward {name!r} takes (args, sample), slime's convention, but no spec values were given for "
                "args; build it with slime.rl.rewards.reward_from_spec"
            )
        return lambda sample: fn(args, sample)
    raise PluginContractError(
        f"reward {name!r} cannot be called with one argument or two; expected def f(sample) -> float, "
        "or slime's async def f(args, sample) -> float"
    )


def wrap_reward(
    fn: Callable[..., Any], name: str, *, args: SlimeArgs | None = None, key: str | None = None
) -> RewardFn:
    """Turn a sync or async ``fn(sample)`` or ``fn(args, sample)`` into an async ``RewardFn`` returning float.

    ``args``: the namespace for slime-convention functions; ``key``: the entry of a returned dict.
    """
    if not callable(fn):
        raise PluginContractError(f"reward {name!r} is not callable (got {type(fn).__name__})")
    call = _bind(fn, name, args)
    if is_async_callable(fn):

        async def reward(sample: Sample) -> float:
            try:
                value = await call(sample)
            except Exception as exc:  # the user's bug, reported as such (not a runtime traceback)
                raise _raised(exc, fn, name) from exc
            return _to_reward(value, name, key)

    else:

        async def reward(sample: Sample) -> float:
            try:
                value = await maybe_await(await asyncio.to_thread(call, sample))
            except Exception as exc:  # the user's bug, reported as such (not a runtime traceback)
                raise _raised(exc, fn, name) from exc
            return _to_reward(value, name, key)

    reward.__qualname__ = reward.__name__ = f"reward[{name}]"
    return reward


def load_custom_reward(path: str, *, args: SlimeArgs | None = None, key: str | None = None) -> RewardFn:
    """Import ``"package.module:function"`` and wrap it; ``UnknownPlugin`` if it is absent."""
    try:
        fn = load_object(path)
    except UnknownPlugin as exc:
        missing = getattr(exc.__cause__, "name", None) or ""
        if missing.startswith("slime.") or missing == "slime":
            raise UnknownPlugin(
                f"{exc}: the module imports THUDM/slime's own {missing!r}, which slime-submit does not have; "
                "import Sample from slime.rl.sample instead (or drop the import)"
            ) from exc
        raise
    return wrap_reward(fn, path, args=args, key=key)
