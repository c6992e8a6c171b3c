"""The Megatron train backend end to end on CPU: TP=2 x CP=2 (four ranks), then TP=2, PP=2, DP=2 and CP=2 (two
ranks each) over gloo, all five layouts in turn in the same four processes.

Checks what must hold whatever the layout: log-probs equal the HF model's; the same global batch
gives the same loss, metrics and gradient norm under TP=2, PP=2 and DP=2 (DP ranks get half the
batch each, so this also checks the micro-batch / data-parallel loss weighting); context parallel
(SDPA attention over the all-gathered K/V, load-balanced chunks, megatron's own rotary chunking)
gives the same log-probs, losses and gradient norms as no model parallelism; the exported HF
checkpoint reproduces the trained model's log-probs; save → train → load → train gives the same
parameters after the repeated step (optimizer moments, decaying learning rate); TIS weights of 2
double the policy loss; the SFT warm-up (its own optimizer) and the critic (value head) train
identically under every layout.

Fake at the boundary: megatron-core places a few buffers with ``device='cuda'`` and asserts CUDA
tensor types in places; the worker redirects exactly those placements to the CPU inside megatron's
own modules (``tests.fixtures.megatron_cpu``). This runs fp32 with the non-distributed optimizer,
without gradient clipping (its kernel asserts CUDA grads; the norm is still computed and compared);
the distributed optimizer's resume is checked in ``test_megatron_moe_cpu.py``; bf16 and clipping in
``tests/gpu``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.fixtures.ranks import spawn_ranks

HAS_MEGATRON = importlib.util.find_spec("megatron.core") is not None
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (optional extra 'megatron')"),
]


# Every layout in one group of four processes (a megatron-core import is ~7 core-s per process): the four-rank
# layout first, then ranks 0-1 go on through the two-rank ones (``_layouts``). name -> (tp, pp, cp, dp_split, save)
LAYOUTS = {
    "tp2cp2": (2, 1, 2, False, False),
    "tp2": (2, 1, 1, False, True),
    "pp2": (1, 2, 1, False, False),
    "dp2": (1, 1, 1, True, False),
    "cp2": (1, 1, 2, False, False),
}


def _run_layouts(model_dir: Path, out_dir: Path) -> dict[str, list[dict]]:
    """Each layout's per-rank results (rank order), every layout run by the same four processes."""
    outs = spawn_ranks(
        lambda rank, port: [sys.executable, __file__, str(model_dir), str(out_dir), str(rank), str(port)],
        4,
        env={"PYTHONWARNINGS": "ignore"},
        timeout=300,
    )
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for out in outs:
        for line in out.splitlines():
            if line.startswith('{"layout"'):
                row = json.loads(line)
                runs[row.pop("layout")].append(row)
    return runs


@pytest.fixture(scope="module")
def tiny_llama(tiny_model):
    return tiny_model(arch="llama", hidden=64, layers=4, heads=4, kv_heads=2, seed=3)


