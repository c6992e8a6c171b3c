"""The smoke's engine check, fast parts: the folded layout, the tiny model of each family, and one deliberately
broken case per stage failing that stage with a clear message (a config the converter cannot take, an EP
that does not divide the scaled experts, an export that drops a tensor, an engine serving stale weights),
and ``--fast`` keeping the tiny-dense path with an exact list of changes.

Real parts: published config.json contents, transformers' own model classes, megatron's rules
(``model_check``), the built-in engine's weight loader. No megatron-core process here (see
``test_smoke_engine_families.py``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from slime.backends.megatron.model_check import ModelShape
from slime.cli.smoke_engine import MAX_RANKS, engine_plan, engine_untested, fold_parallel, skip_reason
from slime.models.tiny_family import scale_config
from slime.spec.types import Parallel
from tests.fixtures.family_configs import FAMILY_CONFIGS, QWEN3_4B, QWEN3_30B_A3B

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("parallel", "sizes", "world", "folded"),
    [
        # Qwen3-30B-A3B as THUDM/slime runs it: TP 4, EP 8 (expert-TP follows TP)
        (dict(tensor=4, expert=8), dict(tensor=2, expert=2, pipeline=1, context=1, expert_tensor=1), 2, 1),
        (dict(tensor=2, pipeline=2), dict(tensor=2, expert=1, pipeline=2, context=1, expert_tensor=1), 4, 0),
        # four dims > 1: tensor and pipeline fill the four ranks, context folds (expert_tensor 1 as spec'd)
        (
            dict(tensor=8, pipeline=4, context=2, expert=4, expert_tensor=1),
            dict(tensor=2, expert=2, pipeline=2, context=1, expert_tensor=1),
            4,
            1,
        ),
        (dict(), dict(tensor=1, expert=1, pipeline=1, context=1, expert_tensor=1), 1, 0),
    ],
)
def test_fold_keeps_each_parallel_dim_at_two_while_four_ranks_allow(parallel, sizes, world, folded):
    fold = fold_parallel(Parallel(**parallel))
    assert {k: v for k, v in fold.parallel.items() if k != "sequence_parallel"} == sizes
    assert fold.world == world <= MAX_RANKS
    assert len(fold.folded) == folded
    assert len(fold.kept) == sum(1 for k in ("tensor", "expert", "pipeline", "context") if sizes[k] == 2)
    for line in fold.folded:  # each fold says why
        assert "(" in line and "->" in line


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_scaled_config_is_the_same_family_with_its_features(family):
    cfg = FAMILY_CONFIGS[family]
    big, small = ModelShape.from_hf_config(cfg), ModelShape.from_hf_config(scale_config(cfg, vocab_size=261))
    assert small.family == big.family and small.num_params() < 10**6
    assert small.tie_embeddings == big.tie_embeddings and small.qk_layernorm == big.qk_layernorm
    assert small.qkv_bias == big.qkv_bias and small.rope_theta == big.rope_theta
    assert (small.num_query_groups < small.num_attention_heads) == (big.num_query_groups < big.num_attention_heads)
    assert (small.moe is None) == (big.moe is None) and (small.mla is None) == (big.mla is None)
    if big.moe:
        assert small.moe.topk > 1 and small.moe.num_experts % 2 == 0
        assert bool(small.moe.shared_ffn_hidden_size) == bool(big.moe.shared_ffn_hidden_size)
        assert small.moe.score_function == big.moe.score_function
        assert any(small.moe.layer_pattern) and (0 in small.moe.layer_pattern) == (0 in big.moe.layer_pattern)
    if big.mla:
        assert (small.mla.q_lora_rank is None) == (big.mla.q_lora_rank is None)
        assert small.mla.yarn is not None and small.mla.yarn["rotary_scaling_factor"] == 40.0


def _spec(tmp_path, config, megatron=None, **parallel):
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    model = tmp_path / "user-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "t",
        "model": {"path": str(model)},
        "data": {"prompts": "p.jsonl"},
        "train": {"backend": "megatron", "parallel": parallel, "precision": "bf16"},
    }
    if megatron is not None:
        data["train"]["megatron"] = megatron
    return resolve(msgspec.convert(data, Spec), tmp_path)


def test_engine_plan_lists_every_change_and_skips_what_cannot_run(tmp_path):
    from tests.fixtures.spec_helpers import change_list_gaps

    # Moonlight's script as THUDM/slime runs it: DeepEP's flex dispatch and the optimizer offloaded to the host
    gpu_only = {"moe-enable-deepep": True, "moe-token-dispatcher-type": "flex", "recompute-granularity": "full"}
    megatron = {"args": gpu_only, "optimizer_offload": 1.0}
    spec = _spec(tmp_path, QWEN3_30B_A3B, megatron, tensor=4, expert=8, sequence_parallel=True)
    assert skip_reason(spec) is None or "megatron-core" in skip_reason(spec)
    plan = engine_plan(spec, tmp_path / "engine" / "model")
    changed = {path: (before, after) for path, before, after, _ in plan.changes}
    assert changed["train.parallel.tensor"] == (4, 2) and changed["train.parallel.expert"] == (8, 2)
    assert changed["train.precision"] == ("bf16", "fp32")
    assert changed["train.megatron.args.moe-enable-deepep"] == (True, False)
    assert changed["train.megatron.args.moe-token-dispatcher-type"] == ("flex", "alltoall")
    assert changed["train.megatron.optimizer_offload"] == (1.0, 0.0)
    assert plan.spec.train.megatron.args["recompute-granularity"] == "full"  # CPU-capable options are kept
    assert plan.spec.model.path == str(tmp_path / "engine" / "model")
    # exact: every field that differs between the two specs is listed, nothing else
    assert change_list_gaps(spec, plan.spec, list(changed)) == ([], [])
    megatron_line = engine_untested(spec, plan)[1]
    assert "your GPU-only options (args.moe-enable-deepep, args.moe-token-dispatcher-type, optimizer_offload)" in (
        megatron_line
    )
    from msgspec.structs import replace

    elsewhere = replace(spec.model, path=str(tmp_path / "not-here"))
    assert "config.json is not readable here" in skip_reason(replace(spec, model=elsewhere))


# ----------------------------------------------------------------------------- broken cases, one per stage
def test_ep_that_does_not_divide_the_scaled_experts_fails_the_layout_stage():
    from slime.backends.smoke_check import StageFailed, parallel_layout

    odd = {**QWEN3_30B_A3B, "num_experts": 6}  # scaled: 6 experts, num_experts_per_tok 2
    fold = fold_parallel(Parallel(expert=4))
    assert fold.parallel["expert"] == 2
    parallel_layout(scale_config(odd, vocab_size=261), fold.to_json())  # 6 experts over EP 2: fine
    three = {**QWEN3_30B_A3B, "num_experts": 3}
    with pytest.raises(StageFailed, match=r"train\.parallel\.expert.*3.*folded to 2 gloo rank") as exc:
        parallel_layout(scale_config(three, vocab_size=261), fold.to_json())
    assert "expert 4 -> 2" in str(exc.value)


def test_config_the_converter_cannot_take_fails_the_conversion_stage(tmp_path):
    from slime.backends.smoke_check import main

    bad = {**QWEN3_30B_A3B, "num_experts_per_tok": 1}  # norm_topk_prob at k = 1: megatron cannot express it
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "config": bad,
                "tokenizer_sources": [],
                "out": str(tmp_path),
                "world": 1,
                "layout": fold_parallel(Parallel()).to_json(),
                "tolerance": 1e-3,
                "timeout_s": 60,
            }
        )
    )
    assert main([str(request)]) == 1
    stages = {s["stage"]: s for s in json.loads((tmp_path / "engine-check.json").read_text())["stages"]}
    assert [s["status"] for s in stages.values()] == ["passed", "passed", "failed"] + ["not reached"] * 3
    assert "norm_topk_prob=true with num_experts_per_tok=1" in stages["HF -> Megatron conversion"]["detail"]
    assert "tiny model's config.json, scaled from yours" in stages["HF -> Megatron conversion"]["detail"]
    assert "built-in, with the qwen3_moe chat template" in stages["tiny model (your family)"]["detail"]


def test_conversion_log_probs_off_by_more_than_the_tolerance_fail_the_conversion_stage():
    """The other way the converter fails: it takes the config but computes another model (the ranks' record of
    Megatron's log-probs against the HF model's, as ``smoke_rank`` writes it)."""
    from slime.backends.smoke_check import StageFailed, conversion_verdict

    records = [{"conversion_diff": 4.8e-7}, {"conversion_diff": 0.37}]
    with pytest.raises(StageFailed, match=r"differ from the HF model's by 0\.37 \(> 0\.001\).*mishandles"):
        conversion_verdict(records, 1e-3)
    assert conversion_verdict(records[:1], 1e-3).endswith("max diff 4.8e-07 on 1 rank(s)")
    with pytest.raises(StageFailed):  # a NaN (a broken forward) is no pass either
        conversion_verdict([{"conversion_diff": float("nan")}], 1e-3)


def _drop_tensor(src: Path, dst: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        if tensors.pop(name, None) is not None:
            save_file(tensors, f, metadata={"format": "pt"})
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].pop(name, None)
        index.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("config", "dropped"),
    [
        (QWEN3_4B, "model.layers.1.self_attn.k_norm.weight"),
        (QWEN3_30B_A3B, "model.layers.2.mlp.experts.5.up_proj.weight"),
    ],
)
def test_export_that_drops_a_tensor_fails_export_and_reload(tmp_path, config, dropped):
    import torch

    from slime.backends.smoke_check import StageFailed, check_export, engine_reload, sample_batch
    from slime.models.tiny_family import build_family_model

    model = tmp_path / "model"
    build_family_model(config, model)
    batch = sample_batch(model, seed=0)
    assert check_export(model, model).startswith(f"{len(_names(model))} HF tensors")
    _drop_tensor(model, tmp_path / "export", dropped)
    with pytest.raises(StageFailed, match=rf"missing: {dropped.replace('.', '[.]')}"):
        check_export(model, tmp_path / "export")
    dense = "experts" not in dropped  # transformers' fused experts: its loader names no single tensor
    with pytest.raises(StageFailed, match=re.escape(dropped) if dense else "does not load as a qwen3_moe checkpoint"):
        engine_reload(model, tmp_path / "export", batch, batch["engine_logp"], 1e-3)
    # the whole export, but of the weights before a step the trainer took: stale weights fail too
    moved = batch["engine_logp"] - 0.01 * batch["response_mask"]
    with pytest.raises(StageFailed, match="does not carry the trained weights"):
        engine_reload(model, model, batch, moved, 1e-3)
    assert torch.isfinite(batch["advantages"]).all() and (batch["advantages"].abs().sum() > 0)


def _names(model: Path) -> list[str]:
    from safetensors import safe_open

    out = []
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            out += list(h.keys())
    return out


# ----------------------------------------------------------------------------- --fast
def test_fast_keeps_the_tiny_dense_path_and_its_change_list_is_exact(tmp_path, capsys):
    """``smoke --fast`` on a Megatron spec whose engine check could run: the run is the built-in tiny dense
    model on the torch trainer, no engine check is planned (the report says why), the "not tested" list keeps
    its generic model and Megatron lines, and the "changed to fit a CPU" list is exactly what differs."""
    from slime.cli.init_cmd import load_checked
    from slime.cli.smoke import _engine_plan, _print_plan
    from slime.spec.smoke import scale_down
    from tests.fixtures.spec_helpers import change_list_gaps

    model = tmp_path / "Qwen3-30B-A3B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    sets = [f"model.path={model}", "train.parallel.tensor=4", "train.parallel.expert=4"]
    sets += ["train.parallel.sequence_parallel=true", "rollout.gpus_per_engine=4"]  # 30B: 2 GPUs leave no KV
    spec = load_checked(REPO / "specs" / "grpo-multinode.yaml", overrides=sets).tasks[0].spec
    plan = scale_down(spec, rollouts=2, logging_dir=str(tmp_path / "runs"))
    fast, (engine, why) = _engine_plan(plan, spec, tmp_path, fast=True)
    assert fast is plan and engine is None and why == "--fast"
    s = fast.spec
    assert (s.model.builtin, s.model.path, s.train.backend, s.rollout.backend) == ("tiny", None, "torch", "builtin")
    assert fast.untested[0].startswith(f"your model ({model}): its config")
    assert any(u.startswith("Megatron-core training: parallel sizes (tensor 4, expert 4") for u in fast.untested)
    paths = [c.path for c in fast.changes]
    assert change_list_gaps(spec, s, paths) == ([], [])
    assert {"model.path", "train.backend", "train.parallel.tensor", "train.parallel.expert"} <= set(paths)
    _print_plan(fast, (engine, why))
    printed = capsys.readouterr().out
    assert f"changed to fit a CPU smoke run ({len(paths)}):" in printed
    assert "engine check (your model family on your train backend): not run: --fast" in printed
    listed = re.findall(r"^  (\S+): ", printed.split("not tested")[0], flags=re.M)
    assert listed == paths  # the printed list is the plan's, entry for entry
    if skip_reason(spec) is None:  # without --fast the same spec plans the engine check
        full, (engine, why) = _engine_plan(plan, spec, tmp_path, fast=False)
        assert engine is not None and why is None and full.untested[0].startswith(f"your model ({model}) at full")
