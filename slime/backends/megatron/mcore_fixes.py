"""Two defects of megatron-core 0.16.1 when Transformer Engine is not installed, corrected in-process.

Neither fix changes what megatron computes; both let its TE-free path run: ``moe_utils``'s
``te_general_gemm`` is defined as ``None`` (otherwise every MoE forward raises ``NameError``), and
``multi_latent_attention``'s ``HAVE_TE`` is set False (a ``MagicMock`` stand-in made it True and
``MLASelfAttention`` raise ``TypeError``). Applied only when ``transformer_engine`` cannot be
imported, on GPU too; idempotent.
"""

from __future__ import annotations

import importlib.util

__all__ = ["apply"]


def apply() -> None:
    """Correct the two defects above (no-op when Transformer Engine is installed)."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.multi_latent_attention as mla

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    mla.HAVE_TE = False
