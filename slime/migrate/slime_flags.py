"""What THUDM/slime's ``train.py`` flags mean in a slime/v1 spec: the tables ``slime.migrate.importer`` uses.

Facts about slime's argument parser (commit 624b824; the flag list itself is ``slime_flags.json``):
which field each flag sets, which Megatron architecture flags config.json implies, which flags are
refused (they change what is trained; with the reason and replacement) and which are droppable (speed,
memory, logging only), and slime's defaults where they differ from slime/v2's. Megatron and SGLang
flags not listed here pass through only when the pinned engine tables have them.
"""

from __future__ import annotations

__all__ = [
    "ARCHITECTURE",
    "ARCH_CONFIG",
    "BOXED_RM_TYPES",
    "DATA_PATH_FLAGS",
    "DIRECT",
    "DROPPABLE",
    "MEGATRON_DROPPABLE",
    "MEGATRON_REFUSED",
    "MEGATRON_RENAMED",
    "OPD_FLAGS",
    "OPTIMIZER_OFFLOAD_FLAGS",
    "PD_TRANSFER_FLAGS",
    "PP_SIZE_FLAGS",
    "REFUSED",
    "RM_TYPES",
    "RM_TYPES_REFUSED",
    "SFT_FLAGS",
    "SFT_REASON",
    "SLIME_DEFAULTS",
    "SLIME_ONLY",
    "SPECIAL",
    "SPECIAL_FIELDS",
    "slime_only_reason",
]

# flag -> (spec path, kind); kind: int | float | str | bool (a switch) | list (several values)
DIRECT: dict[str, tuple[str, str]] = {
    "--hf-checkpoint": ("model.path", "str"),
    "--rollout-external-engine-addrs": ("rollout.external", "list"),
    "--rollout-max-context-len": ("model.max_context_len", "int"),
    "--actor-num-nodes": ("train.nodes", "int"),
    "--actor-num-gpus-per-node": ("train.gpus_per_node", "int"),
    "--num-gpus-per-node": ("cluster.gpus_per_node", "int"),
    "--rollout-num-gpus": ("rollout.gpus", "int"),
    "--rollout-num-gpus-per-engine": ("rollout.gpus_per_engine", "int"),
    "--prefill-num-servers": ("rollout.sglang.pd.prefill_engines", "int"),
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
    "--lr-warmup-fraction": ("train.optimizer.warmup_fraction", "float"),
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
# slime's on-policy distillation flags, mapped together to algorithm.opd.
OPD_FLAGS = ("--use-opd", "--opd-type", "--opd-kl-coef", "--opd-teacher-load")

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
            "--num-critic-only-steps",
            *OPD_FLAGS,
        }
    )
    | DATA_PATH_FLAGS
)

# The field each SPECIAL flag (and the pipeline-size pair) sets, for the flag table's reference.
SPECIAL_FIELDS: dict[str, str] = {
    "--num-critic-only-steps": "algorithm.critic.warmup_rollouts",
    **dict.fromkeys(OPD_FLAGS, "algorithm.opd"),
    "--use-kl-loss": "algorithm.kl_loss_coef",
    "--kl-loss-coef": "algorithm.kl_loss_coef",
    "--adam-beta1": "train.optimizer.betas",
    "--adam-beta2": "train.optimizer.betas",
    "--lr-decay-style": "train.optimizer.lr_schedule",
    "--optimizer": "train.optimizer.name",
    "--load": "train.checkpoint",
    "--ref-load": "model",
    "--save-hf": "train.checkpoint.save_hf",
    "--rm-type": "reward.type",
    "--custom-rm-path": "reward.custom",
    "--eval-prompt-data": "data.eval",
    "--eval-interval": "data.eval",
    "--n-samples-per-eval-prompt": "data.eval",
    "--eval-temperature": "data.eval",
    "--eval-max-response-len": "data.eval",
    "--eval-top-p": "data.eval",
    "--eval-top-k": "data.eval",
    "--log-passrate": "data.eval",
    "--use-wandb": "logging.wandb.mode",
    "--wandb-mode": "logging.wandb.mode",
    "--wandb-key": "cluster.secrets.WANDB_API_KEY",
    "--train-backend": "train.backend",
    "--bf16": "train.precision",
    "--fp16": "train.precision",
    "--update-weight-mode": "rollout.weight_sync",
    "--update-weight-transport": "rollout.weight_sync",
    "--train-env-vars": "cluster.env",
    "--disable-grpo-std-normalization": "algorithm.normalize_std",
    "--calculate-per-token-loss": "algorithm.loss_agg",
    "--reward-key": "reward.key",
    "--loss-type": "algorithm.estimator",
    "--dynamic-sampling-filter-path": "rollout.dynamic_sampling.filter",
    "--debug-rollout-only": "debug.mode",
    "--debug-train-only": "debug.mode",
    "--save-debug-rollout-data": "debug.save_rollouts",
    "--load-debug-rollout-data": "debug.load_rollouts",
    "--sglang-pp-size": "rollout.sglang.args.pp-size",
    "--sglang-pipeline-parallel-size": "rollout.sglang.args.pp-size",
}

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

