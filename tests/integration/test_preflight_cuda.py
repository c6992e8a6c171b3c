"""The preflight on a GPU slot without CUDA, through the local launcher with a real local Ray.

The bootstrap gives Ray ``cluster.gpus_per_node`` logical GPUs; this machine has no CUDA at all, so the
node is exactly a broken GPU node (or the CI SLURM cluster's fake GRES): the preflight must fail with exit
3 naming the node and the fix, and pass only with the explicit ``cluster.fake_gpus`` opt-in, saying so in
the report and the table. ``--preflight-only`` stops after the preflight (no driver).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.node.rayproc import temp_root

pytestmark = [pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - the point is a machine without CUDA
    pytest.skip("needs a machine without CUDA", allow_module_level=True)

HOST = socket.gethostname().split(".")[0]
SPEC = """apiVersion: slime/v2
kind: RLJob
name: cuda-check
cluster:
  launcher: local
  nodes: 1
  gpus_per_node: 1
  cpus_per_node: 2
  bootstrap_timeout_s: 150
{extra}model: {{builtin: tiny}}
rollout: {{colocate: true, num_rollouts: 1, batch_size: 2, n_samples_per_prompt: 2, max_prompt_len: 16,
  max_response_len: 8}}
data: {{prompts: p.jsonl}}
logging: {{dir: runs}}
"""


def _preflight(tmp_path: Path, extra: str = "") -> tuple[subprocess.CompletedProcess, dict, str]:
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    (tmp_path / "spec.yaml").write_text(SPEC.format(extra=extra))
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "spec.yaml", "--preflight-only", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    task = run_dir / "tasks" / "0"
    assert (task / "preflight.json").exists(), proc.stdout + proc.stderr
    for rec in (task / "rendezvous").glob("node-*.json"):  # a failed job keeps Ray's logs; this one failed on purpose
        job = json.loads(rec.read_text())["instance"].split(".")[0]
        for kept in temp_root().glob(f"{job}-*"):
            shutil.rmtree(kept, ignore_errors=True)
    return proc, json.loads((task / "preflight.json").read_text()), (task / "preflight.txt").read_text()


def test_a_gpu_slot_without_cuda_fails_the_preflight_with_exit_3_naming_the_node(tmp_path):
    proc, pre, table = _preflight(tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert not pre["ok"] and pre["bad_nodes"] == [HOST] and pre["fake_gpus"] is False
    failed = {c["name"]: c for c in pre["checks"] if not c["ok"]}
    assert set(failed) == {"gpu_count", "cuda"}, pre["checks"]
    cuda = failed["cuda"]
    assert cuda["node"] == HOST and "CUDA fails on 1 GPU slot(s) of " + HOST in cuda["message"]
    assert "torch.cuda.is_available() is False (torch is a CPU-only build" in cuda["message"]
    assert "cluster.slurm.exclude" in cuda["fix"] and "cluster.fake_gpus: true" in cuda["fix"]
    assert pre["cuda"][0]["gpu_ids"] == ["0"] and pre["cuda"][0]["cuda_visible_devices"] == "0"
    assert "collective_nccl" not in {c["name"] for c in pre["checks"]}  # no NCCL on GPUs that failed CUDA
    assert pre["nodes"][0]["cuda"] == "FAIL"
    assert f"FAIL cuda [{HOST}]: CUDA fails on 1 GPU slot(s)" in table and "fake GPUs" not in table
    assert f"cuda on {HOST}" in proc.stderr and "preflight failed" in proc.stderr


def test_fake_gpus_pass_the_preflight_without_cuda_and_say_so(tmp_path):
    proc, pre, table = _preflight(tmp_path, "  fake_gpus: true\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert pre["ok"] and pre["fake_gpus"] is True and pre["cuda"] == [] and pre["nodes"][0]["cuda"] == "fake"
    checks = {c["name"]: c for c in pre["checks"]}
    assert checks["cuda"]["ok"] and checks["cuda"]["message"].startswith("not checked: cluster.fake_gpus")
    assert "fake GPUs (cluster.fake_gpus): CUDA not checked" in checks["gpu_count"]["message"]
    assert len(pre["slots"]) == 1 and pre["slots"][0]["gpu"] == "0"  # the placement is still checked
    assert "fake GPUs: running on CPU (cluster.fake_gpus" in table
