"""Vocab-parallel log-probs/entropy equal the shared full-vocabulary functions, values and gradients.

TP=2 runs as two real processes over gloo (torch.distributed on CPU); no megatron-core needed.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from slime.backends.megatron.logprobs import vocab_parallel_logprobs
from slime.rl.losses import entropy_from_logits, logprobs_from_logits
from tests.fixtures.ranks import end_group

V, V_PADDED, T = 37, 64, 1.3


def _inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, V_PADDED, generator=g) * 3
    targets = torch.randint(0, V, (3, 5), generator=g)
    return logits, targets


def _reference(logits, targets):
    z = logits[..., :V].clone().requires_grad_(True)
    logp = logprobs_from_logits(z, targets, T)
    ent = entropy_from_logits(z, T)
    (logp.sum() + 0.5 * ent.sum()).backward()
    grad = torch.zeros_like(logits)
    grad[..., :V] = z.grad
    return logp.detach(), ent.detach(), grad


def test_tp1_defers_to_shared_functions_and_ignores_padding():
    logits, targets = _inputs()
    logits[..., V:] = 100.0  # padded columns must not take probability mass
    x = logits.clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(x, targets, vocab_size=V, temperature=T, with_entropy=True)
    (logp.sum() + 0.5 * ent.sum()).backward()
    ref_logp, ref_ent, ref_grad = _reference(logits, targets)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(x.grad, ref_grad)
    with pytest.raises(ValueError, match="plus a vocab dim"):
        vocab_parallel_logprobs(logits, targets[:, :2], vocab_size=V)


def _worker(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    logits, targets = _inputs()
    logits[..., V:] = 100.0
    width = V_PADDED // world
    shard = logits[..., rank * width : (rank + 1) * width].clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(
        shard, targets, vocab_size=V, temperature=T, group=dist.group.WORLD, with_entropy=True
    )
    (logp.sum() + 0.5 * ent.sum()).backward()
    # numpy, not tensors: torch shares tensors through fds that die with this process
    queue.put((rank, logp.detach().numpy(), ent.detach().numpy(), shard.grad.numpy()))
    end_group()


def test_tp2_matches_full_vocabulary():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=120) for _ in procs), key=lambda r: r[0])
    results = [(r, torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)) for r, a, b, c in results]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    logits, targets = _inputs()
    logits[..., V:] = 100.0
    ref_logp, ref_ent, ref_grad = _reference(logits, targets)
    for _, logp, ent, _ in results:
        torch.testing.assert_close(logp, ref_logp)
        torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(torch.cat([r[3] for r in results], dim=-1), ref_grad)
