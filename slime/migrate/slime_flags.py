"""What THUDM/slime's ``train.py`` flags mean in a slime/v1 spec: the tables ``slime.migrate.importer`` uses.

Facts about slime's argument parser (``slime/utils/arguments.py``, read at commit
624b824): flag names, whether they take a value, and their defaults where those
differ from slime/v2's. Flags not listed here and not ``--sglang-``/``--router-``
prefixed are Megatron flags that slime passes through; they become
``train.backend_args``. Every slime flag with no slime/v2 field has a reason, so
the importer never drops one silently.
"""

from __future__ import annotations

__all__ = [
    "ARCHITECTURE",
    "BOXED_RM_TYPES",
    "DATA_PATH_FLAGS",
    "DIRECT",
    "RM_TYPES",
    "RM_TYPES_REFUSED",
    "SLIME_DEFAULTS",
    "SLIME_ONLY",
    "SLIME_SGLANG_OWN",
    "SPECIAL",
    "slime_only_reason",
]

# flag -> (spec path, kind); kind: int | float | str | bool (a switch) | list (several values)
DIRECT: dict[str, tuple[str, str]] = {
    "--hf-checkpoint": ("model.path", "str"),
    "--rollout-max-context-len": ("model.max_context_len", "int"),
    "--actor-num-nodes": ("train.nodes", "int"),
    "--actor-num-gpus-per-node": ("train.gpus_per_node", "int"),
    "--num-gpus-per-node": ("cluster.gpus_per_node", "int"),
    "--rollout-num-gpus": ("rollout.gpus", "int"),
    "--rollout-num-gpus-per-engine": ("rollout.gpus_per_engine", "int"),
    "--colocate": ("rollout.colocate", "bool"),
    "--prompt-data": ("data.prompts", "str"),
    "--input-key": ("data.input_key", "str"),
    "--label-key": ("data.label_key", "str"),
    "--metadata-key": ("data.metadata_key", "str"),
    "--apply-chat-template": ("data.apply_chat_template", "bool"),
    "--rollout-shuffle": ("data.shuffle", "bool"),
    "--rollout-batch-size": ("rollout.batch_size", "int"),
    "--n-samples-per-prompt": ("rollout.n_samples_per_prompt", "int"),
    "--over-sampling-batch-size": ("rollout.over_sampling_batch_size", "int"),
    "--partial-rollout": ("rollout.partial", "bool"),
    "--mask-offpolicy-in-partial-rollout": ("rollout.partial_mask_offpolicy", "bool"),
    "--num-rollout": ("rollout.num_rollouts", "int"),
    "--num-epoch": ("rollout.epochs", "int"),
    "--rollout-max-prompt-len": ("rollout.max_prompt_len", "int"),
    "--rollout-max-response-len": ("rollout.max_response_len", "int"),
    "--rollout-temperature": ("rollout.temperature", "float"),
    "--rollout-top-p": ("rollout.top_p", "float"),
    "--rollout-top-k": ("rollout.top_k", "int"),
    "--rollout-stop": ("rollout.stop", "list"),
    "--sglang-enable-deterministic-inference": ("rollout.deterministic", "bool"),
    "--global-batch-size": ("train.global_batch_size", "int"),
    "--num-steps-per-rollout": ("train.num_steps_per_rollout", "int"),
    "--micro-batch-size": ("train.micro_batch_size", "int"),
    "--use-dynamic-batch-size": ("train.dynamic_batch.enabled", "bool"),
    "--max-tokens-per-gpu": ("train.dynamic_batch.max_tokens_per_gpu", "int"),
    "--tensor-model-parallel-size": ("train.parallel.tensor", "int"),
    "--pipeline-model-parallel-size": ("train.parallel.pipeline", "int"),
    "--context-parallel-size": ("train.parallel.context", "int"),
    "--expert-model-parallel-size": ("train.parallel.expert", "int"),
    "--expert-tensor-parallel-size": ("train.parallel.expert_tensor", "int"),
    "--sequence-parallel": ("train.parallel.sequence_parallel", "bool"),
    "--seed": ("train.seed", "int"),
    "--lr": ("train.optimizer.lr", "float"),
    "--min-lr": ("train.optimizer.min_lr", "float"),
    "--lr-warmup-iters": ("train.optimizer.warmup_steps", "int"),
    "--weight-decay": ("train.optimizer.weight_decay", "float"),
    "--adam-eps": ("train.optimizer.eps", "float"),
    "--clip-grad": ("train.optimizer.clip_grad", "float"),
    "--use-distributed-optimizer": ("train.optimizer.distributed", "bool"),
    "--save": ("train.checkpoint.dir", "str"),
    "--save-interval": ("train.checkpoint.interval", "int"),
    "--advantage-estimator": ("algorithm.estimator", "str"),
    "--eps-clip": ("algorithm.eps_clip", "float"),
    "--eps-clip-high": ("algorithm.eps_clip_high", "float"),
    "--eps-clip-c": ("algorithm.dual_clip_c", "float"),
    "--value-clip": ("algorithm.critic.value_clip", "float"),
    "--kl-coef": ("algorithm.kl_coef", "float"),
    "--kl-loss-type": ("algorithm.kl_loss_type", "str"),
    "--entropy-coef": ("algorithm.entropy_coef", "float"),
    "--gamma": ("algorithm.gamma", "float"),
    "--lambd": ("algorithm.lambda", "float"),
    "--rm-url": ("reward.url", "str"),
    "--wandb-project": ("logging.wandb.project", "str"),
    "--wandb-group": ("logging.wandb.group", "str"),
    "--wandb-team": ("logging.wandb.entity", "str"),
    "--use-tis": ("algorithm.tis.enabled", "bool"),
    "--tis-clip": ("algorithm.tis.clip", "float"),
    "--tis-clip-low": ("algorithm.tis.clip_low", "float"),
    "--use-rollout-logprobs": ("algorithm.use_rollout_logprobs", "bool"),
    "--use-tensorboard": ("logging.tensorboard", "bool"),
}

