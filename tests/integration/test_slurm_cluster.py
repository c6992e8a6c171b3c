"""The local multi-node SLURM cluster (ci/slurm-cluster.sh) behaves like a real one.

Real slurmctld/slurmd, real namespaces; the only fake is the GPUs: GRES backed by char
devices (nothing can open a GPU here), so these tests check what SLURM tells a job about its
GPUs, not that CUDA works. Every test reasons only about its own job ids, so the cluster may be
shared with other sessions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import SCRIPT, SlurmError, job_records, run_sbatch, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def _wait_for_line(path: Path, line: str, timeout: float) -> None:
    """Wait until ``path`` has ``line`` (a job's output is written by the node, not by this process)."""
    deadline = time.monotonic() + timeout
    while line not in (path.read_text().splitlines() if path.exists() else []):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no line {line!r} after {timeout:.0f} s")
        time.sleep(0.25)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_two_node_job_sees_distinct_hosts_ips_and_two_gpus_each(slurm_cluster, tmp_path):
    script = r"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --gpus-per-node=2
srun bash -c 'echo "host=$(hostname)" \
  "ip=$(ip -4 -o addr show eth0 | awk "{print \$4}" | cut -d/ -f1)" \
  "cvd=$CUDA_VISIBLE_DEVICES gon=$SLURM_GPUS_ON_NODE" \
  "default_route=$(ip route show default | wc -l) lo=$(ip -o link show lo | grep -c "[<,]UP[,>]")"'
"""
    job = run_sbatch(script, f"--chdir={tmp_path}", f"--output={tmp_path}/out.txt")
    rec = wait_job(job, timeout=60)[0]
    assert rec["NumNodes"] == "2"
    rows = [dict(kv.split("=", 1) for kv in line.split()) for line in _lines(tmp_path / "out.txt")]
    assert len(rows) == 2, rows
    assert {r["host"] for r in rows} == set(slurm_cluster.nodes[:2])
    for r in rows:
        assert r["ip"] == slurm_cluster.node_ips[r["host"]]  # own namespace, own address
        assert r["cvd"] == "0,1" and r["gon"] == "2"
        assert r["default_route"] == "0"  # nothing leaves the machine
        assert r["lo"] == "1"
    assert socket.gethostname() not in {r["host"] for r in rows}
    # the login node (this process) reaches services on every node: slurmd's port
    for ip in slurm_cluster.node_ips.values():
        socket.create_connection((ip, 6818), timeout=5).close()


def test_array_runs_every_task_at_most_two_at_a_time(slurm_cluster, tmp_path):
    log = tmp_path / "events.log"
    script = f"""#!/bin/bash
echo "$SLURM_ARRAY_TASK_ID start $(date +%s.%N)" >> {log}
sleep 1.5
echo "$SLURM_ARRAY_TASK_ID end $(date +%s.%N)" >> {log}
"""
    job = run_sbatch(script, "--array=0-3%2", f"--output={tmp_path}/%A_%a.out")
    records = wait_job(job, timeout=60)
    assert sorted(r["ArrayTaskId"] for r in records) == ["0", "1", "2", "3"]
    events = [line.split() for line in _lines(log)]
    assert sorted(int(t) for t, kind, _ in events if kind == "start") == [0, 1, 2, 3]
    # replay starts/ends in time order; ends first on ties so back-to-back tasks don't overlap
    timeline = sorted((float(ts), kind == "start") for _, kind, ts in events)
    running = peak = 0
    for _, is_start in timeline:
        running += 1 if is_start else -1
        peak = max(peak, running)
    assert peak <= 2, f"throttle %2 exceeded: {events}"


def test_urgent_job_preempts_batch_job_gracefully_and_the_victim_requeues_itself(slurm_cluster, tmp_path):
    """The cluster preempts like sites that run long jobs: the `batch` partition has a GraceTime and
    slurmctld sends the job's own ``--signal`` (USR1 to the batch shell) first. A job that saves and
    exits within the grace time is not requeued by SLURM (measured on 22.05: it would end FAILED),
    so it requeues itself; the urgent job then runs and the victim comes back with restart count 1.
    This is the mechanism the launcher's batch script relies on (``launchers.slurm.restarts``)."""
    node = slurm_cluster.nodes[-1]
    out = tmp_path / "victim.out"
    # the trap is set before "start" is written: the urgent job is submitted only after that line,
    # so a loaded machine cannot deliver USR1 before the handler exists
    victim_script = """#!/bin/bash
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    trap 'echo got-USR1; scontrol requeue "$SLURM_JOB_ID"; exit 0' USR1
fi
echo "start restart=${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    sleep 300 & wait $!
fi
echo done
"""
    victim = run_sbatch(
        victim_script,
        "-p",
        "batch",
        "-w",
        node,
        "--exclusive",
        "--requeue",
        "--signal=B:USR1@30",
        "--open-mode=append",
        f"--output={out}",
    )
    wait_job(victim, "RUNNING", timeout=60)
    _wait_for_line(out, "start restart=0", timeout=60)
    urgent = run_sbatch(["-p", "urgent", "-w", node, "--wrap", "sleep 1"], f"--output={tmp_path}/urgent.out")
    # no timing claim: on a loaded machine the handler's `scontrol requeue` may take the whole grace time;
    # the victim's log and restart count below show that the handler, not SLURM's kill, ended it
    wait_job(urgent, timeout=120)
    rec = wait_job(victim, timeout=90)[0]
    assert rec["Restarts"] == "1"
    lines = [line for line in _lines(out) if not line.startswith("slurmstepd")]
    assert lines == ["start restart=0", "got-USR1", "start restart=1", "done"], lines


def test_job_completion_log_records_finished_jobs(slurm_cluster, tmp_path):
    ok = run_sbatch(["--wrap", "true"], f"--output={tmp_path}/ok.out")
    bad = run_sbatch(["--wrap", "exit 3"], f"--output={tmp_path}/bad.out")
    wait_job(ok, timeout=60)
    with pytest.raises(SlurmError, match="FAILED"):  # fails fast, not after the timeout
        wait_job(bad, "COMPLETED", timeout=60)
    text = slurm_cluster.jobcomp_log.read_text()
    assert re.search(rf"^JobId={ok} .*JobState=COMPLETED", text, re.M)
    assert re.search(rf"^JobId={bad} .*JobState=FAILED .*ExitCode=3:0", text, re.M)
    sacct = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-j", f"{ok},{bad}", "-o", "jobid,state"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(sacct) == sorted([f"{ok}|COMPLETED", f"{bad}|FAILED"])


def test_scontrol_requeue_reruns_with_restart_count(slurm_cluster, tmp_path):
    out = tmp_path / "requeue.out"
    script = """#!/bin/bash
echo "run restart=${SLURM_RESTART_COUNT:-0}"
[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && { sleep 300 & wait $!; }
echo done
"""
    job = run_sbatch(script, "--open-mode=append", f"--output={out}")
    wait_job(job, "RUNNING", timeout=60)
    # RUNNING is SLURM's word before the script runs: requeued in between, the first run never printed
    # (seen in CI on a loaded machine). Requeue once the first run is under way.
    deadline = time.monotonic() + 60
    while not (out.is_file() and "run restart=0" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    rec = wait_job(job, timeout=90)[0]
    assert rec["Restarts"] == "1"
    assert _lines(out)[0] == "run restart=0"
    assert _lines(out)[-2:] == ["run restart=1", "done"]


def test_up_again_is_a_no_op_on_a_healthy_cluster(slurm_cluster):
    pids = {p.name: p.read_text() for p in (slurm_cluster.state_dir / "pids").iterdir()}
    proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "already up and healthy" in proc.stderr
    assert {p.name: p.read_text() for p in (slurm_cluster.state_dir / "pids").iterdir()} == pids
    assert subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True).returncode == 0


RAY_JOB = r"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --gpus-per-node=2 -c 2 -t 5
# Ray head on the first node, worker on the second, driver in the batch step (first node).
set -euo pipefail
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head=${nodes[0]} worker=${nodes[1]}
head_ip=$(getent hosts "$head" | awk '{print $1}')
worker_ip=$(getent hosts "$worker" | awk '{print $1}')
port=$((20000 + SLURM_JOB_ID % 20000))   # per-job port: no collision with other jobs
common=(--block --num-cpus=2 --num-gpus=2 --object-store-memory=100000000 --disable-usage-stats)
srun --overlap -N1 -n1 -w "$head" "$T_RAY" start --head --node-ip-address="$head_ip" \
    --port="$port" --include-dashboard=false --temp-dir="$T_DIR/$head" "${common[@]}" \
    >"$T_DIR/head.log" 2>&1 &
head_pid=$!
for _ in $(seq 150); do (exec 3<>"/dev/tcp/$head_ip/$port") 2>/dev/null && break; sleep 0.2; done
srun --overlap -N1 -n1 -w "$worker" "$T_RAY" start --address="$head_ip:$port" \
    --node-ip-address="$worker_ip" --temp-dir="$T_DIR/$worker" "${common[@]}" \
    >"$T_DIR/worker.log" 2>&1 &
worker_pid=$!
rc=0
"$T_PY" "$T_DIR/driver.py" "$head_ip:$port" >"$T_DIR/driver.json" || rc=$?
kill -TERM "$worker_pid" "$head_pid"   # srun forwards TERM; `ray start --block` stops its node
wait "$worker_pid" || true
wait "$head_pid" || true
exit "$rc"
"""

RAY_DRIVER = r"""
import json, socket, sys, time
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

t0 = time.monotonic()
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 60
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= 2 or time.monotonic() > deadline:
        break
    time.sleep(0.2)
t_nodes = time.monotonic() - t0

@ray.remote(num_cpus=1)
def where():
    return socket.gethostname(), ray.util.get_node_ip_address()

pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=30)
tasks = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
    pg, placement_group_bundle_index=i)).remote() for i in range(2)], timeout=60)
