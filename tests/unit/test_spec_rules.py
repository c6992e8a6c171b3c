"""Every cross-field rule (slime/spec/rules.py) and layout rule (slime/layout.py): a failing and a passing case.

Each failing case asserts the field path, words of the message and of the hint,
and the reported file:line:col (found independently by scanning the YAML text);
the matching passing case changes only what the rule is about. A coverage test
makes sure every registered rule has a failing case here.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from slime.spec import rules
from slime.spec.resolve import resolve
from slime.spec.types import Spec
from tests.fixtures.spec_helpers import (
    CPU_SPEC,
    DELETE,
    GPU_SPEC,
    ROOT,
    SPEC_FILE,
    errors_at,
    load,
    position_of,
    problems,
    spec,
    to_yaml,
)

G, C = GPU_SPEC, CPU_SPEC
DS = {"filter": "nonzero_std"}
# Disaggregated on 2 x 8 GPUs: the actor takes 6 GPUs of node 0, so engines start at GPU 6.
_STRADDLE = {
    "train.nodes": 1,
    "train.gpus_per_node": 6,
    "rollout.colocate": False,
    "rollout.gpus": 8,
    "rollout.batch_size": 24,
    "train.global_batch_size": 96,
}

# (id, rule function name, base, failing edits, path, message words, hint words, passing edits)
CASES = [
    ("model-both", "model_source", C, {"model.path": "/m"}, "model", ["exactly one"], ["model.builtin"], {}),
    ("model-neither", "model_source", G, {"model.path": DELETE}, "model", ["exactly one"], ["model.path"], {}),
    (
        "local-nodes",
        "local_launcher",
        C,
        {"cluster.nodes": 2},
        "cluster.nodes",
        ["local launcher", "nodes=2"],
        ["launcher: slurm"],
        {"cluster.nodes": 1},
    ),
    (
        "local-partition",
        "local_launcher",
        C,
        {"cluster.partition": "gpu"},
        "cluster.partition",
        ["SLURM-only"],
        ["remove cluster.partition"],
        {"cluster.launcher": "slurm", "cluster.partition": "gpu"},
    ),
    (
        "local-account",
        "local_launcher",
        C,
        {"cluster.account": "a"},
        "cluster.account",
        ["SLURM-only"],
        ["launcher: slurm"],
        {"cluster.launcher": "slurm", "cluster.account": "a"},
    ),
    (
        "local-exclude",
        "local_launcher",
        C,
        {"cluster.exclude": ["n1"]},
        "cluster.exclude",
        ["SLURM-only"],
        ["launcher: slurm"],
        {"cluster.launcher": "slurm", "cluster.exclude": ["n1"]},
    ),
    (
        "local-container",
        "local_launcher",
        C,
        {"cluster.container": {"image": "img"}},
        "cluster.container",
        ["pyxis"],
        ["launcher: slurm"],
        {"cluster.launcher": "slurm", "cluster.container": {"image": "img"}},
    ),
    (
        "grace-vs-limit",
        "time_limit",
        G,
        {"cluster.time_limit": "2"},
        "cluster.signal_grace_s",
        ["not below the time limit", "120 s"],
        ["raise cluster.time_limit"],
        {"cluster.time_limit": "3"},
    ),
    (
        "zero-limit",
        "time_limit",
        G,
        {"cluster.time_limit": "0:00:00"},
        "cluster.time_limit",
        ["zero"],
        ["04:00:00"],
        {"cluster.time_limit": "0-01"},
    ),
    (
        "env-name",
        "env_and_secrets",
        C,
        {"cluster.env": {"1BAD": "x"}},
        "cluster.env.1BAD",
        ["not a valid environment variable name"],
        ["letters, digits"],
        {"cluster.env": {"GOOD_1": "x"}},
    ),
    (
        "secret-name",
        "env_and_secrets",
        C,
        {"cluster.secrets": {"bad-name": {"env": "X"}}},
        "cluster.secrets.bad-name",
        ["not a valid environment variable name"],
        ["exported"],
        {"cluster.secrets": {"GOOD": {"env": "X"}}},
    ),
    (
        "secret-both",
        "env_and_secrets",
        C,
        {"cluster.secrets": {"K": {"env": "X", "file": "/f"}}},
        "cluster.secrets.K",
        ["exactly one of"],
        ["references"],
        {"cluster.secrets": {"K": {"file": "/f"}}},
    ),
    (
        "secret-none",
        "env_and_secrets",
        C,
        {"cluster.secrets": {"K": {}}},
        "cluster.secrets.K",
        ["exactly one of"],
        ["never put the value"],
        {"cluster.secrets": {"K": {"env": "X"}}},
    ),
    (
        "secret-and-env",
        "env_and_secrets",
        C,
        {"cluster.secrets": {"K": {"env": "X"}}, "cluster.env": {"K": "v"}},
        "cluster.secrets.K",
        ["both a plain env var and a secret"],
        ["keep only the secret"],
        {"cluster.secrets": {"K": {"env": "X"}}, "cluster.env": {"J": "v"}},
    ),
    (
        "megatron-cpu",
        "devices",
        C,
        {"train.backend": "megatron"},
        "train.backend",
        ["needs GPUs"],
        ["train.backend: torch"],
        {"train.backend": "torch"},
    ),
    (
        "sglang-cpu",
        "devices",
        C,
        {"rollout.backend": "sglang"},
        "rollout.backend",
        ["needs GPUs"],
        ["rollout.backend: builtin"],
        {"rollout.backend": "builtin"},
    ),
    (
        "train-gpus-cpu",
        "devices",
        C,
        {"train.gpus_per_node": 2},
        "train.gpus_per_node",
        ["CPU-only cluster"],
        ["train.gpus_per_node: 0"],
        {"train.gpus_per_node": 0},
    ),
    (
        "rollout-gpus-cpu",
        "devices",
        C,
        {"rollout.gpus": 2},
        "rollout.gpus",
        ["CPU-only cluster"],
        ["remove rollout.gpus"],
        {"rollout.gpus": 0},
    ),
    (
        "train-zero-gpus",
        "devices",
        G,
        {"train.gpus_per_node": 0},
        "train.gpus_per_node",
        ["is 0 on a GPU cluster"],
        ["at least one GPU"],
        {"train.gpus_per_node": 8},
    ),
    (
        "sglang-builtin",
        "devices",
        G,
        {"model.path": None, "model.builtin": "tiny", "rollout.max_prompt_len": 16, "rollout.max_response_len": 16},
        "rollout.backend",
        ["serve an HF checkpoint", "model.builtin: tiny"],
        ["set model.path"],
        {"model.path": "/models/qwen"},
    ),
    (
        "rollout-zero-gpus",
        "rollout_gpus",
        G,
        {"rollout.gpus": 0},
        "rollout.gpus",
        ["no rollout engine"],
        ["remove rollout.gpus"],
        {"rollout.gpus": 16},
    ),
    (
        "sglang-context",
        "context_fits_sglang",
        G,
        {"model.max_context_len": 1024},
        "rollout.max_response_len",
        ["exceeds the model's context length 1024", "SGLang would refuse"],
        ["lower max_response_len"],
        {"model.max_context_len": 4096},
    ),
    (
        "backend-args-owned",
        "backend_args",
        G,
        {"train.backend_args": {"tensor-model-parallel-size": 4}},
        "train.backend_args.tensor-model-parallel-size",
        ["decided by train.parallel.tensor"],
        ["set train.parallel.tensor"],
        {"train.backend_args": {"recompute-granularity": "selective"}},
    ),
    (
        "attention-backend-value",
        "megatron_model",
        G,
        {"train.backend_args": {"attention-backend": "flashy"}},
        "train.backend_args.attention-backend",
        ["'flashy' is not one of auto, te, sdpa, local, flash, fused, unfused"],
        ["megatron-core's names"],
        {"train.backend_args": {"attention-backend": "flash"}},
    ),
    (
        "sglang-ep-divides-engine-tp",
        "sglang_expert_parallel",
        G,
        {"rollout.engine_args": {"ep-size": 4}},
        "rollout.engine_args.ep-size",
        ["expert-parallel size 4 does not divide the engine's tensor-parallel size 2"],
        ["divides 2"],
        {"rollout.engine_args": {"ep-size": 2}},
    ),
    (
        "mp-divides",
        "parallel_sizes",
        G,
        {"train.parallel.tensor": 3},
        "train.parallel.tensor",
        ["= 3 does not divide", "16 trainer GPUs"],
        ["product divides"],
        {"train.parallel.tensor": 4},
    ),
    (
        "ep-grid-divides",
        "parallel_sizes",
        G,
        {"train.parallel.expert": 3},
        "train.parallel.expert",
        ["expert_tensor 2 x expert 3 x pipeline 1 = 6 does not divide the 16 trainer GPUs"],
        ["product with pipeline divides"],
        {"train.parallel.expert": 8},
    ),
    (
        "ep-grid-etp",
        "parallel_sizes",
        G,
        {"train.parallel": {"tensor": 2, "expert": 8, "expert_tensor": 4}},
        "train.parallel.expert",
        ["expert_tensor 4 x expert 8 x pipeline 1 = 32 does not divide the 16 trainer GPUs"],
        ["expert_tensor"],
        {"train.parallel": {"tensor": 2, "expert": 8, "expert_tensor": 2}},
    ),
    (
        "torch-mp",
        "parallel_sizes",
        C,
        {"cluster.gpus_per_node": 2, "train.parallel": {"tensor": 2}},
        "train.parallel",
        ["data-parallel only"],
        ["train.backend: megatron"],
        {"cluster.gpus_per_node": 2, "train.parallel": {"tensor": 1}},
    ),
    (
        "torch-ep",
        "parallel_sizes",
        C,
        {"cluster.gpus_per_node": 2, "train.parallel": {"expert": 2}},
        "train.parallel",
        ["data-parallel only", "expert"],
        ["train.backend: megatron"],
        {"cluster.gpus_per_node": 2},
    ),
    (
        "samples-gbs",
        "batch_sizes",
        G,
        {"train.global_batch_size": 96},
        "train.global_batch_size",
        ["= 256 samples is not divisible by global_batch_size 96"],
        ["divides the samples"],
        {"train.global_batch_size": 128},
    ),
    (
        "gbs-steps",
        "batch_sizes",
        G,
        {"train.num_steps_per_rollout": 2},
        "train.global_batch_size",
        ["x num_steps_per_rollout 2 != 256"],
        ["only one of the two"],
        {"train.num_steps_per_rollout": 1},
    ),
    (
        "gbs-mbs-dp",
        "batch_sizes",
        G,
        {"train.global_batch_size": 64, "train.micro_batch_size": 16},
        "train.global_batch_size",
        ["not divisible by micro_batch_size 16 x data-parallel size 8 = 128"],
        ["multiple of 128"],
        {"train.global_batch_size": 128, "train.micro_batch_size": 16},
    ),
    (
        "gbs-dp-dynamic",
        "batch_sizes",
        G,
        {
            "cluster.nodes": 3,
            "train.nodes": 3,
            "train.parallel.tensor": 1,
            "train.global_batch_size": 32,
            "rollout.batch_size": 4,
            "train.dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 4096},
        },
        "train.global_batch_size",
        ["not divisible by data-parallel size 24"],
        ["multiple of 24"],
        {
            "cluster.nodes": 3,
            "train.nodes": 3,
            "train.parallel.tensor": 1,
            "train.global_batch_size": 48,
            "rollout.batch_size": 6,
            "train.dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 4096},
        },
    ),
    (
        "oversampling",
        "batch_sizes",
        G,
        {"rollout.over_sampling_batch_size": 16},
        "rollout.over_sampling_batch_size",
        ["< batch_size 32"],
        ["at least rollout.batch_size"],
        {"rollout.over_sampling_batch_size": 64},
    ),
    (
        "dynamic-tokens",
        "dynamic_batch",
        G,
        {"train.dynamic_batch": {"enabled": True}},
        "train.dynamic_batch.max_tokens_per_gpu",
        ["needs max_tokens_per_gpu"],
        ["max_prompt_len + max_response_len"],
        {"train.dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 4096}},
    ),
    (
        "disagg-needs-gpus",
        "rollout_gpus",
        G,
        {"rollout.colocate": False},
        "rollout.gpus",
        ["disaggregated", "needs rollout.gpus"],
        ["rollout.colocate: true"],
        {"rollout.colocate": False, "rollout.gpus": 4, "train.nodes": 1, "train.parallel.tensor": 2},
    ),
    (
        "gpus-remainder",
        "rollout_gpus",
        G,
        {"rollout.gpus": 7},
        "rollout.gpus",
        ["not divisible by gpus_per_engine 2", "1 GPU(s) would sit idle"],
        ["multiple of 2"],
        {"rollout.gpus": 8},
    ),
    (
        "engine-spans",
        "rollout_gpus",
        G,
        {"rollout.gpus_per_engine": 12, "rollout.gpus": 12},
        "rollout.gpus_per_engine",
        ["larger than a node", "whole nodes"],
        ["multiple of 8"],
        {"rollout.gpus_per_engine": 16, "rollout.gpus": 16},
    ),
    (
        "engines-count",
        "rollout_gpus",
        G,
        {"rollout.num_engines": 3},
        "rollout.num_engines",
        ["num_engines 3 != rollout.gpus 16 / gpus_per_engine 2"],
        ["derived"],
        {"rollout.num_engines": 8},
    ),
    (
        "colocated-fits",
        "layout_fits",
        G,
        {"rollout.gpus": 24},
        "rollout.gpus",
        ["needs 24 GPUs", "colocated", "cluster has 16"],
        ["raise cluster.nodes"],
        {"rollout.gpus": 16},
    ),
    (
        "disagg-fits",
        "layout_fits",
        G,
        {"rollout.colocate": False, "rollout.gpus": 4},
        "rollout.gpus",
        ["needs 20 GPUs", "disaggregated: actor + rollout", "actor = train.nodes 2 x train.gpus_per_node 8 = 16"],
        ["lower train.nodes"],
        {"rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 6, "train.parallel.tensor": 2},
    ),
    (
        "train-gpn-exceeds",
        "layout_fits",
        G,
        {"train.gpus_per_node": 10},
        "train.gpus_per_node",
        ["train.gpus_per_node=10 exceeds cluster.gpus_per_node=8"],
        ["<= 8"],
        {"train.gpus_per_node": 8},
    ),
    (
        "train-nodes-exceed",
        "layout_fits",
        G,
        {"train.nodes": 3},
        "train.nodes",
        ["train.nodes=3 exceeds cluster.nodes=2"],
        ["raise cluster.nodes"],
        {"train.nodes": 2},
    ),
    (
        "engine-straddles",
        "layout_fits",
        G,
        dict(_STRADDLE, **{"rollout.gpus_per_engine": 4}),
        "rollout.gpus_per_engine",
        ["engine 0 (4 GPUs) would straddle nodes [0, 1]", "fit in one node"],
        ["divide cluster.gpus_per_node"],
        dict(_STRADDLE, **{"rollout.gpus_per_engine": 2}),
    ),
    (
        "cpu-train-nodes",
        "layout_fits",
        C,
        {"train.nodes": 2},
        "train.nodes",
        ["train.nodes=2 exceeds cluster.nodes=1"],
        ["raise cluster.nodes"],
        {"train.nodes": 1},
    ),
    (
        "temperature",
        "sampling",
        G,
        {"rollout.temperature": 0.0},
        "rollout.temperature",
        ["must be > 0", "got 0.0"],
        ["greedy decoding is only for eval"],
        {"rollout.temperature": 0.7},
    ),
    (
        "prompt-vs-context",
        "sampling",
        C,
        {"rollout.max_prompt_len": 256},
        "rollout.max_prompt_len",
        ["below the model's context length 256"],
        ["<= 255"],
        {"rollout.max_prompt_len": 255},
    ),
    (
        "rollout-count",
        "sampling",
        G,
        {"rollout.num_rollouts": DELETE},
        "rollout.num_rollouts",
        ["num_rollouts or rollout.epochs"],
        ["num_rollouts: 100"],
        {"rollout.num_rollouts": DELETE, "rollout.epochs": 2},
    ),
    (
        "delta-colocated",
        "sampling",
        G,
        {"rollout.weight_sync": "delta"},
        "rollout.weight_sync",
        ["not for colocated"],
        ["disk when colocated"],
        {"rollout.weight_sync": "disk"},
    ),
    (
        "nccl-colocated",
        "sampling",
        G,
        {"rollout.weight_sync": "nccl"},
        "rollout.weight_sync",
        ["colocated engines share"],
        ["use disk when colocated"],
        {"rollout.weight_sync": "disk"},
    ),
    (
        "router-args",
        "engine_support",
        G,
        {"rollout.router_args": {"policy": "cache_aware"}},
        "rollout.router_args",
        ["straight to the engines", "would do nothing"],
        ["remove rollout.router_args"],
        {},
    ),
    (
        "builtin-gpus-per-engine",
        "engine_support",
        C,
        {"rollout.gpus_per_engine": 2},
        "rollout.gpus_per_engine",
        ["runs on one device", "1 of each engine's 2 GPUs idle"],
        ["gpus_per_engine: 1", "rollout.backend: sglang"],
        {"rollout.gpus_per_engine": 1},
    ),
    (
        "sglang-reserved-engine-arg",
        "engine_args_known",
        G,
        {"rollout.engine_args": {"dp-size": 8}},
        "rollout.engine_args.dp-size",
        ["sets --dp-size itself"],
        ["remove it"],
        {"rollout.engine_args": {"mem-fraction-static": 0.7}},
    ),
    (
        "sglang-reserved-abbreviation",
        "engine_args_known",
        G,
        {"rollout.engine_args": {"base_gpu": 1}},
        "rollout.engine_args.base_gpu",
        ["sets --base-gpu-id itself", "(--base-gpu abbreviates it)"],
        ["remove it"],
        {"rollout.engine_args": {}},
    ),
    (
        "builtin-unknown-engine-arg",
        "engine_args_known",
        C,
        {"rollout.engine_args": {"mem-fraction-static": 0.7}},
        "rollout.engine_args.mem-fraction-static",
        ["not an option of the built-in engine"],
        ["max_running_requests", "rollout.backend: sglang"],
        {"rollout.engine_args": {"max-running-requests": 8}},
    ),
    (
        "delta-builtin",
        "weight_sync_support",
        C,
        {"rollout.weight_sync": "delta"},
        "rollout.weight_sync",
        ["SGLang engines only", "every tensor from disk"],
        ["weight_sync: disk"],
        {"rollout.weight_sync": "disk"},
    ),
    (
        "nccl-pipeline",
        "weight_sync_support",
        G,
        {
            "rollout.colocate": False,
            "rollout.gpus": 8,
            "train.nodes": 1,
            "train.gpus_per_node": 8,
            "train.parallel.pipeline": 2,
            "rollout.weight_sync": "nccl",
        },
        "rollout.weight_sync",
        ["trainer rank 0", "first of 2 pipeline stages"],
        ["weight_sync: disk", "derived"],
        {
            "rollout.colocate": False,
            "rollout.gpus": 8,
            "train.nodes": 1,
            "train.gpus_per_node": 8,
            "train.parallel.pipeline": 2,
        },
    ),
    (
        "kl-needs-ref",
        "algorithm",
        G,
        {"algorithm.kl_coef": 0.01},
        "algorithm.kl_coef",
        ["needs a reference model"],
        ["model.ref_path"],
        {"algorithm.kl_coef": 0.01, "model.ref_path": "initial"},
    ),
    (
        "kl-loss-needs-ref",
        "algorithm",
        G,
        {"algorithm.kl_loss_coef": 0.01},
        "algorithm.kl_loss_coef",
        ["needs a reference model"],
        ["'initial' anchors"],
        {"algorithm.kl_loss_coef": 0.01, "model.ref_path": "/ref"},
    ),
    (
        "kl-exclusive",
        "algorithm",
        G,
        {"algorithm.kl_coef": 0.01, "algorithm.kl_loss_coef": 0.01, "model.ref_path": "initial"},
        "algorithm.kl_loss_coef",
        ["exclusive"],
        ["set one of them to 0"],
        {"algorithm.kl_coef": 0.01, "algorithm.kl_loss_coef": 0.0, "model.ref_path": "initial"},
    ),
    (
        "dual-clip",
        "algorithm",
        G,
        {"algorithm.dual_clip_c": 1.0},
        "algorithm.dual_clip_c",
        ["needs c > 1"],
        ["3.0"],
        {"algorithm.dual_clip_c": 3.0},
    ),
    (
        "tis-and-rollout-logprobs",
        "algorithm",
        G,
        {"algorithm.tis": {"enabled": True}, "algorithm.use_rollout_logprobs": True},
        "algorithm.use_rollout_logprobs",
        ["exclusive", "importance weight would be 1"],
        ["tis.enabled: false"],
        {"algorithm.tis": {"enabled": True}},
    ),
    (
        "tis-clip-order",
        "algorithm",
        G,
        {"algorithm.tis": {"enabled": True, "clip": 1.5, "clip_low": 1.5}},
        "algorithm.tis.clip_low",
        ["clip_low (1.5) must be below algorithm.tis.clip (1.5)"],
        ["clip_low: 0.0"],
        {"algorithm.tis": {"enabled": True, "clip": 1.5, "clip_low": 0.5}},
    ),
    (
        "async-colocated",
        "async_training",
        G,
        {"train.async": True},
        "train.async",
        ["engines need slots", "rollout.colocate is true"],
        ["rollout.colocate: false"],
        {"train.async": True, "rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 6},
    ),
    (
        "async-one-cpu",
        "async_training",
        C,
        {"train.async": True, "cluster.cpus_per_node": 1},
        "train.async",
        ["splits each node's cores", "cluster.cpus_per_node is 1"],
        ["at least 2 CPUs"],
        {"train.async": True, "cluster.cpus_per_node": 2},
    ),
    (
        "critic-grpo",
        "algorithm",
        G,
        {"algorithm.critic": {"lr": 1e-5}},
        "algorithm.critic",
        ["only used by ppo", "not grpo"],
        ["remove algorithm.critic"],
        {"algorithm.critic": {"lr": 1e-5}, "algorithm.estimator": "ppo"},
    ),
    (
        "std-one-sample",
        "algorithm",
        G,
        {"rollout.n_samples_per_prompt": 1, "train.global_batch_size": 32, "algorithm.normalize_std": True},
        "algorithm.normalize_std",
        ["needs n_samples_per_prompt > 1"],
        ["normalize_std: false"],
        {"rollout.n_samples_per_prompt": 1, "train.global_batch_size": 32},
    ),
    (
        "custom-needs-path",
        "reward",
        G,
        {"reward.type": "custom"},
        "reward.custom",
        ["needs reward.custom"],
        ["my_pkg.rewards:score"],
        {"reward.type": "custom", "reward.custom": "pkg.mod:fn"},
    ),
    (
        "custom-needs-type",
        "reward",
        G,
        {"reward.custom": "pkg.mod:fn"},
        "reward.custom",
        ["reward.type is 'exact'"],
        ["type: custom"],
        {"reward.custom": "pkg.mod:fn", "reward.type": "custom"},
    ),
    (
        "remote-needs-url",
        "reward",
        G,
        {"reward.type": "remote"},
        "reward.url",
        ["needs reward.url"],
        ["http://"],
        {"reward.type": "remote", "reward.url": "http://rm:8000/score"},
    ),
    (
        "url-needs-remote",
        "reward",
        G,
        {"reward.url": "http://rm:8000/score"},
        "reward.url",
        ["reward.type is 'exact'"],
        ["type: remote"],
        {"reward.url": "http://rm:8000/score", "reward.type": "remote"},
    ),
    (
        "eval-names",
        "data_sets",
        G,
        {"data.eval": [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]},
        "data.eval[1].name",
        ["also used by data.eval[0]", "collide"],
        ["distinct name"],
        {"data.eval": [{"name": "a", "path": "/x"}, {"name": "b", "path": "/y"}]},
    ),
    (
        "pass-at-k-too-big",
        "data_sets",
        C,
        {"data.eval": [{"name": "h", "path": "h.jsonl", "n_samples_per_prompt": 4, "pass_at_k": [1, 8]}]},
        "data.eval[0].pass_at_k",
        ["pass@8 needs at least 8 samples per prompt", "n_samples_per_prompt is 4"],
        ["n_samples_per_prompt to 8"],
        {"data.eval": [{"name": "h", "path": "h.jsonl", "n_samples_per_prompt": 4, "pass_at_k": [1, 4]}]},
    ),
    (
        "pass-at-k-repeated",
        "data_sets",
        C,
        {"data.eval": [{"name": "h", "path": "h.jsonl", "n_samples_per_prompt": 4, "pass_at_k": [2, 2]}]},
        "data.eval[0].pass_at_k",
        ["repeats a k"],
        ["each k once"],
        {"data.eval": [{"name": "h", "path": "h.jsonl", "n_samples_per_prompt": 4, "pass_at_k": [2]}]},
    ),
    (
        "filter-unknown",
        "data_path",
        C,
        {"rollout.dynamic_sampling": {"filter": "nonzero"}},
        "rollout.dynamic_sampling.filter",
        ["unknown group filter 'nonzero'", "built-in: nonzero_std"],
        ["package.module:function"],
        {"rollout.dynamic_sampling": DS},
    ),
    (
        "filter-one-sample",
        "data_path",
        C,
        {"rollout.dynamic_sampling": DS, "rollout.n_samples_per_prompt": 1, "train.global_batch_size": 4},
        "rollout.dynamic_sampling.filter",
        ["n_samples_per_prompt is 1", "never fill"],
        ["n_samples_per_prompt > 1"],
        {"rollout.dynamic_sampling": DS},
    ),
    (
        "over-sampling-alone",
        "data_path",
        C,
        {"rollout.over_sampling_batch_size": 8},
        "rollout.over_sampling_batch_size",
        ["over_sampling_batch_size 8 > batch_size 4", "thrown away"],
        ["rollout.dynamic_sampling.filter", "rollout.partial: true"],
        {"rollout.over_sampling_batch_size": 8, "rollout.partial": True},
    ),
    (
        "partial-alone",
        "data_path",
        C,
        {"rollout.partial": True},
        "rollout.partial",
        ["nothing is ever aborted"],
        ["over_sampling_batch_size > batch_size"],
        {"rollout.partial": True, "rollout.over_sampling_batch_size": 6},
    ),
    (
        "partial-agent",
        "data_path",
        C,
        {"rollout.partial": True, "rollout.dynamic_sampling": DS, "agent": {"max_turns": 2}},
        "rollout.partial",
        ["not implemented for agent episodes"],
        ["remove rollout.partial"],
        {"rollout.dynamic_sampling": DS, "agent": {"max_turns": 2}},
    ),
    (
        "mask-offpolicy-alone",
        "data_path",
        C,
        {"rollout.partial_mask_offpolicy": True},
        "rollout.partial_mask_offpolicy",
        ["rollout.partial is false"],
        ["rollout.partial: true"],
        {"rollout.partial_mask_offpolicy": True, "rollout.partial": True, "rollout.over_sampling_batch_size": 6},
    ),
    (
        "variable-count-needs-gbs",
        "batch_sizes",
        C,
        {"rollout.dynamic_sampling": DS, "train.global_batch_size": DELETE, "train.num_steps_per_rollout": 3},
        "train.global_batch_size",
        ["samples per rollout vary", "rollout.dynamic_sampling keeps only the groups"],
        ["target samples per optimizer step"],
        {"rollout.dynamic_sampling": DS, "train.global_batch_size": DELETE, "train.num_steps_per_rollout": 2},
    ),
    (
        "train-only-needs-rollouts",
        "debug_modes",
        C,
        {"debug": {"mode": "train_only"}},
        "debug.load_rollouts",
        ["train_only trains on saved rollouts", "not set"],
        ["debug.save_rollouts: true"],
        {"debug": {"mode": "train_only", "load_rollouts": "runs/a/tasks/0/rollouts"}},
    ),
    (
        "load-rollouts-needs-train-only",
        "debug_modes",
        C,
        {"debug": {"load_rollouts": "runs/a/tasks/0/rollouts"}},
        "debug.load_rollouts",
        ["only read in debug.mode train_only", "'normal'"],
        ["debug.mode: train_only"],
        {"debug": {"mode": "train_only", "load_rollouts": "runs/a/tasks/0/rollouts"}},
    ),
    (
        "train-only-evals",
        "debug_modes",
        C,
        {"debug": {"mode": "train_only", "load_rollouts": "r"}, "data.eval": [{"name": "h", "path": "h.jsonl"}]},
        "data.eval",
        ["starts no engines"],
        ["data.eval=[]"],
        {"debug": {"mode": "train_only", "load_rollouts": "r"}},
    ),
    (
        "rollout-only-warmup",
        "debug_modes",
        C,
        {"debug": {"mode": "rollout_only"}, "algorithm.sft_warmup_steps": 10},
        "algorithm.sft_warmup_steps",
        ["rollout_only starts no trainer ranks"],
        ["sft_warmup_steps: 0"],
        {"debug": {"mode": "rollout_only"}},
    ),
    (
        "min-lr",
        "optimizer",
        G,
        {"train.optimizer": {"lr": 1e-6, "min_lr": 1e-5}},
        "train.optimizer.min_lr",
        ["above lr"],
        ["min_lr <= lr"],
        {"train.optimizer": {"lr": 1e-6, "min_lr": 1e-7}},
    ),
    (
        "e2b-key",
        "agent",
        G,
        {"agent": {"sandbox": {"backend": "e2b"}}},
        "agent.sandbox.api_key_secret",
        ["needs an API key"],
        ["cluster.secrets.E2B_API_KEY"],
        {
            "agent": {"sandbox": {"backend": "e2b", "api_key_secret": "E2B_API_KEY"}},
            "cluster.secrets": {"E2B_API_KEY": {"env": "E2B_API_KEY"}},
        },
    ),
    (
        "e2b-unknown-secret",
        "agent",
        G,
        {"agent": {"sandbox": {"backend": "e2b", "api_key_secret": "NOPE"}}},
        "agent.sandbox.api_key_secret",
        ["'NOPE' is not a cluster.secrets entry"],
        ["known secrets: none"],
        {"agent": {"sandbox": {"backend": "local"}}},
    ),
    (
        "e2b-work-mb",
        "agent",
        G,
        {
            "agent": {"sandbox": {"backend": "e2b", "api_key_secret": "K", "work_mb": 64}},
            "cluster.secrets": {"K": {"env": "K"}},
        },
        "agent.sandbox.work_mb",
        ["e2b backend cannot cap /work", "E2B template"],
        ["remove work_mb", "agent.sandbox.image"],
        {"agent": {"sandbox": {"backend": "local", "work_mb": 64}}},
    ),
    (
        "e2b-total-memory",
        "agent",
        G,
        {
            "agent": {"sandbox": {"backend": "e2b", "api_key_secret": "K", "total_memory_mb": 2048}},
            "cluster.secrets": {"K": {"env": "K"}},
        },
        "agent.sandbox.total_memory_mb",
        ["cannot cap a sandbox's total memory"],
        ["--memory-mb"],
        {"agent": {"sandbox": {"backend": "local", "total_memory_mb": 2048}}},
    ),
    (
        "e2b-unisolated",
        "agent",
        G,
        {
            "agent": {"sandbox": {"backend": "e2b", "api_key_secret": "K", "allow_unisolated": True}},
            "cluster.secrets": {"K": {"env": "K"}},
        },
        "agent.sandbox.allow_unisolated",
        ["fallback of the local backend"],
        ["remove allow_unisolated"],
        {"agent": {"sandbox": {"backend": "local", "allow_unisolated": True}}},
    ),
    (
        "local-image",
        "agent",
        G,
        {"agent": {"sandbox": {"backend": "local", "image": "my-template"}}},
        "agent.sandbox.image",
        ["E2B template", "local backend"],
        ["use backend: e2b"],
        {
            "agent": {"sandbox": {"backend": "e2b", "api_key_secret": "K", "image": "my-template"}},
            "cluster.secrets": {"K": {"env": "K"}},
        },
    ),
    (
        "rollouts-and-epochs",
        "rollout_count",
        G,
        {"rollout.epochs": 2},
        "rollout.epochs",
        ["both rollout.num_rollouts (10) and rollout.epochs (2)"],
        ["keep one"],
        {},
    ),
]


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_rule_fails_with_path_message_hint_and_origin(case):
    _, rule_name, base, bad, path, words, hint_words, _ = case
    data = spec(base, **bad)
    text = to_yaml(data)
    found = errors_at(problems(text), path)
    assert found, f"no error at {path}; got: {[p.format() for p in problems(text)]}"
    p = found[0]
    for w in words:
        assert w in p.message, (w, p.message)
    for w in hint_words:
        assert p.hint and w in p.hint, (w, p.hint)
    line, col = position_of(text, path)
    assert p.origin is not None and p.origin.file == SPEC_FILE
    assert (p.origin.line, p.origin.col) == (line, col), (p.format(), line, col)
    assert p.format().startswith(f"{SPEC_FILE}:{line}:{col}: error: {path}: ")


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_rule_passes_when_fixed(case):
    _, _, base, _, path, words, _, good = case
    found = [p for p in errors_at(problems(spec(base, **good)), path) if all(w in p.message for w in words)]
    assert not found, [p.format() for p in found]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_named_rule_reports_it(case):
    """The case exercises the rule it names (so the coverage test below means something)."""
    _, rule_name, base, bad, path, _, _, _ = case
    typed = msgspec.convert(spec(base, **bad), Spec)
    if rule_name in {f.__name__ for f in rules.RAW_RULES}:
        findings = getattr(rules, rule_name)(typed)
    else:
        findings = getattr(rules, rule_name)(resolve(typed, ROOT))
    assert path in [f[0] for f in findings]


def test_every_rule_has_a_failing_case():
    covered = {c[1] for c in CASES} | {"long_responses", "slurm_limits_run_locally", "sequence_parallel_without_tensor"}
    registered = {f.__name__ for f in rules.RULES + rules.WARNINGS + rules.RAW_RULES + rules.RAW_WARNINGS}
    assert registered <= covered, f"rules without a test case: {registered - covered}"


def test_base_specs_are_valid():
    assert problems(G) == []
    assert problems(C) == []


def test_long_responses_is_a_warning_not_an_error():
    loaded = load(spec(C, **{"rollout.max_prompt_len": 200, "rollout.max_response_len": 100}))
    (w,) = [p for p in loaded.warnings if p.path == "rollout.max_response_len"]
    assert w.severity == "warning" and "exceeds the model's context length 256" in w.message
    assert not load(C).warnings


def test_slurm_limits_under_the_local_launcher_are_refused():
    found = problems(spec(C, **{"cluster.time_limit": "01:00:00", "cluster.mem": "1G"}))
    assert {(p.path, p.severity) for p in found} == {("cluster.time_limit", "error"), ("cluster.mem", "error")}
    assert all("local launcher does not apply it" in p.message for p in found)


def test_sequence_parallel_with_tensor_1_is_a_warning_and_resolves_to_false():
    """megatron turns sequence parallelism off at tensor 1 (Megatron-LM's validate_args warns); slime's own
    scripts pass --sequence-parallel at TP 1. A warning at the field, and the resolved spec says false."""
    loaded = load(spec(G, **{"train.parallel": {"tensor": 1, "sequence_parallel": True}}))
    (w,) = [p for p in loaded.warnings if p.path == "train.parallel.sequence_parallel"]
    assert w.severity == "warning" and "megatron turns it off" in w.message and "sequence_parallel: false" in w.message
    assert "train.parallel.tensor > 1" in w.hint
    assert loaded.spec.train.parallel.sequence_parallel is False
    kept = load(spec(G, **{"train.parallel": {"tensor": 2, "sequence_parallel": True}}))
    assert kept.spec.train.parallel.sequence_parallel is True
    assert not [p for p in kept.warnings if p.path == "train.parallel.sequence_parallel"]


def test_expert_grid_is_megatron_cores_not_data_parallel():
    """slime's Qwen3-30B-A3B recipe: 8 GPUs, TP 4, EP 8, expert-tensor 1. The expert grid is
    expert_tensor x expert x pipeline = 8, which divides 8 GPUs (parallel_state.initialize_model_parallel);
    the old rule ("expert divides GPUs / (tensor x pipeline)" = 2) refused it."""
    ok = spec(
        G,
        **{
            "cluster.nodes": 1,
            "train.parallel": {"tensor": 4, "expert": 8, "expert_tensor": 1, "sequence_parallel": True},
            "rollout.gpus_per_engine": 8,
            "train.global_batch_size": 32,
        },
    )
    loaded = load(ok)
    assert loaded.spec.train.parallel.expert_tensor == 1
    derived = load(spec(G, **{"train.parallel": {"tensor": 2}}))
    assert derived.spec.train.parallel.expert_tensor == 2  # derived: = tensor


def _model_dir(tmp_path: Path, **config) -> str:
    """A checkpoint dir holding only a config.json: Qwen2.5-7B's shape (28 heads, 4 KV heads), edited."""
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    base = {
        "model_type": "qwen2",
        "hidden_act": "silu",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "vocab_size": 152064,
    }
    (model / "config.json").write_text(json.dumps({**base, **config}))
    return str(model)


def test_tensor_parallel_must_divide_attention_and_kv_heads(tmp_path: Path):
    """A Qwen2.5-7B-shaped config: 28 heads, 4 key/value heads. Megatron asserts both divide by TP;
    SGLang needs the heads divisible by an engine's TP (KV heads divisible by it, or it by them)."""
    model = _model_dir(tmp_path)
    bad = spec(G, **{"model.path": model, "train.parallel.tensor": 8, "rollout.gpus_per_engine": 8})
    found = problems(bad)
    (t,) = errors_at(found, "train.parallel.tensor")
    assert "does not divide the model's 28 attention heads and 4 key/value heads" in t.message
    assert "divides 28 and 4" in t.hint
    (e,) = errors_at(found, "rollout.gpus_per_engine")
    assert "28 attention heads / 4 key/value heads" in e.message
    ok = spec(G, **{"model.path": model, "train.parallel.tensor": 4, "rollout.gpus_per_engine": 4})
    assert not errors_at(problems(ok), "train.parallel.tensor") and not errors_at(
        problems(ok), "rollout.gpus_per_engine"
    )
    # TP 2 engines on a 1-KV-head model: SGLang replicates the KV head (TP divisible by the KV heads)
    model = _model_dir(tmp_path, num_key_value_heads=1)
    assert not errors_at(
        problems(spec(G, **{"model.path": model, "train.parallel.tensor": 1})), "rollout.gpus_per_engine"
    )


@pytest.mark.parametrize(
    "edits",
    [
        {"rollout.dynamic_sampling": DS},
        {"rollout.partial": True, "rollout.over_sampling_batch_size": 6},
        {"agent": {"max_turns": 2}},
        {"debug": {"mode": "train_only", "load_rollouts": "r"}},
    ],
)
def test_a_variable_sample_count_lifts_the_divisibility_rule(edits):
    # 16 samples per rollout: a global batch of 12 neither divides them nor is a multiple of micro_batch_size 8
    odd = {"train.global_batch_size": 12, "train.micro_batch_size": 8}
    assert errors_at(problems(spec(C, **odd)), "train.global_batch_size")
    assert not errors_at(problems(spec(C, **odd, **edits)), "train.global_batch_size")
    typed = resolve(msgspec.convert(spec(C, **odd, **edits), Spec), ROOT)
    assert typed.train.num_steps_per_rollout == 1  # nominal: round(16 / 12)


def test_over_sampling_is_reported_beside_a_batch_size_error():
    found = problems(spec(G, **{"train.global_batch_size": 100, "rollout.over_sampling_batch_size": 8}))
    assert errors_at(found, "train.global_batch_size") and errors_at(found, "rollout.over_sampling_batch_size")


def test_pipeline_must_divide_model_layers(tmp_path: Path):
    model = _model_dir(tmp_path, num_hidden_layers=6, max_position_embeddings=4096)
    bad = spec(G, **{"model.path": model, "train.parallel": {"tensor": 2, "pipeline": 4}})
    (p,) = errors_at(problems(bad), "train.parallel.pipeline")
    assert (
        "train.parallel.pipeline=4 does not divide the model's 6 layers" in p.message and "num_hidden_layers" in p.hint
    )
    assert not errors_at(problems(spec(bad, **{"train.parallel.pipeline": 2})), "train.parallel.pipeline")
    # The context length comes from config.json: max_prompt_len must stay below it.
    long = spec(G, **{"model.path": model, "rollout.max_prompt_len": 4096})
    (p,) = errors_at(problems(long), "rollout.max_prompt_len")
    assert "context length 4096" in p.message


def test_check_paths_requires_local_files(tmp_path: Path):
    data = spec(C, **{"data.prompts": "train.jsonl", "data.eval": [{"name": "h", "path": "held.jsonl"}]})
    found = problems(data, base_dir=tmp_path, check_paths=True)
    assert {p.path for p in found} == {"data.prompts", "data.eval[0].path"}
    assert all(str(tmp_path) in p.message and "relative to the spec file" in p.hint for p in found)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    (tmp_path / "held.jsonl").write_text('{"prompt": "1+2", "label": "3"}\n')
    assert problems(data, base_dir=tmp_path, check_paths=True) == []
    missing_model = spec(G, **{"model.path": str(tmp_path / "nope")})
    (p,) = errors_at(problems(missing_model, check_paths=True), "model.path")
    assert "checkpoint directory not found" in p.message
    assert problems(missing_model) == []  # without check_paths nothing is read


def test_rule_problems_are_all_reported_together():
    """Five independent rule mistakes in one spec: five problems, one SpecError."""
    bad = spec(
        G,
        **{
            "rollout.temperature": 0.0,
            "algorithm.dual_clip_c": 0.5,
            "reward.type": "remote",
            "train.optimizer": {"lr": 1e-6, "min_lr": 1e-3},
            "train.parallel.expert": 3,
            "train.parallel.tensor": 1,
        },
    )
    found = problems(bad)
    assert {p.path for p in found} == {
        "rollout.temperature",
        "algorithm.dual_clip_c",
        "reward.url",
        "train.optimizer.min_lr",
        "train.parallel.expert",
    }
