"""The spec's sections as frozen typed objects, before the plug-ins add theirs (``slime.spec.types``).

Every field carries a one-line description (``Meta(description=...)``); the JSON Schema, ``explain``
and the docs' reference are generated from these types by msgspec, so they cannot drift. msgspec
rather than pydantic: it imports fast, its Structs are frozen/kw_only/slotted natively, and it
converts dicts to Structs with the same constraints it puts in the schema. Fields whose default is
``None`` and whose docstring says "derived" are filled in by ``slime.spec.resolve``. Plug-in
sections (``cluster.<launcher>``, ...) subclass ``Section``; plug-in names are plain strings here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

API_VERSION = "slime/v2"
KIND = "RLJob"

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# SLURM --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME_PATTERN = r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$"
MEM_PATTERN = r"^\d+[KMGT]?$"
PLUGIN_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
# A built-in name (a registry key) or a plug-in path.
NAME_OR_PLUGIN_PATTERN = r"^([a-z][a-z0-9_]*|[A-Za-z_][\w.]*:[A-Za-z_][\w.]*)$"
# The built-in group filters (``slime.rl.filters.FILTERS``; a test keeps the two equal).
BUILTIN_FILTERS = ("nonzero_std", "nonzero_std_with_fallback")


def D(description: str, **constraints: Any) -> Meta:
    """A field's one-line docstring plus its constraints."""
    return Meta(description=description, **constraints)


class Section(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every spec section: immutable, keyword-only, unknown keys rejected."""


PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
Prob = Annotated[float, Meta(ge=0.0, le=1.0)]
Scalar = str | int | float | bool | None


# --------------------------------------------------------------------------- cluster
class SecretRef(Section, kw_only=True):
    """Where a secret's value comes from at run time (never the value itself)."""

    env: Annotated[
        Annotated[str, Meta(pattern=ENV_NAME_PATTERN)] | None,
        D("Read the value from this environment variable of the submitting shell/job."),
    ] = None
    file: Annotated[
        Annotated[str, Meta(min_length=1)] | None,
        D("Read the value from this file (first line, stripped) inside the job."),
    ] = None


class Gpu(Section, kw_only=True):
    """The nodes' GPU model: the fit check sizes every role against its memory (``slime-submit fit``)."""

    name: Annotated[
        Annotated[str, Meta(min_length=1)] | None,
        D("GPU model, e.g. H100-80GB, H200-141GB, A100-40GB, L40S (a known name sets memory_gb)."),
    ] = None
    memory_gb: Annotated[
        Annotated[float, Meta(gt=0)] | None, D("Memory of one GPU in GiB (default: the known size of name).")
    ] = None


class Cluster(Section, kw_only=True):
    """Where the job runs and with what resources (the launcher's own settings: ``cluster.<launcher>``)."""

    launcher: Annotated[str, D("The launcher that runs the job (an installed launcher plug-in).")]
    profile: Annotated[
        Annotated[str, Meta(pattern=NAME_PATTERN)] | None,
        D("Cluster profile (clusters.yaml) whose site settings fill what the spec leaves unset (or --cluster)."),
    ] = None
    nodes: Annotated[int, D("Number of nodes to allocate.", ge=1)] = 1
    gpus_per_node: Annotated[int, D("GPUs per node (0 = CPU-only job).", ge=0)] = 0
    gpu: Annotated[Gpu | None, D("The GPU model and its memory (enables the fit check at validate).")] = None
    fake_gpus: Annotated[
        bool,
        D(
            "GPU slots are placeholders without CUDA (a test cluster's fake GRES): trainers and engines run on "
            "CPU; the preflight checks placement but not CUDA."
        ),
    ] = False
    cpus_per_node: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        D("CPUs per node (derived by the launcher: this machine's, or what the scheduler allocates)."),
    ] = None
    env: Annotated[dict[str, str], D("Plain environment variables exported to every node (never secrets).")] = {}
    secrets: Annotated[
        dict[str, SecretRef], D("Secrets by reference: job env var name -> {env: VAR} or {file: PATH}.")
    ] = {}
    network_interface: Annotated[
        str | None, D("Interface whose address Ray and collectives use (default: the one that reaches the head).")
    ] = None
    bootstrap_timeout_s: Annotated[
        float, D("Seconds the Ray head waits for all nodes before failing with the missing ones named.", gt=0)
    ] = 300.0
    stall_timeout_s: Annotated[
        Annotated[float, Meta(ge=0)] | None,
        D(
            "Seconds a phase (engine start, rollout, train step, weight sync, checkpoint save, eval) may go "
            "without progress before the job ends with every process's stacks dumped (exit 124); also the "
            "trainer ranks' collective timeout. Engine start and the first train step get twice it. null: each "
            "phase's default (see the guide); 0: no watchdog."
        ),
    ] = None


