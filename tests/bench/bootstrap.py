"""Benchmark: batch start → preflight passed at N nodes, against a bare Ray start at the same N in the same run.

Run by hand on a machine where ``ci/slurm-cluster.sh up`` works (numbers depend on the load;
nothing here asserts):

    python tests/bench/bootstrap.py [--rounds 3] [--nodes 2]
    # 2, 4 and 8 nodes on a second, 8-node cluster next to the default one (see ci/slurm-cluster.sh):
    export SLIME_SLURM_NAME=bench SLIME_SLURM_NODES=8 SLIME_SLURM_NODE_PREFIX=bn \
        SLIME_SLURM_SUBNET=10.78.0 SLIME_SLURM_CTLD_PORT=6917 SLIME_SLURM_FIRST_JOB_ID=7000000
    ci/slurm-cluster.sh up
    SLURM_CONF=/etc/slurm-bench/slurm.conf python tests/bench/bootstrap.py --nodes 2 4 8 --rounds 1

Each round submits, for each N, one after the other on N nodes x 2 GPUs:

* slime: ``specs/smoke-slurm.yaml --preflight-only`` (``cluster.nodes=N``) through ``SlurmLauncher`` —
  time to the preflight report's timestamp (Ray head + workers up with per-job ports, temp dirs and
  addresses, every node joined, placement group mapped, gloo all_reduce checked);
* bare: a hand-written sbatch script doing the least that works — ``ray start --head`` on node 0,
  ``ray start --address`` on the others as soon as the head wrote its address, and a driver that
  connects and polls ``ray.nodes()`` until all N are alive.

Both sides start Ray alike, so the ratio is our overhead and not Ray settings: the same CPUs per node,
the same object store (``--object-store-mb``, default 100 MiB), no log monitor, no autoscaler monitor
and no workers prestarted for the first driver (``launchers.node.rayproc`` does the same). With Ray's
defaults (``--bare-ray-defaults``) each raylet prestarts one worker per CPU for the first driver.

Prints every round and a table per N of the medians and the ratio slime/bare (goal <= 1.3 at 2
nodes), plus the slime preflight's own time. Times are from the job's SLURM StartTime (1 s
resolution, the same for both), so time queued behind other jobs does not count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SMOKE = ROOT / "specs" / "smoke-slurm.yaml"
GOAL = 1.3

BARE_JOB = """#!/bin/bash
#SBATCH --job-name=bare-ray --nodes={nodes} --ntasks-per-node=1 --gpus-per-node=2 --cpus-per-task=2 --mem=2G
#SBATCH --output={dir}/bare-%j.out
srun bash {dir}/bare-node.sh
"""

BARE_NODE = r"""set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 {lean_env}
D={dir}; J=$SLURM_JOB_ID; T=/tmp/slime-ray/bare-$J-$SLURM_NODEID; P=$((19000 + (J % 50) * 20))
IP=$(getent ahostsv4 "$(hostname)" | awk 'NR==1{{print $1}}')
COMMON="--block --temp-dir=$T --num-cpus=2 --num-gpus=2 --disable-usage-stats --object-store-memory={store}
  {lean} --node-manager-port=$((P+1)) --object-manager-port=$((P+2)) --dashboard-agent-grpc-port=$((P+3))
  --dashboard-agent-listen-port=$((P+4)) --metrics-export-port=$((P+5)) --runtime-env-agent-port=$((P+6))
  --min-worker-port=$((P+10)) --max-worker-port=$((P+19)) --node-ip-address=$IP"
if [ "$SLURM_NODEID" = 0 ]; then
  {ray} start --head --port=$P --include-dashboard=false --dashboard-port=$((P+7)) {lean_head} $COMMON \
    >$D/head-$J.log 2>&1 &
  R=$!
  echo "$IP:$P" > $D/addr-$J
  {python} -c "
import ray, time
while True:
    try:
        ray.init(address='$IP:$P', logging_level='WARNING'); break
    except Exception:
        time.sleep(0.1)
while sum(n['Alive'] for n in ray.nodes()) < {nodes}:
    time.sleep(0.1)
open('$D/done-$J', 'w').write(repr(time.time()))
"
  kill $R; wait $R
else
  while [ ! -s $D/addr-$J ]; do sleep 0.05; done
  {ray} start --address=$(cat $D/addr-$J) $COMMON >$D/worker-$J.log 2>&1 &
  R=$!
  while [ ! -f $D/done-$J ]; do sleep 0.1; done
  kill $R; wait $R
