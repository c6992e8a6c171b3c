"""On-policy distillation through the driver (``slime.train`` on a private local Ray): the teacher is
loaded on the actor's ranks (type trainer) or served by a second built-in engine (type engine), and its
KL to the student enters every rollout's advantages.

The student is the quickstart's built-in tiny model, the teacher a checkpoint of the same shape and
tokenizer with other weights, so their KL is positive from the first rollout on. How close the teacher's
log-probs are to its direct forward: tests/unit/test_rl_opd.py, tests/integration/test_opd_engine.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import compile_run, metrics, train

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.extended  # the engine type's run below is CI's representative; the rank itself: test_rl_opd.py
def test_the_teacher_enters_every_rollout_through_the_driver(tmp_path, tiny_model):
    teacher = tiny_model(seed=1)
    overrides = [
        "rollout.num_rollouts=2",
        "rollout.batch_size=4",
        "train.global_batch_size=32",
        "train.micro_batch_size=32",
        "algorithm.sft_warmup_steps=0",
        f"algorithm.opd={{teacher: {teacher}, kl_coef: 0.5}}",
        "data.eval=[]",
        "logging.progress=false",
    ]
    run = compile_run(tmp_path, "opd", overrides)
    done = train(run, wandb="disabled", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = metrics(run)[1:]
    assert len(steps) == 2 and all(abs(r["train/opd_kl"]) > 1e-4 for r in steps), [r.get("train/opd_kl") for r in steps]


def _sharpened(model_dir: Path, out: Path, factor: float) -> Path:
    """A copy of ``model_dir`` whose logits are ``factor`` times its own (the final norm's weight scaled):
    the same preferences, held more firmly, so the student's way toward it is measurable in a few rollouts."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * factor
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _kl_to(teacher: Path, student: Path, prompts: list[str]) -> float:
    """Exact KL(student || teacher) of the first response token's distribution, averaged over ``prompts``."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(teacher))
    ids = [torch.tensor([tok.encode(p, add_special_tokens=False)]) for p in prompts]

    def first_token(model_dir: Path) -> torch.Tensor:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            return torch.stack([torch.log_softmax(model(x).logits[0, -1], -1) for x in ids])

    t, s = first_token(teacher), first_token(student)
    return float((s.exp() * (s - t)).sum(-1).mean())


def test_a_teacher_engine_scores_every_rollout_and_the_student_moves_toward_it(tmp_path, tiny_model):
    """``algorithm.opd.type: engine``: the job starts a second built-in engine serving the teacher (on engine
    0's slot), the rollout manager scores every kept sample on it at the rollout temperature, and the trainer
    loads no teacher. With the reward giving nothing (a fresh student gets every sum wrong), the teacher's
    signal alone moves the student toward it: its logged KL falls and so does the exact KL of its final
    weights (first response token over the training prompts)."""
    teacher = _sharpened(tiny_model(), tmp_path / "teacher", 3.0)
    overrides = [
        "rollout.num_rollouts=20",
        "train.optimizer.lr=1e-3",
        "algorithm.sft_warmup_steps=0",
        f"algorithm.opd={{teacher: {teacher}, type: engine, kl_coef: 1.0}}",
        "data.eval=[]",
        "logging.progress=false",
    ]
    run = compile_run(tmp_path, "opd-engine", overrides)
    done = train(run, wandb="disabled", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "teacher engine up" in done.stdout + done.stderr
    steps = metrics(run)[1:]
    kl = [r["train/opd_kl"] for r in steps]
    assert len(steps) == 20 and all(r["rollout/teacher_s"] > 0 for r in steps), steps
    assert sum(kl[-5:]) < 0.8 * sum(kl[:5]), kl
    prompts = [json.loads(x)["prompt"] for x in (REPO / "specs/data/arith/train.jsonl").read_text().splitlines()[:64]]
    before, after = _kl_to(teacher, tiny_model(), prompts), _kl_to(teacher, run / "tasks/0/final_model", prompts)
    assert after < 0.75 * before, (before, after)


def test_fully_async_groups_are_scored_by_the_teacher_engine_too(tmp_path, tiny_model):
    """``train.async`` mode fully takes its groups from the stream, not ``generate``: the teacher scores those."""
    teacher = tiny_model(seed=1)
    overrides = [
        "rollout.num_rollouts=3",
        "rollout.batch_size=4",
        "train.global_batch_size=32",
        "train.micro_batch_size=32",
        "algorithm.sft_warmup_steps=0",
        f"algorithm.opd={{teacher: {teacher}, type: engine, kl_coef: 0.5}}",
        'train.async={"mode": "fully", "max_staleness": 2}',
        "data.eval=[]",
        "logging.progress=false",
    ]
    run = compile_run(tmp_path, "opd-fully", overrides)
    done = train(run, wandb="disabled", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = metrics(run)[1:]
    assert len(steps) == 3 and all(r["rollout/teacher_s"] > 0 and abs(r["train/opd_kl"]) > 1e-4 for r in steps)