# Mapped by flagmap's data-path helper (rollout.dynamic_sampling, debug.*, eval sampling, pass@k).
DATA_PATH_FLAGS = frozenset(
    {
        "--dynamic-sampling-filter-path",
        "--debug-rollout-only",
        "--debug-train-only",
        "--save-debug-rollout-data",
        "--load-debug-rollout-data",
        "--log-passrate",
        "--eval-max-response-len",
        "--eval-top-p",
        "--eval-top-k",
    }
)

# Flags migrate.py maps with logic of their own (they count as known).
SPECIAL = (
    frozenset(
        {
            "--use-kl-loss",
            "--kl-loss-coef",
            "--adam-beta1",
            "--adam-beta2",
            "--lr-decay-style",
            "--optimizer",
            "--load",
            "--ref-load",
            "--save-hf",
            "--rm-type",
            "--custom-rm-path",
            "--eval-prompt-data",
            "--eval-interval",
            "--n-samples-per-eval-prompt",
            "--eval-temperature",
            "--use-wandb",
            "--wandb-mode",
            "--wandb-key",
            "--train-backend",
            "--bf16",
            "--fp16",
            "--update-weight-mode",
            "--update-weight-transport",
            "--train-env-vars",
            "--disable-grpo-std-normalization",
            "--calculate-per-token-loss",
            "--reward-key",
            "--loss-type",
        }
    )
    | DATA_PATH_FLAGS
)

