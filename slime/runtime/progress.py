"""Live progress: a rich progress bar on a terminal, plain log lines otherwise.

The bar (stderr, so ``--json`` output on stdout stays clean) shows rollouts
done / total, elapsed and remaining time, and the latest reward and eval
accuracy. It is shown only when stderr is a TTY and ``logging.progress`` is
true; otherwise a one-line summary is printed every ``max(1, total // 20)``
rollouts and at every eval, so job logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, *, enabled: bool, start: int = 0, label: str = "RL") -> None:
        self.total, self.start, self.label = total, start, label
        self.every = max(1, total // 20)
        self.t0 = time.monotonic()
        self._bar = None
        self._task = None
        self.acc: float | None = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, completed=start, info="")

    def phase(self, label: str, total: int, completed: int = 0) -> None:
        """Switch the bar to another phase (e.g. the SFT warm-up, then RL)."""
        self.total, self.label = total, label
        self.every = max(1, total // 20)
        if self._bar is not None:
            self._bar.update(self._task, description=label, total=total, completed=completed, info="")
        else:
            print(f"[{label}] starting ({total} steps)", flush=True)

    def update(self, done: int, record: dict[str, Any]) -> None:
        reward = record.get("rollout/reward_mean", record.get("sft/loss"))
        if record.get("eval/accuracy") is not None:
            self.acc = record["eval/accuracy"]
        key = "loss" if "sft/loss" in record and "rollout/reward_mean" not in record else "reward"
        info = f"{key} {reward:.3f}" if isinstance(reward, float) else ""
        if self.acc is not None:
            info += f"  eval acc {self.acc:.3f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        elif done % self.every == 0 or done == self.total or "eval/accuracy" in record:
            print(f"[{self.label}] {done}/{self.total} {info} ({time.monotonic() - self.t0:.0f} s)", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
