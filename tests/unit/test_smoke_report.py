"""``slime.cli.smoke_report.judge``: each stage's verdict comes from the run dir's files, and a stage
whose evidence is missing or wrong fails with a message naming it — also when the run exited 0.

The run dir is written here the way the runtime and the smoke driver write it (the shapes are those of
a real smoke run of the quickstart); each test breaks one piece of evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.cli.smoke_report import Expect, exit_code, judge
from slime.core.errors import ExitCode
from slime.core.paths import TaskPaths

EXPECT = Expect(rollouts=3, steps_per_rollout=2, eval_sets=("heldout",), critic=False, sft_steps=2)


def _line(r: int, **extra) -> dict:
    row = {
        "rollout_id": r,
        "step": 2 * (r + 1),
        "weight_version": r + 2,
        "rollout/weight_version": r + 1,
        "rollout/reward_mean": 0.25,
        "rollout/response_len_mean": 3.5,
        "check/stale_samples": 0,
        "train/loss": 0.1,
        "train/grad_norm": 0.5,
        "train/logprob_diff": 2e-7,
    }
    if r == 0:
        row["check/step0_logprob_diff"] = 2e-7
    return {**row, **extra}


def _write(path: Path, doc) -> None:
    """JSON, or JSON lines for a ``.jsonl`` file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in doc) if path.suffix == ".jsonl" else json.dumps(doc))


def _checkpoint(tp: TaskPaths, r: int) -> None:
    cursor = {"epoch": 0, "index": 4 * (r + 1), "size": 2000, "seed": 1, "shuffle": True}
    _write(
        tp.checkpoints / str(r) / "state.json",
        {"rollout_id": r, "step": 2 * (r + 1), "weight_version": r + 2, "manager": {"data": cursor}},
    )


def good_run(tmp_path: Path) -> TaskPaths:
    tp = TaskPaths(tmp_path / "run", 0)
    first = {
        "rollout_id": -1,
        "step": 0,
        "weight_version": 1,
        "sft/steps": 2,
        "sft/loss": 5.0,
        "eval/heldout/accuracy": 0.0,
    }
    rows = [first, _line(0), _line(1), _line(2, **{"eval/heldout/accuracy": 0.5})]
    _write(tp.preflight_json, {"ok": True})
    started = {"ranks": [{"rank": 0}], "engines": ["http://h:1"], "state": "preempted", "exit_code": 75}
    _write(tp.dir / "smoke" / "phase1-state.json", started)
    _write(tp.dir / "smoke" / "phase1-metrics.jsonl", rows[:3])
    _write(tp.dir / "smoke" / "phases.json", [{"exit_code": 75, "stop_after_rollout": 1}, {"exit_code": 0}])
    _checkpoint(tp, 1)
    _checkpoint(tp, 2)
    _write(tp.metrics, rows)
    _write(tp.state, {**started, "state": "succeeded", "exit_code": 0, "resumed_from": str(tp.checkpoints / "1")})
    _write(tp.summary, {"rollout_id": 2})
    _write(tp.final_model / "config.json", {})
    return tp


def verdicts(tp: TaskPaths, expect: Expect = EXPECT, rc: int = 0) -> dict[str, tuple[str, str]]:
    return {s.name: (s.status, s.detail) for s in judge(tp, expect, rc)}


def _edit_metrics(tp: TaskPaths, rollout_id: int, **changes) -> None:
    rows = [json.loads(x) for x in tp.metrics.read_text().splitlines()]
    for r in rows:
        if r["rollout_id"] == rollout_id:
            r.update(changes)
    _write(tp.metrics, rows)


def test_a_complete_run_passes_every_stage(tmp_path):
    stages = judge(good_run(tmp_path), EXPECT, 0)
    assert [s.status for s in stages] == ["passed"] * 10, stages
    assert exit_code(stages, 0) == ExitCode.OK
    got = {s.name: s.detail for s in stages}
    assert got["data read"] == "2000 prompt rows loaded; 8 drawn in 2 rollout(s)"
    assert got["checkpoint + resume"].startswith("stopped after rollout 1 (exit 75), resumed from its checkpoint")


def test_configured_away_stages_are_skipped_not_failed(tmp_path):
    tp = good_run(tmp_path)
    stages = judge(tp, Expect(rollouts=3, steps_per_rollout=2), 0)
    assert {s.name: s.status for s in stages}["eval"] == "skipped"
    assert {s.name: s.detail for s in stages}["SFT warm-up"] == "no SFT warm-up (algorithm.sft_warmup_steps: 0)"
    assert exit_code(stages, 0) == ExitCode.OK


