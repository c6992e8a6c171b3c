"""THUDM/slime's own launch scripts (their flag lists, generated into tests/fixtures/slime_script_flags.json
from slime's ``scripts/run-*.sh`` with the model file each sources) through ``import-slime-args``, each with
the config.json of the model it trains: those megatron-core can run import and validate; the others are
refused with the reason (the importer's for a flag, the engine's for the model or layout)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from slime.migrate.flagmap import unknown_flag, unknown_megatron_option
from slime.migrate.importer import convert_slime_args
from slime.spec import load_spec_text
from tests.fixtures.fit_configs import write_model
from tests.fixtures.slime_script_models import SCRIPT_MODELS

DIGEST = json.loads((Path(__file__).parents[1] / "fixtures" / "slime_script_flags.json").read_text())
SCRIPTS = DIGEST["scripts"]
_UNSUPPORTED = "is not supported by the megatron backend"
_LENGTH = "needs the run's optimizer steps"
# script -> what refuses it (each substring appears in a refusal, contradiction or validation error); [] = accepted
EXPECTED: dict[str, list[str]] = {
    "run-qwen3-4B.sh": [],
    "run-qwen3-4B-amd.sh": [],
    "run-qwen3-32B.sh": [],
    "run-qwen3-30B-A3B.sh": [],
    "run-qwen2.5-0.5B-gb10-smoke.sh": [],
    "run-qwen2.5-0.5B-reproducibility.sh": [],
    "run-moonlight-16B-A3B.sh": [],
    # slime splits the layers unevenly over pipeline stages (--decoder-last-pipeline-num-layers)
    "run-qwen3-235B-A22B.sh": ["pipeline=4 does not divide the model's 94 layers"],
    "run-deepseek-r1.sh": ["pipeline=4 does not divide the model's 61 layers", "multi-latent attention"],
    "run-kimi-k2-Thinking.sh": ["pipeline=8 does not divide the model's 61 layers", "multi-latent attention"],
    # a missing line continuation: bash runs MODEL_ARGS... as a command of its own, train.py gets 7 words
    "run-kimi-k2-Instruct.sh": ["slime never sees these flags", "global_batch_size 16 is not divisible"],
    "run-glm4-9B.sh": ["'glm4' " + _UNSUPPORTED],
    "run-glm4.7-30B-A3B.sh": ["'glm4_moe' " + _UNSUPPORTED, "does not divide the 8 trainer GPUs", "multi-token"],
    "run-glm4.7-355B-A32B.sh": ["'glm4_moe' " + _UNSUPPORTED, "stop token ids are not in slime/v2"],
    "run-glm5-744B-A40B.sh": ["'glm_moe_dsa' " + _UNSUPPORTED],  # its --prefill-num-servers 1 maps (rollout.sglang.pd)
    "run-glm5.2-744B-A40B.sh": ["'glm_moe_dsa' " + _UNSUPPORTED, "SGLang server groups"],
    "run-mimo-7B-rl-eagle.sh": ["'mimo' " + _UNSUPPORTED, "multi-token-prediction training"],
    "run-minimax-m2.sh": ["'minimax_m2' " + _UNSUPPORTED],
    "run-qwen3-next-80B-A3B.sh": ["'qwen3_next' " + _UNSUPPORTED],
    "run-qwen3.5-27B.sh": ["'qwen3_5' " + _UNSUPPORTED, "'mamba-scheduler-strategy' is not a server flag"],
    # SFT scripts import to kind SFTJob; their warm-up is a fraction of a run whose length comes from the
    # data (--num-epoch), which is not on this machine: on the cluster, with data.prompts readable, it resolves
    "run-qwen3.5-35B-A3B-sft.sh": ["'qwen3_5_moe' " + _UNSUPPORTED, _LENGTH],
    "run-qwen3-235B-A22B-sft.sh": [_LENGTH],
    "run-qwen3-4B-base-sft.sh": [_LENGTH],
}


def imported(script: str, tmp_path: Path):
    info = SCRIPTS[script]
    model = write_model(tmp_path, info["model_file"], SCRIPT_MODELS[info["model_file"]])
    text = f"python3 {info['entry']} " + " ".join(shlex.quote(w) for w in info["words"])
    text += "".join(f"\n{line}" for line in info["not_passed"])  # statements after the command (no '\\')
    return convert_slime_args(text, model=str(model))


def test_every_script_of_the_digest_has_a_verdict():
    assert sorted(EXPECTED) == sorted(SCRIPTS) and len(SCRIPTS) == 23
    assert (
        DIGEST["slime_commit"]
        == json.loads((Path(__file__).parents[2] / "slime/migrate/slime_flags.json").read_text())["slime_commit"]
    )


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_each_script_imports_and_validates_or_is_refused_with_the_reason(script, tmp_path):
    result = imported(script, tmp_path)
    reasons = [why for _, why in result.refused + result.conflicts]
    reasons += [p.message for p in result.problems if p.severity == "error"]
    if not EXPECTED[script]:
        assert result.accepted() and reasons == [], reasons
    else:
        assert not result.accepted()
        for words in EXPECTED[script]:
            assert any(words in r for r in reasons), (words, reasons)
    for _, path in result.mapped:  # nothing reaches an engine that the pinned engine does not take
        if path.startswith("train.megatron.args."):
            assert unknown_megatron_option(path.rsplit(".", 1)[1]) is None, path
        if path.startswith("rollout.sglang.args."):
            assert unknown_flag(path.rsplit(".", 1)[1]) is None, path


@pytest.mark.parametrize("script", ["run-qwen3-4B-base-sft.sh", "run-qwen3-235B-A22B-sft.sh"])
def test_slimes_sft_scripts_validate_as_sft_jobs_where_their_data_is_readable(script, tmp_path):
    """With the data on this machine (as on the cluster) the run's length, and so the warm-up, is known."""
    data = tmp_path / "sft.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data.write_text("\n".join(json.dumps(row) for _ in range(64)) + "\n")
    info = SCRIPTS[script]
    words = list(info["words"])
    words[words.index("--prompt-data") + 1] = str(data)
    model = write_model(tmp_path, info["model_file"], SCRIPT_MODELS[info["model_file"]])
    text = f"python3 {info['entry']} " + " ".join(shlex.quote(w) for w in words)
    result = convert_slime_args(text, model=str(model))
    errors = [p.message for p in result.problems if p.severity == "error"]
    assert result.accepted() and not errors, (result.refused, errors)
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert spec.kind == "SFTJob" and spec.train.optimizer.warmup_fraction is not None
    assert spec.train.optimizer.warmup_steps == int(
        spec.train.optimizer.warmup_fraction * spec.rollout.num_rollouts * spec.train.num_steps_per_rollout
    )
