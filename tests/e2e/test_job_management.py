"""Job management end to end on the real 2-node SLURM cluster (ci/slurm-cluster.sh) and locally:
``status``/``logs``/``cancel``/``list``/``rerun`` through the ``slime-submit`` command with ``--json``,
duplicate-submit refusal, the job completion log once SLURM's memory is not asked, and a canary
secret that the job reads but that appears nowhere in the run dirs or any command's output.

Real slurmctld/slurmd, real sbatch/scancel, the real bootstrap (Ray + preflight) on the nodes, the
real local launcher. The one stand-in: the driver (``jm_driver`` below, written into the test's
directory) replaces the RL runtime. It writes what the runtime writes for job management
(``state.json``, ``metrics.jsonl`` lines with ``rollout_id``/``step``), records the SHA-256 of each
secret it was given, and then waits for a ``release`` file, so that tests can look at a running job.
"Left squeue" is shown by asking only the job completion log (``sacct -c``) and the run dir, as
status does once slurmctld has purged a job (``MinJobAge`` is an hour on the CI cluster).
The tests run in file order and share one module directory; each reasons only about its own jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "specs" / "data" / "arith" / "train.jsonl"
ENV_CANARY = f"canary-env-{secrets.token_hex(12)}"
FILE_CANARY = f"canary-file-{secrets.token_hex(12)}"
OUTPUTS: list[str] = []  # every command's stdout and stderr, scanned for the canaries at the end
STATE: dict[str, Path] = {}

DRIVER = '''"""jm_driver: stands in for the RL runtime in tests/e2e/test_job_management.py."""
import hashlib, json, os, signal, sys, time
from pathlib import Path

run_dir, task = Path(sys.argv[1]), int(sys.argv[sys.argv.index("--task") + 1])
tdir = run_dir / "tasks" / str(task)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append("TERM"))


def state(s, **kw):
    tmp = tdir / ".state.tmp"
    tmp.write_text(json.dumps({"state": s, "pid": os.getpid(), "host": os.uname().nodename, **kw}))
    tmp.replace(tdir / "state.json")


probe = {}
for name in ("CANARY_ENV", "CANARY_FILE"):
    value = os.environ.get(name)
    probe[name] = None if value is None else hashlib.sha256(value.encode()).hexdigest()
    print(f"jm-driver: secret {name} has length {len(value) if value is not None else 'MISSING'}", flush=True)
(tdir / "secret-probe.json").write_text(json.dumps(probe))
with open(tdir / "metrics.jsonl", "a") as fh:
    for k in range(3):
        fh.write(json.dumps({"rollout_id": k, "step": k + 1, "rollout/reward_mean": 0.25 * (k + 1)}) + "\\n")
        fh.flush()
        state("running", rollout_id=k, step=k + 1)
        print(f"jm-driver: step {k + 1}", flush=True)
deadline = time.monotonic() + float(os.environ.get("JM_HOLD_S", "0"))
while time.monotonic() < deadline and not (tdir / "release").exists() and not stop:
    time.sleep(0.1)
if stop:
    state("preempted", error="stopped by SIGTERM")
    sys.exit(143)
state("succeeded")
print("jm-driver: done", flush=True)
'''

SPEC = """apiVersion: slime/v2
kind: RLJob
name: {name}
cluster:
  launcher: {launcher}
  nodes: 1
  gpus_per_node: {gpus}
  cpus_per_node: 2
{slurm}  bootstrap_timeout_s: 90
  env: {{OMP_NUM_THREADS: "1"}}
  secrets:
    CANARY_ENV: {{env: JM_CANARY_SOURCE}}
    CANARY_FILE: {{file: {secret_file}}}
model: {{builtin: tiny}}
train: {{backend: torch, nodes: 1, gpus_per_node: {gpus}, micro_batch_size: 1, seed: 1}}
rollout: {{backend: builtin, colocate: {colocate}, batch_size: 4, n_samples_per_prompt: 2, num_rollouts: 2,
          max_prompt_len: 16, max_response_len: 8}}
