"""``slime.diagnosis`` and the watchdog: causes named from error text, the process blamed for a stall,
real stack dumps of real processes (py-spy), the watchdog firing on a real thread, ``why`` on a copied
run dir, and the collective timeout taken from ``cluster.stall_timeout_s``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import pytest

from slime.core.errors import ExitCode
from slime.core.paths import RunPaths
from slime.diagnosis import record as records
from slime.diagnosis.causes import name_cause
from slime.diagnosis.explain import explain
from slime.diagnosis.phases import DEFAULT_TIMEOUT_S, collective_timeout_s, phase_timeout_s
from slime.diagnosis.stacks import ProcStacks, behind, dump, pyspy

REPO = Path(__file__).resolve().parents[2]

CASES = [
    ("RuntimeError", "CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom", None),
    ("OutOfMemoryError", "Task was killed due to the node running low on memory.", "host_oom", None),
    ("OSError", "[Errno 28] No space left on device: '/ck/3/actor-rank0.pt'", "disk_full", None),
    (
        "RuntimeError",
        "[../gloo/transport/tcp/pair.cc:534] Timed out waiting 20000ms for recv operation",
        "collective_timeout",
        ExitCode.STALL,
    ),
    (
        "DistBackendError",
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, ncclSystemError",
        "collective_error",
        None,
    ),
    (
        "RewardFunctionError",
        "reward function 'm:f' raised KeyError: 'x' (at /u/m.py:3 in f); fix the function",
        "user_code",
        None,
    ),
    ("DatasetError", "/data/train.jsonl:17: missing key 'prompt' (row has ['q'])", "data", None),
    ("ActorDiedError", "The actor died unexpectedly before finishing this task. SIGKILL", "process_killed", None),
    ("InfraError", "lost sn2 (10.0.0.2) during training (Ray marks the node dead)", "node_lost", None),
    (
        "InfraError",
        "lost a trainer or engine process during training (a trainer or engine process",
        "process_killed",
        None,
    ),
    ("ValueError", "rollout.num_rollouts is unknown", "input", None),
    ("KeyError", "'weights'", "bug", None),
]


@pytest.mark.parametrize("type_name,text,cause,code", CASES, ids=[c[2] + "-" + c[0] for c in CASES])
def test_each_cause_is_named_from_the_error(type_name, text, cause, code):
    exit_code = ExitCode.SPEC if type_name in ("ValueError", "DatasetError", "RewardFunctionError") else ExitCode.BUG
    named = name_cause([type_name], text, exit_code)
    assert named.cause.key == cause
    assert named.cause.exit_code == code
    assert named.evidence and named.evidence[-1] == text[:400]
    if cause == "user_code":
        assert named.frame == "/u/m.py:3 in f"


def test_phase_timeouts_default_per_phase_apply_one_setting_and_turn_off():
    assert phase_timeout_s(None, "first train step") == DEFAULT_TIMEOUT_S["first train step"]
    assert DEFAULT_TIMEOUT_S["first train step"] > DEFAULT_TIMEOUT_S["train step"]
    assert phase_timeout_s(12.5, "weight sync") == 12.5
    assert phase_timeout_s(12.5, "engine start") == phase_timeout_s(12.5, "first train step") == 25
    assert phase_timeout_s(0, "rollout") is None
    assert collective_timeout_s(20) == 40 and collective_timeout_s(None) == DEFAULT_TIMEOUT_S["first train step"]
    assert collective_timeout_s(0) == DEFAULT_TIMEOUT_S["first train step"]  # no watchdog: the default still bounds it


def _proc(label, frames, stopped=False):
    return ProcStacks(label, 1, "n1", threads=[{"thread_name": "MainThread", "frames": frames}], stopped=stopped)


LIB = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
OURS = str(REPO / "slime/runtime/trainer_group.py")


def test_the_blamed_process_is_the_stopped_one_then_user_code_then_the_rank_outside_the_collective():
    in_ar = _proc(
        "actor rank 0",
        [{"name": "all_reduce", "filename": LIB, "line": 1}, {"name": "train", "filename": OURS, "line": 9}],
    )
    late = _proc("actor rank 1", [{"name": "forward", "filename": OURS, "line": 5}])
    b = behind([in_ar, late], "train step")
    assert (b.proc.label, b.kind, b.frame) == ("actor rank 1", "collective", f"forward ({OURS}:5)")
    user = _proc("rollout manager", [{"name": "my_reward", "filename": "/home/u/rw.py", "line": 4}])
    assert behind([in_ar, late, user], "rollout").kind == "user_code"
    eng = _proc("engine 0", [{"name": "serve", "filename": OURS, "line": 1}], stopped=True)
    b = behind([in_ar, user, eng], "rollout")
    assert (b.proc.label, b.kind) == ("engine 0", "stopped")
    b = behind([_proc("engine 0", [{"name": "serve", "filename": OURS, "line": 1}])], "rollout")
    assert (b.proc.label, b.kind) == ("engine 0", "phase")
    driver = _proc("driver", [{"name": "reserve", "filename": str(REPO / "slime/placement.py"), "line": 186}])
    b = behind([driver], "engine start")  # nothing started yet: where the driver waits
    assert (b.proc.label, b.kind, b.why) == ("driver", "driver", "waits in reserve")


SLEEPER = textwrap.dedent(
    """
    import sys, time
    def wait_here():
        print("ready", flush=True)
        time.sleep(600)
    wait_here()
    """
)


@pytest.fixture
def sleeper(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, script
    proc.kill()
    proc.wait()


@pytest.mark.skipif(pyspy() is None, reason="py-spy is not installed (the runtime extra has it)")
def test_a_real_dump_names_the_frame_a_process_waits_in_also_when_it_is_stopped(sleeper):
    proc, script = sleeper
    p = dump("sleeper", proc.pid, "here")
    assert p.error is None and not p.stopped
    assert f"wait_here ({script}:5)" in p.text
    os.kill(proc.pid, 19)  # SIGSTOP
    try:
        # the signal lands asynchronously; a hung rank is stopped long before a watchdog looks
        for _ in range(200):
            if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "T":
                break
            time.sleep(0.01)
        p = dump("sleeper", proc.pid, "here")
        assert p.stopped and f"wait_here ({script}:5)" in p.text
        b = behind([p], "rollout")
        assert b.kind == "stopped" and b.proc is p
    finally:
        os.kill(proc.pid, 18)  # SIGCONT
    own = dump("driver", os.getpid(), "here")  # py-spy cannot attach to its caller: faulthandler
    assert "test_diagnosis.py" in own.text


@pytest.mark.skipif(pyspy() is None, reason="py-spy is not installed (the runtime extra has it)")
def test_the_watchdog_fires_after_the_timeout_dumps_and_records_and_beats_postpone_it(tmp_path, sleeper):
    from slime.runtime.watchdog import Watchdog

    proc, script = sleeper
    tp = RunPaths(tmp_path / "run").task(0)
    tp.dir.mkdir(parents=True)
    fired: list = []
    done = threading.Event()

    def on_stall(d):
        fired.append(d)
        done.set()
        threading.Event().wait()  # the real one tears down and exits; keep this thread from exiting the test

    exits: list = []
    w = Watchdog(
        1.0,
        tp,
        processes=lambda: [("engine 0", proc.pid, None)],
        on_stall=on_stall,
        say=lambda m: None,
        poll_s=0.1,
        hard_exit=lambda: exits.append(1),  # the real one would end the pytest worker a grace time later
    )
    w.start()
    t0 = time.monotonic()
    with w.phase("weight sync", rollout=3, step=7):
        for _ in range(5):  # progress: no stall while it beats
            time.sleep(0.4)
            w.beat()
        assert not fired
        assert done.wait(30)
    assert time.monotonic() - t0 < 2.0 + 1.0 + 30
    (d,) = fired
    assert (d.cause, d.phase, d.rollout, d.step, d.exit_code) == ("stall", "weight sync", 3, 7, ExitCode.STALL)
    assert d.who == f"engine 0 (pid {proc.pid})" and d.frame == f"wait_here ({script}:5)"
    assert records.read(tp) == [d]
    assert (tp.root / d.stacks / f"engine-0-pid{proc.pid}.txt").read_text().count("wait_here") == 1
    w.close()


def test_the_first_train_step_gets_its_own_longer_default():
    from slime.runtime.watchdog import Watchdog

    w = Watchdog(None, RunPaths(Path("/nonexistent")).task(0), processes=list, on_stall=print, say=print)
    with w.phase("train step"):
        assert (w.name, w.timeout_s) == ("first train step", DEFAULT_TIMEOUT_S["first train step"])
    with w.phase("train step"):
        assert (w.name, w.timeout_s) == ("train step", DEFAULT_TIMEOUT_S["train step"])
    with pytest.raises(KeyError), w.phase("eval", rollout=4):
        raise KeyError("x")
    assert w.failed_in == ("eval", 4, None) and w.name is None
    off = Watchdog(0, RunPaths(Path("/nonexistent")).task(0), processes=list, on_stall=print, say=print).start()
    assert off._thread is None  # 0 turns it off


def test_why_reads_a_copied_run_dir_and_falls_back_to_the_logs(tmp_path):
    paths = RunPaths(tmp_path / "run")
    tp = paths.task(0)
    tp.dir.mkdir(parents=True)
    tp.resolved.write_text("{}")
    tp.state.write_text(json.dumps({"state": "failed", "exit_code": 3}))
    tp.logs.mkdir()
    (tp.logs / "sn2.err").write_text("starting\nray.exceptions.ActorDiedError: The actor died unexpectedly. SIGKILL\n")
    ex = explain(paths, 0)
    assert ex.source == "logs" and ex.diagnosis["cause"] == "process_killed"
    assert any("tasks/0/logs/sn2.err" in line for line in ex.diagnosis["evidence"])
    records.append(tp, records.Diagnosis(cause="disk_full", title="t", fix="free space", exit_code=2, node="sn1"))
    copy = tmp_path / "copied"
    shutil.copytree(paths.root, copy)
    shutil.rmtree(paths.root)
    done = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "why", str(copy), "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["source"] == "record" and doc["diagnosis"]["cause"] == "disk_full" and doc["exit_code"] == 3
    screen = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "why", str(copy)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "disk_full" in screen and "free space" in screen and "node sn1" in screen
    assert max(len(line) for line in screen.splitlines()) <= 80


def test_a_damaged_record_file_reads_as_none():
    class TP:
        diagnosis = Path("/nonexistent/diagnosis.json")

    assert records.read(TP()) == []
    assert msgspec.json.decode(msgspec.json.encode(records.Diagnosis(cause="c", title="t", fix="f", exit_code=1)))


def test_the_trainers_collective_timeout_comes_from_the_setting():
    import datetime

    from slime.backends.train import torch_backend

    src = Path(torch_backend.__file__).read_text()
    assert "collective_timeout_s(self.spec.cluster.stall_timeout_s)" in src and "minutes=10" not in src
    assert datetime.timedelta(seconds=collective_timeout_s(20)).total_seconds() == 40


def test_a_cuda_oom_names_the_roles_fit_estimate(tmp_path):
    """No GPU here: the error is the text torch raises; the estimate is the real one (slime.fit)."""
    from slime.runtime.failures import diagnose
    from tests.fixtures.fit_configs import QWEN25_7B, write_model
    from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

    model = write_model(tmp_path, "Qwen2.5-7B-Instruct", QWEN25_7B)
    s = load(spec(GPU_SPEC, **{"model.path": str(model), "cluster.gpu": {"name": "H100-80GB"}})).spec
    err = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    d = diagnose(err, ExitCode.BUG, phase="train step", rollout=3, step=3, since=time.time(), spec=s)
    assert d.cause == "cuda_oom" and "micro_batch_size" in d.fix
    assert "the fit estimate for the actor:" in d.fix and "GiB per GPU" in d.fix and "largest: " in d.fix
    d = diagnose(err, ExitCode.BUG, phase="train step", rollout=3, step=3, since=time.time(), spec=None)
    assert "fit estimate" not in d.fix


def test_a_phase_longer_than_its_timeout_lives_while_it_beats_and_stalls_once_it_stops(tmp_path):
    """The real Watchdog and ``beats.beat`` (the call the phases' work makes, here in the driver's own
    process): 3 s of beating work under a 1 s timeout is not a stall; beats of another phase do not count;
    silence is a stall within the timeout plus a poll."""
    from slime.diagnosis import beats
    from slime.runtime.watchdog import Watchdog

    tp = RunPaths(tmp_path / "run").task(0)
    tp.dir.mkdir(parents=True)
    fired: list = []
    w = Watchdog(
        1.0, tp, processes=list, on_stall=fired.append, say=lambda m: None, poll_s=0.05, hard_exit=lambda: None
    )
    w.start()
    try:
        with w.phase("checkpoint save", rollout=2, step=4):
            for _ in range(15):  # 3 s in all: three times the timeout, one "file" every 0.2 s
                time.sleep(0.2)
                beats.beat("checkpoint save")
            assert not fired
            silent = time.monotonic()
            while not fired and time.monotonic() - silent < 10:
                time.sleep(0.1)
                beats.beat("rollout")  # an async rollout's progress is not the save's
        assert fired and 1.0 <= time.monotonic() - silent < 1.0 + 1.0
        assert (fired[0].cause, fired[0].phase, fired[0].exit_code) == ("stall", "checkpoint save", ExitCode.STALL)
    finally:
        w.close()
    beats.beat("checkpoint save")  # closed: the process's beats no longer reach it
    assert beats._local is None


ARMED = textwrap.dedent(
    """
    import sys, threading, time
    from slime.diagnosis import fault_dump
    def wait_here():
        print("ready", flush=True)
        time.sleep(600)
    def side():
        time.sleep(600)
    if sys.argv[1] == "arm":
        fault_dump.arm()
    threading.Thread(target=side, daemon=True).start()
    wait_here()
    """
)


def _started(tmp_path, mode: str):
    script = tmp_path / f"armed-{mode}.py"
    script.write_text(ARMED)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc, script


def test_without_py_spy_a_workers_own_faulthandler_dump_names_the_frame(tmp_path, monkeypatch):
    """py-spy made unavailable (``pyspy() -> None``): the real worker process writes its own stacks on
    SIGUSR2 (``fault_dump.arm``); one that never armed it is left alone (the signal would kill it)."""
    from slime.diagnosis import stacks

    monkeypatch.setattr(stacks, "pyspy", lambda: None)
    armed, script = _started(tmp_path, "arm")
    bare, _ = _started(tmp_path, "bare")
    try:
        for _ in range(2):  # twice: the second dump is read from where the first ended
            p = dump("engine 0", armed.pid, "here")
            assert p.error is None and p.via == "faulthandler", p.error
            assert f"wait_here ({script}:6)" in p.text and "(its own faulthandler dump)" in p.text
            assert len(p.threads) == 2 and sum("side" in str(t["frames"]) for t in p.threads) == 1
        b = behind([p], "rollout")
        assert (b.proc, b.kind) == (p, "user_code") and b.frame == f"wait_here ({script}:6)"
        t0 = time.monotonic()
        q = dump("rollout manager", bare.pid, "here")
        assert q.threads == [] and "py-spy is not installed" in q.error and "no faulthandler dump armed" in q.error
        assert time.monotonic() - t0 < 1 and bare.poll() is None  # not signalled: still running
        os.kill(armed.pid, 19)  # SIGSTOP: it cannot run its handler; the dump says so at once
        for _ in range(200):
            if Path(f"/proc/{armed.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "T":
                break
            time.sleep(0.01)
        s = dump("engine 0", armed.pid, "here")
        assert s.stopped and "it is stopped" in s.error
    finally:
        for proc in (armed, bare):
            proc.kill()
            proc.wait()


# What the driver gets when a trainer rank runs out of GPU memory mid-step: Ray's header naming the actor
# task, the rank's traceback, and torch's own message (torch 2.5+: torch.OutOfMemoryError).
RANK_OOM = """\
ray::TrainerRank.train() (pid=48213, ip=10.0.0.7, actor_id=5f1c0a2be8d7, repr=<TrainerRank object at 0x7f3a>)
  File "/opt/slime/slime/runtime/trainer_group.py", line 313, in _train_steps
    m = self.backend.train_step(batch.select(slice(start, start + size)), step=first_step + s)
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call_impl
    return forward_call(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.88 GiB. GPU 0 has a total capacity of 79.10 GiB \
of which 2.06 GiB is free. Including non-PyTorch memory, this process has 77.03 GiB memory in use. Of the allocated \
memory 71.52 GiB is allocated by PyTorch, and 4.21 GiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."""


def test_a_ranks_cuda_oom_from_its_real_text_names_the_rank_and_its_fit_breakdown(tmp_path):
    """A fake at the GPU boundary: no GPU here, so the error is the text a real rank's OOM reaches the driver
    with (Ray's wrapping and torch's message, as above); the fit estimate is the real one (slime.fit)."""
    from slime.runtime.failures import diagnose
    from tests.fixtures.fit_configs import QWEN25_7B, write_model
    from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

    model = write_model(tmp_path, "Qwen2.5-7B-Instruct", QWEN25_7B)
    s = load(spec(GPU_SPEC, **{"model.path": str(model), "cluster.gpu": {"name": "H100-80GB"}})).spec
    d = diagnose(RuntimeError(RANK_OOM), ExitCode.BUG, phase="train step", rollout=5, step=5, since=time.time(), spec=s)
    assert (d.cause, d.who, d.pid, d.phase) == ("cuda_oom", "TrainerRank.train", 48213, "train step")
    assert d.node.endswith("10.0.0.7") and d.title == "a GPU ran out of memory"
    assert d.fix.startswith("lower train.micro_batch_size")
    fit = d.fix[d.fix.index("; the fit estimate") + 2 :]
    assert fit.startswith("the fit estimate for the actor: ") and " GiB of 80.0 GiB per GPU" in fit
    assert "largest: weights " in fit
    assert any("Tried to allocate 3.88 GiB" in line for line in d.evidence)
    # no record (the driver was killed first): `why` reads the same cause from the log's error line
    run = RunPaths(tmp_path / "run")
    run.task(0).logs.mkdir(parents=True)
    run.task(0).state.write_text(json.dumps({"state": "failed", "exit_code": 1}))
    (run.task(0).logs / "driver.err").write_text(RANK_OOM + "\n")
    ex = explain(run, 0)
    assert ex.source == "logs" and ex.diagnosis["cause"] == "cuda_oom"
