"""Bad input reaches the user as one clear message and exit code 2, with ``state.json`` saying why."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytest.importorskip("ray")

from tests.fixtures.quickstart import REPO, compile_run
from tests.fixtures.quickstart import train as run_train

pytestmark = pytest.mark.timeout(180)


def train(*args: str) -> subprocess.CompletedProcess:
    return run_train(*args, wandb="disabled", timeout=150)


def test_missing_run_dir_or_task_is_a_usage_error(tmp_path):
    done = train(str(tmp_path / "nope"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    done = train(str(tmp_path), "--task", "3")
    assert done.returncode == 2 and "resolved.json does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_prompt_file_gone_bad_after_submit_fails_with_file_line_and_exit_2(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    shutil.copy(REPO / "specs/data/arith/train.jsonl", prompts)
    run = compile_run(
        tmp_path / "runs", "bad", [f"data.prompts={prompts}", "algorithm.sft_warmup_steps=0", "logging.progress=false"]
    )
    with prompts.open("a") as fh:
        fh.write('{"prompt": "01+01=", "label": "2"\n')  # broken JSON on line 2001
    done = train(str(run))
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{prompts}:2001" in done.stderr and "invalid JSON" in done.stderr
    assert "Traceback" not in done.stderr
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert state["state"] == "failed" and state["exit_code"] == 2 and f"{prompts}:2001" in state["error"]


def test_resuming_from_a_truncated_checkpoint_names_it_and_the_usable_one_with_exit_2(tmp_path):
    run = compile_run(
        tmp_path / "runs",
        "damaged",
        ["rollout.num_rollouts=2", "algorithm.sft_warmup_steps=2", "logging.progress=false"],
    )
    ck = run / "tasks/0/checkpoints"
    state = {
        "format": 1,
        "rollout_id": 0,
        "step": 1,
        "weight_version": 2,
        "world_size": 1,
        "manager": {"data": {"epoch": 0, "index": 16}},
    }
    for rid in (0, 1):  # 1, the newest, has a truncated rank file (a copy cut short, a full disk)
        (ck / str(rid)).mkdir(parents=True)
        (ck / str(rid) / "state.json").write_text(json.dumps({**state, "rollout_id": rid}))
    (ck / "1" / "actor-rank0.pt").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    done = train(str(run))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "a bug" not in done.stderr
    assert (
        f"cannot resume from checkpoint {ck / '1'}: it is damaged (cannot load {ck / '1' / 'actor-rank0.pt'}: "
        "truncated, corrupted or unreadable"
    ) in done.stderr
    assert (
        f"delete or move aside {ck / '1'}; the run then resumes from the newest complete one left ({ck / '0'})"
        in done.stderr
    )
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert state["state"] == "failed" and state["exit_code"] == 2 and "it is damaged" in state["error"]