# --------------------------------------------------------------------------- model
class Model(Section, kw_only=True):
    """The policy to train (HF-format checkpoint or a built-in tiny model)."""

    path: Annotated[
        Annotated[str, Meta(min_length=1)] | None, D("HF-format checkpoint directory (config.json + weights).")
    ] = None
    builtin: Annotated[
        Literal["tiny", "tiny-agent"] | None,
        D(
            "A built-in model built locally (no download): 'tiny' is a 0.8M-param Qwen2-shaped model; "
            "'tiny-agent' the same at fan-in init scale (learns copies sooner)."
        ),
    ] = None
    ref_path: Annotated[
        str | None, D("Reference model for KL: a checkpoint dir, or 'initial' for the starting policy.")
    ] = None
    critic_path: Annotated[str | None, D("Critic initialisation for PPO (derived: the policy checkpoint).")] = None
    tokenizer: Annotated[str | None, D("Tokenizer directory (derived: the model's).")] = None
    max_context_len: Annotated[
        Annotated[int, Meta(ge=2)] | None,
        D("Longest sequence the model takes (derived: config.json max_position_embeddings)."),
    ] = None


# --------------------------------------------------------------------------- train
class Parallel(Section, kw_only=True):
    """Model-parallel sizes of the trainer; data parallelism fills the rest."""

    tensor: Annotated[int, D("Tensor-parallel size.", ge=1)] = 1
    pipeline: Annotated[int, D("Pipeline-parallel size.", ge=1)] = 1
    context: Annotated[int, D("Context-parallel size.", ge=1)] = 1
    expert: Annotated[int, D("Expert-parallel size (MoE).", ge=1)] = 1
    expert_tensor: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Tensor-parallel size inside each expert (derived: tensor).")
    ] = None
    sequence_parallel: Annotated[
        bool, D("Sequence parallelism over the tensor-parallel group (none at tensor 1: resolved to false).")
    ] = False


class DynamicBatch(Section, kw_only=True):
    """Pack micro-batches by token count instead of sample count."""

    enabled: Annotated[bool, D("Use dynamic micro-batches.")] = False
    max_tokens_per_gpu: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Token budget of one micro-batch per GPU (required when enabled).")
    ] = None