# slime's own flags that change nothing the job learns: speed, memory, logging, evaluation or plumbing
# slime-submit does itself. The import drops each with this note (exit 0).
DROPPABLE: dict[str, str] = {
    "--sglang-router-ip": "slime-submit's rollout manager reaches the engines itself (no router address to give)",
    "--sglang-router-port": "slime-submit's rollout manager reaches the engines itself (no router address to give)",
    "--sglang-router-request-timeout-secs": "a request timeout of slime's router client (speed/robustness only)",
    "--sglang-server-concurrency": "slime's client-side request concurrency (speed only)",
    "--distributed-backend": "the megatron backend uses NCCL on GPUs (slime's default too)",
    "--distributed-timeout-minutes": "a collective timeout (robustness only)",
    "--accumulate-allreduce-grads-in-fp32": "the megatron backend always reduces gradients in fp32 "
    "(DistributedDataParallelConfig grad_reduce_in_fp32)",
    "--moe-grouped-gemm": "a speed switch needing Transformer Engine layer specs; the megatron backend runs MoE "
    "experts one by one (SequentialMLP), the same maths",
    "--moe-permute-fusion": "a Transformer Engine kernel (speed only); the megatron backend's MoE runs without it",
    "--moe-router-fusion": "a Transformer Engine kernel (speed only); the megatron backend's MoE runs without it",
    "--balance-data": "token-balanced data-parallel partitioning (speed only) is chosen by the runtime",
    "--balance-by-flops": "FLOP-balanced partitioning (speed only) is chosen by the runtime",
    "--offload": "offloading (memory only) is decided by the runtime (colocated runs offload in turn)",
    "--offload-train": "offloading (memory only) is decided by the runtime (colocated runs offload in turn)",
    "--offload-rollout": "offloading (memory only) is decided by the runtime (colocated runs offload in turn)",
    "--no-offload-train": "offloading (memory only) is decided by the runtime (colocated runs offload in turn)",
    "--no-offload-rollout": "offloading (memory only) is decided by the runtime (colocated runs offload in turn)",
    "--release-train": "releasing the trainer during rollout (memory only) is decided by the runtime",
    "--update-weight-buffer-size": "weight-update buffering (speed/memory only) is chosen by the runtime",
    "--update-weight-disk-dir": "disk weight updates are staged in the run dir",
    "--update-weight-disk-keep-files": "disk weight updates are staged in the run dir and removed after loading",
    "--update-weight-delta-encoding": "the on-disk delta encoding (speed only) is chosen by the runtime",
    "--update-weight-delta-checksum": "a self-check of delta updates (robustness only)",
    "--update-weight-local-checkpoint-dir": "engines reload from the run dir's staged checkpoint",
    "--log-probs-chunk-size": "log-prob chunking (memory only) is chosen by the runtime",
    "--log-probs-max-tokens-per-gpu": "log-prob batches use train.dynamic_batch.max_tokens_per_gpu (memory only)",
    "--recompute-loss-function": "loss recomputation saves memory only",
    "--allgather-cp": "a context-parallel communication pattern (speed only); same maths",
    "--data-pad-size-multiplier": "padding granularity (speed only)",
    "--use-distributed-post": "how rollout requests are posted (speed only)",
    "--rollout-data-transport": "how rollout data reaches the trainer (speed only)",
    "--qwen-gdn-backend": "a kernel choice for linear-attention layers (speed only)",
    "--megatron-deepgemm-forward-layers": "a DeepGEMM kernel choice (speed only)",
    "--megatron-deepgemm-forward-modules": "a DeepGEMM kernel choice (speed only)",
    "--megatron-deepgemm-moe-forward-layers": "a DeepGEMM kernel choice (speed only)",
    "--megatron-deepgemm-moe-forward-modules": "a DeepGEMM kernel choice (speed only)",
    "--async-save": "checkpoints are written by the runtime (speed only)",
    "--no-save-optim": "checkpoints keep the optimizer state so a run resumes exactly (disk only)",
    "--rollout-seed": "slime/v2 seeds sampling from train.seed (different draws, same distribution)",
    "--rollout-health-check-interval": "engine health is watched by the runtime (robustness only)",
    "--rollout-health-check-timeout": "engine health is watched by the runtime (robustness only)",
    "--rollout-health-check-first-wait": "engine health is watched by the runtime (robustness only)",
    "--use-fault-tolerance": "restarts are set by cluster.slurm.max_failures/max_requeues",
    "--fetch-trajectory-retry-times": "request retries (robustness only)",
    "--http-proxy": "engines are reached without a proxy",
    "--check-weight-update-equal": "a self-check of weight updates (debugging only)",
    "--tb-project-name": "TensorBoard files go to the task dir (tasks/<i>/tensorboard), named by the run",
    "--tb-experiment-name": "TensorBoard files go to the task dir (tasks/<i>/tensorboard), named by the run",
    "--wandb-host": "self-hosted W&B: set WANDB_BASE_URL in cluster.env",
    "--wandb-dir": "W&B files go to the run dir (logging.dir)",
    "--wandb-run-id": "each run gets its own W&B run",
    "--disable-wandb-random-suffix": "W&B run names are the run ids (logging only)",
    "--wandb-always-use-train-step": "W&B steps are the trainer's steps (logging only)",
    "--log-multi-turn": "logging only",
    "--log-reward-category": "logging only",
    "--log-correct-samples": "logging only",
    "--get-mismatch-metrics": "logging only",
    "--use-rollout-entropy": "computes the rollout entropy for logging and custom loss masks (none imported)",
    "--dump-details": "debug dumps (logging only); rollouts are saved with debug.save_rollouts",
    "--save-debug-train-data": "debug dumps (logging only)",
    "--memory-snapshot-dir": "memory profiling (logging only)",
    "--memory-snapshot-num-steps": "memory profiling (logging only)",
    "--memory-recorder": "memory profiling (logging only)",
    "--record-memory-history": "memory profiling (logging only)",
    "--profile-target": "profiling (logging only)",
    "--custom-rollout-log-function-path": "a logging hook (logging only); port it by hand",
    "--custom-eval-rollout-log-function-path": "a logging hook (logging only); port it by hand",
    "--skip-eval-before-train": "evaluation only: slime-submit evaluates at eval intervals and the end",
    "--eval-max-prompt-len": "evaluation only: eval sets use rollout.max_prompt_len",
    "--eval-input-key": "evaluation only: eval sets use data.input_key",
    "--eval-label-key": "evaluation only: eval sets use data.label_key",
    "--eval-tool-key": "evaluation only: eval prompts carry no tools",
    "--eval-min-new-tokens": "evaluation only: no minimum response length",
    "--eval-max-context-len": "evaluation only: eval sets use model.max_context_len",
    "--eval-reward-key": "evaluation only: eval sets are scored with reward.type",
    "--eval-config": "evaluation only: list eval sets under data.eval",
    "--eval-function-path": "evaluation only: a custom eval generate function; port it by hand",
    "--ci-test": "slime's CI self-checks (debugging only)",
    "--ci-disable-kl-checker": "slime's CI self-checks (debugging only)",
    "--ci-train-rollout-logprob-abs-diff-threshold": "slime's CI self-checks (debugging only)",
    "--ci-save-grad-norm": "slime's CI self-checks (debugging only)",
    "--ci-load-grad-norm": "slime's CI self-checks (debugging only)",
}

