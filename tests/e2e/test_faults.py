"""Fault injection on the real local runtime: each cause ends the job within the timeout plus a bounded
margin, with its documented exit code, a diagnosis record, stacks that name the right frame (stalls), no
checkpoint lost, and ``slime-submit why`` naming the cause and the fix.

Real parts only: the quickstart spec scaled down, ``python -m slime.train`` with its own local Ray, and
faults made from outside the way they happen (a reward that never returns or raises, SIGSTOP/SIGKILL of
an engine or rank process, a malformed data row, a full tmpfs, a memory cgroup). The sleeping and the
raising reward run in CI; the others are ``extended``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from slime.diagnosis.stacks import descendants
from tests.fixtures.faults import fault_env
from tests.fixtures.quickstart import REPO, compile_run

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]

STALL_S = 15  # cluster.stall_timeout_s of these runs
MARGIN_S = 75  # the bound on everything else: Ray's start, dumping stacks, teardown
BASE = [
    "algorithm.sft_warmup_steps=0",
    "logging.progress=false",
    "data.eval=[]",
    f"cluster.stall_timeout_s={STALL_S}",
    "rollout.batch_size=4",
    "train.global_batch_size=32",
    "train.micro_batch_size=32",
]


def start(tmp_path: Path, name: str, sets: list[str]) -> tuple[Path, subprocess.Popen]:
    run = compile_run(tmp_path / "runs", name, [*BASE, *sets])
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.train", str(run)],
        cwd=REPO,
        env=fault_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return run, proc


def finish(proc: subprocess.Popen, t0: float, budget_s: float) -> tuple[int, str, float]:
    try:
        _, err = proc.communicate(timeout=budget_s + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the job did not end within {budget_s + 60:.0f}s:\n{err[-3000:]}")
    return proc.returncode, err, time.monotonic() - t0


def why(run: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**fault_env(), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "why", str(run), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def why_json(run: Path) -> dict:
    done = why(run, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {what} within {timeout_s}s")


def ray_proc(root: int, title: str) -> int | None:
    """The pid of the Ray worker under ``root`` whose process title starts with ``ray::TITLE``."""
    for pid in descendants(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(f"ray::{title}"):
            return pid
    return None


def checkpoints_intact(run: Path) -> list[int]:
    """The complete checkpoints of task 0 (each one's state.json reads); asserts no temp dir is left."""
    ck = run / "tasks/0/checkpoints"
    done = sorted(int(d.name) for d in ck.iterdir() if d.is_dir() and d.name.isdigit())
    for rid in done:
        assert json.loads((ck / str(rid) / "state.json").read_text())["rollout_id"] == rid
    return done


def one_record(run: Path) -> dict:
    records = json.loads((run / "tasks/0/diagnosis.json").read_text())
    assert len(records) == 1, records
    return records[0]


# ---------------------------------------------------------------- CI: a stall and a user error


def test_a_reward_that_never_returns_is_a_stall_naming_its_frame(tmp_path):
    t0 = time.monotonic()
    run, proc = start(
        tmp_path,
        "sleepy",
        ["rollout.num_rollouts=2", "reward.type=custom", "reward.custom=tests.fixtures.faults:sleepy_reward"],
    )
    rc, err, wall = finish(proc, t0, STALL_S + MARGIN_S)
    assert rc == 124, err[-3000:]
    assert wall < STALL_S + MARGIN_S, f"{wall:.0f}s"
    d = one_record(run)
    assert d["cause"] == "stall" and d["phase"] == "rollout" and d["exit_code"] == 124
    assert d["who"].startswith("rollout manager") and d["frame"].startswith("sleepy_reward (")
    assert "faults.py" in d["frame"]
    stacks = run / d["stacks"]
    manager = next(stacks.glob("rollout-manager-pid*.txt")).read_text()
    assert "sleepy_reward (" in manager and "faults.py" in manager
    assert {p.name.split("-pid")[0] for p in stacks.glob("*.txt")} >= {"driver", "actor-rank-0", "engine-0"}
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert state["state"] == "failed" and state["exit_code"] == 124
    screen = why(run).stdout
    assert "stall" in screen and "sleepy_reward" in screen and "never returns" in screen
    assert "exit 124" in screen


def test_a_raising_reward_names_the_users_frame_and_exits_2(tmp_path):
    t0 = time.monotonic()
    run, proc = start(
        tmp_path,
        "raising",
        ["rollout.num_rollouts=2", "reward.type=custom", "reward.custom=tests.fixtures.faults:raising_reward"],
    )
    rc, err, _ = finish(proc, t0, MARGIN_S)
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err
    d = one_record(run)
    assert d["cause"] == "user_code" and d["phase"] == "rollout" and d["exit_code"] == 2
    assert d["frame"].startswith("tests/fixtures/faults.py:") or "faults.py" in d["frame"]
    assert "raising_reward" in d["frame"] and "no field 'answer'" in d["message"]
    ex = why_json(run)
    assert ex["diagnosis"]["cause"] == "user_code" and ex["exit_code"] == 2
    assert "fix the function" in ex["diagnosis"]["fix"]