# Megatron model-architecture flags: model.path's config.json already says all of these.
ARCHITECTURE = frozenset(
    {
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--group-query-attention",
        "--num-query-groups",
        "--kv-channels",
        "--rotary-base",
        "--rotary-percent",
        "--rotary-interleaved",
        "--rotary-scaling-factor",
        "--use-rope-scaling",
        "--normalization",
        "--norm-epsilon",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "--padded-vocab-size",
        "--make-vocab-size-divisible-by",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--add-bias-linear",
        "--use-rotary-position-embeddings",
        "--position-embedding-type",
        "--no-position-embedding",
        "--max-position-embeddings",
        "--seq-length",
        "--qk-layernorm",
        "--apply-layernorm-1p",
        "--use-gated-attention",
        "--attention-output-gate",
        "--num-experts",
        "--moe-ffn-hidden-size",
        "--moe-shared-expert-intermediate-size",
        "--moe-layer-freq",
        "--moe-router-topk",
        "--moe-router-score-function",
        "--moe-router-pre-softmax",
        "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor",
        "--moe-router-num-groups",
        "--moe-router-group-topk",
        "--moe-shared-expert-gate",
        "--multi-latent-attention",
        "--q-lora-rank",
        "--kv-lora-rank",
        "--qk-head-dim",
        "--qk-pos-emb-head-dim",
        "--v-head-dim",
        "--mscale",
        "--mscale-all-dim",
        "--post-self-attn-layernorm",
        "--post-mlp-layernorm",
        "--mtp-num-layers",
        "--tokenizer-type",
        "--tokenizer-model",
        "--use-mcore-models",
        "--model-name",
    }
)

# slime's own --sglang-* flags (not SGLang server flags).
SLIME_SGLANG_OWN = {
    "--sglang-router-ip": "slime-submit starts the router itself",
    "--sglang-router-port": "slime-submit starts the router itself",
    "--sglang-router-request-timeout-secs": "router request timeout is not in slime/v2",
    "--sglang-server-concurrency": "slime's client-side request concurrency is not in slime/v2",
}

_REASONS = {
    # a Megatron-LM flag (no megatron-core TransformerConfig field): the backend's DDP config always sets it
    "--accumulate-allreduce-grads-in-fp32": "the megatron backend always reduces gradients in fp32 "
    "(DistributedDataParallelConfig grad_reduce_in_fp32)",
    # Megatron performance switches that need Transformer Engine layer specs, which the megatron backend
    # does not map for MoE models: its experts run as SequentialMLP (not an accepted-and-ignored setting)
    "--moe-grouped-gemm": "grouped expert GEMM needs Transformer Engine layer specs; the megatron backend runs "
    "MoE experts one by one (SequentialMLP)",
    "--moe-permute-fusion": "a Transformer Engine kernel; the megatron backend's MoE runs without it",
    "--moe-router-fusion": "a Transformer Engine kernel; the megatron backend's MoE runs without it",
    "--balance-data": "token-balanced data-parallel partitioning is not configurable in slime/v2",
    "--balance-by-flops": "FLOP-balanced partitioning is not configurable in slime/v2",
    "--offload": "offloading is decided by the runtime (colocated runs offload in turn)",
    "--offload-train": "offloading is decided by the runtime (colocated runs offload in turn)",
    "--offload-rollout": "offloading is decided by the runtime (colocated runs offload in turn)",
    "--rollout-function-path": "custom rollout functions are plug-ins; port it and name it in the spec by hand",
    "--custom-generate-function-path": "custom generate functions are plug-ins (agent.generate takes an agent loop);"
    " port it by hand",
    "--rollout-seed": "slime/v2 seeds sampling from train.seed",
    "--megatron-config-path": "per-role Megatron YAML configs are not in slime/v2; use train.megatron.args",
    "--start-rollout-id": "a resumed run continues from its checkpoint's rollout",
    "--update-weight-buffer-size": "weight-update buffering is chosen by the runtime",
    "--update-weights-interval": "engines are updated after every optimizer step",
    "--tb-project-name": "TensorBoard files go to the task dir (tasks/<i>/tensorboard), named by the run",
    "--tb-experiment-name": "TensorBoard files go to the task dir (tasks/<i>/tensorboard), named by the run",
    "--custom-tis-function-path": "custom importance-sampling functions are not in slime/v2; algorithm.tis is "
    "slime's default truncated IS",
    "--keep-old-actor": "slime/v2's async mode recomputes the old log-probs with the trainer's current weights "
    "and corrects the one-step staleness with algorithm.tis",
    "--wandb-host": "self-hosted W&B: set WANDB_BASE_URL in cluster.env",
    "--wandb-dir": "W&B files go to the run dir (logging.dir)",
    "--wandb-run-id": "each run gets its own W&B run",
    "--eval-max-prompt-len": "eval sets use rollout.max_prompt_len in slime/v2",
    "--eval-input-key": "eval sets use data.input_key in slime/v2",
    "--eval-label-key": "eval sets use data.label_key in slime/v2",
    "--eval-config": "eval YAML configs are not in slime/v2; list eval sets under data.eval",
    "--use-fault-tolerance": "restarts are set by cluster.slurm.max_failures/max_requeues",
    "--group-rm": "slime calls the reward on a whole group (args, samples); slime/v2 calls it per sample: "
    "rewrite a group reward function to score one sample",
}