SFT_REASON = _SFT = "SFT jobs: kind SFTJob (supervised fine-tuning is not an RL spec)"
# slime's SFT recipe flags: refused as one SFT job in a script that is one (flagmap.is_sft), mapped otherwise.
SFT_FLAGS = frozenset(
    {
        "--loss-type",
        "--num-epoch",
        "--calculate-per-token-loss",
        "--disable-compute-advantages-and-returns",
        "--debug-train-only",
        "--rollout-function-path",
    }
)
_PLUGIN = "a slime plug-in hook with no slime/v2 field: port it as a slime-submit plug-in by hand"

# slime's own flags that change what is trained and have no slime/v2 field: the import fails (exit 2)
# unless --drop-unmapped. flag -> reason (and the replacement where one exists).
REFUSED: dict[str, str] = {
    "--opd-teacher-ckpt-step": "an iteration of the teacher's Megatron checkpoint; algorithm.opd.teacher is an HF "
    "directory: export that iteration to HF format and give its directory",
    "--disable-compute-advantages-and-returns": _SFT,
    "--sglang-config": "SGLang server groups from a YAML file: write them as rollout.sglang.pd (prefill_engines, "
    "prefill_args, decode_args: engines of one size) by hand; per-engine SGLang flags go in rollout.sglang.args",
    "--rollout-function-path": "custom rollout functions are plug-ins; port it and name it in the spec by hand",
    "--custom-generate-function-path": "custom generate functions are plug-ins (agent.generate takes an agent loop);"
    " port it by hand",
    "--megatron-config-path": "per-role Megatron YAML configs are not in slime/v2; use train.megatron.args",
    "--start-rollout-id": "a resumed run continues from its checkpoint's rollout; a fresh run starts at 0",
    "--update-weights-interval": "engines are updated after every optimizer step (staleness changes training)",
    "--custom-tis-function-path": "custom importance-sampling functions are not in slime/v2; algorithm.tis is "
    "slime's default truncated IS",
    "--keep-old-actor": "slime/v2's async mode recomputes the old log-probs with the trainer's current weights "
    "and corrects the one-step staleness with algorithm.tis",
    "--group-rm": "slime calls the reward on a whole group (args, samples); slime/v2 calls it per sample: "
    "rewrite a group reward function to score one sample",
    "--custom-model-provider-path": _PLUGIN,
    "--only-train-params-name-list": "training a subset of the parameters is not in slime/v2",
    "--freeze-params-name-list": "freezing parameters is not in slime/v2",
    "--freeze-indexer": "freezing the DSA indexer is not in slime/v2",
    "--rollout-skip-special-tokens": "slime/v2 keeps the response text as generated (rewards see it as is)",
    "--rollout-stop-token-ids": "stop token ids are not in slime/v2; use rollout.stop (strings)",
    "--rollout-sample-hook-path": _PLUGIN,
    "--buffer-filter-path": _PLUGIN,
    "--rollout-data-postprocess-path": _PLUGIN,
    "--rollout-sample-filter-path": _PLUGIN,
    "--rollout-all-samples-process-path": _PLUGIN,
    "--custom-reward-post-process-path": _PLUGIN,
    "--custom-convert-samples-to-train-data-path": _PLUGIN,
    "--custom-loss-function-path": _PLUGIN,
    "--custom-advantage-function-path": _PLUGIN,
    "--custom-pg-loss-reducer-function-path": _PLUGIN,
    "--custom-megatron-init-path": _PLUGIN,
    "--custom-megatron-before-log-prob-hook-path": _PLUGIN,
    "--custom-megatron-before-train-step-hook-path": _PLUGIN,
    "--custom-update-weight-post-write-path": _PLUGIN,
    "--custom-config-path": "the arguments of custom plug-in functions, which are ported by hand",
    "--data-source-path": "a custom data source class: data.prompts is a JSONL/Parquet file",
    "--disable-rollout-global-dataset": "rollouts always draw from data.prompts",
    "--apply-chat-template-kwargs": "chat-template arguments are not in slime/v2 (data.apply_chat_template is on/off)",
    "--multimodal-keys": "multimodal prompts are not in slime/v2",
    "--tool-key": "tools in the chat template are not in slime/v2",
    "--rollout-buffer-url": "an external rollout buffer is not in slime/v2",
    "--min-batch-collection-ratio": "an external rollout buffer's partial batches are not in slime/v2",
    "--rollout-task-type": "an external rollout buffer's task types are not in slime/v2",
    "--loss-mask-type": "slime/v2 masks every non-response token; other loss masks are not in slime/v2",
    "--load-forge-rollout-data": "loading slime's saved rollouts: use debug.load_rollouts with slime-submit's",
    "--load-debug-rollout-data-subsample": "subsampling saved rollouts is not in slime/v2",
    "--ref-ckpt-step": "the reference model is the starting weights (model.ref_path: initial) or an HF checkpoint",
    "--ref-update-interval": "a reference model that follows the actor is not in slime/v2",
    "--use-unbiased-kl": "the unbiased KL estimator is not in slime/v2 "
    "(algorithm.kl_loss_type: k1, k2, k3, low_var_kl)",
    "--normalize-advantages": "advantage whitening over the batch is not in slime/v2",
    "--disable-rewards-normalization": "slime/v2's estimators normalise rewards per group (algorithm.normalize_std "
    "turns off the std division only)",
    "--reset-optimizer-states": "resetting the optimizer after each rollout is not in slime/v2",
    "--use-stateless-adam": "a stateless Adam is not in slime/v2",
    "--use-routing-replay": "MoE routing replay is not in slime/v2",
    "--use-rollout-routing-replay": "MoE rollout routing replay is not in slime/v2",
    "--use-opsm": "off-policy sequence masking (OPSM) is not in slime/v2",
    "--opsm-delta": "off-policy sequence masking (OPSM) is not in slime/v2",
    "--mtp-loss-scaling-factor": "multi-token-prediction training is not in slime/v2",
    "--enable-mtp-training": "multi-token-prediction training is not in slime/v2",
}

