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
import os
import signal
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


# ---------------------------------------------------------------- extended: the other causes

LONG = ["rollout.num_rollouts=40", "train.checkpoint.interval=1", "train.checkpoint.keep=3"]


def first_checkpoint(run: Path, proc: subprocess.Popen) -> None:
    ck = run / "tasks/0/checkpoints/0/state.json"
    wait_for(ck.exists, 150, "a first checkpoint", proc)


@pytest.mark.extended
def test_an_engine_stopped_mid_rollout_is_a_stall_naming_the_engine(tmp_path):
    t0 = time.monotonic()
    run, proc = start(tmp_path, "sigstop", LONG)
    first_checkpoint(run, proc)
    engine = wait_for(lambda: ray_proc(proc.pid, "EngineHost"), 30, "the engine process", proc)
    os.kill(engine, signal.SIGSTOP)
    stopped_at = time.monotonic()
    rc, err, _ = finish(proc, t0, STALL_S + MARGIN_S)
    assert rc == 124, err[-3000:]
    assert time.monotonic() - stopped_at < STALL_S + MARGIN_S
    d = one_record(run)
    assert d["cause"] == "stall" and d["phase"] in ("rollout", "weight sync")
    assert d["who"] == f"engine 0 (pid {engine})" and "is stopped" in d["title"]
    assert f"kill -CONT {engine}" in d["fix"]
    assert "(stopped)" in next((run / d["stacks"]).glob("engine-0-pid*.txt")).read_text()
    assert checkpoints_intact(run)
    ex = why_json(run)
    assert ex["diagnosis"]["who"].startswith("engine 0") and ex["exit_code"] == 124


@pytest.mark.extended
def test_a_trainer_rank_killed_mid_step_names_the_process_and_keeps_the_checkpoints(tmp_path):
    t0 = time.monotonic()
    run, proc = start(tmp_path, "sigkill", LONG)
    first_checkpoint(run, proc)
    rank = wait_for(lambda: ray_proc(proc.pid, "TrainerRank"), 30, "the trainer rank process", proc)
    os.kill(rank, signal.SIGKILL)
    rc, err, _ = finish(proc, t0, MARGIN_S)
    assert rc == 3, err[-3000:]
    d = one_record(run)
    assert d["cause"] == "process_killed" and d["exit_code"] == 3
    assert any("died" in line or "SIGKILL" in line for line in d["evidence"]), d["evidence"]
    done = checkpoints_intact(run)
    assert done
    screen = why(run).stdout
    assert "process_killed" in screen and "exit 3" in screen


@pytest.mark.extended
def test_a_rank_that_never_joins_the_collective_ends_within_the_timeout(tmp_path):
    """Two data-parallel trainer ranks on CPU (fake GPU slots); rank 1 is stopped, rank 0 waits in the
    all-reduce: the watchdog (or the gloo timeout, the same setting) ends the job naming rank 1."""
    t0 = time.monotonic()
    two = [
        "cluster.gpus_per_node=3",
        "cluster.cpus_per_node=6",  # a CPU for each of the three slots' bundles and the manager
        "cluster.fake_gpus=true",
        "train.gpus_per_node=2",
        "rollout.gpus=1",
        "rollout.gpus_per_engine=1",
        "train.micro_batch_size=16",
    ]
    run, proc = start(tmp_path, "collective", [*LONG, *two])
    first_checkpoint(run, proc)
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert [r["rank"] for r in state["ranks"]] == [0, 1]
    victim = state["ranks"][1]["pid"]  # where each rank runs, as the driver recorded it
    os.kill(victim, signal.SIGSTOP)
    try:
        rc, err, _ = finish(proc, t0, STALL_S + MARGIN_S)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert rc == 124, err[-3000:]
    d = one_record(run)
    assert d["exit_code"] == 124 and d["cause"] in ("stall", "collective_timeout")
    if d["cause"] == "stall":
        assert d["who"] == f"actor rank 1 (pid {victim})", d
    assert checkpoints_intact(run)


@pytest.mark.extended
def test_a_malformed_data_row_names_the_file_and_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text((REPO / "specs/data/arith/train.jsonl").read_text() + '{"prompt": "01+01=", "label": "2"\n')
    t0 = time.monotonic()
    run, proc = start(tmp_path, "baddata", ["rollout.num_rollouts=2", f"data.prompts={prompts}"])
    rc, err, _ = finish(proc, t0, MARGIN_S)
    assert rc == 2, err[-3000:]
    d = one_record(run)
    assert d["cause"] == "data" and f"{prompts}:2001" in d["message"]
    ex = why_json(run)
    assert any(f"{prompts}:2001" in line for line in ex["diagnosis"]["evidence"])
    assert "the file and line" in ex["diagnosis"]["fix"] or "row" in ex["diagnosis"]["fix"]


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MB tmpfs (root only): a file system that fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "ck"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.extended
def test_a_checkpoint_on_a_full_filesystem_names_the_dir_and_the_space_and_keeps_the_last(tmp_path, small_fs):
    t0 = time.monotonic()
    run, proc = start(tmp_path, "fulldisk", [*LONG, f"train.checkpoint.dir={small_fs}"])
    wait_for((small_fs / "0" / "state.json").exists, 150, "a first checkpoint", proc)
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    with (small_fs / "filler").open("wb") as fh:  # leave less than a checkpoint needs
        os.posix_fallocate(fh.fileno(), 0, max(0, free - 256 * 1024))
    rc, err, _ = finish(proc, t0, MARGIN_S)
    assert rc == 2, err[-3000:]
    assert "a bug" not in err
    d = one_record(run)
    assert d["cause"] == "disk_full" and d["exit_code"] == 2
    assert str(small_fs) in d["message"] and "MB free there" in d["message"] and "took" in d["message"]
    assert "train.checkpoint.dir" in d["fix"]
    kept = sorted(int(p.name) for p in small_fs.iterdir() if p.name.isdigit())
    assert kept and all((small_fs / str(k) / "state.json").exists() for k in kept)
    assert "disk_full" in why(run).stdout


CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@pytest.mark.extended
def test_a_rank_over_its_memory_cgroup_is_a_host_oom_naming_node_and_process(tmp_path):
    if os.geteuid() != 0 or not (CGROUP_V1 / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and the cgroup v1 memory controller (this machine's layout)")
    group = CGROUP_V1 / f"slime-test-{os.getpid()}"
    group.mkdir()
    t0 = time.monotonic()
    run, proc = start(tmp_path, "cgroup", LONG)
    try:
        first_checkpoint(run, proc)
        rank = wait_for(lambda: ray_proc(proc.pid, "TrainerRank"), 30, "the trainer rank process", proc)
        (group / "memory.limit_in_bytes").write_text(str(4 * 1024 * 1024))
        (group / "cgroup.procs").write_text(str(rank))  # its next pages go over the limit
        rc, err, _ = finish(proc, t0, MARGIN_S)
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (CGROUP_V1 / "cgroup.procs").write_text(pid)
        group.rmdir()
    assert rc == 3, err[-3000:]
    d = one_record(run)
    assert d["cause"] == "host_oom" and d["pid"] == rank and "memory cgroup" in d["title"]
    assert d["who"].startswith("ray::TrainerRa") and d["node"]
    assert "cluster.slurm.mem" in d["fix"]
    assert checkpoints_intact(run)
