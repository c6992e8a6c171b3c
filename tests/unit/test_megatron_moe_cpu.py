"""The Megatron backend on Qwen3, Qwen3-MoE, Qwen2-MoE and DeepSeek-V3 (MLA + MoE) models, on CPU over gloo.

Tiny random checkpoints built with transformers' own classes (``tests/fixtures/tiny_families.py``:
hidden 32, 2 layers, 4 experts), fp32. For each family, one rank (no parallelism) must give the HF
model's log-probs, lower its loss with a training step, report the router load-balancing loss that
the HF router logits imply, and export an HF checkpoint that reproduces its trained log-probs. Then
the same global batch under expert parallelism — EP=2 over two ranks (Qwen3-MoE; Qwen2-MoE with the
distributed optimizer), and TP=2 x EP=2 over four (DeepSeek-V3: sequence parallel, expert-tensor 1) —
must give the same losses and gradient norms and (without the distributed optimizer, whose gradients
are reduce-scattered) the same gradients of every HF-named tensor, experts gathered from their EP
ranks. The Qwen2-MoE run also saves before its second step, loads and repeats that step:
parameters after it must be identical (distributed optimizer shards, Adam step counts, scheduler)
and the torch/Python RNG streams restored.

megatron-core's CUDA-only placements are redirected to the CPU inside its modules
(``tests.fixtures.megatron_cpu``). Each layout is its own set of processes (``slow``); measured
times are in the Megatron backend README.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.ranks import free_port, next_group_port

HAS_MEGATRON = importlib.util.find_spec("megatron.core") is not None
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (optional extra 'megatron')"),
]
T, PAD_TO = 20, 24  # sequence length of the batch; micro-batches are padded to a multiple of 8


def _spawn(args: str, world: int, timeout: float) -> list[str]:
    """``world`` worker processes of this file given ``args`` (JSON), one per rank; their stdouts. A rank that
    fails fails the test with its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, args, str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    done = [p.communicate(timeout=timeout) for p in procs]
    failed = [f"rank {r}:\n{err[-3000:]}" for r, (p, (_, err)) in enumerate(zip(procs, done)) if p.returncode]
    assert not failed, "\n".join(failed[::-1])  # the last rank's error first: usually the cause
    return [out for out, _ in done]


def run_layout(model_dir: Path, out_dir: Path, *, world: int, timeout: float = 600, **layout) -> list[dict]:
    """Start ``world`` worker processes of this file (one trainer rank each); their JSON results."""
    port = free_port()
    out_dir.mkdir(parents=True, exist_ok=True)
    args = json.dumps({"model_dir": str(model_dir), "out_dir": str(out_dir), "port": port, "world": world, **layout})
    return [json.loads(out.strip().splitlines()[-1]) for out in _spawn(args, world, timeout)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.tiny_families import build

    root = tmp_path_factory.mktemp("families")
    families = ("qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "deepseek_v3_yarn")
    return {f: (root / f, build(f, root / f)) for f in families}


@pytest.fixture(scope="module")
def one_rank(models, tmp_path_factory):
    """family -> (result, out dir) of the one-rank run (gradients and export kept). The five families run one
    after another in one worker process (torch and megatron imported once: CI time), each with its own
    process group and model-parallel state."""
    outs = {f: tmp_path_factory.mktemp(f"one-{f}") for f in models}
    jobs = [
        # port 0: the first family's rank picks a free port when its process group starts, and each family after
        # it gets the port picked at the end of the one before (_workers). Five ports picked here could be taken
        # by another test's processes (the other xdist worker) before the last family runs.
        dict(model_dir=str(models[f][0]), out_dir=str(outs[f]), port=0, world=1, grads=True, export=True)
        for f in models
    ]
    (out,) = _spawn(json.dumps(jobs), world=1, timeout=900)
    results = [json.loads(line) for line in out.splitlines() if line.startswith('{"logp_before"')]
    assert len(results) == len(jobs), out[-3000:]
    by_family = {f: (r, outs[f]) for f, r in zip(models, results)}
    return by_family.__getitem__


def _hf_logp(model, tokens):
    import torch

    from slime.rl.losses import logprobs_from_logits

    with torch.no_grad():
        return logprobs_from_logits(model(tokens).logits[:, :-1], tokens[:, 1:], 1.0)


def _expected_balance_loss(model, tokens) -> float:
    """megatron's switch load-balancing loss (coefficient 1) from the HF routers' logits on the padded batch,
    averaged over MoE layers: E * sum_i f_i P_i, scores softmax (Qwen) or normalised sigmoid (DeepSeek)."""
    import torch

    padded = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], PAD_TO - T)], dim=1)
    logits = []
    hooks = [
        m.register_forward_hook(lambda mod, i, o: logits.append(torch.nn.functional.linear(i[0].float(), mod.weight)))
        for n, m in model.named_modules()
        if n.endswith("mlp.gate")
    ]
    with torch.no_grad():
        model(padded)
    for h in hooks:
        h.remove()
    cfg = model.config
    topk, sigmoid = cfg.num_experts_per_tok, cfg.model_type == "deepseek_v3"  # (the yarn variant too)
    values = []
    for lg in logits:
        lg = lg.reshape(-1, lg.shape[-1])
        scores = torch.sigmoid(lg) / torch.sigmoid(lg).sum(-1, keepdim=True) if sigmoid else torch.softmax(lg, -1)
        top = torch.topk(scores, topk, dim=-1).indices
        f = torch.zeros(lg.shape[-1]).scatter_add_(0, top.flatten(), torch.ones(top.numel())) / (lg.shape[0] * topk)
        values.append(float(lg.shape[-1] * (f * scores.mean(0)).sum()))
    return sum(values) / len(values)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "deepseek_v3_yarn"])
