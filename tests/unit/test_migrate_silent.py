"""The cases issue #30 found the importer resolving without a word: each is now mapped, refused or a
contradiction, with its message. (Each failed on the importer before this change: the flag landed in an
engine table, was dropped, or one setting silently became another.)"""

from __future__ import annotations

import json

import pytest

from slime.backends.sglang.flags import engine_tp
from slime.cli.main import main
from slime.migrate.importer import IMPLIED, convert_slime_args
from slime.spec import SpecError, load_spec_text
from tests.fixtures.fit_configs import QWEN3_30B_A3B, write_model

DISAGG = "--hf-checkpoint /m --rollout-num-gpus 8 --rollout-num-gpus-per-engine 4 --actor-num-gpus-per-node 8"


def _engine_args(result) -> dict:
    return load_spec_text(result.yaml, file="imported.yaml").spec.rollout.sglang.args


@pytest.mark.parametrize("flags, words", [("--sglang-config /cfg/groups.yaml", "SGLang server groups")])
def test_pd_disaggregation_flags_are_refused_not_placed(flags, words):
    result = convert_slime_args(f"{DISAGG} {flags}")
    flag = flags.split()[0]
    assert words in dict(result.refused)[flag] and not result.accepted()
    assert not any(p.startswith(("train.megatron.args", "rollout.sglang.args")) for _, p in result.mapped)
    assert result.accepted(drop_unmapped=True) and _engine_args(result) == {}


def test_prefill_num_servers_becomes_the_prefill_decode_section():
    """slime's --prefill-num-servers N (its first N engines prefill, the rest decode) and the transfer flags
    map onto rollout.sglang.pd, not into the engines' args (where 0.5.23 would start regular servers)."""
    flags = (
        "--sglang-disaggregation-transfer-backend nixl --sglang-disaggregation-ib-device mlx5_0 --prefill-num-servers 1"
    )
    result = convert_slime_args(f"{DISAGG} {flags}")
    assert result.accepted(), (result.refused, result.unmapped)
    mapped = dict(result.mapped)
    assert mapped["--prefill-num-servers"] == "rollout.sglang.pd.prefill_engines"
    assert mapped["--sglang-disaggregation-transfer-backend"] == "rollout.sglang.pd.transfer"
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    pd = spec.rollout.sglang.pd
    assert (pd.prefill_engines, pd.transfer, pd.ib_device) == (1, "nixl", "mlx5_0") and _engine_args(result) == {}
    # 8 rollout GPUs of 4-GPU engines: 1 prefill + 1 decode engine, as slime's from_prefill_num_servers splits them
    from slime.spec.layout import plan_layout

    assert plan_layout(spec).engine_roles == ("prefill", "decode")


def test_pd_transfer_flags_without_prefill_num_servers_are_dropped_with_the_field_to_use():
    result = convert_slime_args(f"{DISAGG} --sglang-disaggregation-transfer-backend mooncake")
    assert "set it in rollout.sglang.pd" in dict(result.unmapped)["--sglang-disaggregation-transfer-backend"]
    assert result.accepted(drop_unmapped=True)
    assert load_spec_text(result.yaml, file="imported.yaml").spec.rollout.sglang.pd is None


def test_prefill_num_servers_leaving_no_decode_engine_is_refused_at_validate():
    result = convert_slime_args(f"{DISAGG} --prefill-num-servers 2")
    with pytest.raises(SpecError, match="2 prefill engine\\(s\\) leave no decode engine"):
        load_spec_text(result.yaml, file="imported.yaml")


@pytest.mark.parametrize("flag", ["--sglang-pp-size", "--sglang-pipeline-parallel-size"])
def test_sglang_pipeline_size_becomes_pp_size_and_splits_tensor_parallel(flag):
    result = convert_slime_args(f"{DISAGG} {flag} 2")
    assert result.accepted(), result.unmapped
    args = _engine_args(result)
    assert args == {"pp-size": 2} and dict(result.mapped)[flag] == "rollout.sglang.args.pp-size"
    assert engine_tp(4, args) == 2  # an engine of 4 GPUs runs TP 2 x PP 2, as slime divides it


def test_both_pipeline_size_spellings_with_two_values_contradict():
    result = convert_slime_args(f"{DISAGG} --sglang-pp-size 2 --sglang-pipeline-parallel-size 4")
    [(flag, why)] = result.conflicts
    assert flag == "--sglang-pipeline-parallel-size" and "--sglang-pp-size 2" in why and "4" in why
    assert not result.accepted(drop_unmapped=True)


@pytest.mark.parametrize("flag", ["--use-slime-router", "--megatron-to-hf-mode"])
def test_removed_flags_are_named_as_removed(flag):
    result = convert_slime_args(f"{DISAGG} {flag}")
    assert dict(result.refused)[flag].startswith("removed from slime (last in its parser at commit ")
    assert not any(p.startswith("train.megatron.args") for _, p in result.mapped)


