"""pass@k: the chance that at least one of k samples of a prompt is right, estimated from n ≥ k samples.

For a prompt with ``n`` samples of which ``c`` are correct, the unbiased estimator (Chen et al. 2021,
the one slime logs) is ``1 - C(n-c, k) / C(n, k)``: one minus the chance that k samples drawn without
replacement from the n are all wrong. It is computed as the product ``prod_{i=n-c+1}^{n} (1 - k/i)``,
which never forms the (huge) binomials. A run's pass@k is the mean over its prompts.

Guaranteed: exact for every ``0 <= c <= n`` and ``1 <= k <= n`` (0 when c = 0, 1 when n - c < k);
``pass_at_k(n, c, 1) == c / n``. ``ValueError`` for k outside 1..n or c outside 0..n.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct of ``n`` samples."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples (n = {n})")
    if not 0 <= c <= n:
        raise ValueError(f"{c} correct samples out of {n} is impossible")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(groups: Iterable[tuple[int, int]], k: int) -> float:
    """The mean pass@k over prompts given as ``(n, c)`` pairs (0.0 for none)."""
    values = [pass_at_k(n, c, k) for n, c in groups]
    return sum(values) / len(values) if values else 0.0
