"""import-slime-args: slime launch scripts and flag lists become commented, valid slime/v2 specs,
and every flag is accounted for (mapped, implied, passed through, or listed with a reason)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.cli.main import main
from slime.migrate.bashargs import read_script
from slime.migrate.importer import IMPLIED, convert_slime_args, read_source
from slime.migrate.slime_flags import ARCHITECTURE, DIRECT, SLIME_ONLY
from slime.spec import SpecError, load_spec_text
from slime.spec.yamlmarks import load_yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "slime_scripts"
COLOCATED = FIXTURES / "run-qwen2.5-7b-grpo.sh"
DISAGG = FIXTURES / "run-disagg-flags.sh"


def convert(path: Path, **kw):
    return convert_slime_args(path.read_text(), **kw)


def spec_of(result):
    return load_spec_text(result.yaml, file="imported.yaml").spec


def line_of(path: Path, needle: str) -> int:
    return next(
        i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln and not ln.lstrip().startswith("#")
    )


def yaml_line(result, key_text: str) -> str:
    return next(ln for ln in result.yaml.splitlines() if ln.strip().startswith(key_text))


def flags_in_script(path: Path) -> set[str]:
    """Every --flag the train.py command receives, read independently: array bodies and the lines
    after 'train.py', comments skipped."""
    flags: set[str] = set()
    in_array = after_entry = False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#"):
            continue
        if re.match(r"^[A-Z_]+=\($", line):
            in_array = True
            continue
        if in_array and line == ")":
            in_array = False
            continue
        if "train.py" in line:
            after_entry = True
            line = line.split("train.py", 1)[1]
        if in_array or after_entry:
            flags |= {m.split("=")[0] for m in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?:=\S*)?", line)}
    return flags


# ----------------------------------------------------------------------------- the colocated launch script
def test_launch_script_becomes_a_valid_spec():
    result = convert(COLOCATED)
    assert result.valid and result.problems == [], [p.format() for p in result.problems]
    s = spec_of(result)
    assert (s.cluster.launcher, s.cluster.nodes, s.cluster.gpus_per_node) == ("slurm", 2, 8)
    assert s.model.path == "/mnt/shared/models/Qwen2.5-7B-Instruct" and s.model.ref_path == "initial"
    t = s.train
    assert (t.backend, t.nodes, t.gpus_per_node, t.precision) == ("megatron", 2, 8, "bf16")
    assert (t.parallel.tensor, t.parallel.pipeline, t.parallel.sequence_parallel) == (2, 1, True)
    assert (t.global_batch_size, t.micro_batch_size) == (256, 1)  # '# --micro-batch-size 1' is a comment
    assert t.dynamic_batch.enabled and t.dynamic_batch.max_tokens_per_gpu == 8192
    o = t.optimizer
    assert (o.lr, o.lr_schedule, o.weight_decay, o.betas) == (1e-6, "constant", 0.1, (0.9, 0.98))
    assert t.checkpoint.dir == "/mnt/shared/ckpt/qwen2.5-7b-grpo" and t.checkpoint.interval == 25
    m = t.megatron.args
    assert m["recompute-granularity"] == "full" and m["recompute-num-layers"] == 1
    assert "accumulate-allreduce-grads-in-fp32" not in m  # Megatron-LM's, not a megatron-core option
    assert m["attention-dropout"] == 0.0 and "expert-tensor-parallel-size" not in m
    assert t.parallel.expert_tensor == 1  # --expert-tensor-parallel-size is a first-class field
    r = s.rollout
    assert (r.backend, r.colocate, r.gpus_per_engine, r.gpus, r.num_engines) == ("sglang", True, 2, 16, 8)
    assert (r.batch_size, r.n_samples_per_prompt, r.num_rollouts) == (32, 8, 400)
    assert (r.max_prompt_len, r.max_response_len, r.temperature, r.top_p) == (1024, 4096, 0.9, 1.0)
    assert r.sglang.args == {"mem-fraction-static": 0.7, "enable-metrics": True}
    assert r.sglang.router_args == {}  # --router-balance-abs-threshold: no router in the request path (listed)
    assert r.builtin is None  # only the selected rollout backend's section is filled
    mapped = dict(result.mapped)  # the paths the written spec has, not the flag table's slime/v1 ones
    assert mapped["--recompute-granularity"] == "train.megatron.args.recompute-granularity"
    assert mapped["--sglang-mem-fraction-static"] == "rollout.sglang.args.mem-fraction-static"
    d = s.data
    assert (d.prompts, d.input_key, d.label_key, d.apply_chat_template, d.shuffle) == (
        "/mnt/shared/data/dapo-math-17k.jsonl",
        "prompt",
        "label",
        True,
        True,
    )
    assert [(e.name, e.path, e.interval, e.n_samples_per_prompt, e.temperature) for e in d.eval] == [
        ("aime24", "/mnt/shared/data/aime-2024.jsonl", 25, 8, 0.9),
        ("math500", "/mnt/shared/data/math 500.jsonl", 25, 8, 0.9),
    ]  # the quoted path keeps its space
    assert s.reward.type == "deepscaler"  # slime's grader, not math (its scores differ)
    a = s.algorithm
    assert (a.estimator, a.eps_clip, a.eps_clip_high, a.kl_loss_coef, a.kl_loss_type, a.entropy_coef) == (
        "grpo",
        0.2,
        0.28,
        0.001,
        "low_var_kl",
        0.0,
    )
    assert (s.logging.wandb.mode, s.logging.wandb.project, s.logging.wandb.group) == (
        "online",
        "slime-grpo",
        "qwen2.5-7b-grpo",
    )
    assert s.cluster.secrets["WANDB_API_KEY"].env == "WANDB_API_KEY"


def test_every_flag_of_the_script_is_accounted_for():
    result = convert(COLOCATED)
    accounted = {f for f, _ in result.mapped} | {f for f, _ in result.unmapped}
    expected = flags_in_script(COLOCATED)
    assert len(expected) > 70
    assert expected - accounted == set()
    assert {f for f, _ in result.mapped}.isdisjoint({f for f, _ in result.unmapped})


def test_architecture_flags_are_implied_by_the_hf_config():
    mapped = dict(convert(COLOCATED).mapped)
    for flag in (
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--group-query-attention",
        "--num-query-groups",
        "--rotary-base",
        "--normalization",
        "--norm-epsilon",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--use-rotary-position-embeddings",
    ):
        assert mapped[flag] == IMPLIED == "implied by model.path config.json"


def test_unmapped_flags_have_reasons():
    unmapped = dict(convert(COLOCATED).unmapped)
    assert set(unmapped) == {
        "--accumulate-allreduce-grads-in-fp32",
        "--update-weight-buffer-size",
        "--balance-data",
        "--sglang-cuda-graph-bs",
        "--router-balance-abs-threshold",
    }
    assert "several values (1 2 4 8 16 32 64)" in unmapped["--sglang-cuda-graph-bs"]
    assert all(reason for reason in unmapped.values())
    # slime's eval sampling flags set every eval set's own fields
    sets = spec_of(convert(COLOCATED)).data.eval
    assert [(e.max_response_len, e.top_p, e.n_samples_per_prompt) for e in sets] == [(8192, 0.95, 8)] * 2


def test_comments_say_where_each_value_came_from():
    result = convert(COLOCATED)
    n = line_of(COLOCATED, "--rollout-batch-size 32")
    assert yaml_line(result, "batch_size:").endswith(f"# --rollout-batch-size 32 (line {n})")
    assert f"--tensor-model-parallel-size 2 (line {line_of(COLOCATED, '--tensor-model-parallel-size')})" in yaml_line(
        result, "tensor:"
    )
    assert "(line 143)" in yaml_line(result, "nodes: 2 # --actor") or "--actor-num-nodes 2 (line" in result.yaml
    assert "derived: max(actor, rollout) = 16 GPUs / 8 per node" in yaml_line(result, "nodes: 2 # derived")
    assert yaml_line(result, "weight_decay:").endswith(f"(line {line_of(COLOCATED, '--weight-decay')})")
    assert result.yaml.startswith("# Generated by `slime-submit import-slime-args` from the flags of train.py")
    assert "# Not mapped" in result.yaml and "#   --balance-data: token-balanced" in result.yaml


def test_commented_out_flags_are_not_imported():
    result = convert(COLOCATED)
    assert "FP8" not in yaml_line(result, "path: /mnt")
    assert "micro_batch_size" not in result.yaml


def test_secret_values_are_never_copied():
    text = COLOCATED.read_text().replace("--wandb-key ${WANDB_API_KEY}", "--wandb-key abc123secret")
    result = convert_slime_args(text)
    assert "abc123secret" not in result.yaml and "WANDB_API_KEY: {env: WANDB_API_KEY}" in result.yaml


# ----------------------------------------------------------------------------- the disaggregated script
def test_disaggregated_flags_with_equals_signs():
    result = convert(DISAGG)
    assert result.valid, [p.format() for p in result.problems]
    s = spec_of(result)
    assert (s.cluster.nodes, s.cluster.gpus_per_node, s.cluster.launcher) == (2, 8, "slurm")
    assert (s.rollout.colocate, s.rollout.gpus, s.rollout.gpus_per_engine, s.rollout.num_engines) == (False, 8, 4, 2)
    assert s.rollout.weight_sync == "nccl" and s.rollout.stop == ("</answer>", "<|im_end|>")
    assert s.rollout.batch_size == 32  # given twice: the last wins, as in argparse
    assert (s.rollout.epochs, s.rollout.num_rollouts) == (2, None)
    assert s.data.prompts == "/data/gsm8k/train.jsonl"  # ${DATA_ROOT:-/data}
    assert (s.data.input_key, s.data.label_key, s.data.shuffle) == ("question", "answer", False)
    assert s.reward.type == "exact" and s.algorithm.kl_loss_coef == 0.0  # boxed_math has no v1 equivalent
    assert s.rollout.sglang.args == {"cuda-graph-max-bs-decode": 128}  # SGLang 0.5.23's name
    unmapped = dict(result.unmapped)
    assert "slime ignores it without --use-kl-loss" in unmapped["--kl-loss-coef"]
    assert "grades only the \\boxed{} content" in unmapped["--rm-type"]
    assert dict(result.mapped)["--spec"].startswith(IMPLIED)  # the layer spec follows config.json's model_type
    assert dict(result.refused).keys() == {"${MODEL_ARGS[@]}", "--rm-type"}  # the rest changes nothing trained
    assert "given again on line" in unmapped["--rollout-batch-size"]
    assert "not defined in this file" in unmapped['"${MODEL_ARGS[@]}"'.strip('"')]
    assert any(t.startswith("source ") for t, _ in result.notes)


def test_slime_defaults_that_differ_are_written_out():
    result = convert_slime_args(
        "--hf-checkpoint /m --prompt-data /p.jsonl --num-rollout 5 --colocate --rollout-batch-size 8 --rm-type math"
    )
    s = spec_of(result)
    assert (s.data.input_key, s.data.label_key, s.data.shuffle) == ("input", None, False)
    assert s.rollout.n_samples_per_prompt == 1 and s.algorithm.kl_loss_type == "k1"
    assert s.train.optimizer.betas == (0.9, 0.999) and s.train.optimizer.weight_decay == 0.01
    assert s.logging.wandb.mode == "disabled" and (s.train.nodes, s.train.gpus_per_node) == (1, 8)
    assert "(flag absent)" in yaml_line(result, "input_key:")
    assert s.cluster.launcher == "local" and s.cluster.nodes == 1


# ----------------------------------------------------------------------------- incomplete input
def test_missing_required_values_get_placeholders_and_the_spec_still_validates():
    result = convert_slime_args("--actor-num-gpus-per-node 2 --colocate\n")
    assert {p for p, _ in result.placeholders} == {"model.path", "data.prompts", "rollout.num_rollouts", "reward.type"}
    assert result.valid, [p.format() for p in result.problems]
    assert "# PLACEHOLDER: no --hf-checkpoint in the input" in yaml_line(result, "path: /path/to/hf-checkpoint")
    assert result.report()["placeholders"][0]["path"] == "model.path"


@pytest.mark.parametrize("text", ["", "   \n# nothing\n", "echo hi\n", "python3 train.py\n"])
def test_empty_inputs_still_give_a_valid_skeleton(text):
    result = convert_slime_args(text)
    assert result.valid and result.mapped == [] and result.unmapped == []


def test_kl_without_a_reference_gets_one():
    result = convert_slime_args("--kl-coef 0.05 --hf-checkpoint /m --colocate")
    s = spec_of(result)
    assert s.model.ref_path == "initial" and ("model.ref_path" in dict(result.placeholders))


def test_a_generated_spec_that_breaks_a_rule_reports_it():
    result = convert_slime_args(
        "--hf-checkpoint /m --prompt-data /p --num-rollout 3 --colocate "
        "--rollout-batch-size 3 --n-samples-per-prompt 1 --global-batch-size 2 --rm-type f1"
    )
    assert not result.valid
    assert [p.path for p in result.problems] == ["train.global_batch_size"]
    assert result.report()["valid"] is False and result.report()["problems"][0]["path"] == "train.global_batch_size"


# ----------------------------------------------------------------------------- individual mappings
@pytest.mark.parametrize(
    "flags, path, value",
    [
        ("--custom-rm-path my_pkg.rewards.score", "reward.custom", "my_pkg.rewards:score"),
        ("--rm-type remote_rm --rm-url http://rm:8000/score", "reward.type", "remote"),
        ("--rm-type boxed_f1", "reward.type", "f1"),
        ("--fp16", "train.precision", "fp16"),
        ("--lambd 0.95 --advantage-estimator ppo", "algorithm.lambda", 0.95),
        ("--eps-clip-c 3", "algorithm.dual_clip_c", 3.0),
        ("--disable-grpo-std-normalization", "algorithm.normalize_std", False),
        ('--train-env-vars \'{"NCCL_DEBUG": "INFO"}\'', "cluster.env", {"NCCL_DEBUG": "INFO"}),
        ("--rollout-max-context-len 4096", "model.max_context_len", 4096),
        (
            "--update-weight-mode delta --update-weight-transport disk --rollout-num-gpus 8",
            "rollout.weight_sync",
            "delta",
        ),
        (
            "--eval-prompt-data /d/aime-2024.jsonl --eval-temperature 0.6 --num-rollout 40",
            "data.eval",
            [{"name": "aime-2024", "path": "/d/aime-2024.jsonl", "interval": 40, "temperature": 0.6}],
        ),
        (
            "--dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
            "rollout.dynamic_sampling.filter",
            "nonzero_std",
        ),
        (
            "--dynamic-sampling-filter-path "
            "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback",
            "rollout.dynamic_sampling.filter",
            "nonzero_std_with_fallback",
        ),
        (
            "--dynamic-sampling-filter-path my_pkg.filters.keep_hard",
            "rollout.dynamic_sampling.filter",
            "my_pkg.filters:keep_hard",
        ),
        ("--over-sampling-batch-size 48 --partial-rollout", "rollout.over_sampling_batch_size", 48),
        ("--over-sampling-batch-size 48 --partial-rollout", "rollout.partial", True),
        ("--partial-rollout --mask-offpolicy-in-partial-rollout", "rollout.partial_mask_offpolicy", True),
        ("--debug-rollout-only", "debug.mode", "rollout_only"),
        ("--debug-train-only --load-debug-rollout-data /dbg/{rollout_id}.pt", "debug.mode", "train_only"),
        ("--load-debug-rollout-data /dbg/{rollout_id}.pt", "debug.load_rollouts", "/dbg"),
        ("--save-debug-rollout-data /dbg/{rollout_id}.pt", "debug.save_rollouts", True),
        (
            "--eval-prompt-data aime /d/aime.jsonl --n-samples-per-eval-prompt 6 --log-passrate "
            "--eval-max-response-len 512 --eval-top-p 0.9 --eval-top-k 20 --eval-interval 5",
            "data.eval",
            [
                {
                    "name": "aime",
                    "path": "/d/aime.jsonl",
                    "interval": 5,
                    "n_samples_per_prompt": 6,
                    "max_response_len": 512,
                    "top_p": 0.9,
                    "top_k": 20,
                    "temperature": 1.0,
                    "pass_at_k": [1, 2, 4],
                }
            ],
        ),
    ],
)
def test_individual_mappings(flags, path, value):
    result = convert_slime_args("--hf-checkpoint /m --prompt-data /p --num-rollout 3 " + flags)
    data, _ = load_yaml(result.yaml, "imported.yaml")
    node = data
    for part in path.split("."):
        node = node[part]
    assert node == value


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--rm-type ifbench", "clones the IFBench repository"),
        ("--rm-type boxed_gpqa", "slime/v2 has no such variant"),
        ("--optimizer sgd", "Adam(W) only"),
        ("--lr-decay-style WSD", "constant, cosine and linear"),
        ("--custom-tis-function-path a.b", "not in slime/v2; algorithm.tis"),
        ("--keep-old-actor", "corrects the one-step staleness"),
        ("--ci-test", "CI self-checks"),
        ("--custom-generate-function-path a.b.c", "plug-ins"),
        ("--sglang-router-port 3000", "reaches the engines itself"),
        ("--router-policy cache_aware", "no sglang-router in the request path"),
        ("--sglang-dp-size 8", "slime-submit sets --dp-size itself"),
        ("--loss-type sft_loss", "SFT jobs: kind SFTJob"),
        ("--rollout-batch-size abc", "not an integer"),
        ("--rollout-batch-size", "needs a value"),
        ("--seq-length", None),
        ("--log-passrate", "pass@k for eval sets"),
        ("--eval-top-k 5", "no --eval-prompt-data to apply it to"),
        # not options of the pinned engines: the spec would not validate (slime-submit validate names the tables)
        ("--sglang-mem-fraction-statc 0.7", "not a server flag of SGLang 0.5.23; did you mean 'mem-fraction-static'"),
        ("--recompute-granularty full", "not a megatron-core 0.16.1 option"),
        ("--accumulate-allreduce-grads-in-fp32", "always reduces gradients in fp32"),
    ],
)
def test_unmappable_flags_are_listed_with_a_reason(flag, words):
    result = convert_slime_args(flag)
    name = flag.split()[0]
    if words is None:
        assert (name, IMPLIED) in result.mapped
        return
    assert words in dict(result.unmapped)[name]
    assert f"#   {name}: " in result.yaml


def test_data_path_flags_say_how_slime_differs_and_the_result_validates():
    result = convert_slime_args(
        "--hf-checkpoint /m --prompt-data /p --num-rollout 3 --rollout-batch-size 8 --n-samples-per-prompt 4 "
        "--global-batch-size 32 --over-sampling-batch-size 16 --partial-rollout --mask-offpolicy-in-partial-rollout "
        "--dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std "
        "--save-debug-rollout-data /dbg/{rollout_id}.pt --eval-prompt-data /d/aime.jsonl "
        "--n-samples-per-eval-prompt 4 --log-passrate"
    )
    differs = dict(result.differences)
    assert "max_rounds" in next(v for k, v in differs.items() if k.startswith("--dynamic-sampling-filter-path"))
    assert "Parquet" in next(v for k, v in differs.items() if k.startswith("--save-debug-rollout-data"))
    assert "training rollouts" in differs["--log-passrate"]
    mapped = dict(result.mapped)
    for flag in (
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
        "--log-passrate",
        "--dynamic-sampling-filter-path",
    ):
        assert flag in mapped, flag
    assert result.valid, [p.format() for p in result.problems]
    spec = spec_of(result)
    assert spec.rollout.partial and spec.rollout.dynamic_sampling.filter == "nonzero_std"
    assert spec.debug.save_rollouts and spec.data.eval[0].pass_at_k == (1, 2, 4)
    # slime's saved .pt dumps cannot be replayed: the directory is a placeholder to point at our own
    loaded = convert_slime_args("--hf-checkpoint /m --prompt-data /p --load-debug-rollout-data /dbg/{rollout_id}.pt")
    assert "debug.load_rollouts" in dict(loaded.placeholders) and "PLACEHOLDER" in yaml_line(loaded, "load_rollouts:")


def test_a_megatron_flag_with_several_values_is_listed():
    unmapped = dict(convert_slime_args("--recompute-modules core_attn mlp").unmapped)
    assert "train.megatron.args holds one value per Megatron flag" in unmapped["--recompute-modules"]


def test_async_entry_point_tis_and_tensorboard_flags_map():
    result = convert_slime_args(
        "python train_async.py --hf-checkpoint /m --prompt-data /p --num-rollout 3 --use-tis --tis-clip 1.5 "
        "--tis-clip-low 0.2 --use-tensorboard"
    )
    data, _ = load_yaml(result.yaml, "imported.yaml")
    assert data["train"]["async"] is True and "train_async.py (line 1)" in result.yaml
    assert data["algorithm"]["tis"] == {"enabled": True, "clip": 1.5, "clip_low": 0.2}
    assert data["logging"]["tensorboard"] is True
    assert "train_async.py" not in dict(result.unmapped)
    rollout_lp = convert_slime_args("--hf-checkpoint /m --use-rollout-logprobs")
    assert load_yaml(rollout_lp.yaml, "i.yaml")[0]["algorithm"]["use_rollout_logprobs"] is True
    # slime's train_async.py refuses colocation; so does the imported spec's validation
    colocated = convert_slime_args("python train_async.py --colocate --hf-checkpoint /m --prompt-data /p")
    assert any(p.path == "train.async" and "rollout.colocate is true" in p.message for p in colocated.problems)


def test_tables_do_not_overlap():
    assert not set(DIRECT) & ARCHITECTURE and not set(DIRECT) & SLIME_ONLY and not ARCHITECTURE & SLIME_ONLY


# ----------------------------------------------------------------------------- reading bash
def test_read_script_handles_bash_syntax():
    script = read_script(r"""