class Optimizer(Section, kw_only=True):
    """Optimizer and learning-rate schedule."""

    name: Annotated[Literal["adam"], D("Optimizer (AdamW; sharded with train.optimizer.distributed).")] = "adam"
    lr: Annotated[float, D("Peak learning rate.", gt=0)] = 1e-6
    min_lr: Annotated[float, D("Final learning rate of the decay.", ge=0)] = 0.0
    lr_schedule: Annotated[Literal["constant", "cosine", "linear"], D("Learning-rate decay after warm-up.")] = (
        "constant"
    )
    warmup_steps: Annotated[int, D("Linear warm-up steps.", ge=0)] = 0
    warmup_fraction: Annotated[
        Annotated[float, Meta(ge=0, lt=1)] | None,
        D(
            "Linear warm-up as a fraction of the run's optimizer steps (slime's --lr-warmup-fraction); "
            "resolved into warmup_steps once the run's length is known."
        ),
    ] = None
    weight_decay: Annotated[float, D("Decoupled weight decay.", ge=0)] = 0.0
    betas: Annotated[tuple[float, float], D("Adam (beta1, beta2).")] = (0.9, 0.98)
    eps: Annotated[float, D("Adam epsilon.", gt=0)] = 1e-8
    clip_grad: Annotated[float, D("Global gradient-norm clip (0 disables).", ge=0)] = 1.0
    distributed: Annotated[
        bool | None,
        D(
            "Shard optimizer state across data-parallel ranks (derived by the train backend; one that cannot shard "
            "keeps a full copy per rank and refuses true)."
        ),
    ] = None


class Checkpoint(Section, kw_only=True):
    """Saving and resuming."""

    dir: Annotated[str | None, D("Checkpoint directory (derived: <run dir>/checkpoints).")] = None
    interval: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Save every N rollouts (the last rollout is always saved).")
    ] = None
    keep: Annotated[int, D("Keep the newest K checkpoints.", ge=1)] = 2
    load: Annotated[str | None, D("Resume from this checkpoint directory (default: the newest in dir, if any).")] = None
    save_hf: Annotated[bool, D("Also write an HF-format copy of the final policy.")] = True


class AsyncTrain(Section, kw_only=True):
    """How generation overlaps training (``train.async`` as a mapping)."""

    mode: Annotated[
        Literal["one_step", "fully"],
        D(
            "one_step: rollout k+1 generates while k trains (= true); fully: the engines generate groups "
            "continuously and each step trains on rollout.batch_size ready ones (slime's fully-async rollout)."
        ),
    ] = "one_step"
    max_staleness: Annotated[
        int,
        D("fully: train on groups at most K weight versions older than the trainer's; older ones are dropped.", ge=1),
    ] = 1
    buffer_groups: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        D("fully: groups generated ahead, ready or in flight (derived: max_staleness x rollout.batch_size)."),
    ] = None


class Train(Section, kw_only=True):
    """The trainer (actor, and critic under PPO)."""

    backend: Annotated[str, D("The train backend (an installed train-backend plug-in).")]
    nodes: Annotated[Annotated[int, Meta(ge=1)] | None, D("Nodes holding trainer ranks (derived: cluster.nodes).")] = (
        None
    )
    gpus_per_node: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        D("GPUs per node for the actor (derived: cluster.gpus_per_node; 0 = one CPU rank per node)."),
    ] = None
    parallel: Annotated[Parallel, D("Tensor/pipeline/context/expert parallel sizes.")] = field(default_factory=Parallel)
    global_batch_size: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        D("Samples per optimizer step (derived: rollout.batch_size x n_samples_per_prompt / num_steps_per_rollout)."),
    ] = None
    num_steps_per_rollout: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Optimizer steps per rollout (derived from global_batch_size, default 1).")
    ] = None
    micro_batch_size: Annotated[int, D("Samples per forward/backward per data-parallel rank.", ge=1)] = 1
    dynamic_batch: Annotated[DynamicBatch, D("Token-count based micro-batching.")] = field(default_factory=DynamicBatch)
    optimizer: Annotated[Optimizer, D("Optimizer and schedule.")] = field(default_factory=Optimizer)
    checkpoint: Annotated[Checkpoint, D("Saving and resuming.")] = field(default_factory=Checkpoint)
    precision: Annotated[Literal["fp32", "bf16", "fp16"], D("Training precision (fp32 on CPU).")] = "fp32"
    seed: Annotated[int, D("Random seed (data order, sampling, init).", ge=0)] = 1234
    async_: Annotated[
        bool | AsyncTrain,
        D(
            "Overlap generation with training (true = one_step: rollout k+1 generates while k trains, slime's "
            "train_async.py; or a mapping, e.g. {mode: fully, max_staleness: 2}); needs engines on their own "
            "slots (rollout.colocate: false; on CPU the node's cores are split between trainer and engines)."
        ),
    ] = field(default=False, name="async")

    @property
    def async_mode(self) -> Literal["off", "one_step", "fully"]:
        """``train.async`` as one word: off, one_step (``true``) or fully."""
        if isinstance(self.async_, AsyncTrain):
            return self.async_.mode
        return "one_step" if self.async_ else "off"