fi
rm -rf "$T"
"""


def start_time(job: str) -> float:
    from launchers.slurm.cluster import job_records

    (rec,) = [r for r in job_records(job) if r.get("StartTime")]
    return time.mktime(time.strptime(rec["StartTime"], "%Y-%m-%dT%H:%M:%S"))


def run_slime(work: Path, nodes: int, timeout: float) -> tuple[float, float, dict] | None:
    from launchers.base import SubmitOptions
    from launchers.slurm.launcher import SlurmLauncher
    from slime.core.errors import InfraError
    from slime.spec import load_spec

    sizes = [f"cluster.nodes={nodes}", f"train.nodes={nodes}", f"rollout.batch_size={2 * nodes}"]  # 2 samples/rank
    loaded = load_spec(SMOKE, overrides=[f"logging.dir={json.dumps(str(work / 'runs'))}", *sizes])
    launcher = SlurmLauncher()
    options = SubmitOptions(preflight_only=True, extra={"wait_timeout_s": timeout})
    dry = launcher.dryrun(loaded, options)
    t0 = time.time()
    try:
        sub = launcher.submit(dry)
    except InfraError as exc:  # the wait timed out
        print(f"slime: {exc}", flush=True)
        subprocess.run(["scancel", "--name", loaded.spec.name], check=False)  # the bench cluster: only ours
        return None
    if sub.returncode != 0:
        print(f"slime preflight failed or timed out: see {sub.run_dir}", flush=True)
        return None
    report = json.loads((sub.run_dir / "tasks/0/preflight.json").read_text())
    return report["created"] - t0, report["created"] - start_time(sub.job_ids[0]), report


def _bare_failure(job: str, work: Path) -> None:
    """Why a bare job did not connect: the tail of each node's raylet log, then cancel it."""
    for log in sorted(Path("/tmp/slime-ray").glob(f"bare-{job}-*/session_latest/logs/raylet.out")):
        tail = log.read_text(errors="replace").splitlines()[-3:]
        print(f"  {log.parts[3]}: " + " | ".join(t[-160:] for t in tail), flush=True)
    subprocess.run(["scancel", job], check=False)
    print(f"bare Ray job {job} did not connect; see {work}/bare-{job}.out", flush=True)


def run_bare(work: Path, nodes: int, timeout: float, store: int, ray_defaults: bool) -> tuple[float, float] | None:
    ray = Path(sys.executable).parent / "ray"
    lean = dict(lean_env="", lean="", lean_head="")
    if not ray_defaults:  # what launchers.node.rayproc does too
        lean = dict(
            lean_env="RAY_prestart_worker_first_driver=0", lean="--include-log-monitor=false", lean_head="--no-monitor"
        )
    text = BARE_NODE.format(dir=work, ray=ray, python=sys.executable, nodes=nodes, store=store, **lean)
    (work / "bare-node.sh").write_text(text)
    (work / "bare.sbatch").write_text(BARE_JOB.format(dir=work, nodes=nodes))
    t0 = time.time()
    out = subprocess.run(
        ["sbatch", "--parsable", str(work / "bare.sbatch")], capture_output=True, text=True, check=True
    )
    job = out.stdout.strip().split(";")[0]
    done = work / f"done-{job}"
    deadline = time.monotonic() + timeout
    while not done.exists() or not done.read_text():
        if time.monotonic() > deadline:
            _bare_failure(job, work)
            return None
        time.sleep(0.1)
    end = float(done.read_text())
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.5)  # let it finish before the next round starts
    return end - t0, end - start_time(job)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def measure(n: int, rounds: int, tmp: str, args: argparse.Namespace) -> tuple:
    """Medians for ``n`` nodes: slime, bare, the preflight's own time, and the load average seen."""
    slime_t, bare_t, pre_t, loads = [], [], [], []
    for r in range(rounds):
        work = Path(tmp) / f"n{n}-round{r}"
        work.mkdir()
        loads.append(os.getloadavg()[0])
        bare = run_bare(work, n, args.timeout, args.object_store_mb << 20, args.bare_ray_defaults)
        ours = run_slime(work, n, args.timeout)
        loads.append(os.getloadavg()[0])
        if bare:
            bare_t.append(bare[1])
        if ours:
            slime_t.append(ours[1])
            pre_t.append(ours[2]["seconds"])
        print(
            f"{n} nodes, round {r + 1}: slime job start→preflight passed {_fmt(ours and ours[1])} s "
            f"(preflight {_fmt(ours and ours[2]['seconds'], '.2f')} s) | bare job start→driver sees {n} nodes "
            f"{_fmt(bare and bare[1])} s | load average {loads[-2]:.1f}→{loads[-1]:.1f}",
            flush=True,
        )
    return n, _median(slime_t), _median(bare_t), _median(pre_t), min(loads), max(loads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", type=int, nargs="+", default=[2], help="job sizes to measure (each <= the cluster's)")
    p.add_argument("--timeout", type=float, default=600, help="seconds each job may take to be all up")
    p.add_argument("--object-store-mb", type=int, default=100, help="object store per node, both sides")
    p.add_argument("--bare-ray-defaults", action="store_true", help="bare Ray with its own defaults (see above)")
    args = p.parse_args()
    if subprocess.run(["bash", str(ROOT / "ci/slurm-cluster.sh"), "status"], capture_output=True).returncode != 0:
        print("the local SLURM cluster is not up: run `ci/slurm-cluster.sh up` first", file=sys.stderr)
        return 2
    os.environ["SLIME_RAY_OBJECT_STORE_MB"] = str(args.object_store_mb)  # sbatch passes it to our job
    with tempfile.TemporaryDirectory(prefix="slime-bench-boot-") as tmp:
        rows = [measure(n, args.rounds, tmp, args) for n in args.nodes]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"job start → all nodes up (median of {args.rounds}; goal at 2 nodes: ratio <= {GOAL})")
    for col in ("nodes", "slime → preflight passed (s)", "bare ray → driver sees all (s)", "ratio", "preflight (s)"):
        table.add_column(col, justify="right")
    table.add_column("load average")
    for n, ms, mb, pre, lo, hi in rows:
        ratio = _fmt(ms / mb, ".2f") if ms and mb else "—"
        table.add_row(str(n), _fmt(ms), _fmt(mb), ratio, _fmt(pre, ".2f"), f"{lo:.1f}-{hi:.1f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
