"""Which ``rollout.sglang.args`` keys SGLang takes: one table for ``validate`` and the launch.

Any server flag except the ones slime-submit sets itself from the spec and the layout
(:data:`SGLANG_RESERVED`), nor an abbreviation of one (SGLang's argparse expands unambiguous
prefixes, so ``base-gpu`` would set ``--base-gpu-id``). Torch-free: the spec's rules import it.
"""

from __future__ import annotations

__all__ = [
    "EP_FLAGS",
    "SGLANG_RESERVED",
    "normalize_flag",
    "sglang_reserved",
]

# Set by slime-submit from the spec/layout; a key in rollout.sglang.args would disagree with it.
SGLANG_RESERVED = (
    "model-path",
    "model",
    "tp-size",
    "tensor-parallel-size",
    "base-gpu-id",
    "host",
    "port",
    "nccl-port",
    "nnodes",
    "node-rank",
    "dist-init-addr",
    "nccl-init-addr",
    # one engine per rollout.gpus_per_engine GPUs: these would make it use others
    "dp-size",
    "data-parallel-size",
    "attn-dp-size",
    "attention-data-parallel-size",
    "gpu-id-step",
    "tokenizer-path",  # model.tokenizer: the rollout manager tokenizes with the same one
    "enable-deterministic-inference",  # rollout.deterministic
    "api-key",  # the job's secret (slime.core.auth), given through --config
    "config",
)

# The spec field that decides a reserved flag, where one does (the hint of a refusal names it).
_FIELD_OF = {
    "enable-deterministic-inference": "rollout.deterministic: true",
    "tokenizer-path": "model.tokenizer",
    "api-key": "SLIME_JOB_AUTH (the job's own secret; docs/security.md)",
    "config": "rollout.sglang.args (one key per flag)",
}


def reserved_hint(flag: str) -> str:
    """What to change instead of passing the reserved ``flag`` in rollout.sglang.args."""
    return _FIELD_OF.get(flag, "rollout.gpus_per_engine / model.path")


# --ep-size and its aliases in the pinned SGLang 0.5.23 (arg_groups/fields/parallel.py)
EP_FLAGS = ("ep-size", "expert-parallel-size", "ep")


def normalize_flag(key: str) -> str:
    """``'--tp_size'`` -> ``'tp-size'``: how SGLang's argparse reads a key written in rollout.sglang.args."""
    return key.strip().lstrip("-").replace("_", "-")


def sglang_reserved(key: str) -> str | None:
    """The reserved flag ``key`` sets (itself or by abbreviation), or None."""
    norm = normalize_flag(key)
    return next((r for r in SGLANG_RESERVED if norm and r.startswith(norm)), None)
