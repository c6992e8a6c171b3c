"""Context-parallel attention over NCCL on two GPUs: the check of ``tests/fixtures/cp_attention.py``
with CUDA tensors, which exercises the reduce-scatter backward of the K/V all-gather (gloo lacks
reduce-scatter, so the CPU test takes the all-reduce path)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NCCL)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.device_count() < 2,
        reason="needs 2 GPUs: NCCL cannot put two ranks on one GPU",
    ),
]


def test_cp_attention_over_nccl(tmp_path):
    from tests.fixtures.cp_attention import check_cp_attention

    check_cp_attention(tmp_path, "nccl")
