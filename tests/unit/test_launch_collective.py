"""The preflight's collective subprocess: two real ranks on this machine, real torch/gloo.

Two ``python -m launchers.node.collective`` processes stand for two nodes (both on 127.0.0.1); the
rendezvous files are written the way the bootstrap writes them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from slime.core.paths import RunPaths
from slime.core.rendezvous import Rendezvous


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(run_dir: Path, rank: int, world: int, wait: float = 60) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launchers.node.collective",
            str(run_dir),
            "--task",
            "0",
            "--rank",
            str(rank),
            "--world",
            str(world),
            "--instance",
            "9.0",
            "--wait",
            str(wait),
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_ranks_all_reduce_after_the_go_ahead_and_report_their_gpu_facts(tmp_path):
    rdv = Rendezvous(RunPaths(tmp_path).task(0).rendezvous, "9.0")
    rdv.publish_head(ip="127.0.0.1", port=1, gloo_port=_free_port())
    for r in (0, 1):
        rdv.write_node(r, host=f"n{r}", ip="127.0.0.1", state="joined")
    procs = [_start(tmp_path, r, 2) for r in (0, 1)]
    time.sleep(0.5)
    assert rdv.collectives(2) == {}  # nothing happens before the head says go
    rdv.go()
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stdout.read()
    results = rdv.collectives(2)
    assert {r: res["value"] for r, res in results.items()} == {0: 3.0, 1: 3.0}
    assert all(res["nvidia_smi"] is None and res["torch_cuda"] == 0 for res in results.values())
    assert json.loads(rdv.collective_file(0).read_text())["rank"] == 0


def test_a_finished_job_releases_a_waiting_rank(tmp_path):
    rdv = Rendezvous(RunPaths(tmp_path).task(0).rendezvous, "9.0")
    proc = _start(tmp_path, 1, 2, wait=600)
    rdv.mark_done(3)  # the head failed before the preflight
    assert proc.wait(timeout=120) == 1
    assert rdv.collectives(2) == {}