def test_tp_pp_dp_agree_and_export_round_trips(tiny_llama, tmp_path):
    import torch

    runs = _run_layouts(tiny_llama, tmp_path)
    assert {name: len(run) for name, run in runs.items()} == {"tp2cp2": 4, "tp2": 2, "pp2": 2, "dp2": 2, "cp2": 2}
    tp2 = runs["tp2"]
    full = _batch(slice(None))
    mask = full.response_mask.bool()
    hf_before = _hf_logp(tiny_llama, full.tokens)
    for name, run in runs.items():
        rows = [slice(0, None, 2), slice(1, None, 2)] if name == "dp2" else [slice(None)] * len(run)
        hf_after = _hf_logp(tmp_path / name / "export", full.tokens)
        for r, sl in zip(run, rows):
            m = mask[sl]
            before, after = torch.tensor(r["logp_before"]), torch.tensor(r["logp_after"])
            assert (before - hf_before[sl])[m].abs().max() < 1e-5, name
            assert (after - hf_after[sl])[m].abs().max() < 1e-5, name  # the export is the trained model
            assert (after - before)[m].abs().max() > 1e-3, name  # and training changed it
    # SFT warm-up: the first NLL is the HF model's (token mean over DP ranks' masks), then it falls
    nll = -hf_before[mask].mean().item()
    for run in runs.values():
        for r in run:
            assert r["sft_losses"][0] == pytest.approx(nll, rel=1e-5) and r["sft_losses"][1] < r["sft_losses"][0]
    ref = tp2[0]["steps"]
    assert ref[0]["grad_norm"] > 0 and ref[1]["grad_norm"] > 0
    assert ref[1]["pg_loss"] < ref[0]["pg_loss"]  # the policy improved on its batch
    for run in runs.values():
        for r in run:
            for got, want in zip(r["steps"], ref):
                for key in ("loss", "pg_loss", "clipfrac", "approx_kl", "grad_norm"):
                    assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (key, got, want)
    # save -> step -> load -> step: identical parameters after the repeated step (so the optimizer's moments,
    # the scheduler's decaying learning rate and the step count came back, not only the weights)
    assert [r["reload_max_diff"] for r in tp2] == [0.0, 0.0]
    for name, run in runs.items():  # TIS weights of 2 double the policy loss under every layout
        for r in run:
            tis = r["tis_pg_loss"]
            assert tis["plain"] != 0 and tis["weighted"] == pytest.approx(2 * tis["plain"], rel=1e-5), (name, tis)
    # critic: zero-initialised value head, the value loss falls, identically under every layout
    critic = tp2[0]["critic_losses"]
    assert tp2[0]["critic_initial_abs"] == 0.0 and critic[2] < critic[0]
    for run in runs.values():
        for r in run:
            assert r["critic_losses"] == pytest.approx(critic, rel=1e-4)
    # hf_weights: rank 0 holds the whole policy, as exported (TP shards gathered); pp > 1 is refused
    from safetensors.torch import load_file

    for name, run in runs.items():
        if name == "pp2":
            assert all("pipeline > 1 is not implemented" in r["hf_weights_error"] for r in run)
            continue
        exported = {k: v for f in (tmp_path / name / "export").glob("*.safetensors") for k, v in load_file(f).items()}
        assert sorted(run[0]["hf_weights"]) == sorted(exported), name
        for key, head in run[0]["hf_weights"].items():
            assert head == exported[key].float().flatten()[:8].tolist(), (name, key)
    index = json.loads((tmp_path / "pp2" / "export" / "model.safetensors.index.json").read_text())
    assert {Path(f).name.split("-")[1] for f in index["weight_map"].values()} == {"stage000", "stage001"}


# ----------------------------------------------------------------------------- worker
def _batch(rows: slice):
    import torch

    from slime.backends.base import TrainBatch

    g = torch.Generator().manual_seed(0)
    B, T = 8, 20
    tokens = torch.randint(5, 100, (B, T), generator=g)
    lengths = torch.tensor([20, 14, 17, 9, 20, 12, 18, 11])
    am = (torch.arange(T)[None] < lengths[:, None]).long()
    rm = am[:, 1:].clone()
    rm[:, :5] = 0  # prompt tokens are not trained
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, -0.2, 0.3, -1.2])[:, None].expand(B, T - 1).clone()
    return TrainBatch(tokens=tokens[rows], attention_mask=am[rows], response_mask=rm[rows], advantages=adv[rows])


def _hf_logp(model_dir: Path, tokens):
    import torch
    from transformers import AutoModelForCausalLM

    from slime.rl.losses import logprobs_from_logits

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return logprobs_from_logits(hf(tokens).logits[:, :-1], tokens[:, 1:], 1.0)


