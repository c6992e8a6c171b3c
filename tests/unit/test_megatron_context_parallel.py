"""Context-parallel pieces of the megatron backend, without megatron: the split and CP attention.

The attention test runs two real processes over gloo (``tests/gpu/test_megatron_cp_gpu.py``
runs the same check over NCCL on two GPUs, which takes the reduce-scatter backward path): each holds its two
load-balanced chunks of q/k/v, runs ``cp_attention`` and back-propagates; the
outputs and the q/k/v gradients, put back in sequence order, must equal a
single-process causal SDPA over the whole sequence (GQA: 4 query heads, 2 KV heads).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs():
    g = torch.Generator().manual_seed(0)
    b, h, kv, s, d = 2, 4, 2, 16, 8
    q, k, v = (torch.randn(b, n, s, d, generator=g) for n in (h, kv, kv))
    up = torch.randn(b, h, s, d, generator=g)  # upstream gradient
    return q, k, v, up


def check_cp_attention(tmp_path: Path, backend: str = "gloo") -> None:
    """Two ranks (gloo on CPU; nccl on cuda:0/cuda:1 from ``tests/gpu``) against one full SDPA."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), str(port), str(tmp_path), backend],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    from slime.backends.megatron.context_parallel import split_seq

    q, k, v, up = _inputs()
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    out.backward(up)
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt")
        want = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
        for key, full in want.items():
            diff = (got[key] - split_seq(full, 2, r, dim=2)).abs().max().item()
            assert diff < 1e-5, (r, key, diff)


def test_cp_attention_matches_full_causal_sdpa(tmp_path):
    check_cp_attention(tmp_path, "gloo")


def _worker(rank: int, port: int, out: str, backend: str) -> None:
    import torch.distributed as dist

    from slime.backends.megatron.context_parallel import cp_attention, split_seq

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # compare in true fp32
    q, k, v, up = (split_seq(t, 2, rank, dim=2).clone().to(device) for t in _inputs())
    for t in (q, k, v):
        t.requires_grad_()
    o = cp_attention(q, k, v, dist.group.WORLD, scale=0.3, enable_gqa=True)
    o.backward(up)
    result = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    torch.save({key: t.cpu() for key, t in result.items()}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
