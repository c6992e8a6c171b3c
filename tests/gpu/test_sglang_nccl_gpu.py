"""NCCL weight sync between a trainer GPU and two (fake) engine GPUs: the protocol of
``tests/fixtures/weight_sync_protocol.py`` with ``backend="nccl"`` and CUDA tensors.

The engines are the same fakes at the SGLang boundary (SGLang is not installable on
our GPU machine): they join the group exactly as SGLang does and receive by broadcast.
NCCL refuses two ranks on one GPU, so this needs 3 GPUs (trainer + 2 engines).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NCCL)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.device_count() < 3,
        reason="needs 3 GPUs: NCCL cannot put two ranks on one GPU",
    ),
]


def test_nccl_sync_protocol_on_gpus():
    from tests.fixtures.weight_sync_protocol import check_sync_protocol, run_sync_protocol

    sent, logs = run_sync_protocol("nccl", devices=["0", "1", "2"])
    check_sync_protocol(sent, logs, "nccl")