def _worker(
    model_dir: str,
    out_dir: str,
    rank: int,
    port: int,
    tp: int,
    pp: int,
    dp_split: bool,
    save: bool,
    cp: int = 1,
    world: int = 2,
):
    import warnings

    warnings.filterwarnings("ignore")
    from tests.fixtures.megatron_cpu import cpu_shim

    cpu_shim()
    import msgspec
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend
    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "cpu",
        "model": {"path": model_dir},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 4},
        "algorithm": {"entropy_coef": 0.01},  # the entropy's gradient path too (vocab- and context-parallel)
        "train": {
            "backend": "megatron",
            "parallel": {"tensor": tp, "pipeline": pp, "context": cp},
            "micro_batch_size": 2,
            "precision": "fp32",
            # the learning rate decays: a resume that lost the scheduler would repeat a step with another one
            "optimizer": {"lr": 1e-3, "lr_schedule": "linear", "distributed": False, "clip_grad": 0.0},
        },
    }
    spec = resolve(msgspec.convert(data, Spec), Path(out_dir))
    backend = MegatronTrainBackend()
    backend.init(
        spec,
        RankInfo(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, device="cpu"),
        Path(model_dir),
        role="actor",
    )
    batch = _batch(slice(rank, None, 2) if dp_split else slice(None))
    result = {"logp_before": backend.log_probs(batch, temperature=1.0).tolist()}
    sft = batch.select(slice(None))
    sft.kind = "sft"
    result["sft_losses"] = [backend.train_step(sft, step=0)["sft_loss"] for _ in range(2)]
    logp = backend.log_probs(batch, temperature=1.0)  # after the warm-up: the RL steps start here
    batch.old_log_probs = logp
    keys = ("loss", "pg_loss", "clipfrac", "approx_kl", "grad_norm")
    steps = []
    for step in range(2):
        if save and step == 1:
            backend.save(Path(out_dir) / "ckpt")
        metrics = backend.train_step(batch, step=step)
        steps.append({k: metrics[k] for k in keys})
    result["steps"] = steps
    result["logp_after"] = backend.log_probs(batch, temperature=1.0).tolist()
    if save:  # back to the state before step 1: the parameters after repeating it must be the same
        backend.load(Path(out_dir) / "ckpt")
        backend.train_step(batch, step=1)
        again = backend.log_probs(batch, temperature=1.0)
        result["reload_max_diff"] = float((again - torch.tensor(result["logp_after"])).abs().max())
    backend.export_weights(Path(out_dir) / "export")
    try:  # what a collective weight sync sends (TrainBackend.hf_weights): every rank iterates, rank 0 is whole
        heads = {n: t.float().flatten()[:8].tolist() for n, t in backend.hf_weights()}
        result["hf_weights"] = heads if rank == 0 else {}
    except ValueError as exc:
        result["hf_weights_error"] = str(exc)
    # TIS weights (algorithm.tis) reach the loss through the micro-batches: weights of 2 double the policy loss
    backend.save(Path(out_dir) / "ckpt-tis")
    plain = backend.train_step(batch, step=2)["pg_loss"]
    backend.load(Path(out_dir) / "ckpt-tis")
    batch.tis_weights = torch.full_like(batch.response_mask, 2.0, dtype=torch.float32)
    result["tis_pg_loss"] = {"plain": plain, "weighted": backend.train_step(batch, step=2)["pg_loss"]}
    batch.tis_weights = None

    critic = MegatronTrainBackend()
    critic.init(
        spec,
        RankInfo(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, device="cpu"),
        Path(model_dir),
        role="critic",
    )
    batch.old_values = critic.values(batch)
    batch.returns = batch.advantages.clone()
    result["critic_initial_abs"] = float(batch.old_values.abs().max())
    result["critic_losses"] = [critic.train_step(batch, step=s)["value_loss"] for s in range(3)]
    return result


def _layouts(model_dir: str, out_dir: str, rank: int, port: int) -> None:
    """Every layout this rank takes part in, in ``LAYOUTS`` order; one JSON line per layout. Between two layouts
    rank 0 picks the next process group's port and sends it over the current group, then the group and its
    model-parallel state are torn down (the next ``backend.init`` builds them again, and reseeds megatron's RNG
    tracker)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from tests.fixtures.ranks import next_group_port

    for name, (tp, pp, cp, dp_split, save) in LAYOUTS.items():
        world = 4 if tp * pp * cp == 4 else 2
        if rank >= world:
            return
        result = _worker(model_dir, str(Path(out_dir) / name), rank, port, tp, pp, dp_split, save, cp, world)
        print(json.dumps({"layout": name, **result}), flush=True)
        port = next_group_port()
        dist.destroy_process_group()
        parallel_state.destroy_model_parallel()


if __name__ == "__main__":
    a = sys.argv[1:]
    _layouts(a[0], a[1], int(a[2]), int(a[3]))
