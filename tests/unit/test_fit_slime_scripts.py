"""THUDM/slime's launch scripts (tests/fixtures/slime_scripts) through the importer and the estimate,
on the hardware their recipes name (the scripts name none: H100-80GB for the Qwen2.5 ones, H200-141GB
for Kimi-K2 as its recipe's table says), and each with its parallelism reduced."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from ruamel.yaml import YAML

from slime.fit import estimate
from slime.migrate.importer import convert_slime_args, read_source
from slime.spec import SpecError, load_spec_text
from slime.spec.resolve import resolve
from slime.spec.types import Spec
from tests.fixtures.fit_configs import KIMI_K2, QWEN25_1P5B, QWEN25_7B, write_model
from tests.fixtures.spec_helpers import ROOT, spec

SCRIPTS = ROOT / "tests/fixtures/slime_scripts"
QWEN7B, DISAGG, KIMI = "run-qwen2.5-7b-grpo.sh", "run-disagg-flags.sh", "run-kimi-k2-instruct-excerpt.sh"
MODELS = {QWEN7B: (QWEN25_7B, "H100-80GB"), DISAGG: (QWEN25_1P5B, "H100-80GB"), KIMI: (KIMI_K2, "H200-141GB")}
# slime's Kimi-K2 recipe layout (TP 8, PP 8, EP 32, full recompute, optimizer on the host, 4096 tokens a GPU);
# its CP 4 and uneven last stage are left out: the megatron backend refuses both for this model
KIMI_RECIPE = {
    "train.parallel": {"tensor": 8, "pipeline": 8, "expert": 32, "expert_tensor": 1, "sequence_parallel": True},
    "train.dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 4096},
    "train.megatron": {"args": {"recompute-granularity": "full"}, "optimizer_offload": 1.0},
    "rollout.gpus_per_engine": 32,
}


def _imported(script: str, tmp_path: Path) -> tuple[str, list[str]]:
    cfg, gpu = MODELS[script]
    model = write_model(tmp_path, script, cfg)
    text = convert_slime_args(read_source(str(SCRIPTS / script)), name=None).yaml
    return text, [f"model.path={model}", f"cluster.gpu={{name: {gpu}}}"]


def _verdicts(loaded_spec) -> dict[str, str]:
    return {r.role: r.verdict for r in estimate(loaded_spec).roles}


@pytest.mark.parametrize("script", [QWEN7B, DISAGG])
def test_the_complete_scripts_fit_their_hardware(script, tmp_path):
    text, sets = _imported(script, tmp_path)
    verdicts = _verdicts(load_spec_text(text, overrides=sets).spec)
    assert set(verdicts.values()) == {"ok"}, verdicts


def test_the_7b_script_with_tensor_parallel_1_and_no_recompute_is_refused(tmp_path):
    text, sets = _imported(QWEN7B, tmp_path)
    reduced = ["train.parallel.tensor=1", "train.parallel.sequence_parallel=false", "train.megatron.args={}"]
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, overrides=sets + reduced)
    [p] = [p for p in exc.value.problems if p.severity == "error"]
    assert p.path == "train.parallel" and "the actor needs 103." in p.message and "H100-80GB" in p.message
    assert "recompute-granularity: full" in p.hint


def test_the_1p5b_script_still_fits_with_one_gpu_engines(tmp_path):
    text, sets = _imported(DISAGG, tmp_path)
    assert set(_verdicts(load_spec_text(text, overrides=[*sets, "rollout.gpus_per_engine=1"]).spec).values()) == {"ok"}


def test_the_kimi_excerpt_as_imported_is_refused(tmp_path):
    # the excerpt's train.py command ends on its line 30, so no parallelism flag reaches it: TP = PP = EP = 1
    text, sets = _imported(KIMI, tmp_path)
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, overrides=sets)
    actor = [p for p in exc.value.problems if p.path == "train.parallel"]
    assert actor and "the actor needs 5801.9 GiB per GPU" in actor[0].message


def _typed(text: str, sets: list[str], edits: dict) -> Spec:
    """The spec without its rules (the recipe's layout is one the megatron backend refuses for other reasons)."""
    data = YAML(typ="safe").load(text)
    data = spec(data, **{"model.path": sets[0].split("=", 1)[1], "cluster.gpu": {"name": "H200-141GB"}, **edits})
    return resolve(msgspec.convert(data, Spec), ROOT)


def test_kimi_on_its_recipe_layout(tmp_path):
    text, sets = _imported(KIMI, tmp_path)
    report = estimate(_typed(text, sets, KIMI_RECIPE))
    actor, engine, host = report.roles
    assert actor.verdict == "ok" and actor.memory.get("optimizer") == 0 and engine.verdict == "ok"
    halved = estimate(
        _typed(text, sets, {**KIMI_RECIPE, "train.parallel": {**KIMI_RECIPE["train.parallel"], "expert": 4}})
    )
    assert halved.roles[0].verdict == "over"


# THUDM/slime's scripts of the digest (tests/fixtures/slime_script_flags.json) whose model family the megatron
# backend runs, each with its model's config.json on the GPU its recipe names (H100-80GB; H200-141GB for Kimi):
# the roles estimated not to fit, with why each is right.
DIGEST = msgspec.json.decode((ROOT / "tests/fixtures/slime_script_flags.json").read_bytes())["scripts"]
DIGEST_OVER: dict[str, set[str]] = {
    "run-qwen3-4B.sh": set(),
    "run-qwen3-4B-amd.sh": set(),
    "run-qwen3-32B.sh": set(),
    "run-qwen3-30B-A3B.sh": set(),
    "run-qwen2.5-0.5B-gb10-smoke.sh": set(),
    "run-qwen2.5-0.5B-reproducibility.sh": set(),
    "run-moonlight-16B-A3B.sh": set(),
    "run-qwen3-235B-A22B.sh": set(),
    "run-qwen3-235B-A22B-sft.sh": set(),  # fits only because its optimizer is on the host (below)
    "run-qwen3-4B-base-sft.sh": set(),
    "run-deepseek-r1.sh": set(),
    # its missing line continuation drops every parallelism flag: 1T parameters on TP = EP = 1
    "run-kimi-k2-Instruct.sh": {"actor", "engine (rollout, beside the actor)"},
    # colocated: a 16-GPU engine's bf16 weights beside the trainer's resident weights and gradients
    "run-kimi-k2-Thinking.sh": {"engine (rollout, beside the actor)"},
}


def _digest_spec(script: str, tmp_path: Path, **edits) -> Spec:
    import shlex

    from tests.fixtures.slime_script_models import SCRIPT_MODELS

    info = DIGEST[script]
    model = write_model(tmp_path, info["model_file"], SCRIPT_MODELS[info["model_file"]])
    text = f"python3 {info['entry']} " + " ".join(shlex.quote(w) for w in info["words"])
    gpu = "H200-141GB" if "kimi" in script else "H100-80GB"
    return _typed(
        convert_slime_args(text, model=str(model)).yaml,
        [f"model.path={model}"],
        {"cluster.gpu": {"name": gpu}, **edits},
    )


@pytest.mark.parametrize("script", sorted(DIGEST_OVER))
def test_the_real_scripts_fit_their_hardware_but_the_ones_that_cannot(script, tmp_path):
    report = estimate(_digest_spec(script, tmp_path))
    assert {r.role for r in report.roles if r.verdict == "over"} == DIGEST_OVER[script]


def test_the_235b_sft_script_fits_only_with_its_optimizer_on_the_host(tmp_path):
    on_host = estimate(_digest_spec("run-qwen3-235B-A22B-sft.sh", tmp_path))
    on_gpu = estimate(_digest_spec("run-qwen3-235B-A22B-sft.sh", tmp_path, **{"train.megatron.optimizer_offload": 0.0}))
    assert on_host.roles[0].verdict == "ok" and on_gpu.roles[0].verdict == "over"
    assert on_gpu.roles[0].memory.get("optimizer") > on_gpu.gpu_bytes - on_host.roles[0].memory.total
    assert [r.role for r in on_host.roles] == ["actor", "host RAM per node"]  # no eval sets: no engines
