"""THUDM/slime's own launch scripts through the smoke's engine check: each script whose model family the
Megatron backend maps and whose import validates (``import-slime-args``, the config.json of the model it
trains) runs every stage on a tiny model of that family, its layout folded, its GPU-only options (DeepEP
dispatch, optimizer CPU offload) set to their CPU path and listed. The scripts of a supported family that
validation refuses (an uneven pipeline split, CP with MLA): ``tests/unit/test_migrate_real_scripts.py``.

Real parts: slime's flag lists (``tests/fixtures/slime_script_flags.json``), the importer, megatron-core ranks
over gloo (``slime.backends.megatron.cpu``), transformers' own classes for the reload. Moonlight-16B-A3B
(MLA, shared experts, DeepEP, offload) is the CI case (15-50 s on 2 cores); the others are ``extended``.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from slime.cli.smoke_engine import engine_plan, run_engine_check, skip_reason
from slime.migrate.importer import convert_slime_args
from slime.spec import load_spec_text
from tests.fixtures.fit_configs import write_model
from tests.fixtures.slime_script_models import SCRIPT_MODELS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]
SCRIPTS = json.loads((Path(__file__).parents[1] / "fixtures" / "slime_script_flags.json").read_text())["scripts"]
_OFFLOAD = ["train.megatron.optimizer_offload"]
_DEEPEP = ["train.megatron.args.moe-enable-deepep", "train.megatron.args.moe-token-dispatcher-type"]
# script -> (the dims kept at 2, the GPU-only options changed for the CPU)
CASES = {
    "run-moonlight-16B-A3B.sh": (["tensor 4 -> 2", "expert 8 -> 2"], _DEEPEP + _OFFLOAD),
    "run-qwen3-30B-A3B.sh": (["tensor 4 -> 2", "expert 8 -> 2"], _OFFLOAD),
    "run-qwen3-235B-A22B-sft.sh": (["tensor 4 -> 2", "expert 32 -> 2"], _OFFLOAD),
    "run-qwen3-32B.sh": (["tensor 8 -> 2"], _OFFLOAD),
    "run-qwen3-4B.sh": (["tensor 2"], []),
    "run-qwen3-4B-amd.sh": (["tensor 2"], []),
    "run-qwen3-4B-base-sft.sh": ([], []),
    "run-qwen2.5-0.5B-gb10-smoke.sh": ([], []),
    "run-qwen2.5-0.5B-reproducibility.sh": ([], []),
}
CI_CASE = "run-moonlight-16B-A3B.sh"


def _imported_spec(script: str, tmp_path: Path):
    info = SCRIPTS[script]
    words = list(info["words"])
    if "sft" in script:  # an SFT job's length comes from its data: make some here
        data = tmp_path / "sft.jsonl"
        row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        data.write_text("\n".join(json.dumps(row) for _ in range(64)) + "\n")
        words[words.index("--prompt-data") + 1] = str(data)
    model = write_model(tmp_path, info["model_file"], SCRIPT_MODELS[info["model_file"]])
    text = f"python3 {info['entry']} " + " ".join(shlex.quote(w) for w in words)
    result = convert_slime_args(text + "".join(f"\n{line}" for line in info["not_passed"]), model=str(model))
    assert result.accepted(), (result.refused, result.conflicts)
    return load_spec_text(result.yaml, file=f"{script} (imported)").spec


@pytest.mark.parametrize(
    "script", [s if s == CI_CASE else pytest.param(s, marks=pytest.mark.extended) for s in sorted(CASES)]
)
def test_slime_script_passes_the_engine_check_with_its_gpu_only_options_listed(script, tmp_path):
    kept, gpu_only = CASES[script]
    spec = _imported_spec(script, tmp_path)
    assert skip_reason(spec) is None
    plan = engine_plan(spec, tmp_path / "engine" / "model")
    assert list(plan.fold.kept) == kept
    assert [c[0] for c in plan.changes if c[0].startswith("train.megatron.")] == gpu_only
    result = run_engine_check(spec, plan, tmp_path / "engine", tolerance=1e-3, verbose=False)
    stages = {s["stage"]: s for s in result["stages"]}
    assert all(s["status"] == "passed" for s in stages.values()), json.dumps(result, indent=1)
    train = stages["train step (your engine)"]["detail"]
    assert ("your SFT loss" if spec.kind == "SFTJob" else "synthetic reward") in train
    print(f"{script}: {result['seconds']} s")
