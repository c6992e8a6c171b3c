"""slime's newer modes through ``import-slime-args``: on-policy distillation, critic-only warm-up and external
engines each land on their slime/v2 field (and validate), or are refused or dropped with slime's reason."""

from __future__ import annotations

import json

import pytest

from slime.migrate.importer import convert_slime_args
from slime.spec import SpecError, load_spec_text

BASE = "--hf-checkpoint /m --colocate --actor-num-gpus-per-node 8 --rollout-num-gpus-per-engine 2"


def _spec(flags: str):
    result = convert_slime_args(f"{BASE} {flags}")
    assert result.accepted(), (result.refused, result.conflicts, [p.format() for p in result.problems])
    return result, load_spec_text(result.yaml, file="imported.yaml").spec


def test_opd_with_a_megatron_teacher_maps_to_the_trainer_type(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    result, spec = _spec(f"--use-opd --opd-type megatron --opd-teacher-load {teacher} --opd-kl-coef 0.5")
    assert (spec.algorithm.opd.teacher, spec.algorithm.opd.type, spec.algorithm.opd.kl_coef) == (
        str(teacher),
        "trainer",
        0.5,
    )
    assert dict(result.mapped)["--use-opd"] == "algorithm.opd"
    assert "algorithm.opd.teacher" not in dict(result.placeholders)


def test_a_megatron_checkpoint_teacher_becomes_a_placeholder_naming_the_flag():
    result, spec = _spec("--use-opd --opd-type megatron --opd-teacher-load /ckpt/teacher_torch_dist")
    assert spec.algorithm.opd.kl_coef == 1.0  # slime's default
    assert "/ckpt/teacher_torch_dist is a Megatron checkpoint" in dict(result.placeholders)["algorithm.opd.teacher"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ("--use-opd --opd-type sglang", "teacher SGLang server the job does not start"),
        ("--use-opd --opd-teacher-load /t", "needs one --opd-type"),
        ("--use-opd --opd-type megatron", "needs one --opd-teacher-load"),
        ("--use-opd --opd-type megatron --opd-teacher-load /t --opd-teacher-ckpt-step 40", "export that iteration"),
    ],
)
def test_opd_forms_slime_submit_cannot_run_are_refused_with_the_reason(flags, words):
    result = convert_slime_args(f"{BASE} {flags}")
    assert not result.accepted() and any(words in why for _, why in result.refused), result.refused


def test_opd_settings_without_use_opd_are_dropped_as_slime_ignores_them():
    result, spec = _spec("--opd-kl-coef 0.3 --opd-type megatron")
    assert spec.algorithm.opd is None
    assert dict(result.unmapped)["--opd-kl-coef"] == "slime reads it only with --use-opd"


def test_critic_only_steps_map_for_ppo_and_are_dropped_otherwise():
    _, spec = _spec("--advantage-estimator ppo --num-critic-only-steps 3")
    assert spec.algorithm.critic.warmup_rollouts == 3
    result, spec = _spec("--num-critic-only-steps 3")
    assert (
        spec.algorithm.estimator == "grpo"
        and "only with --advantage-estimator ppo" in dict(result.unmapped)["--num-critic-only-steps"]
    )


def test_external_engine_addresses_become_engines_the_job_does_not_start():
    flags = "--hf-checkpoint /m --actor-num-gpus-per-node 8 --rollout-external-engine-addrs"
    result = convert_slime_args(f"{flags} 10.0.0.5:30000 10.0.0.6:30001")
    assert result.accepted(), [p.format() for p in result.problems]
    spec = load_spec_text(result.yaml, file="imported.yaml").spec
    assert spec.rollout.external == ("10.0.0.5:30000", "10.0.0.6:30001") and spec.rollout.num_engines == 2
    assert spec.cluster.nodes == 1 and "rollout.gpus" not in dict(result.placeholders)  # no GPUs for them
    colocated = convert_slime_args(f"{flags} 10.0.0.5:30000 --colocate")  # they cannot share the trainer's GPUs
    assert not colocated.accepted() and any(p.path == "rollout.colocate" for p in colocated.problems)
    bad = convert_slime_args(f"{flags} http://10.0.0.5")
    with pytest.raises(SpecError) as exc:  # slime takes host:port; the spec's pattern says so at validate
        load_spec_text(bad.yaml, file="imported.yaml")
    assert any(p.path.startswith("rollout.external") for p in exc.value.problems)