# The rest of slime's own flags with no slime/v2 field (both kinds above).
SLIME_ONLY = frozenset(DROPPABLE) | frozenset(REFUSED)


def slime_only_reason(flag: str) -> str:
    return DROPPABLE.get(flag) or REFUSED.get(flag) or _PLUGIN


# SGLang's pipeline-parallel size under slime's two names (slime divides an engine's GPUs by it for TP).
# SGLang's PD transfer flags: rollout.sglang.pd fields where --prefill-num-servers makes one (else dropped)
PD_TRANSFER_FLAGS: dict[str, str] = {
    "--sglang-disaggregation-transfer-backend": "rollout.sglang.pd.transfer",
    "--sglang-disaggregation-ib-device": "rollout.sglang.pd.ib_device",
}
PP_SIZE_FLAGS = ("--sglang-pp-size", "--sglang-pipeline-parallel-size")

# Megatron-LM's optimizer offload (a fraction that defaults to 1.0 there) -> train.megatron.optimizer_offload.
OPTIMIZER_OFFLOAD_FLAGS = ("--optimizer-cpu-offload", "--optimizer-offload-fraction")

# Megatron-LM flags whose megatron-core option has another name: flag -> (option, value it stores).
MEGATRON_RENAMED: dict[str, tuple[str, object]] = {"--no-rope-fusion": ("apply-rope-fusion", False)}

