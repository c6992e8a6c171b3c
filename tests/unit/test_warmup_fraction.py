"""``train.optimizer.warmup_fraction`` (slime's ``--lr-warmup-fraction``): a warm-up given as a share of the
run's optimizer steps becomes ``warmup_steps`` at resolve, which the schedule then follows."""

from __future__ import annotations

from slime.backends.train.optim import lr_at
from slime.migrate.importer import convert_slime_args
from slime.spec import load_spec_text
from tests.fixtures.spec_helpers import CPU_SPEC, spec, to_yaml


def _resolved(**edits):
    return load_spec_text(to_yaml(spec(CPU_SPEC, **edits)), file="spec.yaml").spec


def test_a_warmup_fraction_becomes_steps_of_the_run():
    s = _resolved(**{"train.optimizer.warmup_fraction": 0.25, "rollout.num_rollouts": 8})
    assert s.train.num_steps_per_rollout == 1  # 4 prompts x 4 samples, global batch 16
    assert s.train.optimizer.warmup_steps == 2  # a quarter of 8 rollouts x 1 step
    o = s.train.optimizer
    first = lr_at(0, lr=o.lr, min_lr=0.0, warmup_steps=o.warmup_steps, total_steps=8, schedule="constant")
    assert first == o.lr / 2  # the schedule warms up over those steps
    assert _resolved(**{"rollout.num_rollouts": 8}).train.optimizer.warmup_steps == 0


def test_slimes_warmup_fraction_flag_imports_to_the_field():
    result = convert_slime_args("--hf-checkpoint /m --colocate --num-rollout 10 --lr-warmup-fraction 0.1")
    assert ("--lr-warmup-fraction", "train.optimizer.warmup_fraction") in result.mapped, result.unmapped
    assert load_spec_text(result.yaml, file="imported.yaml").spec.train.optimizer.warmup_fraction == 0.1