def test_one_rank_matches_hf_trains_and_exports(models, one_rank, family):
    import torch
    from transformers import AutoModelForCausalLM

    _, hf = models[family]
    r, out = one_rank(family)
    batch = _batch(slice(None))
    mask = batch.response_mask.bool()
    before = torch.tensor(r["logp_before"])
    assert (before - _hf_logp(hf, batch.tokens))[mask].abs().max() < 2e-5
    s0, s1 = r["steps"]
    assert s1["pg_loss"] < s0["pg_loss"] and s0["grad_norm"] > 0  # one step lowered the loss on its batch
    if family != "qwen3":
        want = _expected_balance_loss(hf, batch.tokens)
        assert s0["moe_load_balancing_loss"] == pytest.approx(want, rel=1e-5)
        assert 1.0 <= s0["moe_load_balancing_loss"] < 4.0
    else:
        assert "moe_load_balancing_loss" not in s0
    exported = AutoModelForCausalLM.from_pretrained(out / "export", dtype=torch.float32)
    after = torch.tensor(r["logp_after"])
    assert (after - _hf_logp(exported, batch.tokens))[mask].abs().max() < 2e-5  # the export is the trained model
    assert (after - before)[mask].abs().max() > 1e-3


# id -> (family, layout). All run in one group of four processes (``expert_parallel``): the four-rank layout
# first, then ranks 0-1 go on through the two-rank ones (megatron-core imported 4 times instead of 8).
EP_LAYOUTS = {
    "deepseek_v3-tp2ep2": ("deepseek_v3", dict(world=4, tp=2, ep=2, etp=1, sp=True)),
    "qwen3_moe-ep2": ("qwen3_moe", dict(world=2, ep=2)),
    "qwen2_moe-ep2-distopt-resume": ("qwen2_moe", dict(world=2, ep=2, distributed=True, resume=True)),
}


@pytest.fixture(scope="module")
def expert_parallel(models, tmp_path_factory):
    """id -> (per-rank results in rank order, out dir) of every ``EP_LAYOUTS`` entry (gradients and export
    kept), run in turn by the same four worker processes (``_workers``)."""
    outs = {case: tmp_path_factory.mktemp(f"ep-{case}") for case in EP_LAYOUTS}
    jobs = [
        dict(model_dir=str(models[family][0]), out_dir=str(outs[case]), grads=True, export=True, **layout)
        for case, (family, layout) in EP_LAYOUTS.items()
    ]
    jobs[0]["port"] = free_port()  # each later job's port is picked by rank 0 of the job before (_worker)
    per_rank = [
        [json.loads(line) for line in out.splitlines() if line.startswith('{"logp_before"')]
        for out in _spawn(json.dumps(jobs), world=4, timeout=900)
    ]
    results = {case: [rows[k] for rows in per_rank if len(rows) > k] for k, case in enumerate(EP_LAYOUTS)}
    assert {c: len(r) for c, r in results.items()} == {c: lay["world"] for c, (_, lay) in EP_LAYOUTS.items()}
    return {case: (results[case], outs[case]) for case in EP_LAYOUTS}


