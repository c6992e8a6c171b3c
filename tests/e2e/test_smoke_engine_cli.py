"""``slime-submit smoke`` on a Megatron spec runs the user's engine path: THUDM/slime's Qwen3-30B-A3B layout
(TP 4, EP 4, sequence parallel) on a tiny Qwen3-MoE built from the model's published config.json, folded to
TP 2 x EP 2 over gloo, after the tiny-dense pipeline stages; ``--fast`` runs only the latter.

Real parts only: the CLI as a subprocess, the local launcher and Ray for the pipeline, megatron-core ranks
over gloo (its CUDA-only placements redirected to the CPU: ``slime.backends.megatron.cpu``), transformers'
own Qwen3-MoE class for the engine reload. The representative case of the engine-check family (the other
families: ``tests/unit/test_smoke_engine_families.py``, extended).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.family_configs import QWEN3_30B_A3B

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]
REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "specs" / "data" / "arith"


def _smoke(tmp_path: Path, *args: str) -> tuple[int, dict]:
    model = tmp_path / "Qwen3-30B-A3B"  # the checkpoint a user has: here only its config.json
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    sets = {
        "model.path": str(model),
        "train.parallel.tensor": "4",
        "train.parallel.expert": "4",
        "train.parallel.sequence_parallel": "true",
        "rollout.gpus_per_engine": "4",  # the 30B model's weights on 2 GPUs leave the engine no KV cache
        "data.prompts": str(DATA / "train.jsonl"),
        "data.eval[0].path": str(DATA / "heldout.jsonl"),
    }
    cmd = [sys.executable, "-m", "slime.cli.main", "smoke", str(REPO / "specs" / "grpo-multinode.yaml"), "--json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"WANDB_API_KEY": "not-used-by-smoke"}
    proc = subprocess.run([*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"exit {proc.returncode}, no JSON report:\n{proc.stderr[-4000:]}")


def test_smoke_runs_qwen3_moe_on_megatron_with_tp_and_ep_folded(tmp_path):
    code, report = _smoke(tmp_path, "--dir", str(tmp_path / "runs"))
    engine = report["engine"]
    assert code == 0, json.dumps(report["stages"], indent=1)
    assert engine["ran"] and engine["world"] == 2
    assert engine["kept"] == ["tensor 4 -> 2", "expert 4 -> 2"]
    assert [f.split(" (")[0] for f in engine["folded"]] == ["expert_tensor 4 -> 1"]
    stages = {s["stage"]: s for s in engine["stages"]}
    assert list(stages) == [
        "tiny model (your family)",
        "parallel layout",
        "HF -> Megatron conversion",
        "train step (your engine)",
        "weight export",
        "engine reload",
    ]
    assert all(s["status"] == "passed" for s in stages.values())
    assert stages["tiny model (your family)"]["detail"].startswith("qwen3_moe, 4 layers")
    assert "8 experts top-2" in stages["tiny model (your family)"]["detail"]
    train = stages["train step (your engine)"]["detail"]
    assert "synthetic reward" in train and "distributed optimizer" in train
    changed, total = (int(x) for x in train.split(" parameter tensors")[0].rsplit(" ", 1)[1].split("/"))
    assert changed == total > 0  # every tensor moved (the zero-signal case: the synthetic reward's gradient)
    # the engine stages are part of the report's verdict, and the changes are listed with their reasons
    assert {s["stage"] for s in report["stages"]} >= set(stages)
    paths = [c["path"] for c in engine["changes"]]
    assert paths == [
        "model.path",
        "train.precision",
        "train.optimizer.clip_grad",
        "train.parallel.tensor",
        "train.parallel.expert",
        "train.parallel.expert_tensor",
    ]
    assert report["untested"][0].startswith(f"your model ({tmp_path / 'Qwen3-30B-A3B'}) at full size")
    assert not any(u.startswith("Megatron-core training") for u in report["untested"])
    print(f"engine check: {engine['seconds']} s; whole smoke: {report['seconds']} s")
