"""The ``perf/*`` keys of a step (``slime.runtime.perf``): rates by hand, the trainer's FLOPs per pass, the peak
table (known GPUs only, bf16/fp16 only; never guessed), and the run's PerfModel from a config and rank info."""

from __future__ import annotations

import json

import pytest

from slime.models.flops import forward_flops, model_shape
from slime.rl.sample import Sample
from slime.runtime.perf import PerfModel, peak_tflops, perf_model, step_perf
from slime.spec import load_spec
from tests.fixtures.spec_helpers import ROOT

SHAPE = model_shape(
    {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
)


def samples() -> list[Sample]:
    # prompt 6 + response 4, prompt 5 + response 2, prompt 3 + response 1: 21 tokens, 7 of them generated
    return [
        Sample(tokens=list(range(10)), response_length=4),
        Sample(tokens=list(range(7)), response_length=2),
        Sample(tokens=list(range(4)), response_length=1),
    ]


def test_rates_and_flops_of_a_step_by_hand():
    model = PerfModel(shape=SHAPE, ref=False, critic=False, ranks=2, peak_tflops=100.0)
    times = {"time/generate_s": 0.5, "time/train_s": 2.0, "time/step_s": 4.0, "time/sync_s": 1.0, "time/eval_s": 0.5}
    out = step_perf(model, samples(), times)
    assert out["perf/rollout_tokens_per_s"] == 7 / 0.5 and out["perf/rollout_samples_per_s"] == 3 / 0.5
    assert out["perf/train_tokens_per_s"] == 21 / 2.0 and out["perf/train_samples_per_s"] == 3 / 2.0
    assert out["perf/samples_per_s"] == 3 / 4.0
    # old log-probs (1 forward) + training (3 forwards), no reference model, no critic
    flops = 4 * forward_flops(SHAPE, [10, 7, 4])
    assert out["perf/train_flops"] == flops
    assert out["perf/train_tflops"] == pytest.approx(flops / 2 / 2.0 / 1e12)  # per rank, per second
    assert out["perf/mfu"] == pytest.approx(out["perf/train_tflops"] / 100.0)
    # trainer busy 2 + 1 of 4 s; engines 0.5 + 1 + 0.5 of 4 s
    assert out["perf/trainer_idle_frac"] == pytest.approx(0.25) and out["perf/engine_idle_frac"] == pytest.approx(0.5)


def test_reference_model_and_critic_passes_are_counted():
    lengths = [10, 7, 4]
    policy, backbone = forward_flops(SHAPE, lengths), forward_flops(SHAPE.without_lm_head(), lengths)
    both = PerfModel(shape=SHAPE, ref=True, critic=True, ranks=1, peak_tflops=None)
    # actor: old + ref + 3 training passes; critic: values + 3 training passes on the backbone (value head h x 1)
    assert both.trainer_flops(lengths) == 5 * policy + 4 * backbone
    assert backbone < policy and SHAPE.without_lm_head().vocab == 1


def test_what_cannot_be_known_is_left_out():
    no_shape = PerfModel(shape=None, ref=False, critic=False, ranks=1, peak_tflops=None)
    out = step_perf(no_shape, samples(), {"time/train_s": 1.0, "time/step_s": 1.0})
    assert not {"perf/train_flops", "perf/train_tflops", "perf/mfu", "perf/rollout_tokens_per_s"} & set(out)
    assert out["perf/train_tokens_per_s"] == 21.0
    cpu = PerfModel(shape=SHAPE, ref=False, critic=False, ranks=1, peak_tflops=None)
    assert "perf/mfu" not in step_perf(cpu, samples(), {"time/train_s": 1.0, "time/step_s": 1.0})


@pytest.mark.parametrize(
    "name, precision, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 NVL", "fp16", 835.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H20", "bf16", 148.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA GB200", "bf16", 2500.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L40", "bf16", 181.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("AMD Instinct MI300X", "bf16", 1307.4),
        ("NVIDIA A10G", "bf16", None),  # not in the table: no guess from the "A10" in its name
        ("Tesla V100-SXM2-32GB", "fp16", None),
        ("NVIDIA H100 80GB HBM3", "fp32", None),  # fp32's peak depends on TF32: no MFU
        (None, "bf16", None),
    ],
)
def test_peak_table(name, precision, peak):
    assert peak_tflops(name, precision) == peak


def test_perf_model_of_a_run(tmp_path):
    spec = load_spec(ROOT / "specs" / "quickstart.yaml").spec
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})
    )
    gpu = [{"role": "actor", "device": "cuda:0", "device_name": "NVIDIA H200"}] * 2
    cpu = [{"role": "actor", "device": "cpu", "device_name": "Intel(R) Xeon(R) H200 lookalike"}]
    from msgspec.structs import replace

    bf16 = replace(spec, train=replace(spec.train, precision="bf16"))
    on_gpu = perf_model(bf16, tmp_path, gpu)
    assert on_gpu.ranks == 2 and on_gpu.peak_tflops == 989.5 and on_gpu.shape is not None
    assert not on_gpu.ref and not on_gpu.critic
    assert perf_model(bf16, tmp_path, cpu).peak_tflops is None  # a CPU never gets a peak, whatever its name
    assert perf_model(spec, tmp_path / "missing", cpu).shape is None