A=/x
export B="${A}/y"   # comment
ARR=( --one 1
      # --skipped 0
      "--two" 'lit $A' )
ARR+=(--three $(( 2 * 3 )) --four ${UNSET:-dflt})
cat foo > /tmp/out 2>&1
CMD="--not-used"
nohup python3 /opt/train.py --a=$A --b "$B" \
   ${ARR[@]} --c ${NOPE} --d $(hostname) --e 1 2>&1 | tee x.log &
""")
    assert script.entry == "/opt/train.py"
    assert [w.text for w in script.words] == [
        "--a=/x",
        "--b",
        "/x/y",
        "--one",
        "1",
        "--two",
        "lit $A",
        "--three",
        "6",
        "--four",
        "dflt",
        "--c",
        "${NOPE}",
        "--d",
        "$(hostname)",
        "--e",
        "1",
    ]
    assert [w.line for w in script.words][:5] == [10, 10, 10, 4, 4]
    notes = dict(script.notes)
    assert "not assigned" in notes["${NOPE}"] and "not run" in notes["$(hostname)"]


def test_read_script_without_an_entry_point_reads_flag_lists():
    script = read_script("--a 1 \\\n  --b\n# --c 3\n--d 'x y'\n")
    assert script.entry is None and [w.text for w in script.words] == ["--a", "1", "--b", "--d", "x y"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_read_script_never_raises(text):
    read_script(text)


_FLAG_POOL = sorted(DIRECT) + [
    "--use-kl-loss",
    "--kl-loss-coef",
    "--adam-beta1",
    "--ref-load",
    "--load",
    "--rm-type",
    "--eval-prompt-data",
    "--eval-interval",
    "--use-wandb",
    "--wandb-key",
    "--num-layers",
    "--sglang-mem-fraction-static",
    "--router-policy",
    "--recompute-granularity",
    "--balance-data",
    "--update-weight-transport",
    "--train-env-vars",
    "--spec",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_FLAG_POOL),
            st.lists(
                st.one_of(
                    st.sampled_from(["1", "0", "8", "0.5", "abc", "/p", "math", "grpo", "${X}", "-1", "{}", "nccl"]),
                    st.text(max_size=5),
                ),
                max_size=2,
            ),
        ),
        max_size=12,
    )
)
def test_any_flag_list_converts_and_accounts_for_every_flag(pairs):
    import shlex

    text = " ".join(shlex.quote(f) + "".join(" " + shlex.quote(v) for v in vals) for f, vals in pairs)
    result = convert_slime_args(text)
    load_yaml(result.yaml, "imported.yaml")  # always well-formed YAML
    accounted = {f for f, _ in result.mapped} | {f for f, _ in result.unmapped}
    for f, _ in pairs:
        assert f in accounted, (f, result.mapped, result.unmapped)
    for p in result.problems:
        assert p.message


# ----------------------------------------------------------------------------- CLI
def test_cli_writes_a_spec_that_validates(tmp_path, capsys):
    out = tmp_path / "job.yaml"
    assert main(["import-slime-args", str(COLOCATED), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "dropped: --balance-data" in err and "5 not mapped, of which 0 change what is trained" in err
    assert "dropped: --sglang-cuda-graph-bs" in err  # CUDA-graph batch sizes tune speed only
    assert main(["validate", str(out)]) == 0


@pytest.mark.parametrize("where", ["a-file/job.yaml", "."])
def test_cli_output_that_cannot_be_written_is_a_usage_error(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x")
    assert main(["import-slime-args", str(COLOCATED), "-o", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert "cannot write -o" in err and "Traceback" not in err and "internal error" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing half-written


def test_cli_output_into_a_new_directory_creates_it(tmp_path):
    out = tmp_path / "new" / "job.yaml"
    assert main(["import-slime-args", str(COLOCATED), "-o", str(out)]) == 0 and out.read_text().startswith("#")


def test_cli_prints_yaml_and_json_report(capsys):
    assert main(["import-slime-args", str(DISAGG), "--name", "disagg-job", "--drop-unmapped"]) == 0
    out = capsys.readouterr().out
    assert load_spec_text(out, file="x.yaml").spec.name == "disagg-job"
    assert main(["import-slime-args", "--json", str(DISAGG)]) == 2  # boxed_math and MODEL_ARGS are refused
    report = json.loads(capsys.readouterr().out)
    keys = {"valid", "mapped", "unmapped", "placeholders", "notes", "problems", "differences", "refused", "conflicts"}
    assert set(report) == keys | {"accepted"} and report["accepted"] is False
    assert report["valid"] is True
    assert {"flag": "--rollout-stop", "path": "rollout.stop"} in report["mapped"]
    assert all(set(u) == {"flag", "reason"} for u in report["unmapped"])


def test_cli_reads_stdin():
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "import-slime-args", "-"],
        input="--colocate\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0 and "colocate: true # --colocate (line 1)" in proc.stdout


def test_read_source_errors_are_spec_errors(tmp_path):
    with pytest.raises(SpecError) as info:
        read_source(str(tmp_path / "missing.sh"))
    assert "file not found" in info.value.problems[0].message
    with pytest.raises(SpecError):
        read_source(str(tmp_path))
    (tmp_path / "f.sh").write_text("--colocate")
    assert read_source(str(tmp_path / "f.sh")) == "--colocate"


def test_cli_missing_file_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "import-slime-args", str(tmp_path / "no.sh")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
