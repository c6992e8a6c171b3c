"""``x @ W (+ b) (+ residual)`` for the lean decoder, through oneDNN with pre-packed weights on CPU.

Why oneDNN: torch's fp32 CPU matmul calls MKL, which on AMD CPUs runs an AVX2
code path; oneDNN generates code for the CPU it runs on (AVX-512 where present).
On the 2-core AMD EPYC (Zen 5) CI machine the tiny model's decode GEMMs
(256 rows) took 2.0-2.2x less CPU time through oneDNN (``tests/bench/engine.py``
shows the end-to-end effect). The op used, ``torch.ops.mkldnn._linear_pointwise``,
is the one torch.compile's CPU weight-freezing pass emits; it is private, so
:func:`onednn_available` probes it once with a numerical self-check, and every
caller falls back to ``torch.matmul`` when it is missing or wrong.

Below ``min_rows`` rows the MKL path is used: oneDNN's fixed per-call cost
(~5-8 us) loses to MKL for small products. By default ``min_rows`` follows from
the weight's shape (rows x in x out >= ``MIN_MACS``).

Guaranteed: both paths compute the same fp32 product up to summation order
(relative differences ~1e-7), the residual and bias are added in fp32.
Not guaranteed: bitwise-equal results between the two paths, or between batch
sizes on either side of ``min_rows``; any speed-up on Intel CPUs (where MKL is
already fast) — the gain was measured on AMD. Memory: a packed projection keeps
the plain weight (for the MKL path below ``min_rows``) beside its packed copy, so
the engine holds its projection weights twice in CPU RAM: negligible for the
small models the built-in engine serves on CPU, a reason to pass ``onednn=False``
for large ones.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["MIN_MACS", "Linear", "onednn_available"]

# Crossover measured on the CI machine (1 thread, thread CPU time): oneDNN breaks even with
# MKL at ~700k multiply-adds per call for [K, N] = [128, 128], [128, 256], [128, 261] and
# [384, 128] (48, 22, 22 and 14 rows), and wins by 1.5-2x at 4x that; [128, 768] already at
# 3 rows.
MIN_MACS = 600_000


@functools.cache
def _ops():
    """(plain, fused-binary) oneDNN linear overloads, resolved once (the packet lookup costs ~1 us
    a call), or None when missing or numerically wrong here."""
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