data: {{prompts: {prompts}, eval: []}}
logging: {{dir: {logdir}, wandb: {{mode: disabled}}}}
"""
# fake_gpus: the CI cluster's GRES GPUs have no CUDA (without it the preflight fails, as it must)
SLURM_LINES = '  slurm: {mem: 2G, time_limit: "00:10:00", partition: batch}\n  fake_gpus: true\n'


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("jobmgmt")
    (d / "jm_driver.py").write_text(DRIVER)
    (d / "secret.txt").write_text(FILE_CANARY + "\n")
    for launcher in ("slurm", "local"):
        gpus = 2 if launcher == "slurm" else 0
        (d / f"{launcher}.yaml").write_text(
            SPEC.format(
                name=f"jm-{launcher}",
                launcher=launcher,
                gpus=gpus,
                slurm=SLURM_LINES if launcher == "slurm" else "",
                secret_file=d / "secret.txt",
                colocate="true" if gpus else "false",
                prompts=PROMPTS,
                logdir=d / f"runs-{launcher}",
            )
        )
    return d


def job_env(work: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(work),
        "SLIME_DRIVER": "jm_driver",
        "JM_CANARY_SOURCE": ENV_CANARY,
        "JM_HOLD_S": "150",
        "COLUMNS": "200",
        **extra,
    }


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[int, object]:
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    OUTPUTS.extend([proc.stdout, proc.stderr])
    print(
        f"slime-submit {' '.join(a if len(a) < 40 else '...' + a[-30:] for a in args)} -> {proc.returncode} "
        f"({time.monotonic() - t:.1f} s)"
    )
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, proc.stdout + proc.stderr


def wait_status(target: str, env: dict[str, str], pred, what: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rc, st = cli("status", target, "--json", env=env)
        assert rc == 0, st
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {json.dumps(st, indent=1)}"
        time.sleep(1.0)


def task(st: dict, i: int) -> dict:
    return next(t for t in st["tasks"] if t["task"] == i)


def test_slurm_sweep_status_reasons_duplicate_cancel_logs_follow_and_jobcomp(slurm_cluster, work):
    env = job_env(work)
    spec = str(work / "slurm.yaml")
    sweep = ["--set", 'sweep.grid={"train.seed": [1, 2]}', "--set", "sweep.max_parallel=1"]
    t0 = time.monotonic()
    rc, out = cli(spec, *sweep, "--json", env=env)
    assert rc == 0, out
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    STATE["slurm_run"] = run_dir

    # task 0 runs (and reaches step 3), task 1 waits behind sweep.max_parallel, with the reason said
    st = wait_status(
        str(run_dir),
        env,
        lambda s: task(s, 0)["state"] == "running" and task(s, 0)["step"] == 3,
        "task 0 to run to step 3",
    )
    print(f"task 0 at step 3 {time.monotonic() - t0:.1f} s after submit")
    t0s, t1s = task(st, 0), task(st, 1)
    assert (t0s["job_id"], t0s["source"], t0s["nodes"] in slurm_cluster.nodes) == (f"{job}_0", "scontrol", True)
    assert t0s["metric"] == {"name": "rollout/reward_mean", "value": 0.75} and t0s["rollout_id"] == 2
    assert t1s["state"] == "pending" and t1s["job_id"] == f"{job}_1"
    assert t1s["reason"].startswith("JobArrayTaskLimit"), t1s

    rc, listed = cli("list", "--dir", str(run_dir.parent), "--json", env=env)
    assert rc == 0 and [(r["run_dir"], r["state"], r["job_ids"], r["last_step"]) for r in listed["runs"]] == [
        (str(run_dir), "running", [job], 3)
    ]

    # the same spec again while it runs: refused (exit 2), nothing created; a job id finds the run
    rc, dup = cli(spec, *sweep, "--json", env=env)
    assert rc == 2 and job in dup["problems"][0]["message"] and str(run_dir) in dup["problems"][0]["message"]
    assert "--force" in dup["problems"][0]["hint"]
    assert [p.name for p in run_dir.parent.iterdir() if not p.name.startswith(".")] == [run_dir.name]
    rc, by_id = cli("status", f"{job}_0", "--dir", str(run_dir.parent), "--json", env=env)
    assert rc == 0 and by_id["run_dir"] == str(run_dir) and [t["task"] for t in by_id["tasks"]] == [0]

    # cancel the pending task only
    rc, cancelled = cli("cancel", str(run_dir), "--task", "1", "--json", env=env)
    assert rc == 0 and cancelled["cancelled"] == [f"{job}_1"] and cancelled["tasks"] == [1]
    st = wait_status(str(run_dir), env, lambda s: task(s, 1)["state"] == "cancelled", "task 1 cancelled", 60)
    assert task(st, 0)["state"] == "running"

    # logs: what the job printed so far; then follow until the job ends by itself
    rc, logs = cli("logs", job, "--task", "0", "--dir", str(run_dir.parent), "--json", env=env)
    (f,) = logs["files"]
    assert f["path"] == str(run_dir / "logs" / f"{job}_0".join(("slurm-", ".out")))
    assert "jm-driver: secret CANARY_ENV has length 35" in f["text"]  # the job saw the secret...
    assert "jm-driver: secret CANARY_FILE has length 36" in f["text"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "slime.cli.main", "logs", "-f", str(run_dir), "--task", "0", "--json"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    (run_dir / "tasks" / "0" / "release").touch()
    t1 = time.monotonic()
    fout, ferr = follow.communicate(timeout=120)  # it must stop on its own once the job ended
    OUTPUTS.extend([fout, ferr])
    print(f"logs -f stopped {time.monotonic() - t1:.1f} s after the release")
    chunks = [json.loads(x) for x in fout.splitlines()]
    assert follow.returncode == 0 and chunks[-1] == {
        "run_dir": str(run_dir),
        "task": 0,
        "state": "succeeded",
        "done": True,
    }
    followed = "".join(c.get("text", "") for c in chunks)
    assert "jm-driver: done" in followed and "slime: task 0 finished with exit code 0" in followed

    rc, st = cli("status", job, "--dir", str(run_dir.parent), "--json", env=env)
    assert st["state"] == "cancelled"  # one task succeeded, one was cancelled
    # an array task's own job id, without --dir: found through SLURM's record of its working dir
    plain = re.search(r"^slime: job (\d+) task 0 ", (run_dir / "logs" / f"slurm-{job}_0.out").read_text(), re.M)[1]
    rc, by_plain = cli("status", plain, "--json", env=env)
    assert rc == 0 and by_plain["run_dir"] == str(run_dir) and [t["task"] for t in by_plain["tasks"]] == [0]
    assert [(t["state"], t["step"], t["source"]) for t in st["tasks"]] == [
        ("succeeded", 3, "scontrol"),
        ("cancelled", None, "scontrol"),
    ]

    # once slurmctld is not asked: the job completion log and the run dir give the same answer
    from launchers.slurm.jobs import run_status
    from slime.core.paths import RunPaths

    late = run_status(RunPaths(run_dir), sources=("jobcomp", "rundir"))
    assert [(t.state, t.job_id, t.source) for t in late.tasks] == [
        ("succeeded", f"{job}_0", "jobcomp"),
        ("cancelled", f"{job}_1", "jobcomp"),
    ]
    assert late.tasks[0].exit_code == "0:0" and late.tasks[0].step == 3

    # provenance: the lock got the hosts from the preflight
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["hosts"]["0"]["nodes"][0]["host"] in slurm_cluster.nodes and lock["hosts"]["0"]["ok"] is True
    assert lock["options"]["driver_env"] == "jm_driver"
    print(f"sweep flow: {time.monotonic() - t0:.1f} s")


def test_rerun_submits_the_recorded_spec_as_a_new_run_and_cancel_stops_it(slurm_cluster, work):
    original = STATE.get("slurm_run")
    if original is None:
        pytest.skip("needs the run of the previous test")
    env = {k: v for k, v in job_env(work).items() if k != "SLIME_DRIVER"}  # the lock brings the driver back
    rc, out = cli("rerun", str(original), "--json", env=env)
    assert rc == 0, out
    new, (job,) = Path(out["run_dir"]), out["job_ids"]
    STATE["rerun"] = new
    assert new != original and new.parent == original.parent
    assert out["rerun_of"] == str(original) and out["script_identical"] is True
    old_lock, lock = (json.loads((d / "lock.json").read_text()) for d in (original, new))
    assert lock["spec_sha256"] == old_lock["spec_sha256"] == out["spec_sha256"]
    assert lock["rerun_of"]["run_dir"] == str(original) and lock["options"]["driver_env"] == "jm_driver"
    assert (new / "resolved.json").read_bytes() == (original / "resolved.json").read_bytes()
    assert (new / "job.sbatch").read_text() == (original / "job.sbatch").read_text().replace(str(original), str(new))
    rc, dup = cli("rerun", str(original), "--json", env=env)  # the rerun is now pending/running
    assert rc == 2 and job in dup["problems"][0]["message"]

    rc, cancelled = cli("cancel", job, "--dir", str(new.parent), "--json", env=env)
    assert rc == 0 and cancelled["cancelled"] == [job] and cancelled["tasks"] == [0, 1]
    st = wait_status(str(new), env, lambda s: s["state"] == "cancelled", "the rerun cancelled", 60)
    assert [t["state"] for t in st["tasks"]] == ["cancelled", "cancelled"]
    rc, again = cli("cancel", str(new), "--json", env=env)
    assert rc == 0 and again["cancelled"] == [] and "nothing to cancel" in again["message"]


def test_local_run_status_list_duplicate_and_cancel(work):
    env = job_env(work)
    spec = str(work / "local.yaml")
    submit = subprocess.Popen(
        [sys.executable, "-m", "slime.cli.main", spec, "--json"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs = work / "runs-local"
        deadline = time.monotonic() + 60
        while not (runs.is_dir() and any(runs.iterdir())):
            assert time.monotonic() < deadline and submit.poll() is None, "the local run did not start"
            time.sleep(0.2)
        (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
        STATE["local_run"] = run_dir
        st = wait_status(str(run_dir), env, lambda s: task(s, 0)["step"] == 3, "the local driver at step 3", 120)
        t = task(st, 0)
        assert (st["launcher"], t["state"], t["source"], t["metric"]["value"]) == ("local", "running", "process", 0.75)
        rc, listed = cli("list", "--dir", str(runs), "--json", env=env)
        assert [(r["state"], r["last_step"]) for r in listed["runs"]] == [("running", 3)]
        rc, dup = cli(spec, "--json", env=env)
        assert rc == 2 and str(run_dir) in dup["problems"][0]["message"]
        rc, cancelled = cli("cancel", str(run_dir), "--json", env=env)
        assert rc == 0 and cancelled["cancelled"] == [0] and len(cancelled["pids"]) == 1
        sout, serr = submit.communicate(timeout=90)  # the launcher returns once the bootstrap stopped
        OUTPUTS.extend([sout, serr])
        assert submit.returncode != 0
        assert json.loads(sout)["run_dir"] == str(run_dir)  # --json: stdout is the JSON alone, logs on stderr
        assert "driver exited with code" in serr
        rc, st = cli("status", str(run_dir), "--json", env=env)
        assert st["state"] == "cancelled" and task(st, 0)["exit_code"] == str(submit.returncode)
        assert json.loads((run_dir / "lock.json").read_text())["launcher"] == "local"
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()


def test_the_canary_secret_was_seen_by_the_jobs_and_appears_nowhere(work):
    runs = [STATE[k] for k in ("slurm_run", "rerun", "local_run") if k in STATE]
    if "slurm_run" not in STATE or "local_run" not in STATE:
        pytest.skip("needs the runs of the previous tests")
    want = {
        "CANARY_ENV": hashlib.sha256(ENV_CANARY.encode()).hexdigest(),
        "CANARY_FILE": hashlib.sha256(FILE_CANARY.encode()).hexdigest(),
    }
    for run_dir in (STATE["slurm_run"], STATE["local_run"]):  # the jobs did read both secrets
        assert json.loads((run_dir / "tasks" / "0" / "secret-probe.json").read_text()) == want
    scanned = 0
    for run_dir in runs:
        for path in run_dir.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                scanned += 1
                for canary in (ENV_CANARY, FILE_CANARY):
                    assert canary.encode() not in data, f"secret leaked into {path}"
    for text in OUTPUTS:
        assert ENV_CANARY not in text and FILE_CANARY not in text, "secret leaked into command output"
    assert scanned > 20 and len(OUTPUTS) > 20
    print(f"canary scan: {scanned} files in {len(runs)} run dirs and {len(OUTPUTS)} command outputs: clean")