# The rest of slime's own flags (names from its parser); none has a slime/v2 field.
SLIME_ONLY = frozenset(_REASONS) | frozenset(
    {
        "--update-weight-disk-dir",
        "--update-weight-disk-keep-files",
        "--update-weight-delta-encoding",
        "--update-weight-delta-checksum",
        "--custom-update-weight-post-write-path",
        "--update-weight-local-checkpoint-dir",
        "--custom-model-provider-path",
        "--recompute-loss-function",
        "--log-probs-chunk-size",
        "--only-train-params-name-list",
        "--freeze-params-name-list",
        "--freeze-indexer",
        "--allgather-cp",
        "--rollout-skip-special-tokens",
        "--rollout-stop-token-ids",
        "--rollout-sample-hook-path",
        "--custom-rollout-log-function-path",
        "--custom-eval-rollout-log-function-path",
        "--buffer-filter-path",
        "--rollout-data-postprocess-path",
        "--rollout-data-transport",
        "--rollout-external-engine-addrs",
        "--rollout-health-check-interval",
        "--rollout-health-check-timeout",
        "--rollout-health-check-first-wait",
        "--disable-rollout-global-dataset",
        "--data-source-path",
        "--apply-chat-template-kwargs",
        "--multimodal-keys",
        "--tool-key",
        "--log-probs-max-tokens-per-gpu",
        "--eval-function-path",
        "--skip-eval-before-train",
        "--eval-tool-key",
        "--eval-min-new-tokens",
        "--eval-max-context-len",
        "--ref-ckpt-step",
        "--async-save",
        "--no-save-optim",
        "--num-critic-only-steps",
        "--custom-loss-function-path",
        "--disable-compute-advantages-and-returns",
        "--custom-advantage-function-path",
        "--use-unbiased-kl",
        "--ref-update-interval",
        "--normalize-advantages",
        "--disable-rewards-normalization",
        "--use-rollout-entropy",
        "--get-mismatch-metrics",
        "--reset-optimizer-states",
        "--use-stateless-adam",
        "--custom-pg-loss-reducer-function-path",
        "--use-routing-replay",
        "--use-rollout-routing-replay",
        "--use-opsm",
        "--opsm-delta",
        "--use-opd",
        "--opd-type",
        "--opd-kl-coef",
        "--opd-teacher-load",
        "--opd-teacher-ckpt-step",
        "--disable-wandb-random-suffix",
        "--wandb-always-use-train-step",
        "--log-multi-turn",
        "--log-reward-category",
        "--log-correct-samples",
        "--load-forge-rollout-data",
        "--load-debug-rollout-data-subsample",
        "--save-debug-train-data",
        "--dump-details",
        "--memory-snapshot-dir",
        "--memory-snapshot-num-steps",
        "--profile-target",
        "--memory-recorder",
        "--record-memory-history",
        "--check-weight-update-equal",
        "--http-proxy",
        "--use-distributed-post",
        "--eval-reward-key",
        "--group-rm",
        "--custom-reward-post-process-path",
        "--custom-convert-samples-to-train-data-path",
        "--rollout-buffer-url",
        "--fetch-trajectory-retry-times",
        "--min-batch-collection-ratio",
        "--rollout-task-type",
        "--loss-mask-type",
        "--data-pad-size-multiplier",
        "--rollout-sample-filter-path",
        "--rollout-all-samples-process-path",
        "--custom-megatron-init-path",
        "--custom-megatron-before-log-prob-hook-path",
        "--custom-megatron-before-train-step-hook-path",
        "--megatron-deepgemm-forward-layers",
        "--megatron-deepgemm-forward-modules",
        "--megatron-deepgemm-moe-forward-layers",
        "--megatron-deepgemm-moe-forward-modules",
        "--mtp-loss-scaling-factor",
        "--enable-mtp-training",
        "--ci-test",
        "--ci-disable-kl-checker",
        "--ci-train-rollout-logprob-abs-diff-threshold",
        "--ci-save-grad-norm",
        "--ci-load-grad-norm",
        "--custom-config-path",
        "--qwen-gdn-backend",
        "--release-train",
    }
)