@pytest.mark.parametrize(
    ("breakage", "stage", "message"),
    [
        (lambda tp: tp.preflight_json.unlink(), "start", "no preflight.json"),
        (
            lambda tp: _write(tp.preflight_json, {"ok": False, "stage": "bootstrap", "error": "no Ray head"}),
            "start",
            "the bootstrap failed: no Ray head",
        ),
        (lambda tp: (tp.checkpoints / "1" / "state.json").unlink(), "data read", "no complete checkpoint"),
        (lambda tp: _edit_metrics(tp, 1, **{"rollout/reward_mean": None}), "reward called", "reward_mean is None"),
        (lambda tp: _edit_metrics(tp, 0, **{"check/stale_samples": 3}), "rollout", "3 stale sample(s)"),
        (
            lambda tp: _edit_metrics(tp, 0, **{"check/step0_logprob_diff": 0.5}),
            "rollout",
            "differ by 0.5 before any update",
        ),
        (lambda tp: _edit_metrics(tp, 1, **{"train/loss": float("nan")}), "train step", "train/loss is nan"),
        (lambda tp: _edit_metrics(tp, 1, step=3), "train step", "rollout 1: step 3, expected 4"),
        (
            lambda tp: _edit_metrics(tp, 1, **{"rollout/weight_version": 1}),
            "weight sync",
            "sampled with weight version 1, but version 2 was synced before it",
        ),
        (
            lambda tp: _edit_metrics(tp, 2, **{"train/logprob_diff": 0.02}),
            "weight sync",
            "the engines do not serve the synced weights",
        ),
        (lambda tp: _edit_metrics(tp, -1, **{"sft/steps": 1}), "SFT warm-up", "reports 1 SFT steps, expected 2"),
        (
            lambda tp: _write(tp.dir / "smoke" / "phases.json", [{"exit_code": 0}]),
            "checkpoint + resume",
            "was to stop after rollout 1 with exit 75; it exited 0",
        ),
        (
            lambda tp: _write(tp.state, {"state": "succeeded", "ranks": [1], "engines": [1]}),
            "checkpoint + resume",
            "did not resume from",
        ),
        (
            lambda tp: _edit_metrics(tp, 0, **{"train/loss": 0.2}),
            "checkpoint + resume",
            "rollouts were redone",
        ),
        (
            lambda tp: _edit_metrics(tp, 2, weight_version=9),
            "weight sync",
            "rollout 2: weight_version 9 after its sync",
        ),
        (lambda tp: _edit_metrics(tp, 2, **{"eval/heldout/accuracy": None}), "eval", "eval/heldout/accuracy is None"),
        (lambda tp: tp.summary.unlink(), "final outputs", "no summary.json"),
        (lambda tp: (tp.final_model / "config.json").unlink(), "final outputs", "final_model/ is missing"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_stage_without_its_evidence_fails_even_when_the_run_exited_0(tmp_path, breakage, stage, message):
    tp = good_run(tmp_path)
    breakage(tp)
    got = verdicts(tp)
    assert got[stage][0] == "failed" and message in got[stage][1], got
    assert exit_code(judge(tp, EXPECT, 0), 0) == ExitCode.BUG


def test_a_failed_run_names_its_error_at_the_first_stage_it_did_not_reach(tmp_path):
    tp = TaskPaths(tmp_path / "run", 0)
    _write(tp.preflight_json, {"ok": True})
    error = "reward plug-in my_rewards:score raised ZeroDivisionError: division by zero"
    _write(tp.state, {"ranks": [{}], "engines": ["u"], "state": "failed", "exit_code": 2, "error": error})
    _write(tp.dir / "smoke" / "phases.json", [{"exit_code": 2, "stop_after_rollout": 1}])
    _write(tp.metrics, [{"rollout_id": -1, "step": 0, "weight_version": 1}])
    stages = judge(tp, EXPECT, 2)
    assert [s.status for s in stages][:3] == ["passed", "failed", "not reached"]
    assert error in stages[1].detail and "exit 2" in stages[1].detail
    assert exit_code(stages, 2) == ExitCode.SPEC  # the run's own code: bad input
    assert exit_code(stages, 3) == ExitCode.INFRA


def test_final_model_only_when_save_hf(tmp_path):
    tp = good_run(tmp_path)
    no_hf = Expect(rollouts=3, steps_per_rollout=2, eval_sets=("heldout",), sft_steps=2, save_hf=False)
    assert verdicts(tp, no_hf)["final outputs"] == ("failed", "final_model/ was written (save_hf False)")
    (tp.final_model / "config.json").unlink()
    assert verdicts(tp, no_hf)["final outputs"][0] == "passed"


def test_ppo_needs_critic_metrics_and_one_rollout_skips_the_resume(tmp_path):
    tp = good_run(tmp_path)
    got = verdicts(tp, Expect(rollouts=3, steps_per_rollout=2, critic=True))
    assert got["train step"] == ("failed", "rollout 0: no critic/* metrics although the estimator is ppo")
    one = verdicts(tp, Expect(rollouts=1, steps_per_rollout=2))
    assert one["checkpoint + resume"] == ("skipped", "one rollout: nothing to resume (--rollouts 2 or more)")
