"""Every cross-field rule (slime/spec/rules.py, the plug-ins' hooks modules) and layout rule (slime/layout.py):
a failing and a passing case.

Each failing case asserts the field path, words of the message and of the hint,
and the reported file:line:col (found independently by scanning the YAML text);
the matching passing case changes only what the rule is about. A coverage test
makes sure every registered rule has a failing case here. The cases are in
``tests/fixtures/spec_rule_cases.py`` (``test_spec_partial.py`` runs a property over them too).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from slime.spec import rules
from slime.spec.plugin import KINDS, hook, profiles
from slime.spec.resolve import resolve
from slime.spec.types import Spec
from tests.fixtures.hf_configs import QWEN25_7B
from tests.fixtures.spec_helpers import (
    CPU_SPEC,
    GPU_SPEC,
    ROOT,
    SPEC_FILE,
    errors_at,
    load,
    position_of,
    problems,
    spec,
    to_yaml,
)
from tests.fixtures.spec_rule_cases import CASES

G, C = GPU_SPEC, CPU_SPEC
DS = {"filter": "nonzero_std"}


def _ids(cases):
    return [c[0] for c in cases]


_GROUPS = ("RULES", "WARNINGS", "RAW_RULES", "RAW_WARNINGS")


def _registered() -> dict[str, tuple[str, object]]:
    """Every rule by name, with its group: the core's (slime.spec.rules) and every installed plug-in's hooks."""
    sources = [(g, getattr(rules, g)) for g in _GROUPS]
    sources += [(g, hook(p, g, ())) for kind in KINDS for p in profiles(kind).values() for g in _GROUPS]
    out: dict[str, tuple[str, object]] = {}
    for group, fns in sources:
        for fn in fns:
            assert out.get(fn.__name__, (group, fn))[1] is fn, f"two rules are named {fn.__name__}"
            out[fn.__name__] = (group, fn)
    return out


REGISTERED = _registered()


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_rule_fails_with_path_message_hint_and_origin(case):
    _, rule_name, base, bad, path, words, hint_words, _ = case
    data = spec(base, **bad)
    text = to_yaml(data)
    found = errors_at(problems(text), path)
    assert found, f"no error at {path}; got: {[p.format() for p in problems(text)]}"
    p = found[0]
    for w in words:
        assert w in p.message, (w, p.message)
    for w in hint_words:
        assert p.hint and w in p.hint, (w, p.hint)
    line, col = position_of(text, path)
    assert p.origin is not None and p.origin.file == SPEC_FILE
    assert (p.origin.line, p.origin.col) == (line, col), (p.format(), line, col)
    assert p.format().startswith(f"{SPEC_FILE}:{line}:{col}: error: {path}: ")


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_rule_passes_when_fixed(case):
    _, _, base, _, path, words, _, good = case
    found = [p for p in errors_at(problems(spec(base, **good)), path) if all(w in p.message for w in words)]
    assert not found, [p.format() for p in found]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_named_rule_reports_it(case):
    """The case exercises the rule it names (so the coverage test below means something)."""
    _, rule_name, base, bad, path, _, _, _ = case
    typed = msgspec.convert(spec(base, **bad), Spec)
    group, fn = REGISTERED[rule_name]
    findings = fn(typed) if group.startswith("RAW_") else fn(resolve(typed, ROOT))
    assert path in [f[0] for f in findings]


def test_every_rule_has_a_failing_case():
    # tested below: long_responses, sequence_parallel_without_tensor and (with a config.json) engine_heads;
    # memory_headroom (a warning, with a config.json) in tests/unit/test_fit_check.py
    covered = {c[1] for c in CASES} | {"long_responses", "sequence_parallel_without_tensor", "engine_heads"}
    covered |= {"memory_headroom"}
    covered |= {
        "container_image"
    }  # a warning: tests/unit/test_slurm_site.py::test_an_image_written_for_the_other_runtime_is_a_warning
    registered = set(REGISTERED)
    assert registered <= covered, f"rules without a test case: {registered - covered}"
    # the plug-ins' rules are in it (each plug-in's hooks module was found)
    assert {"one_machine", "time_limit", "data_parallel_only", "megatron_model", "one_device", "reserved_args"} <= (
        registered
    )


def test_base_specs_are_valid():
    assert problems(G) == []
    assert problems(C) == []


def test_long_responses_is_a_warning_not_an_error():
    loaded = load(spec(C, **{"rollout.max_prompt_len": 200, "rollout.max_response_len": 100}))
    (w,) = [p for p in loaded.warnings if p.path == "rollout.max_response_len"]
    assert w.severity == "warning" and "exceeds the model's context length 256" in w.message
    assert not load(C).warnings


def test_prefill_decode_groups_are_valid_and_runnable():
    """A run pairs their requests (slime.backends.rollout.pd): no warning that it would refuse them."""
    loaded = load(spec(G, **{"rollout.sglang.pd": {"prefill_engines": 1}}))
    assert not [p for p in loaded.warnings if p.path.startswith("rollout.sglang")]
    assert problems(spec(G, **{"rollout.sglang.pd": {"prefill_engines": 1}})) == []


def test_slurm_limits_under_the_local_launcher_are_refused():
    """SLURM's settings are the slurm launcher's section: under the local launcher it is refused as a whole,
    once, at the section (nothing would read it), and accepted with launcher: slurm."""
    limits = {"cluster.slurm.time_limit": "01:00:00", "cluster.slurm.mem": "1G"}
    found = problems(spec(C, **limits))
    assert [(p.path, p.severity) for p in found] == [("cluster.slurm", "error")]
    assert "the slurm launcher, but cluster.launcher is 'local': nothing would read them" in found[0].message
    assert problems(spec(C, **limits, **{"cluster.launcher": "slurm"})) == []


def test_sequence_parallel_with_tensor_1_is_a_warning_and_resolves_to_false():
    """megatron turns sequence parallelism off at tensor 1 (Megatron-LM's validate_args warns); slime's own
    scripts pass --sequence-parallel at TP 1. A warning at the field, and the resolved spec says false."""
    loaded = load(spec(G, **{"train.parallel": {"tensor": 1, "sequence_parallel": True}}))
    (w,) = [p for p in loaded.warnings if p.path == "train.parallel.sequence_parallel"]
    assert (
        w.severity == "warning" and "the trainer turns it off" in w.message and "sequence_parallel: false" in w.message
    )
    assert "train.parallel.tensor > 1" in w.hint
    assert loaded.spec.train.parallel.sequence_parallel is False
    kept = load(spec(G, **{"train.parallel": {"tensor": 2, "sequence_parallel": True}}))
    assert kept.spec.train.parallel.sequence_parallel is True
    assert not [p for p in kept.warnings if p.path == "train.parallel.sequence_parallel"]


def test_expert_grid_is_megatron_cores_not_data_parallel():
    """slime's Qwen3-30B-A3B recipe: 8 GPUs, TP 4, EP 8, expert-tensor 1. The expert grid is
    expert_tensor x expert x pipeline = 8, which divides 8 GPUs (parallel_state.initialize_model_parallel);
    the old rule ("expert divides GPUs / (tensor x pipeline)" = 2) refused it."""
    ok = spec(
        G,
        **{
            "cluster.nodes": 1,
            "train.parallel": {"tensor": 4, "expert": 8, "expert_tensor": 1, "sequence_parallel": True},
            "rollout.gpus_per_engine": 8,
            "train.global_batch_size": 32,
        },
    )
    loaded = load(ok)
    assert loaded.spec.train.parallel.expert_tensor == 1
    derived = load(spec(G, **{"train.parallel": {"tensor": 2}}))
    assert derived.spec.train.parallel.expert_tensor == 2  # derived: = tensor


def _model_dir(tmp_path: Path, **config) -> str:
    """A checkpoint dir holding only a config.json: Qwen2.5-7B's shape (28 heads, 4 KV heads), edited."""
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**QWEN25_7B, **config}))
    return str(model)