print(json.dumps({"node_ips": sorted(n["NodeManagerAddress"] for n in alive),
                  "gpus": ray.cluster_resources().get("GPU", 0), "tasks": sorted(tasks),
                  "seconds_to_two_nodes": round(t_nodes, 2)}))
ray.shutdown()
"""


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{proc.name}: {cmd[:200]}")
    return found


def test_ray_head_and_worker_on_two_nodes_in_one_job(slurm_cluster):
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip(f"ray CLI not found next to {sys.executable}")
    # short path: Ray's unix sockets live under --temp-dir and must stay < 108 bytes
    tdir = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))
    try:
        (tdir / "driver.py").write_text(RAY_DRIVER)
        env = dict(os.environ, T_RAY=str(ray_bin), T_PY=sys.executable, T_DIR=str(tdir))
        start = time.monotonic()
        job = run_sbatch(RAY_JOB, f"--chdir={tdir}", f"--output={tdir}/job.out", env=env)
        try:
            wait_job(job, timeout=180)
        except SlurmError as exc:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text()[-3000:]}"
                for p in sorted(tdir.glob("*.log")) + [tdir / "job.out"]
                if p.exists()
            )
            raise SlurmError(f"{exc}\n{logs}") from None
        elapsed = time.monotonic() - start
        result = json.loads((tdir / "driver.json").read_text())
        ips = sorted(slurm_cluster.node_ips[n] for n in slurm_cluster.nodes[:2])
        assert result["node_ips"] == ips
        assert result["gpus"] == 4
        assert result["tasks"] == sorted([n, slurm_cluster.node_ips[n]] for n in slurm_cluster.nodes[:2])
        print(
            f"ray across 2 nodes: {result['seconds_to_two_nodes']} s driver->2 nodes, {elapsed:.1f} s submit->job done"
        )
        # everything Ray started is gone once the job ends (stopped via srun/TERM, by PID)
        assert _processes_mentioning(str(tdir)) == []
        assert job_records(job)[0]["JobState"] == "COMPLETED"
    finally:
        shutil.rmtree(tdir, ignore_errors=True)


def _running(pid: int) -> bool:
    """Exists and is not a zombie (an init that reaps late may keep zombies around)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_down_then_up_restores_and_rebuilds(slurm_cluster):
    """Only when this session started the cluster: others may be using a cluster we found."""
    if not slurm_cluster.started_here:
        pytest.skip("cluster was already up (possibly in use by others); not taking it down")
    state = slurm_cluster.state_dir
    pids = [int(p.read_text().split()[0]) for p in (state / "pids").iterdir()]
    down = subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    assert [pid for pid in pids if _running(pid)] == []
    assert "slime-slurm" not in Path("/etc/hosts").read_text()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not set(slurm_cluster.nodes) & {line.split()[0] for line in netns.splitlines() if line}
    assert subprocess.run(["ip", "link", "show", "slimebr0"], capture_output=True).returncode
    conf = slurm_cluster.conf_path
    assert not conf.exists() or "slime-slurm" not in conf.read_text()
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    job = run_sbatch(["-N2", "--wrap", "srun hostname"], "--output=/dev/null")
    wait_job(job, timeout=60)
