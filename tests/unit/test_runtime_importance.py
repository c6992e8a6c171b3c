"""A trainer rank's ``prepare`` (``TrainerRank``, run here as a plain object on one CPU rank: no Ray) with
engine log-probs that disagree with the trainer's, as stale samples of an async run do: the importance ratio
``exp(old - rollout)`` and its metrics by hand, the TIS weights it hands to the loss, and
``use_rollout_logprobs`` putting the engine's log-probs in place of the old ones."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace  # noqa: E402

from slime.models.tiny import build_tiny_model  # noqa: E402
from slime.runtime.train_data import collate  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.spec import load_spec  # noqa: E402
from slime.spec.types import Tis  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)
SHIFT = [0.5, -0.25, 0.0]  # engine log-prob = trainer's - shift: ratio exp(shift) per response token


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("importance") / "tiny", seed=0)


def rank(model_dir, **algorithm):
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    spec = replace(spec, algorithm=replace(spec.algorithm, **algorithm))
    r = TrainerRank(spec, "actor", 0, 1, threads=1, gpu_slot=False)
    r.init("127.0.0.1", 0, str(model_dir))
    return r


def stale_samples(r) -> list[dict]:
    """Two samples whose engine log-probs are the trainer's own shifted by SHIFT (the engine ran other weights)."""
    data = [{"tokens": [5, 6, 7, 8, 9, 10], "response_length": 3}, {"tokens": [11, 12, 13, 14], "response_length": 3}]
    batch = collate(data)
    own = r.backend.log_probs(batch, temperature=1.0)
    for i, s in enumerate(data):
        n = len(s["tokens"])
        s["rollout_log_probs"] = [float(own[i, t]) - d for t, d in zip(range(n - 4, n - 1), SHIFT)]
    return data


def test_stale_samples_get_a_ratio_other_than_one_and_tis_clamps_it(model_dir):
    r = rank(model_dir, tis=Tis(enabled=True, clip=1.5, clip_low=0.9))
    metrics, _ = r.prepare(stale_samples(r), [1.0, -1.0])
    ratios = [math.exp(d) for d in SHIFT] * 2  # [1.6487, 0.7788, 1.0] for each sample
    assert metrics["train/is_ratio_mean"] == pytest.approx(sum(ratios) / 6, rel=1e-5)
    assert metrics["train/is_ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-5)
    assert metrics["train/is_ratio_min"] == pytest.approx(math.exp(-0.25), rel=1e-5)
    assert metrics["train/logprob_diff"] == pytest.approx(0.75 / 3, rel=1e-4)
    assert metrics["train/tis_clipfrac"] == pytest.approx(4 / 6)  # 1.65 -> 1.5 and 0.78 -> 0.9, twice
    m = r.batch.response_mask.bool()
    assert r.batch.tis_weights[m].tolist() == pytest.approx([1.5, 0.9, 1.0] * 2, rel=1e-6)
    assert torch.equal(r.batch.tis_weights[~m], torch.ones_like(r.batch.tis_weights[~m]))  # padding: ratio 1
    step = r.train(1, 0)[0]
    assert step["pg_loss"] == step["pg_loss"]  # a finite step with the weights in the loss


def test_without_tis_no_weights_and_with_rollout_logprobs_the_ratio_uses_them(model_dir):
    plain = rank(model_dir)
    metrics, _ = plain.prepare(stale_samples(plain), [1.0, -1.0])
    assert plain.batch.tis_weights is None and "train/tis_clipfrac" not in metrics
    assert metrics["train/is_ratio_max"] > 1.6  # reported whenever the samples carry engine log-probs
    own = rank(model_dir, use_rollout_logprobs=True)
    data = stale_samples(own)
    own.prepare(data, [1.0, -1.0])
    m = own.batch.response_mask.bool()
    expected = torch.tensor([lp for s in data for lp in s["rollout_log_probs"]])
    assert torch.allclose(own.batch.old_log_probs[m], expected)  # the PPO ratio's denominator is the engine's


def test_tis_without_engine_log_probs_is_refused(model_dir):
    r = rank(model_dir, tis=Tis(enabled=True))
    with pytest.raises(ValueError, match="algorithm.tis needs the engine's rollout log-probs"):
        r.prepare([{"tokens": [5, 6, 7, 8], "response_length": 2}], [0.0])


def test_rollout_kl_is_the_k3_estimate_of_engine_vs_trainer_and_becomes_check_step0_kl(model_dir):
    """check/step0_kl can fail: engine log-probs shifted off the trainer's (an engine serving other weights)
    give the k3 value by hand, clearly non-zero; the trainer's own log-probs as the engine's give ~0."""
    from slime.rl.sample import Sample
    from slime.runtime.record import rollout_record

    r = rank(model_dir)
    metrics, _ = r.prepare(stale_samples(r), [1.0, -1.0])
    k3 = [math.exp(d) - 1 - d for d in SHIFT]  # log(trainer / engine) = d on each response token
    assert metrics["train/rollout_kl"] == pytest.approx(sum(k3) / 3, rel=1e-4)
    assert metrics["train/rollout_kl"] > 0.05
    agree = stale_samples(r)
    for s in agree:  # the engine gave each sampled token exactly the trainer's log-prob
        s["rollout_log_probs"] = [lp + d for lp, d in zip(s["rollout_log_probs"], SHIFT)]
    same, _ = r.prepare(agree, [1.0, -1.0])
    assert 0.0 <= same["train/rollout_kl"] < 1e-10 and same["train/logprob_diff"] < 1e-6
    small = stale_samples(r)
    for s in small:  # a mismatch of 0.01 nat per token: k3 ~ 5e-5, kept to 3 digits (float64, expm1)
        s["rollout_log_probs"] = [lp + d + 0.01 for lp, d in zip(s["rollout_log_probs"], SHIFT)]
    near, _ = r.prepare(small, [1.0, -1.0])
    assert near["train/rollout_kl"] == pytest.approx(math.expm1(-0.01) + 0.01, rel=1e-3)

    samples = [Sample(group_index=0, index=i, reward=1.0, response_length=3) for i in range(2)]
    kw = dict(step=1, weight_version=1, samples=samples, used_version=0, critic=[])
    step = r.train(1, 0)  # prepare() above kept the agreeing batch
    line = rollout_record(0, **kw, prepare=metrics, train=step)
    assert line["check/step0_kl"] == metrics["train/rollout_kl"] > 0.05
    assert abs(line["check/kl_before_update"]) < 1e-6  # the trainer against itself: blind to the engine
