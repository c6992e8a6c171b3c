"""``TransformerConfig`` / ``MLATransformerConfig`` from the keyword arguments ``config.py`` computes.

Apart from ``config.py`` because it imports torch and megatron-core: ``config.py`` is also read by
``render`` (the control plane, which must not import them; an import-linter contract checks it).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from slime.backends.megatron.model_check import MegatronConfigError

__all__ = ["build_transformer_config"]


def build_transformer_config(kwargs: Mapping[str, Any]):
    """Instantiate ``TransformerConfig`` or ``MLATransformerConfig`` (imports megatron-core); unknown keys get a
    clear error."""
    import dataclasses

    import torch
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    cls = MLATransformerConfig if kwargs.get("multi_latent_attention") else TransformerConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in kwargs if k not in fields]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, sorted(fields), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise MegatronConfigError(
            [f"train.megatron.args: unknown megatron-core {cls.__name__} option(s) {', '.join(hints)}"]
        )
    resolved = dict(kwargs)
    if resolved.get("activation_func") == "silu":
        resolved["activation_func"] = torch.nn.functional.silu
    for key in ("params_dtype", "pipeline_dtype"):
        if isinstance(resolved.get(key), str):
            resolved[key] = getattr(torch, resolved[key])
    if isinstance(resolved.get("attention_backend"), str):
        resolved["attention_backend"] = AttnBackend[resolved["attention_backend"]]
    return cls(**resolved)