# Megatron-LM flags (no megatron-core option) that change only speed, memory or logging: dropped with a note.
MEGATRON_DROPPABLE: dict[str, str] = {
    "--overlap-cpu-optimizer-d2h-h2d": "overlaps host-offloaded optimizer copies (speed only)",
    "--use-precision-aware-optimizer": "an optimizer that keeps its states in the dtypes --exp-avg-dtype etc. name "
    "(fp32 unless given; those are refused): memory/speed only as used here",
    "--decoder-first-pipeline-num-layers": "an uneven pipeline split (layout only, same maths): the megatron "
    "backend splits layers evenly over train.parallel.pipeline and validate says if it cannot",
    "--decoder-last-pipeline-num-layers": "an uneven pipeline split (layout only, same maths): the megatron "
    "backend splits layers evenly over train.parallel.pipeline and validate says if it cannot",
    "--no-check-for-nan-in-loss-and-grad": "a NaN check (robustness only)",
}

# Megatron-LM flags that change what is trained and have no slime/v2 field: flag -> reason and replacement.
MEGATRON_REFUSED: dict[str, str] = {
    "--opd-teacher-ckpt-step": "an iteration of the teacher's Megatron checkpoint; algorithm.opd.teacher is an HF "
    "directory: export that iteration to HF format and give its directory",
    "--exp-avg-dtype": "low-precision optimizer states are not in slime/v2 (Adam keeps fp32 states)",
    "--exp-avg-sq-dtype": "low-precision optimizer states are not in slime/v2 (Adam keeps fp32 states)",
    "--main-params-dtype": "low-precision master weights are not in slime/v2 (fp32)",
}

