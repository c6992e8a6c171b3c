"""``kind: SFTJob`` on Megatron, validated and rendered: the trainer arguments say the loss (sft_loss, per
token, no advantages). The megatron backend's SFT step on CPU/gloo was not run for this kind."""

from __future__ import annotations

import pytest

from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

pytest.importorskip("msgspec")

SFT = {
    "kind": "SFTJob",
    "rollout.n_samples_per_prompt": 1,
    "train.global_batch_size": 32,
    "data.input_key": "messages",
    "data.apply_chat_template": True,
    "algorithm": {},
}


def test_an_sft_job_renders_for_megatron_with_the_sft_loss_and_no_advantages():
    from slime.backends.megatron.render import render_megatron_args

    text = render_megatron_args(load(spec(GPU_SPEC, **SFT)).spec)
    assert "loss: sft_loss" in text and "no advantages or returns" in text
    assert "loss: sft_loss" not in render_megatron_args(load(GPU_SPEC).spec)
