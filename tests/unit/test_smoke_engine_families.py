"""The smoke's engine check for each family the Megatron backend maps, with a GPU layout folded to <= 4 gloo
ranks: every stage passes (tiny model of the family, layout, HF -> Megatron conversion against the HF
log-probs, a train step on the labelled synthetic reward that changes the weights, the export, the engine
reload matching the trainer), and the dims > 1 are kept at 2 where the world allows.

Real parts: published config.json contents, transformers' own classes, megatron-core ranks over gloo (its
CUDA-only placements redirected to the CPU by ``slime.backends.megatron.cpu``). Qwen3-MoE runs in CI
through the CLI (``tests/e2e/test_smoke_engine_cli.py``); these are ``extended`` (15-45 s each). Each
spec is one megatron accepts at full size (MoE or MLA with tensor > 1 needs sequence parallelism, as in
THUDM/slime's scripts): the check is of the fold, not of a layout validation already refuses. The broken
train step (a learning rate too small to move fp32 weights) runs in CI (10-30 s).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import msgspec
import pytest

from slime.cli.smoke_engine import engine_plan, run_engine_check
from slime.spec.resolve import resolve
from slime.spec.types import Spec
from tests.fixtures.family_configs import FAMILY_CONFIGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

# family -> (the spec's train.parallel, the dims the check keeps at 2, gloo ranks)
CASES = {
    "llama": (dict(tensor=2, pipeline=2), ["tensor 2", "pipeline 2"], 4),
    "qwen2": (dict(tensor=4, pipeline=2, context=2), ["tensor 4 -> 2", "pipeline 2"], 4),
    "qwen3": (dict(tensor=2, pipeline=4), ["tensor 2", "pipeline 4 -> 2"], 4),
    "qwen3_moe": (
        dict(tensor=4, expert=8, pipeline=2, sequence_parallel=True),
        ["tensor 4 -> 2", "expert 8 -> 2", "pipeline 2"],
        4,
    ),
    # DeepSeek-V3's 61 layers split over no pipeline > 1 (megatron needs an even split): TP x EP, 2 ranks
    "deepseek_v3": (
        dict(tensor=8, expert=8, sequence_parallel=True, expert_tensor=1),
        ["tensor 8 -> 2", "expert 8 -> 2"],
        2,
    ),
}


def _spec(tmp_path: Path, family: str, parallel: dict, lr: float = 1e-6) -> Spec:
    model = tmp_path / "user-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(FAMILY_CONFIGS[family]))
    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "t",
        "model": {"path": str(model)},
        "data": {"prompts": "p.jsonl"},
        "cluster": {"nodes": 8, "gpus_per_node": 8},
        "train": {"backend": "megatron", "parallel": parallel, "precision": "bf16", "optimizer": {"lr": lr}},
    }
    return resolve(msgspec.convert(data, Spec), tmp_path)


@pytest.mark.extended
@pytest.mark.parametrize("family", list(CASES))
def test_engine_check_of_each_family_passes_with_its_layout_folded(tmp_path, family):
    from slime.backends.megatron.hooks import megatron_model

    parallel, kept, world = CASES[family]
    spec = _spec(tmp_path, family, parallel)
    assert list(megatron_model(spec)) == []  # the user's layout is valid at full size
    plan = engine_plan(spec, tmp_path / "engine" / "model")
    assert list(plan.fold.kept) == kept and plan.fold.world == world
    result = run_engine_check(spec, plan, tmp_path / "engine", tolerance=1e-3, verbose=False)
    stages = {s["stage"]: s for s in result["stages"]}
    assert all(s["status"] == "passed" for s in stages.values()), json.dumps(result, indent=1)
    assert stages["tiny model (your family)"]["detail"].startswith(f"{family}, 4 layers")
    assert f"kept: {', '.join(kept)}" in stages["parallel layout"]["detail"]
    train = stages["train step (your engine)"]["detail"]
    assert "synthetic reward" in train and "distributed optimizer" in train
    print(f"{family}: {result['seconds']} s")


def test_a_step_that_leaves_the_weights_unchanged_fails_the_train_stage(tmp_path):
    """The broken case of the train stage: a learning rate of 1e-30 gives a finite loss and a gradient, but
    Adam's first step (about lr per weight) moves no fp32 weight that matters: not one log-prob moves. (A few
    near-zero weights do change: the stage is not fooled by them, nor is the reload stage blamed.)"""
    spec = _spec(tmp_path, "qwen3", {}, lr=1e-30)
    plan = engine_plan(spec, tmp_path / "engine" / "model")
    result = run_engine_check(spec, plan, tmp_path / "engine", tolerance=1e-3, verbose=False)
    status = {s["stage"]: s["status"] for s in result["stages"]}
    assert list(status.values()) == ["passed"] * 3 + ["failed", "not reached", "not reached"], result
    train = next(s for s in result["stages"] if s["status"] == "failed")
    assert train["stage"] == "train step (your engine)"
    assert train["detail"].startswith("the step left the weights unchanged (grad norm ")
    assert "log-probs moved by up to 0)" in train["detail"] and "train.optimizer.lr" in train["detail"]
