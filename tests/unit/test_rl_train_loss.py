"""``slime.rl.train_loss``: the spec's ``algorithm`` settings reach the loss the same way for both backends."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from slime.rl.losses import total_loss, value_loss  # noqa: E402
from slime.rl.train_loss import policy_loss_of, value_clip_of, value_loss_of, wants_entropy  # noqa: E402
from slime.spec.types import Algorithm, Critic  # noqa: E402


def _tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g)
    old = logp + 0.3 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    return logp, old, adv, mask


def test_every_algorithm_setting_reaches_total_loss():
    logp, old, adv, mask = _tensors()
    ref, ent, tis = logp - 0.1, torch.rand(3, 5), torch.full((3, 5), 1.5)
    a = Algorithm(
        estimator="ppo",
        eps_clip=0.1,
        eps_clip_high=0.3,
        dual_clip_c=3.0,
        entropy_coef=0.01,
        kl_loss_coef=0.2,
        kl_loss_type="k3",
        loss_agg="seq_mean_token_mean",
    )
    assert wants_entropy(a) and not wants_entropy(Algorithm())
    got, metrics = policy_loss_of(a, logp, old, adv, mask, entropy=ent, ref_logp=ref, tis_weights=tis)
    want, _ = total_loss(
        logp,
        old,
        adv,
        mask,
        estimator="ppo",
        eps_clip=0.1,
        eps_clip_high=0.3,
        dual_clip_c=3.0,
        entropy=ent,
        entropy_coef=0.01,
        ref_logp=ref,
        kl_loss_coef=0.2,
        kl_loss_type="k3",
        agg="seq_mean_token_mean",
        tis_weights=tis,
    )
    assert torch.equal(got, want) and {"kl_loss", "entropy", "dual_clipfrac"} <= set(metrics)


def test_no_old_log_probs_is_on_policy_and_reference_is_unused_without_kl_loss():
    logp, _, adv, mask = _tensors(1)
    loss, metrics = policy_loss_of(Algorithm(), logp, None, adv, mask, ref_logp=logp - 1.0, num_tokens=7.0)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0) and "kl_loss" not in metrics
    want, _ = total_loss(logp, logp.detach(), adv, mask, num_tokens=7.0)
    assert torch.equal(loss, want)


def test_the_value_clip_is_the_specs_with_one_default():
    assert value_clip_of(Algorithm(critic=Critic(value_clip=0.5))) == 0.5
    assert value_clip_of(Algorithm()) == Critic().value_clip  # no critic section: the spec type's default
    values, old, returns, mask = _tensors(2)
    a = Algorithm(estimator="ppo", critic=Critic(value_clip=0.05))
    got, _ = value_loss_of(a, values, old, returns, mask, num_tokens=9.0)
    want, _ = value_loss(values, old, returns, mask, value_clip=0.05, num_tokens=9.0)
    assert torch.equal(got, want)