# Architecture flags with a config.json counterpart: compared with it (the first key config.json has).
ARCH_CONFIG: dict[str, tuple[str, ...]] = {
    "--num-layers": ("num_hidden_layers",),
    "--hidden-size": ("hidden_size",),
    "--ffn-hidden-size": ("intermediate_size",),
    "--num-attention-heads": ("num_attention_heads",),
    "--num-query-groups": ("num_key_value_heads",),
    "--kv-channels": ("head_dim",),
    "--rotary-base": ("rope_theta",),
    "--norm-epsilon": ("rms_norm_eps",),
    "--vocab-size": ("vocab_size",),
    "--max-position-embeddings": ("max_position_embeddings",),
    "--num-experts": ("num_experts", "n_routed_experts", "num_local_experts"),
    "--moe-ffn-hidden-size": ("moe_intermediate_size",),
    "--moe-router-topk": ("num_experts_per_tok",),
    "--moe-shared-expert-intermediate-size": ("shared_expert_intermediate_size",),
    "--moe-router-num-groups": ("n_group",),
    "--moe-router-group-topk": ("topk_group",),
    "--moe-router-topk-scaling-factor": ("routed_scaling_factor",),
    "--q-lora-rank": ("q_lora_rank",),
    "--kv-lora-rank": ("kv_lora_rank",),
    "--qk-head-dim": ("qk_nope_head_dim",),
    "--qk-pos-emb-head-dim": ("qk_rope_head_dim",),
    "--v-head-dim": ("v_head_dim",),
    "--mtp-num-layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
}

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
    "--opd-teacher-ckpt-step": "an iteration of the teacher's Megatron checkpoint; algorithm.opd.teacher is an HF "
    "directory: export that iteration to HF format and give its directory",
    "ifbench": "slime's ifbench clones the IFBench repository when first used and runs its instruction checkers; "
    "slime-submit fetches no code at run time: port it as reward.type: custom",
}
