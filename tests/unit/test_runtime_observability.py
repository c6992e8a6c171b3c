"""Metrics file, summary, curve, task state and the stop flag (a real signal to this process)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from slime.core.errors import ExitCode
from slime.core.paths import TaskPaths
from slime.runtime.metrics import MetricsLog, WandbSink, read_metrics
from slime.runtime.state import StopFlag, TaskState
from slime.runtime.summary import final_metrics, write_summary


def rows():
    out = [
        {
            "rollout_id": -1,
            "step": 0,
            "eval/accuracy": 0.5,
            "eval/heldout/accuracy": 0.5,
            "sft/before/accuracy": 0.0,
            "sft/before/heldout/accuracy": 0.0,
        }
    ]
    for r in range(4):
        out.append(
            {
                "rollout_id": r,
                "step": r + 1,
                "rollout/reward_mean": 0.1 * r,
                "time/train_s": 1.0,
                "weight_version": r + 2,
                **({"check/step0_logprob_diff": 1e-7, "check/step0_kl": 3e-14} if r == 0 else {}),
            }
        )
    out[-1].update({"eval/accuracy": 0.9, "eval/heldout/accuracy": 0.9})
    return out


def test_metrics_log_appends_and_cuts_back_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, keep_through=None)
    for r in rows():
        log.write(r)
    log.write({"rollout_id": 4, "x": float("nan")})
    log.close()
    assert [r["rollout_id"] for r in read_metrics(path)] == [-1, 0, 1, 2, 3, 4]
    assert read_metrics(path)[-1]["x"] is None  # NaN is not JSON
    with path.open("a") as fh:
        fh.write('{"rollout_id": 5, "torn')  # a crash mid-line
    resumed = MetricsLog(path, keep_through=2)
    resumed.write({"rollout_id": 3, "again": True})
    resumed.close()
    assert [r["rollout_id"] for r in read_metrics(path)] == [-1, 0, 1, 2, 3]
    assert read_metrics(path)[-1]["again"] is True
    fresh = MetricsLog(path, keep_through=None)  # no checkpoint: a restart from scratch
    fresh.close()
    assert read_metrics(path) == []


def test_final_metrics_report_latest_eval_initial_accuracy_and_checks(tmp_path):
    final = final_metrics(rows(), wall_s=12.5)
    assert final["eval/accuracy"] == 0.9 and final["eval/heldout/accuracy"] == 0.9
    assert final["eval/accuracy_initial"] == 0.5 and final["eval/accuracy_before_sft"] == 0.0
    assert not any(k.startswith("sft/") for k in final)  # the untrained policy's sets: one summary key
    assert final["rollout_id"] == 3 and final["step"] == 4 and final["weight_version"] == 5
    assert final["check/step0_logprob_diff"] == 1e-7 and final["check/step0_kl"] == 3e-14
    assert final["time/train_s"] == 4.0 and final["time/total_s"] == 12.5
    assert final["rollout/reward_mean_last10"] == pytest.approx(0.15)
    write_summary(tmp_path / "summary.json", final)
    assert json.loads((tmp_path / "summary.json").read_text()) == final


def test_curve_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from slime.runtime.plots import plot_curve

    out = plot_curve(rows(), tmp_path / "plots" / "curve.png", title="t")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_curve([], tmp_path / "none.png") is None


def test_stop_flag_catches_sigusr1_and_sigterm():
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        flag = StopFlag().install()
        try:
            assert not flag.requested
            os.kill(os.getpid(), sig)
            assert flag.requested and flag.reason == signal.Signals(sig).name
        finally:
            flag.uninstall()
    assert ExitCode.REQUEUE == 75


def test_task_state_is_rewritten_atomically(tmp_path):
    st = TaskState(tmp_path / "state.json", num_rollouts=10)
    st.update(state="running")
    st.update(rollout_id=3, step=4)
    doc = TaskState.read(tmp_path / "state.json")
    assert doc["state"] == "running" and doc["rollout_id"] == 3 and doc["num_rollouts"] == 10
    assert TaskState.read(tmp_path / "missing.json") is None


def test_wandb_disabled_by_env_and_run_id_reused(tmp_path, monkeypatch):
    from slime.spec import load_spec

    spec = load_spec(os.path.join(os.path.dirname(__file__), "..", "..", "specs", "quickstart.yaml")).spec
    tp = TaskPaths(tmp_path, 0)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    sink = WandbSink(spec, tp, resume=False)
    sink.log({"rollout_id": 0, "a": 1.0})
    sink.finish()
    assert sink.run is None and not tp.wandb_id.exists()
    monkeypatch.setenv("WANDB_MODE", "offline")
    first = WandbSink(spec, tp, resume=False)
    run_id = tp.wandb_id.read_text().strip()
    first.log({"rollout_id": 0, "a": 1.0})
    first.finish()
    second = WandbSink(spec, tp, resume=True)
    assert second.run_id == run_id
    second.log({"rollout_id": 1, "a": 2.0})
    second.finish()
    runs = sorted(p.name for p in (tp.wandb / "wandb").iterdir() if p.name.startswith("offline-run-"))
    # offline-run-<time>-<id> (W&B appends -1 when both start within the same second)
    assert len(runs) == 2 and all(r.split("-")[3] == run_id for r in runs), runs
