"""Context-parallel pieces of the megatron backend, without megatron: the split and CP attention.

The attention test runs two real processes over gloo (``tests/gpu/test_megatron_cp_gpu.py``
runs the same check over NCCL on two GPUs, which takes the reduce-scatter backward path): each holds its two
load-balanced chunks of q/k/v, runs ``cp_attention`` and back-propagates; the
outputs and the q/k/v gradients, put back in sequence order, must equal a
single-process causal SDPA over the whole sequence (GQA: 4 query heads, 2 KV heads).
The check and its rank worker are in ``tests/fixtures/cp_attention.py`` (shared with the GPU test).
"""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.cp_attention import check_cp_attention


def test_split_is_megatrons_load_balanced_layout():
    from slime.backends.megatron.context_parallel import split_seq

    seq = torch.arange(16).unsqueeze(0)
    # cp=2: 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert split_seq(seq, 2, 0).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert split_seq(seq, 2, 1).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert split_seq(seq, 4, 3).tolist() == [[6, 7, 8, 9]]
    assert split_seq(seq, 1, 0) is seq
    with pytest.raises(ValueError, match="not divisible by 2 x context-parallel size = 6"):
        split_seq(torch.arange(16).unsqueeze(0), 3, 0)


def test_cp_attention_matches_full_causal_sdpa(tmp_path):
    check_cp_attention(tmp_path, "gloo")