@pytest.mark.parametrize("case", list(EP_LAYOUTS))
def test_expert_parallel_agrees_with_one_rank(models, one_rank, expert_parallel, case):
    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.megatron.hf_io import read_tensors

    family, layout = EP_LAYOUTS[case]
    ref, ref_dir = one_rank(family)
    runs, ep_dir = expert_parallel[case]
    # the export gathered every expert from its EP rank: same tensors as one rank's, and HF loading it
    # reproduces the log-probs the EP-trained model gives on rank 0's rows (data-parallel rank 0: rows 0::2)
    ep_export, ref_export = read_tensors(ep_dir / "export"), read_tensors(ref_dir / "export")
    assert {n: t.shape for n, t in ep_export.items()} == {n: t.shape for n, t in ref_export.items()}
    batch = _batch(slice(0, None, 2))
    exported = AutoModelForCausalLM.from_pretrained(ep_dir / "export", dtype=torch.float32)
    got_logp = _hf_logp(exported, batch.tokens)
    assert (got_logp - torch.tensor(runs[0]["logp_after"]))[batch.response_mask.bool()].abs().max() < 2e-5
    for r in runs:
        for got, want in zip(r["steps"], ref["steps"]):
            for key in ("loss", "pg_loss", "clipfrac", "approx_kl", "grad_norm"):
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (key, got, want)
    if layout.get("resume"):
        # the distributed optimizer's shards, Adam's step counts and the scheduler came back: the step repeats
        assert [r["resume_max_diff"] for r in runs] == [0.0] * len(runs)
        assert all(r["rng_after_load"] == r["rng_after_save"] for r in runs)  # torch and Python RNG restored
        return  # its gradients are reduce-scattered: each rank holds only its shard (losses and norms agree above)
    want = torch.load(ref_dir / "grads.pt")
    got = torch.load(ep_dir / "grads.pt")
    assert sorted(got) == sorted(want)  # every expert of every layer, gathered from its EP rank
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert any("experts.3." in n for n in got)


def test_ppo_resume_gives_actor_and_critic_their_own_state(tmp_path):
    """Actor and critic save into one checkpoint (the driver's order: actor, then critic) and both resume.

    Was: both wrote role-less files into the same directory, so after a resume the actor held the critic's
    tensors and scheduler. Now each must come back exactly (log-probs / values), and one more step of each
    must repeat the step taken after the save bit for bit (optimizer, scheduler, RNG)."""
    from slime.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden=32, layers=2, heads=4, kv_heads=2, seed=5)
    (r,) = run_layout(model, tmp_path / "ppo", world=1, ppo=True)
    assert r["actor_changed"] > 1e-4 and r["critic_changed"] > 1e-4  # the steps after the save moved both
    assert r["actor_after_load"] == 0.0 and r["critic_after_load"] == 0.0
    assert r["actor_step_again"] == 0.0 and r["critic_step_again"] == 0.0
    assert sorted(p.name for p in (tmp_path / "ppo" / "ckpt").iterdir()) == ["actor", "critic"]


# ----------------------------------------------------------------------------- worker
def _batch(rows: slice):
    import torch

    from slime.backends.base import TrainBatch

    g = torch.Generator().manual_seed(0)
    B = 8
    tokens = torch.randint(5, 100, (B, T), generator=g)
    lengths = torch.tensor([20, 14, 17, 9, 20, 12, 18, 11])
    am = (torch.arange(T)[None] < lengths[:, None]).long()
    rm = am[:, 1:].clone()
    rm[:, :5] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, -0.2, 0.3, -1.2])[:, None].expand(B, T - 1).clone()
    return TrainBatch(tokens=tokens[rows], attention_mask=am[rows], response_mask=rm[rows], advantages=adv[rows])


def make_spec(model_dir: str, out_dir: str, *, tp=1, pp=1, ep=1, etp=None, sp=False, mbs=8, distributed=False):
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    parallel = {"tensor": tp, "pipeline": pp, "expert": ep, "sequence_parallel": sp}
    if etp is not None:
        parallel["expert_tensor"] = etp
    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "cpu",
        "model": {"path": model_dir},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 4},
        "train": {
            "backend": "megatron",
            "parallel": parallel,
            "micro_batch_size": mbs,
            "precision": "fp32",
            # a decaying learning rate: a resume that lost the scheduler would step with another one
            "optimizer": {"lr": 1e-3, "lr_schedule": "linear", "distributed": distributed, "clip_grad": 0.0},
        },
    }
    return resolve(msgspec.convert(data, Spec), Path(out_dir))


def hf_grads(backend) -> dict:
    """Every HF-named gradient of the model (TP/EP gathered), as ``iter_hf_weights`` names weights."""
    pairs = ((n, p.main_grad) for n, p in backend.gpt.named_parameters())
    return {n: t.clone() for n, t in backend._hf_named(pairs)}