def test_tensor_parallel_must_divide_attention_and_kv_heads(tmp_path: Path):
    """A Qwen2.5-7B-shaped config: 28 heads, 4 key/value heads. Megatron asserts both divide by TP;
    SGLang needs the heads divisible by an engine's TP (KV heads divisible by it, or it by them)."""
    model = _model_dir(tmp_path)
    bad = spec(G, **{"model.path": model, "train.parallel.tensor": 8, "rollout.gpus_per_engine": 8})
    found = problems(bad)
    (t,) = errors_at(found, "train.parallel.tensor")
    assert "does not divide the model's 28 attention heads and 4 key/value heads" in t.message
    assert "divides 28 and 4" in t.hint
    (e,) = errors_at(found, "rollout.gpus_per_engine")
    assert "28 attention heads / 4 key/value heads" in e.message
    ok = spec(G, **{"model.path": model, "train.parallel.tensor": 4, "rollout.gpus_per_engine": 4})
    assert not errors_at(problems(ok), "train.parallel.tensor") and not errors_at(
        problems(ok), "rollout.gpus_per_engine"
    )
    # an engine of 8 GPUs with pp-size 2 runs TP 4: launch passes --tp-size 4, so validate checks 4
    piped = {"train.parallel.tensor": 4, "rollout.gpus_per_engine": 8, "rollout.sglang.args": {"pp-size": 2}}
    assert not errors_at(problems(spec(G, **{"model.path": model, **piped})), "rollout.gpus_per_engine")
    piped["rollout.gpus_per_engine"] = 16
    (e,) = errors_at(problems(spec(G, **{"model.path": model, **piped})), "rollout.gpus_per_engine")
    assert "tensor parallelism of 8 (gpus_per_engine 16 / pp-size 2)" in e.message
    # TP 2 engines on a 1-KV-head model: SGLang replicates the KV head (TP divisible by the KV heads)
    model = _model_dir(tmp_path, num_key_value_heads=1)
    assert not errors_at(
        problems(spec(G, **{"model.path": model, "train.parallel.tensor": 1})), "rollout.gpus_per_engine"
    )