def test_an_unknown_megatron_flag_is_refused_at_import_with_a_suggestion(tmp_path, capsys):
    script = tmp_path / "flags.txt"
    script.write_text(f"{DISAGG} --recompute-granularty full\n")
    assert main(["import-slime-args", str(script)]) == 2
    err = capsys.readouterr().err
    assert "refused: --recompute-granularty ('recompute-granularty' is not a megatron-core" in err
    assert "did you mean 'recompute-granularity'" in err


def test_megatron_no_switches_set_the_option_false():
    """Megatron-LM's --no-<x> stores False into <x>: the option, not an unknown key 'no_<x>'."""
    result = convert_slime_args(f"{DISAGG} --no-gradient-accumulation-fusion")
    assert result.accepted(), result.unmapped
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert spec.train.megatron.args == {"gradient-accumulation-fusion": False}


def test_delta_updates_over_nccl_contradict():
    result = convert_slime_args(f"{DISAGG} --update-weight-mode delta --update-weight-transport nccl")
    [(flag, why)] = result.conflicts
    assert flag == "--update-weight-transport"
    assert "--update-weight-mode delta (line 1) needs --update-weight-transport disk" in why and "nccl" in why
    assert not result.accepted(drop_unmapped=True)


def test_delta_updates_with_colocate_contradict(tmp_path, capsys):
    script = tmp_path / "flags.txt"
    script.write_text("--hf-checkpoint /m --colocate --update-weight-mode delta --update-weight-transport disk\n")
    assert main(["import-slime-args", str(script), "--drop-unmapped"]) == 2
    err = capsys.readouterr().err
    assert "contradiction: --update-weight-mode (--update-weight-mode delta (line 1) with --colocate" in err
    assert "no spec written" in err


def test_architecture_flags_are_compared_with_config_json(tmp_path):
    model = write_model(tmp_path, "qwen3-30b-a3b", QWEN3_30B_A3B)
    agree = f"--hf-checkpoint {model} --num-layers {QWEN3_30B_A3B['num_hidden_layers']} --moe-ffn-hidden-size 768"
    result = convert_slime_args(agree)
    assert result.conflicts == [] and dict(result.mapped)["--moe-ffn-hidden-size"] == IMPLIED
    result = convert_slime_args(f"--hf-checkpoint {model} --moe-ffn-hidden-size 1024 --swiglu")
    [(flag, why)] = result.conflicts
    assert flag == "--moe-ffn-hidden-size"
    assert f"--moe-ffn-hidden-size 1024 (line 1) contradicts {model}/config.json moe_intermediate_size = 768" in why
    assert not result.accepted(drop_unmapped=True)