def slime_only_reason(flag: str) -> str:
    if flag in _REASONS:
        return _REASONS[flag]
    if flag.startswith("--ci-"):
        return "slime's CI self-checks are not in slime/v2"
    if flag.startswith(("--custom-", "--rollout-sample-", "--rollout-all-samples-")) or flag.endswith("-path"):
        return "a slime plug-in hook with no slime/v2 field; port it by hand"
    return "a slime option with no slime/v2 field"


# Where slime's default (flag absent) differs from slime/v2's: written into the spec so the
# imported job behaves as the script did. spec path -> (value, why)
SLIME_DEFAULTS: dict[str, tuple[object, str]] = {
    "data.input_key": ("input", "slime's --input-key default"),
    "data.label_key": (None, "slime's --label-key default (no label)"),
    "data.shuffle": (False, "slime shuffles only with --rollout-shuffle"),
    "rollout.n_samples_per_prompt": (1, "slime's --n-samples-per-prompt default"),
    "algorithm.kl_loss_type": ("k1", "slime's --kl-loss-type default"),
    "algorithm.loss_agg": (
        "seq_mean_token_mean",
        "slime averages each sample's token mean over the step's samples unless --calculate-per-token-loss",
    ),
    "train.optimizer.weight_decay": (0.01, "Megatron's --weight-decay default"),
    "train.nodes": (1, "slime's --actor-num-nodes default"),
    "train.gpus_per_node": (8, "slime's --actor-num-gpus-per-node default"),
    "train.precision": ("bf16", "slime trains in bf16 unless --fp16"),
    "train.backend": ("megatron", "slime trains with Megatron"),
    "rollout.backend": ("sglang", "slime generates with SGLang"),
}


# slime's --rm-type graders (slime/rollout/rm_hub/) -> (slime/v2 reward.type, how slime/v2 scores
# differently; "" = the same rules). The import writes the difference out, so it is never silent.
RM_TYPES: dict[str, tuple[str, str]] = {
    "math": (
        "math",
        "slime's math scores 0 without a \\boxed{} answer and also accepts answers equal only under sympy "
        "simplification; slime/v2's math falls back to the response's last number and compares normalised "
        "strings and exact fractions (a boxed label is unwrapped by both)",
    ),
    "dapo": ("dapo", ""),
    "deepscaler": (
        "deepscaler",
        "the </think> and \\boxed{} rules are slime's, but answers are graded like slime/v2's math (normalised "
        "strings, exact fractions): an answer equal to the label only under sympy simplification scores 0 "
        "here and 1 in slime",
    ),
    "f1": ("f1", ""),
    "gpqa": ("gpqa", ""),
    "random": ("random", ""),
    "remote_rm": ("remote", ""),
}

# boxed_<type>: slime first replaces the response by its last \boxed{} content ("" without one).
BOXED_RM_TYPES: dict[str, tuple[str, str]] = {
    "f1": (
        "f1",
        "slime's boxed_f1 scores only the last \\boxed{} content of the response (0 without one); slime/v2's "
        "f1 scores the whole response, so words around the box lower its precision",
    ),
    "random": ("random", ""),  # the response is not read
    "remote_rm": ("remote", ""),  # remote_rm sends the sample itself: the box changes nothing
}

# slime's graders slime/v2 does not ship, with why (the import names them instead of a generic line)
RM_TYPES_REFUSED: dict[str, str] = {
    "ifbench": "slime's ifbench clones the IFBench repository when first used and runs its instruction checkers; "
    "slime-submit fetches no code at run time: port it as reward.type: custom",
}