@pytest.mark.parametrize(
    "edits",
    [
        {"rollout.dynamic_sampling": DS},
        {"rollout.partial": True, "rollout.over_sampling_batch_size": 6},
        {"agent": {"max_turns": 2}},
        {"debug": {"mode": "train_only", "load_rollouts": "r"}},
    ],
)
def test_a_variable_sample_count_lifts_the_divisibility_rule(edits):
    # 16 samples per rollout: a global batch of 12 neither divides them nor is a multiple of micro_batch_size 8
    odd = {"train.global_batch_size": 12, "train.micro_batch_size": 8}
    assert errors_at(problems(spec(C, **odd)), "train.global_batch_size")
    assert not errors_at(problems(spec(C, **odd, **edits)), "train.global_batch_size")
    typed = resolve(msgspec.convert(spec(C, **odd, **edits), Spec), ROOT)
    assert typed.train.num_steps_per_rollout == 1  # nominal: round(16 / 12)


def test_over_sampling_is_reported_beside_a_batch_size_error():
    found = problems(spec(G, **{"train.global_batch_size": 100, "rollout.over_sampling_batch_size": 8}))
    assert errors_at(found, "train.global_batch_size") and errors_at(found, "rollout.over_sampling_batch_size")


def test_pipeline_must_divide_model_layers(tmp_path: Path):
    model = _model_dir(tmp_path, num_hidden_layers=6, max_position_embeddings=4096)
    bad = spec(G, **{"model.path": model, "train.parallel": {"tensor": 2, "pipeline": 4}})
    (p,) = errors_at(problems(bad), "train.parallel.pipeline")
    assert (
        "train.parallel.pipeline=4 does not divide the model's 6 layers" in p.message and "num_hidden_layers" in p.hint
    )
    assert not errors_at(problems(spec(bad, **{"train.parallel.pipeline": 2})), "train.parallel.pipeline")
    # The context length comes from config.json: max_prompt_len must stay below it.
    long = spec(G, **{"model.path": model, "rollout.max_prompt_len": 4096})
    (p,) = errors_at(problems(long), "rollout.max_prompt_len")
    assert "context length 4096" in p.message


def test_check_paths_requires_local_files(tmp_path: Path):
    data = spec(C, **{"data.prompts": "train.jsonl", "data.eval": [{"name": "h", "path": "held.jsonl"}]})
    found = problems(data, base_dir=tmp_path, check_paths=True)
    assert {p.path for p in found} == {"data.prompts", "data.eval[0].path"}
    assert all(str(tmp_path) in p.message and "relative to the spec file" in p.hint for p in found)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    (tmp_path / "held.jsonl").write_text('{"prompt": "1+2", "label": "3"}\n')
    assert problems(data, base_dir=tmp_path, check_paths=True) == []
    missing_model = spec(G, **{"model.path": str(tmp_path / "nope")})
    (p,) = errors_at(problems(missing_model, check_paths=True), "model.path")
    assert "checkpoint directory not found" in p.message
    assert problems(missing_model) == []  # without check_paths nothing is read


def test_rule_problems_are_all_reported_together():
    """Five independent rule mistakes in one spec: five problems, one SpecError."""
    bad = spec(
        G,
        **{
            "rollout.temperature": 0.0,
            "algorithm.dual_clip_c": 0.5,
            "reward.type": "remote",
            "train.optimizer": {"lr": 1e-6, "min_lr": 1e-3},
            "train.parallel.expert": 3,
            "train.parallel.tensor": 1,
        },
    )
    found = problems(bad)
    assert {p.path for p in found} == {
        "rollout.temperature",
        "algorithm.dual_clip_c",
        "reward.url",
        "train.optimizer.min_lr",
        "train.parallel.expert",
    }