def test_architecture_flags_are_compared_with_the_model_given_on_the_command_line(tmp_path, capsys):
    model = write_model(tmp_path, "qwen3-30b-a3b", QWEN3_30B_A3B)
    script = tmp_path / "flags.txt"
    script.write_text("--hf-checkpoint /root/Qwen3-30B-A3B --num-experts 64 --colocate\n")
    assert main(["import-slime-args", str(script)]) == 0  # config.json not readable here: noted, not compared
    capsys.readouterr()
    assert main(["import-slime-args", str(script), "--model", str(model), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    [conflict] = report["conflicts"]
    assert conflict["flag"] == "--num-experts" and "num_experts = 128" in conflict["reason"]


def test_an_sft_script_imports_to_an_sft_job():
    flags = (
        "--hf-checkpoint /m --colocate --loss-type sft_loss --num-epoch 3 --calculate-per-token-loss "
        "--disable-compute-advantages-and-returns --rollout-function-path slime.rollout.sft_rollout.generate_rollout "
        "--input-key messages --rm-type math --prompt-data /d/train.jsonl"
    )
    result = convert_slime_args(flags)
    assert result.accepted(), result.unmapped
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert (spec.kind, spec.rollout.epochs, spec.data.input_key) == ("SFTJob", 3, "messages")
    # the RL-only value the script carried is named as left out, not silently dropped
    assert any(f == "--rm-type" and "not used by kind SFTJob" in why for f, why in result.notes), result.notes


def test_a_half_sft_script_is_refused_naming_the_flag():
    result = convert_slime_args("--hf-checkpoint /m --colocate --loss-type sft_loss --calculate-per-token-loss")
    refused = dict(result.refused)
    assert "--rollout-function-path" in refused and "sft_loss" in refused["--rollout-function-path"]


def test_an_rl_script_keeps_its_epochs_and_token_mean():
    result = convert_slime_args("--hf-checkpoint /m --colocate --num-epoch 3 --calculate-per-token-loss")
    assert result.accepted(), result.unmapped
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert (spec.rollout.epochs, spec.algorithm.loss_agg) == (3, "token_mean")


def test_an_import_the_rules_refuse_is_not_written(tmp_path, capsys):
    """The same rules as a hand-written spec: a batch the data-parallel size cannot divide is exit 2."""
    script = tmp_path / "flags.txt"
    script.write_text("--hf-checkpoint /m --colocate --global-batch-size 12 --actor-num-gpus-per-node 8\n")
    out = tmp_path / "job.yaml"
    assert main(["import-slime-args", str(script), "-o", str(out), "--drop-unmapped"]) == 2
    assert not out.exists() and "is not divisible by global_batch_size 12" in capsys.readouterr().err


def test_megatron_lm_names_reach_megatron_core_s_option_or_a_note():
    flags = f"{DISAGG} --no-rope-fusion --optimizer-cpu-offload --decoder-last-pipeline-num-layers 5"
    result = convert_slime_args(flags)
    assert result.accepted(), result.refused
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert spec.train.megatron.args == {"apply-rope-fusion": False}
    assert spec.train.megatron.optimizer_offload == 1.0  # Megatron-LM's fraction when none is given
    dropped = dict(result.unmapped)
    assert "--optimizer-cpu-offload" not in dropped
    assert "splits layers evenly" in dropped["--decoder-last-pipeline-num-layers"]
    refused = dict(convert_slime_args(f"{DISAGG} --exp-avg-dtype bf16").refused)
    assert "Adam keeps fp32 states" in refused["--exp-avg-dtype"]


def test_the_optimizer_offload_pair_maps_to_one_fraction_and_the_fraction_alone_offloads_nothing():
    half = convert_slime_args(f"{DISAGG} --optimizer-offload-fraction 0.5 --optimizer-cpu-offload")
    assert half.accepted(), half.refused
    assert load_spec_text(half.yaml, file="i.yaml").spec.train.megatron.optimizer_offload == 0.5
    alone = convert_slime_args(f"{DISAGG} --optimizer-offload-fraction 0.5")
    assert alone.accepted() and "offloads nothing" in dict(alone.unmapped)["--optimizer-offload-fraction"]
    assert load_spec_text(alone.yaml, file="i.yaml").spec.train.megatron.optimizer_offload == 0.0
    bad = convert_slime_args(f"{DISAGG} --optimizer-cpu-offload --optimizer-offload-fraction 2")
    assert "not a fraction" in dict(bad.refused)["--optimizer-offload-fraction"]
    with pytest.raises(SpecError) as exc:  # megatron-core's hybrid optimizer runs inside the distributed one
        load_spec_text(half.yaml, file="i.yaml", overrides=["train.optimizer.distributed=false"])
    assert [p.path for p in exc.value.problems] == ["train.megatron.optimizer_offload"]


def test_an_array_defined_nowhere_in_a_script_without_sources_passes_nothing():
    text = "python3 train.py --hf-checkpoint /m --colocate ${EVAL_ARGS[@]}\n"
    result = convert_slime_args(text)
    assert result.accepted() and "defined nowhere in this script" in dict(result.unmapped)["${EVAL_ARGS[@]}"]
    sourced = convert_slime_args("source ./models/m.sh\n" + text)
    assert "a sourced file?" in dict(sourced.refused)["${EVAL_ARGS[@]}"]


def test_a_sourced_model_file_given_on_the_command_line_defines_its_arrays(tmp_path, capsys):
    """slime's scripts source scripts/models/<m>.sh for MODEL_ARGS: --source reads it (nothing is run),
    and its architecture flags are compared with --model's config.json."""
    model = write_model(tmp_path, "qwen3-30b-a3b", QWEN3_30B_A3B)
    models_sh = tmp_path / "qwen3-30B-A3B.sh"
    models_sh.write_text("NLAYERS=48\nMODEL_ARGS=(\n  --num-layers $NLAYERS\n  --moe-ffn-hidden-size 768\n)\n")
    script = tmp_path / "run.sh"
    script.write_text(
        'source "${SCRIPT_DIR}/models/qwen3-30B-A3B.sh"\n'
        "python3 train.py --hf-checkpoint /root/Qwen3-30B-A3B --colocate ${MODEL_ARGS[@]}\n"
    )
    assert main(["import-slime-args", str(script)]) == 2  # MODEL_ARGS unknown: its flags unseen
    assert "a sourced file?" in capsys.readouterr().err
    args = ["import-slime-args", str(script), "--source", str(models_sh), "--model", str(model), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"flag": "--num-layers", "path": IMPLIED} in report["mapped"] and report["conflicts"] == []
    models_sh.write_text("MODEL_ARGS=(--num-layers 36)\n")
    assert main(args) == 2
    assert "num_hidden_layers = 48" in json.loads(capsys.readouterr().out)["conflicts"][0]["reason"]


@pytest.mark.parametrize(
    "flags, mode",
    [
        ("--use-opd --opd-type sglang", "teacher SGLang server the job does not start"),
        (
            "--rollout-function-path examples.fully_async.fully_async_rollout.generate_rollout",
            "write train.async: {mode: fully",
        ),
    ],
)
def test_modes_slime_submit_lacks_are_refused_by_name(flags, mode):
    result = convert_slime_args(f"{DISAGG} {flags}")
    assert mode in dict(result.refused)[flags.split()[0]] and not result.accepted()