# --------------------------------------------------------------------------- rollout
class DynamicSampling(Section, kw_only=True):
    """DAPO-style dynamic sampling: train only on prompt groups that pass a filter."""

    filter: Annotated[
        str,
        D(
            "Group filter: 'nonzero_std' (drop groups whose rewards are all equal), 'nonzero_std_with_fallback' "
            "(the same, but keep one when no other could replace it) or 'package.module:function' taking the "
            "group's samples (or slime's (args, samples)) and returning keep or (keep, reason).",
            pattern=NAME_OR_PLUGIN_PATTERN,
        ),
    ]
    max_rounds: Annotated[
        int,
        D("Most over-sampling batches drawn per rollout; then the rollout trains on the groups that passed.", ge=1),
    ] = 4


class Rollout(Section, kw_only=True):
    """Generation of samples by inference engines."""

    backend: Annotated[str, D("The rollout engine (an installed rollout-backend plug-in).")]
    colocate: Annotated[bool, D("Engines share the trainer's GPUs (offloaded in turn) instead of their own.")] = False
    gpus: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        D("GPUs for rollout engines (required unless colocated or CPU-only; derived when colocated)."),
    ] = None
    gpus_per_engine: Annotated[
        int, D("GPUs per engine (tensor x pipeline parallel, where the engine has pipeline stages).", ge=1)
    ] = 1
    num_engines: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Engines (derived: gpus / gpus_per_engine; on CPU, default 1).")
    ] = None
    batch_size: Annotated[int, D("Prompts per rollout.", ge=1)] = 16
    n_samples_per_prompt: Annotated[int, D("Responses sampled per prompt (the group size).", ge=1)] = 8
    over_sampling_batch_size: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        D(
            "Prompts drawn per round of generation (derived: batch_size); more than batch_size needs "
            "dynamic_sampling or partial."
        ),
    ] = None
    dynamic_sampling: Annotated[
        DynamicSampling | None,
        D("Keep only the prompt groups that pass a filter, drawing more prompts until batch_size groups pass."),
    ] = None
    partial: Annotated[
        bool,
        D("Partial rollout: abort requests still running once batch_size groups passed; continue them next rollout."),
    ] = False
    partial_mask_offpolicy: Annotated[
        bool, D("With partial rollout: leave the tokens an older policy generated out of the loss.")
    ] = False
    num_rollouts: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        D("Rollouts to run (derived from epochs when not given); 0: only the SFT warm-up, saved as final_model/."),
    ] = None
    epochs: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Passes over the prompt data (alternative to num_rollouts).")
    ] = None
    max_prompt_len: Annotated[int, D("Longest prompt in tokens (longer prompts are skipped and counted).", ge=1)] = 512
    max_response_len: Annotated[int, D("Most new tokens per response.", ge=1)] = 1024
    temperature: Annotated[float, D("Sampling temperature (> 0 for RL).", ge=0)] = 1.0
    top_p: Annotated[float, D("Nucleus sampling mass.", gt=0, le=1)] = 1.0
    top_k: Annotated[int, D("Top-k sampling (-1 = off).", ge=-1)] = -1
    stop: Annotated[tuple[str, ...], D("Stop strings.")] = ()
    deterministic: Annotated[
        bool,
        D(
            "Reproducible sampling from the per-request seeds: engines start in their deterministic mode "
            "(batch-invariant kernels: slower) where they have one; some always are."
        ),
    ] = False
    weight_sync: Annotated[
        Literal["disk", "nccl", "delta"] | None,
        D("How new weights reach engines (derived by the rollout backend: nccl where it can, else disk)."),
    ] = None
    startup_timeout_s: Annotated[float, D("Seconds an engine may take to become healthy.", gt=0)] = 600.0
    external: Annotated[
        tuple[Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")], ...],
        D(
            "host:port of engines the job does not start (slime's --rollout-external-engine-addrs): "
            "rollouts go to them, the layout gives them no slots, the preflight checks each."
        ),
    ] = ()
    external_frozen: Annotated[
        bool, D("The external engines keep their weights: the job never syncs them (else they take each update).")
    ] = False
    external_token_secret: Annotated[
        Annotated[str, Meta(pattern=ENV_NAME_PATTERN)] | None,
        D("The cluster.secrets entry holding the external engines' bearer token (default: none sent)."),
    ] = None


# --------------------------------------------------------------------------- data
class EvalSet(Section, kw_only=True):
    """A held-out prompt set evaluated on an interval."""

    name: Annotated[str, D("Name used in metric keys (eval/<name>/...).", pattern=r"^[A-Za-z0-9_.-]+$")]
    path: Annotated[str, D("JSONL file of prompts and labels.", min_length=1)]
    interval: Annotated[int, D("Evaluate every N rollouts (and at the end).", ge=1)] = 10
    n_samples_per_prompt: Annotated[int, D("Samples per eval prompt.", ge=1)] = 1
    temperature: Annotated[float, D("Eval sampling temperature (0 = greedy).", ge=0)] = 0.0
    max_prompts: Annotated[Annotated[int, Meta(ge=1)] | None, D("Evaluate at most this many prompts.")] = None
    max_response_len: Annotated[
        Annotated[int, Meta(ge=1)] | None, D("Most new tokens per eval response (derived: rollout.max_response_len).")
    ] = None
    top_p: Annotated[
        Annotated[float, Meta(gt=0, le=1)] | None, D("Eval nucleus sampling mass (derived: rollout.top_p).")
    ] = None
    top_k: Annotated[Annotated[int, Meta(ge=-1)] | None, D("Eval top-k, -1 = off (derived: rollout.top_k).")] = None
    pass_at_k: Annotated[
        tuple[PosInt, ...],
        D("Log eval/<name>/pass@k for each k (unbiased estimator; each k <= n_samples_per_prompt)."),
    ] = ()


class Data(Section, kw_only=True):
    """Prompts and evaluation sets."""

    prompts: Annotated[str, D("JSONL file of training prompts.", min_length=1)]
    input_key: Annotated[str, D("JSON key of the prompt text.", min_length=1)] = "prompt"
    label_key: Annotated[str | None, D("JSON key of the label the reward compares to.")] = "label"
    metadata_key: Annotated[str | None, D("JSON key of per-sample metadata passed to plug-ins.")] = None
    apply_chat_template: Annotated[bool, D("Wrap prompts in the tokenizer's chat template.")] = False
    shuffle: Annotated[bool, D("Shuffle prompts each epoch (seeded by train.seed).")] = True
    eval: Annotated[tuple[EvalSet, ...], D("Held-out sets evaluated on intervals.")] = ()


# --------------------------------------------------------------------------- reward
class Reward(Section, kw_only=True):
    """How a response is scored."""

    type: Annotated[str, D("Reward function: an installed reward (remote: reward.url; custom: reward.custom).")] = (
        "exact"
    )
    custom: Annotated[
        Annotated[str, Meta(pattern=PLUGIN_PATTERN)] | None, D("'package.module:function' for type custom.")
    ] = None
    url: Annotated[Annotated[str, Meta(pattern=r"^https?://")] | None, D("Reward server URL for type remote.")] = None
    key: Annotated[
        Annotated[str, Meta(min_length=1)] | None,
        D(
            "For a custom function returning a dict or a remote server replying with a JSON object: the key "
            "holding the reward (slime's --reward-key; default: a number, or a server's 'reward' key)."
        ),
    ] = None
    timeout_s: Annotated[float, D("Per-request timeout for remote rewards.", gt=0)] = 30.0
    max_retries: Annotated[int, D("Retries of transient remote-reward failures.", ge=0)] = 3


# --------------------------------------------------------------------------- algorithm
class Critic(Section, kw_only=True):
    """The PPO critic (it reuses the actor's layout)."""

    lr: Annotated[float, D("Critic learning rate.", gt=0)] = 1e-5
    value_clip: Annotated[float, D("Clip range of the value loss.", gt=0)] = 0.2
    warmup_rollouts: Annotated[
        int,
        D(
            "First rollouts in which only the critic trains; the actor is frozen (slime's --num-critic-only-steps).",
            ge=0,
        ),
    ] = 0


class Tis(Section, kw_only=True):
    """Truncated importance sampling: reweight the policy loss by the trainer/engine probability ratio."""

    enabled: Annotated[
        bool,
        D(
            "Multiply each token's policy loss by clamp(exp(old log-prob - rollout log-prob), clip_low, clip), "
            "correcting engine/trainer mismatch and async staleness (slime's --use-tis)."
        ),
    ] = False
    clip: Annotated[float, D("Upper clamp of the importance weight (slime's --tis-clip).", gt=0)] = 2.0
    clip_low: Annotated[float, D("Lower clamp of the importance weight (slime's --tis-clip-low).", ge=0)] = 0.0


class Opd(Section, kw_only=True):
    """On-policy distillation: a teacher's log-probs on the sampled tokens enter the advantages as a KL penalty."""

    teacher: Annotated[
        str, D("The teacher's HF-format checkpoint directory (same tokenizer as the student).", min_length=1)
    ]
    type: Annotated[
        Literal["engine", "trainer"],
        D(
            "Where teacher log-probs come from (slime's --opd-type): 'trainer' forwards the teacher on the trainer "
            "ranks at the rollout temperature; 'engine' serves it on a second engine of the "
            "rollout backend, on engine 0's slot, that scores each kept sample at rollout time and temperature."
        ),
    ] = "trainer"
    kl_coef: Annotated[
        float,
        D("Each sampled token's advantage is lowered by kl_coef x (student - teacher log-prob) (--opd-kl-coef).", gt=0),
    ] = 1.0


Estimator = Literal["grpo", "ppo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


class Algorithm(Section, kw_only=True):
    """Advantage estimator and loss."""

    estimator: Annotated[Estimator, D("Advantage estimator / policy loss family.")] = "grpo"
    eps_clip: Annotated[float, D("PPO ratio clip (lower side).", gt=0)] = 0.2
    eps_clip_high: Annotated[Annotated[float, Meta(gt=0)] | None, D("Upper-side ratio clip (derived: eps_clip).")] = (
        None
    )
    dual_clip_c: Annotated[float | None, D("Dual-clip constant for negative advantages (> 1).")] = None
    kl_coef: Annotated[float, D("KL penalty folded into the reward (needs a reference model).", ge=0)] = 0.0
    kl_loss_coef: Annotated[float, D("KL term added to the loss (needs a reference model).", ge=0)] = 0.0
    kl_loss_type: Annotated[Literal["k1", "k2", "k3", "low_var_kl"], D("KL estimator for the loss.")] = "low_var_kl"
    entropy_coef: Annotated[float, D("Entropy bonus coefficient.", ge=0)] = 0.0
    normalize_std: Annotated[
        bool | None, D("Divide group advantages by their std (derived: n_samples_per_prompt > 1).")
    ] = None
    gamma: Annotated[float, D("Discount factor (PPO, REINFORCE++).", ge=0, le=1)] = 1.0
    lam: Annotated[float, D("GAE lambda (PPO).", ge=0, le=1)] = field(default=1.0, name="lambda")
    loss_agg: Annotated[
        Literal["token_mean", "seq_mean_token_mean"],
        D(
            "How per-token losses are averaged over an optimizer step: 'token_mean' over every trained token "
            "(slime's --calculate-per-token-loss); 'seq_mean_token_mean' each sample's mean over its trained "
            "tokens, then the mean over samples (slime's default)."
        ),
    ] = "token_mean"
    critic: Annotated[Critic | None, D("Critic settings (derived for PPO).")] = None
    tis: Annotated[Tis, D("Truncated importance sampling against the engine's rollout log-probs.")] = field(
        default_factory=Tis
    )
    use_rollout_logprobs: Annotated[
        bool,
        D(
            "Use the engine's rollout log-probs as the old log-probs of the ratio instead of the trainer's "
            "recomputation (slime's --use-rollout-logprobs; exclusive with tis)."
        ),
    ] = False
    opd: Annotated[Opd | None, D("On-policy distillation from a teacher model (slime's --use-opd).")] = None
    sft_warmup_steps: Annotated[int, D("Supervised warm-up steps on (prompt, label) before RL.", ge=0)] = 0
    sft_warmup_lr: Annotated[float, D("Learning rate of the SFT warm-up.", gt=0)] = 1e-3


# --------------------------------------------------------------------------- agent
class SandboxSpec(Section, kw_only=True):
    """Where agent tools execute."""

    backend: Annotated[
        Literal["local", "e2b"], D("'local' (bubblewrap-isolated subprocess) or 'e2b' (E2B cloud sandbox).")
    ] = "local"
    image: Annotated[str | None, D("Sandbox template/image (e2b template id).")] = None
    timeout_s: Annotated[float, D("Wall-clock limit of one tool execution.", gt=0)] = 10.0
    network: Annotated[bool, D("Allow network access from the sandbox.")] = False
    memory_mb: Annotated[int, D("Address-space limit per tool process, MiB.", ge=16)] = 512
    cpu_time_s: Annotated[int, D("CPU-time limit per tool process, seconds.", ge=1)] = 10
    max_procs: Annotated[int, D("Process-count limit inside the sandbox.", ge=1)] = 64
    max_file_mb: Annotated[int, D("Largest file a tool may write, MiB.", ge=1)] = 16
    work_mb: Annotated[
        PosInt | None, D("Size cap of the sandbox's /work, MiB (local: a tmpfs, default 256; e2b: refused).")
    ] = None
    total_memory_mb: Annotated[
        Annotated[int, Meta(ge=16)] | None,
        D("Memory cap for all of one sandbox's processes together, MiB (local: a cgroup; e2b: refused)."),
    ] = None
    allow_unisolated: Annotated[bool, D("Run without isolation when bubblewrap is unavailable (unsafe).")] = False
    api_key_secret: Annotated[str | None, D("Name of the cluster.secrets entry holding the E2B API key.")] = None


class Agent(Section, kw_only=True):
    """Agentic rollouts: the policy acts through an API in sandboxes."""

    sandbox: Annotated[SandboxSpec, D("Tool execution sandbox.")] = field(default_factory=SandboxSpec)
    adapter: Annotated[Literal["openai", "anthropic"], D("API the agent speaks to the policy.")] = "openai"
    max_turns: Annotated[int, D("Turn cap per session.", ge=1)] = 4
    generate: Annotated[
        Annotated[str, Meta(pattern=PLUGIN_PATTERN)] | None,
        D("'package.module:function' agent loop (default: the built-in tool-calling loop)."),
    ] = None
    tools: Annotated[tuple[str, ...], D("Tools offered to the agent.")] = ("python",)


# --------------------------------------------------------------------------- sweep, logging
class Sweep(Section, kw_only=True):
    """A grid of overrides; each point is one task (a job-array task where the launcher has arrays)."""

    grid: Annotated[
        dict[str, tuple[Any, ...]], D("Dotted field path -> list of values; the tasks are the cross product.")
    ]
    max_parallel: Annotated[Annotated[int, Meta(ge=1)] | None, D("Tasks running at once (array %N).")] = None


class Wandb(Section, kw_only=True):
    """Weights & Biases logging."""

    mode: Annotated[
        Literal["online", "offline", "disabled"], D("'offline' writes locally (default), 'online' syncs.")
    ] = "offline"
    project: Annotated[str, D("W&B project.")] = "slime"
    group: Annotated[str | None, D("W&B group (derived: the spec name).")] = None
    entity: Annotated[str | None, D("W&B entity (team or user).")] = None


class Logging(Section, kw_only=True):
    """Where runs and metrics go."""

    dir: Annotated[
        str, D("Parent directory of run dirs (relative to the spec file's directory unless absolute).", min_length=1)
    ] = "runs"
    wandb: Annotated[Wandb, D("Weights & Biases settings.")] = field(default_factory=Wandb)
    progress: Annotated[bool, D("Show a live progress bar on a terminal.")] = True
    tensorboard: Annotated[
        bool, D("Also write the metrics as TensorBoard event files into the task dir (tasks/<i>/tensorboard).")
    ] = False


# --------------------------------------------------------------------------- debug
class Debug(Section, kw_only=True):
    """Debugging the data path: saved rollouts, generation-only and training-only runs."""

    mode: Annotated[
        Literal["normal", "rollout_only", "train_only"],
        D(
            "'rollout_only': generate and score, no trainer ranks and no weight updates; 'train_only': train on "
            "debug.load_rollouts, no engines."
        ),
    ] = "normal"
    save_rollouts: Annotated[
        bool, D("Write each rollout's trained samples to <task>/rollouts/rollout_<id>.parquet.")
    ] = False
    load_rollouts: Annotated[
        Annotated[str, Meta(min_length=1)] | None,
        D("Saved rollouts train_only trains on: a run's tasks/<i>/rollouts directory."),
    ] = None


# --------------------------------------------------------------------------- top level
class Spec(Section, kw_only=True):
    """An RL post-training job, or a supervised fine-tuning job on chat messages (spec v2)."""

    api_version: Annotated[Literal["slime/v2"], D("Spec version; 'slime/v2' (slime/v1 files are upgraded).")] = field(
        name="apiVersion"
    )
    kind: Annotated[
        Literal["RLJob", "SFTJob"],
        D("'RLJob' (rollouts, rewards, RL loss) or 'SFTJob' (supervised fine-tuning on data.prompts' chat messages)."),
    ]
    name: Annotated[str, D("Job name: lowercase letters, digits and dashes.", pattern=NAME_PATTERN)]
    description: Annotated[str, D("Free-text description (the W&B run's notes).")] = ""
    cluster: Annotated[Cluster, D("Where the job runs and with what resources.")]
    model: Annotated[Model, D("The policy to train.")]
    train: Annotated[Train, D("The trainer.")]
    rollout: Annotated[Rollout, D("Rollout generation.")]
    data: Annotated[Data, D("Prompts and evaluation sets.")]
    reward: Annotated[Reward, D("Reward function.")] = field(default_factory=Reward)
    algorithm: Annotated[Algorithm, D("Advantage estimator and loss.")] = field(default_factory=Algorithm)
    agent: Annotated[Agent | None, D("Agentic rollouts (optional).")] = None
    sweep: Annotated[Sweep | None, D("Grid sweep (optional): one task per point.")] = None
    logging: Annotated[Logging, D("Where runs and metrics go.")] = field(default_factory=Logging)
    debug: Annotated[Debug, D("Saved rollouts and debug modes (rollout only, train only).")] = field(
        default_factory=Debug
    )
