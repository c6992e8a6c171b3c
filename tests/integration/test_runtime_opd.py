"""On-policy distillation through the driver (``slime.train`` on a private local Ray): the teacher is
loaded on the actor's ranks and its KL to the student enters every rollout's advantages.

The student is the quickstart's built-in tiny model, the teacher a checkpoint of the same shape and
tokenizer with other weights, so their KL is positive from the first rollout on; the run completes.
How close the teacher's log-probs are to its direct forward: tests/unit/test_rl_opd.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import compile_run, metrics, train

pytestmark = pytest.mark.timeout(300)


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
