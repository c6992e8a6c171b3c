"""Dynamic-sampling group filters (``rollout.dynamic_sampling.filter``): keep or drop one prompt group.

Built-ins live in ``FILTERS`` (``nonzero_std``, ``nonzero_std_with_fallback``; a test keeps them
equal to ``slime.spec.types.BUILTIN_FILTERS``). A user filter is ``"package.module:function"``
taking ``(samples)`` or slime's ``(args, samples)`` and returning a bool, ``(keep, reason)`` or an
object with ``keep``/``reason`` (and optionally ``keep_when_insufficient``).
Guaranteed: :func:`load_filter` refuses bad names, imports and shapes, naming the filter; a filter
that raises or returns something else raises :class:`FilterError` (exit 2). Not guaranteed: that a
filter is deterministic (the runtime's repeatability assumes it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from slime.core.registry import Registry, load_object
from slime.rl.plugins import FilterResult, accepts_positional, is_async_callable
from slime.rl.sample import Sample

__all__ = ["FILTERS", "FilterError", "GroupFilter", "Verdict", "load_filter", "nonzero_std"]


class Verdict(NamedTuple):
    """A filter's answer for one group, as the runtime uses it."""

    keep: bool
    reason: str = ""
    keep_when_insufficient: bool = False  # slime's fallback: keep a rejected group if none could replace it


GroupFilter = Callable[[Sequence[Sample]], Verdict]

FILTERS = Registry(
    "group filter",
    {
        "nonzero_std": "slime.rl.filters:nonzero_std",
        "nonzero_std_with_fallback": "slime.rl.filters:nonzero_std_with_fallback",
    },
)

STD_EPS = 1e-6


class FilterError(ValueError):
    """A group filter raised or returned something that is not a verdict."""


def nonzero_std(samples: Sequence[Sample]) -> FilterResult:
    """Keep the group when its rewards differ (there is something for group advantages to learn)."""
    rewards = [float(s.reward or 0.0) for s in samples]
    if len(rewards) > 1 and statistics.stdev(rewards) > STD_EPS:
        return FilterResult(True)
    return FilterResult(False, f"zero_std_{round(rewards[0], 1) if rewards else 0.0}")


def nonzero_std_with_fallback(samples: Sequence[Sample]) -> Verdict:
    """``nonzero_std``, but a flat group is kept when the groups left could not fill the batch without it
    (slime's ``check_reward_nonzero_std_with_fallback``)."""
    keep, reason = nonzero_std(samples)
    return Verdict(keep, reason, keep_when_insufficient=True)


def _verdict(value: Any, name: str) -> Verdict:
    if isinstance(value, Verdict):
        return value
    if isinstance(value, bool):
        return Verdict(value, "" if value else "rejected")
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bool):  # also a FilterResult
        return Verdict(value[0], str(value[1] or ("" if value[0] else "rejected")))
    keep = getattr(value, "keep", None)
    if isinstance(keep, bool):
        reason = getattr(value, "reason", None) or ("" if keep else "rejected")
        return Verdict(keep, str(reason), bool(getattr(value, "keep_when_insufficient", False)))
    raise FilterError(
        f"group filter {name!r} returned {value!r}; return a bool, (keep, reason), or an object with .keep/.reason"
    )


def load_filter(name: str, *, args: Any = None) -> GroupFilter:
    """The filter ``name`` (a built-in or ``package.module:function``) as ``f(samples) -> Verdict``.

    ``args``: what a slime-style ``f(args, samples)`` receives."""
    fn = FILTERS.get(name) if ":" not in name else load_object(name)
    if not callable(fn):
        raise FilterError(f"group filter {name!r} is not callable (got {type(fn).__name__})")
    if is_async_callable(fn):
        raise FilterError(f"group filter {name!r} must be a plain function, not async: def f(samples) -> bool")
    if accepts_positional(fn, 1):
        call = fn
    elif accepts_positional(fn, 2):

        def call(samples: Sequence[Sample]) -> Any:
            return fn(args, samples)

    else:
        raise FilterError(f"group filter {name!r} takes neither (samples) nor slime's (args, samples)")

    def run(samples: Sequence[Sample]) -> Verdict:
        try:
            out = call(list(samples))
        except FilterError:
            raise
        except Exception as exc:  # the user's code: report it as theirs, with the cause
            raise FilterError(f"group filter {name!r} raised {type(exc).__name__}: {exc}") from exc
        return _verdict(out, name)

    return run
