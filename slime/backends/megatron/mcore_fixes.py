"""Two defects of megatron-core 0.16.1 when Transformer Engine is not installed, corrected in-process.

Both modules mean "TE is unavailable" and then fail to say so; neither fix changes what
megatron computes, only lets its TE-free path run:

* ``megatron/core/transformer/moe/moe_utils.py``: ``te_general_gemm`` is imported inside
  ``try: import transformer_engine`` and never defined in the ``except``, yet
  ``RouterGatingLinearFunction`` tests ``te_general_gemm is not None`` on every router call —
  every MoE forward raises ``NameError``. We define it as ``None`` (its "no TE" value).
* ``megatron/core/transformer/multi_latent_attention.py``: ``HAVE_TE`` is True whenever TE's
  megatron wrappers import, which they do over a ``MagicMock`` stand-in for ``te``; then
  ``isinstance(linear_proj, TELinear)`` is called with a mock and raises ``TypeError`` while
  building ``MLASelfAttention``. We set that module's ``HAVE_TE`` to False (it only guards
  TE-specific fp8/fp4 tweaks).

Applied only when ``transformer_engine`` cannot be imported; idempotent. The H200 test
machine has no Transformer Engine either, so the backend applies this on GPU too.
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
