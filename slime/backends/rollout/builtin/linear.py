"""``x @ W (+ b) (+ residual)`` for the lean decoder, through oneDNN with pre-packed weights on CPU.

Why oneDNN: torch's fp32 CPU matmul calls MKL, which takes an AVX2 path on AMD CPUs; oneDNN
generates code for the CPU it runs on. The op is private (``mkldnn._linear_pointwise``, what
torch.compile emits), so :func:`onednn_available` self-checks it once and callers fall back to
``torch.matmul``. Below ``min_rows`` rows MKL is used (oneDNN's per-call cost loses there).
Guaranteed: both paths give the same fp32 product up to summation order. Not guaranteed: bitwise
equality between paths or across ``min_rows``, a gain on Intel CPUs. Packed weights are held twice
in RAM: pass ``onednn=False`` for large models.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["MIN_MACS", "Linear", "onednn_available"]

# Multiply-adds per call below which MKL beats oneDNN's fixed per-call cost; set a little under the
# break-even measured on the CI machine (see docs/design-notes.md, Numbers).
MIN_MACS = 600_000


@functools.cache
def _ops():
    """(plain, fused-binary) oneDNN linear overloads, resolved once (the packet lookup has a cost
    per call), or None when missing or numerically wrong here."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        op = torch.ops.mkldnn._linear_pointwise
        plain_op, binary_op = op.default, op.binary
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(40, 24, generator=gen)
        w = torch.randn(16, 24, generator=gen)
        b = torch.randn(16, generator=gen)
        r = torch.randn(40, 16, generator=gen)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        with torch.inference_mode():
            plain = plain_op(x, packed, None, "none", [], "")
            fused = binary_op(x, r, packed, b, "add")
        ref = x @ w.t()
        ok = torch.allclose(plain, ref, atol=1e-4, rtol=1e-5) and torch.allclose(
            fused, ref + b + r, atol=1e-4, rtol=1e-5
        )
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return (plain_op, binary_op) if ok else None


def onednn_available() -> bool:
    """True when the oneDNN linear ops exist here and agree with ``torch.matmul``."""
    return _ops() is not None


class Linear:
    """One projection: ``weight`` is ``[in, out]`` (pre-transposed for ``x @ weight``).

    ``packed=True`` also keeps a oneDNN-packed copy (CPU fp32 only; ignored
    when oneDNN is unavailable), used for inputs of at least ``min_rows`` rows
    (default: the row count where oneDNN starts to win for this shape).
    """

    __slots__ = ("weight", "bias", "packed", "min_rows", "_plain", "_binary")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        packed: bool = False,
        min_rows: int | None = None,
    ) -> None:
        self.weight = weight.contiguous()
        self.bias = None if bias is None else bias.contiguous()
        if min_rows is None:
            macs_per_row = max(1, weight.shape[0] * weight.shape[1])
            min_rows = -(-MIN_MACS // macs_per_row)
        self.min_rows = max(1, int(min_rows))
        self.packed = None
        if packed and weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available():
            self._plain, self._binary = _ops()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous())

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [n, in] -> ``x @ W + b + residual`` [n, out] (a new tensor)."""
        if self.packed is not None and x.shape[0] >= self.min_rows:
            x = x.contiguous()
            if residual is None:
                return self._plain(x, self.packed, self.bias, "none", [], "")
            return self._binary(x, residual.contiguous(), self.packed, self.bias, "add")
        if residual is None:
            return x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)
        out = torch.addmm(residual, x, self.weight)
        return out if self.bias is None else out.add_(self.bias)