def _worker(args: dict, rank: int) -> int | None:
    """One job on this rank; the port rank 0 picked for the next job (None after a PPO job)."""
    import random
    import warnings

    warnings.filterwarnings("ignore")
    from tests.fixtures.megatron_cpu import cpu_shim

    cpu_shim()
    if args.get("ppo"):
        return _ppo_worker(args, rank)
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend

    world = args["world"]
    layout = {k: args[k] for k in ("tp", "ep", "etp", "sp", "distributed") if k in args}
    spec = make_spec(args["model_dir"], args["out_dir"], **layout)
    backend = MegatronTrainBackend()
    info = RankInfo(
        rank=rank, world_size=world, master_addr="127.0.0.1", master_port=args["port"] or free_port(), device="cpu"
    )
    backend.init(spec, info, Path(args["model_dir"]), role="actor")
    dp, dp_size = backend.data_parallel_coords()
    batch = _batch(slice(dp, None, dp_size))
    result = {"logp_before": backend.log_probs(batch, temperature=1.0).tolist()}
    batch.old_log_probs = torch.tensor(result["logp_before"])
    keys = ("loss", "pg_loss", "clipfrac", "approx_kl", "grad_norm", "moe_load_balancing_loss")
    steps = []
    for step in range(2):
        metrics = backend.train_step(batch, step=step)
        steps.append({k: metrics[k] for k in keys if k in metrics})
        if step == 0 and args.get("grads"):
            grads = hf_grads(backend)
            if rank == 0:
                torch.save(grads, Path(args["out_dir"]) / "grads.pt")
        if step == 0 and args.get("resume"):
            backend.save(Path(args["out_dir"]) / "ckpt")
            result["rng_after_save"] = [torch.rand(3).tolist(), random.random()]
    result["steps"] = steps
    result["logp_after"] = backend.log_probs(batch, temperature=1.0).tolist()
    if args.get("resume"):  # back to the state before step 1: the step must repeat exactly
        backend.load(Path(args["out_dir"]) / "ckpt")
        result["rng_after_load"] = [torch.rand(3).tolist(), random.random()]
        backend.train_step(batch, step=1)
        again = backend.log_probs(batch, temperature=1.0)
        result["resume_max_diff"] = float((again - torch.tensor(result["logp_after"])).abs().max())
    if args.get("export"):
        backend.export_weights(Path(args["out_dir"]) / "export")
    port = next_group_port()  # of the next job in this process (_workers)
    torch.distributed.destroy_process_group()
    print(json.dumps(result), flush=True)
    return port


def _ppo_worker(args: dict, rank: int) -> None:
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend

    spec = make_spec(args["model_dir"], args["out_dir"])
    info = RankInfo(
        rank=rank, world_size=args["world"], master_addr="127.0.0.1", master_port=args["port"], device="cpu"
    )
    actor, critic = MegatronTrainBackend(), MegatronTrainBackend()
    actor.init(spec, info, Path(args["model_dir"]), role="actor")
    critic.init(spec, info, Path(args["model_dir"]), role="critic")
    batch = _batch(slice(None))
    batch.old_log_probs = actor.log_probs(batch, temperature=1.0)
    batch.old_values = critic.values(batch)
    batch.returns = batch.advantages.clone()

    def step_both():
        actor.train_step(batch, step=0)
        critic.train_step(batch, step=0)
        return actor.log_probs(batch, temperature=1.0), critic.values(batch)

    step_both()  # both move away from their initial weights
    ckpt = Path(args["out_dir"]) / "ckpt"
    actor.save(ckpt)
    critic.save(ckpt)
    a0, v0 = actor.log_probs(batch, temperature=1.0), critic.values(batch)
    a1, v1 = step_both()
    actor.load(ckpt)
    critic.load(ckpt)
    a2, v2 = actor.log_probs(batch, temperature=1.0), critic.values(batch)
    a3, v3 = step_both()

    def diff(x, y):
        return float((x - y).abs().max())

    result = {
        "actor_changed": diff(a1, a0),
        "critic_changed": diff(v1, v0),
        "actor_after_load": diff(a2, a0),
        "critic_after_load": diff(v2, v0),
        "actor_step_again": diff(a3, a1),
        "critic_step_again": diff(v3, v1),
    }
    torch.distributed.destroy_process_group()
    print(json.dumps(result))


def _workers(jobs: list[dict], rank: int) -> None:
    """Jobs in turn in this process, each on the ranks below its ``world`` (a rank stops at the first job it is
    not part of): the process group and model-parallel state are torn down between, and each job after the
    first starts its process group on the port rank 0 of the job before picked and sent over its group."""
    from megatron.core import parallel_state

    port = None
    for job in jobs:
        if rank >= job["world"]:
            return
        port = _worker(job if port is None else {**job, "port": port}, rank)
        parallel_state.destroy_model_parallel()


if __name__ == "__main__":
    _job = json.loads(sys.argv[1])
    (_workers if isinstance(_job, list) else _worker)(_job, int(sys.argv[2]))
