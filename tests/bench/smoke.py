"""What ``slime-submit smoke`` costs, against a plain run of the same scaled-down spec.

    python tests/bench/smoke.py [--spec specs/quickstart.yaml] [--repeats 1]

Runs, interleaved: (a) ``slime-submit smoke SPEC --json`` (2 rollouts: the run stopped after rollout 0
and resumed in a second driver process) and (b) the baseline: the same scaled-down spec submitted plainly
(``slime-submit SPEC`` with the smoke's changes as ``--set``s, one driver process, no resume). Prints the
wall time and, where a cgroup v1 ``cpuacct`` hierarchy is writable (root), the CPU seconds of every process
each one started (Ray's included), and the ratios smoke / baseline. Wall times depend on what else the
machine runs; CPU seconds much less so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _measured(cmd: list[str], env: dict[str, str]) -> tuple[int, float, float | None, str]:
    """(exit code, wall seconds, CPU seconds of the whole process tree or None, stdout)."""
    group = None
    if CPUACCT.is_dir() and os.access(CPUACCT, os.W_OK):
        group = CPUACCT / f"slime-bench-{os.getpid()}-{time.monotonic_ns()}"
        group.mkdir()
        wrapped = ["sh", "-c", f'echo $$ > "{group}/tasks" && exec "$@"', "sh", *cmd]
    else:
        wrapped = cmd
    t = time.monotonic()
    proc = subprocess.run(wrapped, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t
    cpu = None
    if group is not None:
        time.sleep(1.0)  # Ray's processes leave a moment after the launcher returns
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
        try:
            group.rmdir()
        except OSError:
            pass  # a straggler still in it; the kernel frees the group when it exits
    return proc.returncode, wall, cpu, proc.stdout


def _baseline_sets(spec: str) -> list[str]:
    """The smoke's changes to ``spec`` as --set overrides (paths as the scaled spec has them)."""
    sys.path.insert(0, str(REPO))
    from slime.spec import load_spec
    from slime.spec.smoke import scale_down

    loaded = load_spec(spec)
    plan = scale_down(loaded.tasks[0].spec, rollouts=2, logging_dir="DIR")
    return [f"{c.path}={json.dumps(c.to_json()['after'])}" for c in plan.changes if c.path != "logging.dir"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "specs" / "quickstart.yaml"))
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    sets = [a for s in _baseline_sets(args.spec) for a in ("--set", s)]
    rows: dict[str, list[tuple[float, float | None]]] = {"smoke": [], "baseline": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            smoke = [sys.executable, "-m", "slime.cli.main", "smoke", args.spec, "--json", "--dir", f"{d}/s"]
            rc, wall, cpu, out = _measured(smoke, env)
            assert rc == 0, out
            rows["smoke"].append((wall, cpu))
            plain = [sys.executable, "-m", "slime.cli.main", args.spec, *sets, "--set", f"logging.dir={d}/b", "--json"]
            rc, wall, cpu, out = _measured(plain, env)
            assert rc == 0, out
            rows["baseline"].append((wall, cpu))
    medians = {}
    for name, vals in rows.items():
        wall = sorted(w for w, _ in vals)[len(vals) // 2]
        cpus = sorted(c for _, c in vals if c is not None)
        cpu = cpus[len(cpus) // 2] if cpus else None
        medians[name] = (wall, cpu)
        cpu_text = f", CPU {cpu:.1f} s" if cpu is not None else ""
        print(f"{name:9s}: wall {wall:.1f} s{cpu_text} (median of {len(vals)})")
    (sw, sc), (bw, bc) = medians["smoke"], medians["baseline"]
    cpu_ratio = f", CPU {sc / bc:.2f}" if sc is not None and bc is not None else ""
    print(f"ratio smoke / baseline: wall {sw / bw:.2f}{cpu_ratio}")
    try:
        load = os.getloadavg()[0]
        print(f"(load average during the run: {load:.1f} on {os.cpu_count()} CPUs)")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
