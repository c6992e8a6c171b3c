"""The fit check as spec rules: refuse a role that cannot fit its GPU, warn on a near miss.

Runs only when the estimate can (``slime.fit.plan.estimate``); ``--no-fit-check`` (validate, submit)
sets ``SLIME_NO_FIT_CHECK=1`` to skip it, and the run's lock.json records that it was skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slime.fit.breakdown import gib
from slime.fit.fixes import engine_fixes, trainer_fixes
from slime.fit.gpus import GPU_MEMORY_GIB, gpu_memory_gib
from slime.fit.plan import FitReport, RoleFit, engine_layout, estimate, trainer_layout

__all__ = ["DISABLE_ENV", "enabled", "findings", "fit_errors", "fit_warnings", "gpu_known", "skipped"]

DISABLE_ENV = "SLIME_NO_FIT_CHECK"
Finding = tuple[str, str, str | None]


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


@contextmanager
def skipped() -> Iterator[None]:
    """The fit rules off inside the block (``slime-submit fit`` shows the table of a spec that cannot fit)."""
    before = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DISABLE_ENV, None)
        else:
            os.environ[DISABLE_ENV] = before


def gpu_known(s: Any) -> Iterator[Finding]:
    g = s.cluster.gpu
    if g is not None and g.memory_gb is None and gpu_memory_gib(g.name) is None:
        what = f"cluster.gpu.name {g.name!r} is not a GPU slime-submit knows" if g.name else "cluster.gpu is empty"
        yield (
            "cluster.gpu.name" if g.name else "cluster.gpu",
            f"{what}, so its memory is unknown",
            f"set cluster.gpu.memory_gb, or use one of: {', '.join(GPU_MEMORY_GIB)}",
        )


def _report(s: Any) -> FitReport | None:
    if not enabled():
        return None
    try:
        return estimate(s)
    except (ArithmeticError, TypeError, ValueError):
        return None  # counts an earlier rule refuses (a zero, a missing size): nothing to estimate from


def fit_errors(s: Any) -> Iterator[Finding]:
    yield from gpu_known(s)
    report = _report(s)
    yield from (f for sev, f in findings(s, report) if sev == "error") if report else ()


def fit_warnings(s: Any) -> Iterator[Finding]:
    report = _report(s)
    yield from (f for sev, f in findings(s, report) if sev == "warning") if report else ()


def findings(s: Any, report: FitReport) -> list[tuple[str, Finding]]:
    """(severity, finding) of each role that does not fit (error) or fits narrowly (warning)."""
    out = [("error", _refusal(s, report, r)) for r in report.roles if r.verdict == "over"]
    return out + [("warning", _near_miss(report, r)) for r in report.roles if r.verdict == "tight"]


def _where(r: RoleFit) -> str:
    return "cluster" if r.gpus == 0 else "rollout.gpus_per_engine" if r.engine else "train.parallel"


def _refusal(s: Any, report: FitReport, r: RoleFit) -> Finding:
    if r.engine is not None:
        e = r.engine
        msg = (
            f"the {r.role} cannot hold one request: its KV pool takes {e.kv_tokens} tokens, a sample needs "
            f"{e.request_tokens} (max_prompt_len + max_response_len) on the {report.gpu} "
            f"({gib(report.gpu_bytes)}); largest terms: {r.memory.describe()}"
        )
        heads = report.dims.heads
        fixes = engine_fixes(
            report.dims,
            engine_layout(s, report.gpu_bytes, r.memory.get("trainer (resident)")),
            colocated="actor" in r.role,
            heads_ok=lambda tp: heads % tp == 0 and tp <= s.cluster.gpus_per_node,
        )
        shorter = f"rollout.max_response_len below {e.kv_tokens}" if e.kv_tokens else "more GPUs per engine"
        return (_where(r), msg, _fixes_text(fixes, shorter))
    if r.gpus == 0:
        msg = f"a node's host RAM peaks at {gib(r.memory.total)} but the job asks for {gib(r.capacity)}: "
        return (_where(r), msg + r.memory.describe(), "raise the launcher's mem, or save_hf: false")
    msg = (
        f"the {r.role} needs {gib(r.memory.total)} per GPU but the {report.gpu} has {gib(r.capacity)}; "
        f"largest terms: {r.memory.describe()}"
    )
    t, lay = s.train, trainer_layout(s)
    fixes = trainer_fixes(
        report.dims,
        lay,
        r.capacity,
        extra=r.memory.get("engine (released)"),
        world=(t.nodes or 1) * (t.gpus_per_node or 1),
        dynamic=t.dynamic_batch.enabled,
        reference=r.memory.get("reference") > 0,
        critic=r.memory.get("critic") > 0,
    )
    return (_where(r), msg, _fixes_text(fixes, "more model parallelism or GPUs with more memory"))


def _fixes_text(fixes: list[str], fallback: str) -> str:
    if not fixes:
        return f"no single change fits; combine several, e.g. {fallback} (see `slime-submit fit`)"
    return "cheapest fixes: " + "; ".join(fixes[:3]) + " (or --no-fit-check to submit anyway)"


def _near_miss(report: FitReport, r: RoleFit) -> Finding:
    if r.engine is not None and r.memory.get("working") < r.engine.reserve / 2:
        return (
            _where(r),
            f"the {r.role} keeps {gib(r.memory.get('working'))} beside its KV pool for prefill activations and "
            f"CUDA graphs, under half of the {gib(r.engine.reserve)} SGLang's default leaves: it may run out of "
            "memory on a long prefill",
            "lower rollout.sglang.args.mem-fraction-static (or remove it for SGLang's default)",
        )
    if r.engine is not None:
        e = r.engine
        waves = -(-e.demand_tokens // max(1, e.kv_tokens))
        return (
            _where(r),
            f"the {r.role}'s KV pool holds {e.kv_tokens} tokens: {e.concurrent_fit} samples at full length, but a "
            f"rollout sends each engine {e.demand_tokens // e.request_tokens}; SGLang queues the rest, so "
            f"generation runs in about {waves} waves (slower rollouts)",
            "more engines (rollout.gpus), a larger mem-fraction-static, or shorter max_response_len",
        )
    return (
        _where(r),
        f"the {r.role} fits narrowly: {gib(r.memory.total)} of {gib(r.capacity)} "
        f"({gib(r.headroom)} headroom); largest terms: {r.memory.describe()}",
        "fragmentation or a long batch may push it over; see `slime-submit fit` for the breakdown",
    )
