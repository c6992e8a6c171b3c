"""The ``metrics.jsonl`` line of a rollout and of the warm-up (``slime.runtime.record``), from hand-made parts."""

from __future__ import annotations

import pytest

from slime.rl.sample import Sample, SampleStatus
from slime.runtime.record import mean_metrics, rollout_record, sample_metrics, warmup_record


def _samples(rewards, versions, statuses=None, group_size=2):
    statuses = statuses or [SampleStatus.COMPLETED] * len(rewards)
    return [
        Sample(group_index=i // group_size, index=i, reward=r, response_length=2 + i, weight_version=v, status=s)
        for i, (r, v, s) in enumerate(zip(rewards, versions, statuses))
    ]


PREPARE = {
    "train/logprob_diff": 2e-7,
    "train/rollout_kl": 3e-6,
    "train/tokens": 40.0,
    "train/ref_kl": 0.0,
    "time/prepare_s": 0.5,
}
TRAIN = [
    {"loss": 1.0, "approx_kl": 1e-8, "lr": 1e-3, "step_time_s": 0.25},
    {"loss": 3.0, "approx_kl": 0.1, "lr": 2e-3, "step_time_s": 0.75},
]


def test_sample_metrics_count_full_credit_flat_groups_and_stale_samples():
    rewards = [1.0, 0.5, 0.0, 0.0]  # group 0 mixed, group 1 flat
    samples = _samples(rewards, [3, 3, 3, 2], [SampleStatus.COMPLETED] * 3 + [SampleStatus.TRUNCATED])
    m = sample_metrics(samples, 3)
    assert m["rollout/samples"] == 4
    assert m["rollout/reward_mean"] == pytest.approx(0.375) and m["rollout/accuracy"] == 0.25
    assert m["rollout/zero_std_groups"] == 0.5 and m["rollout/truncated_frac"] == 0.25
    assert m["rollout/response_len_mean"] == 3.5 and m["rollout/weight_version"] == 3
    assert m["check/stale_samples"] == 1 and m["rollout/offpolicy_token_frac"] == 0.0
    # groups are group_index, of any size: one group of three mixed rewards and one lone sample
    uneven = _samples([1.0, 0.0, 0.0, 1.0], [3] * 4)
    for s, g in zip(uneven, (0, 0, 0, 1)):
        s.group_index = g
    assert sample_metrics(uneven, 3)["rollout/zero_std_groups"] == 0.5
    # a continued partial response: its newest tokens are from the current version, its first from an older one
    cont = _samples([1.0], [2])[0]
    cont.token_versions = [2, 2, 3]
    cont.response_length = 3
    m = sample_metrics([cont], 3)
    assert m["check/stale_samples"] == 0 and m["rollout/offpolicy_token_frac"] == pytest.approx(2 / 3)


def test_mean_metrics_average_the_steps_and_keep_the_last_learning_rate():
    assert mean_metrics("train", []) == {}
    m = mean_metrics("critic", [{"value_loss": 1.0, "lr": 1.0, "x": None}, {"value_loss": 2.0, "lr": 5.0, "x": None}])
    assert m == {"critic/value_loss": 1.5, "critic/lr": 5.0}


def test_a_rollout_line_holds_every_part_and_the_step0_checks_only_at_rollout_0():
    samples = _samples([1.0, 0.0], [4, 4])
    line = rollout_record(
        0,
        step=2,
        weight_version=5,
        samples=samples,
        used_version=4,
        prepare=PREPARE,
        train=TRAIN,
        critic=[{"value_loss": 0.5, "step_time_s": 1.0}],
    )
    assert (line["rollout_id"], line["step"], line["weight_version"], line["rollout/weight_version"]) == (0, 2, 5, 4)
    assert line["check/stale_samples"] == 0 and line["train/logprob_diff"] == 2e-7
    assert line["train/loss"] == 2.0 and line["train/lr"] == 2e-3 and line["critic/value_loss"] == 0.5
    assert line["time/train_steps_s"] == 1.0 and line["time/critic_steps_s"] == 1.0
    assert "train/step_time_s" not in line and TRAIN[0]["step_time_s"] == 0.25  # the caller's dicts unchanged
    assert line["check/kl_before_update"] == 1e-8  # the first step's approx_kl: the trainer against itself
    assert line["check/step0_kl"] == 3e-6 == line["train/rollout_kl"]  # engine vs trainer, not the trainer's own
    assert line["check/step0_logprob_diff"] == 2e-7 and line["check/step0_ref_kl"] == 0.0
    later = rollout_record(
        1,
        step=4,
        weight_version=6,
        samples=samples,
        used_version=5,
        prepare=PREPARE,
        train=TRAIN,
        critic=[],
    )
    assert not [k for k in later if k.startswith("check/step0")] and "time/critic_steps_s" not in later
    assert later["check/stale_samples"] == 2  # the samples say version 4, the engines were told 5


def test_an_agent_rollout_line_adds_the_agent_metrics():
    samples = _samples([1.0, 0.0], [0, 0])
    for s, calls in zip(samples, ([{"ok": True, "sandbox_id": "local-1"}], [])):
        s.metadata["agent"] = {"tool_calls": calls, "turns": 2, "stop": "answer", "sandbox_id": "local-1"}
    kw = dict(step=1, weight_version=1, samples=samples, used_version=0)
    line = rollout_record(3, **kw, prepare={}, train=TRAIN[:1], critic=[], agent=True)
    assert line["agent/tool_calls"] == 1.0 and line["agent/tool_call_rate"] == 0.5
    assert not [k for k in rollout_record(3, **kw, prepare={}, train=TRAIN[:1], critic=[]) if k.startswith("agent/")]


def test_a_rollout_without_optimizer_steps_has_no_train_keys():
    line = rollout_record(
        0,
        step=0,
        weight_version=0,
        samples=_samples([1.0, 0.0], [0, 0]),
        used_version=0,
        prepare={},
        train=[],
        critic=[],
    )
    assert line["rollout/samples"] == 2 and not [k for k in line if k.startswith(("train/", "check/kl", "check/step0"))]


def test_the_warmup_keys():
    assert warmup_record([], 1.0) == {}
    assert warmup_record([3.0, 2.0, 0.5], 9.0) == {
        "sft/loss": 0.5,
        "sft/loss_first": 3.0,
        "sft/steps": 3,
        "time/sft_s": 9.0,
    }


def test_staleness_counts_the_updates_the_policy_is_ahead_of_each_sample():
    # async: the trainer's policy is version 6; the samples came from versions 5 and 4 (one lagging engine)
    line = rollout_record(
        3,
        step=4,
        weight_version=7,
        samples=_samples([1.0, 0.0, 0.0], [5, 5, 4]),
        used_version=5,
        policy_version=6,
        prepare=PREPARE,
        train=TRAIN,
        critic=[],
    )
    assert line["rollout/staleness_mean"] == pytest.approx(4 / 3) and line["rollout/staleness_max"] == 2
    assert line["check/stale_samples"] == 1  # the version-4 sample: not what the engines were told to serve
    sync = rollout_record(
        0,
        step=1,
        weight_version=2,
        samples=_samples([1.0], [1]),
        used_version=1,
        policy_version=1,
        prepare=PREPARE,
        train=TRAIN,
        critic=[],
    )
    assert sync["rollout/staleness_mean"] == sync["rollout/staleness_max"] == 0
