"""slime.backends.train.optim.AdamW against torch.optim.AdamW: the same bits after many steps (weight decay on
and off, a parameter without a gradient on some steps), state dicts that load into each other, and no
torch._dynamo import (the reason it exists)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from slime.backends.train.optim import AdamW, build_adamw  # noqa: E402

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)


def _pair(weight_decay: float):
    torch.manual_seed(0)
    ours = [
        torch.nn.Parameter(torch.randn(6, 4)),
        torch.nn.Parameter(torch.randn(9)),
        torch.nn.Parameter(torch.randn(3)),
    ]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return (
        ours,
        theirs,
        AdamW(ours, weight_decay=weight_decay, **HYPER),
        torch.optim.AdamW(theirs, weight_decay=weight_decay, **HYPER),
    )


def _steps(pairs, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        for _, opt in pairs:
            opt.zero_grad(set_to_none=True)
        grads = [torch.randn(p.shape, generator=g) for p in pairs[0][0]]
        for ps, opt in pairs:
            for j, (p, grad) in enumerate(zip(ps, grads)):
                if not (j == 2 and i % 3 == 0):  # the third parameter skips every third step
                    p.grad = grad.clone()
            opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_same_bits_as_torch(weight_decay):
    ours, theirs, a, b = _pair(weight_decay)
    _steps([(ours, a), (theirs, b)], 25, seed=1)
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
    assert any(not torch.equal(p, q0) for p, q0 in zip(ours, _pair(weight_decay)[0]))  # it did move


def test_state_dicts_load_into_each_other_and_continue_identically():
    ours, theirs, a, b = _pair(0.1)
    _steps([(ours, a), (theirs, b)], 5, seed=2)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert {i: set(s) for i, s in sa["state"].items()} == {i: set(s) for i, s in sb["state"].items()}
    # torch's state into a fresh ours, ours into a fresh torch; all four continue with the same bits
    ours2 = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    theirs2 = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    a2, b2 = AdamW(ours2, weight_decay=0.1, **HYPER), torch.optim.AdamW(theirs2, weight_decay=0.1, **HYPER)
    a2.load_state_dict(copy.deepcopy(sb))  # as from torch.load: torch's load keeps the given tensors
    b2.load_state_dict(copy.deepcopy(sa))
    _steps([(ours, a), (theirs, b), (ours2, a2), (theirs2, b2)], 5, seed=3)
    for group in zip(ours, theirs, ours2, theirs2):
        assert all(torch.equal(group[0], t) for t in group[1:])


def test_a_state_of_other_size_is_refused():
    ours, _, a, _ = _pair(0.0)
    other = AdamW(ours[:2], weight_decay=0.0, **HYPER)
    with pytest.raises(ValueError, match="3 parameters, the model 2"):
        other.load_state_dict(a.state_dict())


def test_cpu_parameters_get_it_and_it_imports_no_dynamo():
    assert isinstance(build_adamw([torch.nn.Parameter(torch.zeros(2))], weight_decay=0.0, **HYPER), AdamW)
    code = (
        "import sys, torch; from slime.backends.train.optim import build_adamw; "
        "p = torch.nn.Parameter(torch.ones(3)); o = build_adamw([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, "
        "weight_decay=0.0); p.sum().backward(); torch.nn.utils.clip_grad_norm_([p], 1.0); o.step(); "
        "print('torch._dynamo' in sys.modules, float(p[0]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False" and float(out[1]) < 1.0, out
