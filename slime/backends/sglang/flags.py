"""Which ``rollout.sglang.args`` keys SGLang takes: one table for ``validate`` and the launch.

A server flag of the pinned SGLang (``server_args.json``, written by ``gen_server_args``), written in
full, except the ones slime-submit sets itself from the spec and the layout (:data:`SGLANG_RESERVED`),
nor an abbreviation of one (SGLang's argparse expands unambiguous prefixes, so ``base-gpu`` would set
``--base-gpu-id``). Torch-free: the spec's rules import it.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path

__all__ = [
    "EP_FLAGS",
    "PP_FLAGS",
    "SGLANG_RESERVED",
    "engine_pp",
    "engine_tp",
    "normalize_flag",
    "server_flags",
    "sglang_reserved",
    "unknown_flag",
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
    # prefill/decode roles, their transfer and bootstrap ports come from rollout.sglang.pd and the layout
    "disaggregation-mode",
    "disaggregation-bootstrap-port",
    "disaggregation-transfer-backend",
    "disaggregation-ib-device",
)

# The spec field that decides a reserved flag, where one does (the hint of a refusal names it).
_FIELD_OF = {
    "enable-deterministic-inference": "rollout.deterministic: true",
    "tokenizer-path": "model.tokenizer",
    "api-key": "SLIME_JOB_AUTH (the job's own secret; docs/security.md)",
    "config": "rollout.sglang.args (one key per flag)",
    "disaggregation-mode": "rollout.sglang.pd",
    "disaggregation-bootstrap-port": "rollout.sglang.pd",
    "disaggregation-transfer-backend": "rollout.sglang.pd.transfer",
    "disaggregation-ib-device": "rollout.sglang.pd.ib_device",
}


def reserved_hint(flag: str) -> str:
    """What to change instead of passing the reserved ``flag`` in rollout.sglang.args."""
    return _FIELD_OF.get(flag, "rollout.gpus_per_engine / model.path")


# --ep-size and its aliases in the pinned SGLang 0.5.23 (arg_groups/fields/parallel.py)
EP_FLAGS = ("ep-size", "expert-parallel-size", "ep")
# --pp-size and its alias: an engine of rollout.gpus_per_engine GPUs runs tp = gpus_per_engine / pp
PP_FLAGS = ("pp-size", "pipeline-parallel-size")


def normalize_flag(key: str) -> str:
    """``'--tp_size'`` -> ``'tp-size'``: how SGLang's argparse reads a key written in rollout.sglang.args."""
    return key.strip().lstrip("-").replace("_", "-")


def sglang_reserved(key: str) -> str | None:
    """The reserved flag ``key`` sets (itself or by abbreviation), or None."""
    norm = normalize_flag(key)
    return next((r for r in SGLANG_RESERVED if norm and r.startswith(norm)), None)


@cache
def server_flags() -> tuple[str, frozenset[str]]:
    """(the pinned SGLang version, its launch_server flags without dashes) from ``server_args.json``."""
    table = json.loads(Path(__file__).with_name("server_args.json").read_text())
    return table["sglang"], frozenset(table["flags"])


def unknown_flag(key: str) -> tuple[str, str] | None:
    """(message, hint) when ``key`` is not a flag of the pinned SGLang written in full, else None.

    An abbreviation is refused even where SGLang's argparse would expand it: a later flag with the same
    prefix makes it ambiguous (0.5.23 split --cuda-graph-max-bs into -decode and -prefill).
    """
    version, flags = server_flags()
    norm = normalize_flag(key)
    if norm in flags:
        return None
    expands = sorted(f for f in flags if norm and f.startswith(norm))
    also = f" (--{norm} abbreviates {', '.join('--' + f for f in expands)})" if expands else ""
    if norm.startswith("sglang-") and norm[len("sglang-") :] in flags:
        close = [norm[len("sglang-") :]]
        also = " (slime's --sglang-<flag> spelling: SGLang's own flags have no sglang- prefix)"
    else:
        close = expands[:3] or difflib.get_close_matches(norm, sorted(flags), n=3)
    mean = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"'{key}' is not a server flag of SGLang {version}{also}{mean}",
        f"write the full flag: {' or '.join(close)}" if close else "see python -m sglang.launch_server --help",
    )


def engine_pp(args) -> tuple[str, object] | None:
    """(key, value) of the pipeline-parallel size in ``rollout.sglang.args``, or None (1)."""
    return next(((k, v) for k, v in args.items() if normalize_flag(k) in PP_FLAGS), None)


def engine_tp(gpus_per_engine: int, args) -> int | None:
    """An engine's tensor-parallel size: gpus_per_engine / pp-size; None for a pp-size that does not divide it."""
    pp = (engine_pp(args) or ("", 1))[1]
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1 or gpus_per_engine % pp:
        return None
    return gpus_per_engine // pp
