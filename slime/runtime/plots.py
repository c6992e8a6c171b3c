"""The end-of-run curve: training reward and held-out accuracy against optimizer steps.

matplotlib with the Agg backend (no display needed, chosen because it is the
standard for static PNGs and already a runtime dependency). One PNG,
``plots/curve.png``: rollout reward mean (and its moving average) on the left
axis, every eval set's accuracy on the same 0..1 axis, x = optimizer steps
(the ``rollout_id = -1`` line gives the starting point at step 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_curve"]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_curve(rows: list[dict[str, Any]], out: Path, *, title: str = "") -> Path | None:
    """Write the curve PNG to ``out``; None when there is nothing to plot."""
    train = [r for r in rows if r.get("rollout_id", -1) >= 0 and r.get("rollout/reward_mean") is not None]
    evals = sorted(
        {k for r in rows for k in r if k.startswith("eval/") and k.endswith("/accuracy") and k.count("/") == 2}
    )
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if train:
        xs = [r["step"] for r in train]
        ys = [float(r["rollout/reward_mean"]) for r in train]
        ax.plot(xs, ys, color="tab:blue", alpha=0.25, linewidth=1, label="rollout reward")
        ax.plot(
            xs,
            _moving_average(ys, max(1, len(ys) // 30)),
            color="tab:blue",
            linewidth=2,
            label="rollout reward (moving avg)",
        )
    for i, key in enumerate(evals):
        pts = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None]
        if pts:
            name = key.split("/")[1]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=f"C{(i + 1) % 10}",
                linewidth=2,
                label=f"{name} accuracy (greedy)",
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
