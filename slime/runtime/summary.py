"""The end-of-run summary: ``summary.json`` (flat final metrics) and a short rich table.

``summary.json`` is what ``slime-submit --json`` reports as ``final_metrics``: the latest eval
metrics, accuracy before RL (and before the SFT warm-up), the last rollout's reward and a recent
mean, the step-0 consistency checks (see ``slime.runtime.record``), the final counters and total
timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slime.core.paths import atomic_write
from slime.runtime.metrics import clean

__all__ = ["final_metrics", "print_summary", "write_summary"]

_TIMES = ("time/rollout_s", "time/train_s", "time/sync_s", "time/eval_s")


def final_metrics(rows: list[dict[str, Any]], *, wall_s: float) -> dict[str, Any]:
    steps = [r for r in rows if r.get("rollout_id", -1) >= 0]
    out: dict[str, Any] = {}
    for r in rows:  # the latest value of every eval metric
        for k, v in r.items():
            if k.startswith("eval/") and v is not None:
                out[k] = v
    initial = next((r for r in rows if r.get("rollout_id") == -1), None)
    if initial is not None and initial.get("eval/accuracy") is not None:
        out["eval/accuracy_initial"] = initial["eval/accuracy"]
    if initial is not None and initial.get("eval/loss") is not None:  # kind SFTJob: the held-out loss before
        out["eval/loss_initial"] = initial["eval/loss"]
    if initial is not None and initial.get("sft/before/accuracy") is not None:
        out["eval/accuracy_before_sft"] = initial["sft/before/accuracy"]
    if steps:
        last = steps[-1]
        for k in ("rollout_id", "step", "weight_version", "rollout/reward_mean", "rollout/accuracy", "train/sft_loss"):
            if k in last:
                out[k] = last[k]
        tail = [r["rollout/reward_mean"] for r in steps[-10:] if r.get("rollout/reward_mean") is not None]
        if tail:
            out["rollout/reward_mean_last10"] = sum(tail) / len(tail)
        first = steps[0]
        for k in ("check/step0_logprob_diff", "check/step0_kl", "check/step0_ref_kl"):
            if first.get(k) is not None:
                out[k] = first[k]
        for k in _TIMES:
            out[k] = sum(float(r.get(k) or 0.0) for r in steps)
    out["time/total_s"] = wall_s
    return clean(out)


def write_summary(path: Path, metrics: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(metrics, indent=1, sort_keys=True) + "\n")


def print_summary(metrics: dict[str, Any], *, title: str, stderr: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in sorted(metrics):
        v = metrics[k]
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console(stderr=stderr).print(table)
