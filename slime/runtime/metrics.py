"""Metrics sinks: ``metrics.jsonl`` (the source of truth), Weights & Biases and TensorBoard.

``metrics.jsonl`` has one flushed JSON line per rollout step plus a ``rollout_id: -1`` line for the
policy before RL. On resume it is cut back to the checkpoint, so a resumed run's file equals an
uninterrupted one's line for line (timings aside); W&B resumes the same run id and TensorBoard
purges past the checkpoint, so each rollout shows once. W&B and TensorBoard are optional: if they
cannot start, a warning is printed and training goes on; both start in background threads.
Modes and step numbering: docs/design-notes.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.core.paths import TaskPaths, atomic_write

if TYPE_CHECKING:
    from slime.spec.types import Spec

__all__ = ["MetricsLog", "TensorBoardSink", "WandbSink", "clean", "numbers", "read_metrics"]


def clean(record: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe copy: NaN/inf become None, numpy/torch scalars become floats."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if hasattr(v, "item") and callable(v.item):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def numbers(record: dict[str, Any]) -> dict[str, int | float]:
    """The numeric entries of a record (what W&B and TensorBoard take), NaN/inf dropped."""
    return {k: v for k, v in clean(record).items() if isinstance(v, (int, float))}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line from a crash: drop it
    return rows


class MetricsLog:
    """Appends to ``metrics.jsonl``; ``keep_through`` cuts the file back first (resume)."""

    def __init__(self, path: Path, *, keep_through: int | None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = (
            []
            if keep_through is None
            else [r for r in read_metrics(path) if int(r.get("rollout_id", -1)) <= keep_through]
        )
        atomic_write(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        self.rows = kept
        self._fh = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        record = clean(record)
        self.rows.append(record)
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class WandbSink:
    """Logs the same records to W&B (or does nothing when disabled or unavailable)."""

    def __init__(self, spec: Spec, task: TaskPaths, *, resume: bool, task_index: int = 0) -> None:
        self.run: Any = None
        self.mode = os.environ.get("WANDB_MODE") or spec.logging.wandb.mode
        self._thread: threading.Thread | None = None
        if self.mode == "disabled":
            return
        run_id = None
        if resume or task.wandb_id.is_file():
            try:
                run_id = task.wandb_id.read_text().strip() or None
            except OSError:
                run_id = None
        if run_id is None:
            import secrets

            run_id = secrets.token_hex(4)
            atomic_write(task.wandb_id, run_id + "\n")
        self.run_id = run_id
        task.wandb.mkdir(parents=True, exist_ok=True)
        w = spec.logging.wandb
        kwargs = dict(
            project=w.project,
            group=w.group,
            entity=w.entity,
            id=run_id,
            resume="allow",
            name=f"{spec.name}-{task.root.name}-t{task_index}",
            notes=spec.description or None,
            dir=str(task.wandb),
            mode=self.mode,
        )
        self._thread = threading.Thread(target=self._init, args=(spec, kwargs), daemon=True, name="wandb-init")
        self._thread.start()

    def _init(self, spec: Spec, kwargs: dict[str, Any]) -> None:
        try:
            import msgspec
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True)
            self.run = wandb.init(config=msgspec.to_builtins(spec), settings=settings, **kwargs)
        except Exception as exc:  # noqa: BLE001 - W&B is optional; say why and go on
            print(f"warning: W&B ({self.mode}) did not start, metrics go to metrics.jsonl only: {exc}", file=sys.stderr)
            self.run = None

    def _ready(self) -> bool:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.run is not None

    def log(self, record: dict[str, Any]) -> None:
        if not self._ready():
            return
        step = int(record.get("rollout_id", -1)) + 1  # W&B steps must be >= 0 and increasing
        data = numbers(record)
        try:
            self.run.log(data, step=step)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: W&B log failed: {exc}", file=sys.stderr)

    def summary(self, final: dict[str, Any]) -> None:
        if self._ready():
            for k, v in clean(final).items():
                if isinstance(v, (int, float)):
                    self.run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        if self._ready():
            try:
                self.run.finish(exit_code=exit_code)
            except Exception:  # noqa: BLE001
                pass
            self.run = None


class TensorBoardSink:
    """Writes the same records as :class:`WandbSink` as TensorBoard scalars (or nothing when off)."""

    def __init__(self, spec: Spec, task: TaskPaths, *, resume_after: int | None) -> None:
        self.writer: Any = None
        self._thread: threading.Thread | None = None
        if not spec.logging.tensorboard:
            return
        # the first W&B-style step a resumed run logs again (checkpoint rollout R covers steps <= R + 1)
        purge = None if resume_after is None else resume_after + 2
        self._thread = threading.Thread(
            target=self._init, args=(task.tensorboard, purge), daemon=True, name="tensorboard-init"
        )
        self._thread.start()

    def _init(self, logdir: Path, purge: int | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter

            logdir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(log_dir=str(logdir), purge_step=purge, flush_secs=10)
        except Exception as exc:  # noqa: BLE001 - TensorBoard is optional; say why and go on
            print(f"warning: TensorBoard did not start, metrics go to metrics.jsonl only: {exc}", file=sys.stderr)
            self.writer = None

    def _ready(self) -> bool:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.writer is not None

    def log(self, record: dict[str, Any]) -> None:
        if not self._ready():
            return
        step = int(record.get("rollout_id", -1)) + 1
        for key, value in numbers(record).items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        if self._ready():
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                pass
            self.writer = None
