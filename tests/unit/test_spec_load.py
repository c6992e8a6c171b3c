"""Loading a spec: YAML errors, schema errors with did-you-mean, odd YAML values, ``--set`` overrides,
every problem in one pass, and the resolved spec with every default and derived value visible."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from slime.spec import SpecError, load_spec
from tests.fixtures.spec_helpers import (
    CPU_SPEC,
    DELETE,
    GPU_SPEC,
    SPEC_FILE,
    errors_at,
    load,
    position_of,
    problems,
    spec,
    to_yaml,
)

C, G = CPU_SPEC, GPU_SPEC


def only(found, path=None):
    found = [p for p in found if path is None or p.path == path]
    assert len(found) == 1, [p.format() for p in found]
    return found[0]


def at(text: str, path: str) -> tuple[int, int]:
    return position_of(text, path)


# ----------------------------------------------------------------------------- YAML itself
@pytest.mark.parametrize(
    "text, line, words",
    [
        ("apiVersion: slime/v2\nkind: RLJob\nmodel: [unclosed\nname: x\n", 4, ["YAML syntax error"]),
        ("apiVersion: slime/v2\nkind: RLJob\nname: a\nname: b\n", 4, ["duplicate key", "name"]),
        ("apiVersion: slime/v2\nmodel:\n\tbuiltin: tiny\n", 3, ["YAML syntax error"]),
        ("apiVersion: slime/v2\n---\napiVersion: slime/v2\n", 2, ["single document"]),
        ("apiVersion: slime/v2\nname: 'unterminated\n", 3, ["YAML syntax error"]),
    ],
)
def test_yaml_errors_give_the_line(text, line, words):
    p = only(problems(text))
    assert p.origin.file == SPEC_FILE and p.origin.line == line, p.format()
    for w in words:
        assert w in p.message
    assert p.hint


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "42\n", "just text\n"])
def test_a_document_that_is_not_a_mapping(text):
    p = only(problems(text))
    assert p.message == "the spec must be a YAML mapping" and "quickstart" in p.hint


def test_runaway_nesting_is_a_problem_not_a_crash():
    p = only(problems("a: " + "[" * 600 + "]" * 600 + "\n"))
    assert "nested too deeply" in p.message


def test_an_alias_bomb_is_a_problem_not_a_hang():
    """A few hundred bytes of nested aliases ("billion laughs") would expand to 10**9 values."""
    lines = ["apiVersion: slime/v2", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    p = only(problems("\n".join(lines) + "\n"))
    assert "expands to more than" in p.message and "aliases" in p.hint


def test_a_mapping_as_a_key_is_a_problem():
    p = only(problems("apiVersion: slime/v2\n? {a: {b: 1}}\n: 1\n"))
    assert "mapping key is itself a mapping" in p.message


# ----------------------------------------------------------------------------- apiVersion / kind
def test_unknown_api_version_lists_the_supported_ones():
    text = to_yaml(spec(C, apiVersion="slime/v9"))
    p = only(problems(text))
    assert p.path == "apiVersion" and "unknown apiVersion 'slime/v9'" in p.message
    assert p.hint == "supported versions: slime/v1, slime/v2"
    assert (p.origin.line, p.origin.col) == at(text, "apiVersion")


def test_missing_api_version():
    p = only(problems(spec(C, apiVersion=DELETE)))
    assert p.message == "apiVersion is missing" and "slime/v2" in p.hint


def test_wrong_kind_suggests_the_right_one():
    text = to_yaml(spec(C, kind="RLjob"))
    p = only(problems(text))
    assert p.path == "kind" and "'RLjob' is not a valid value" in p.message
    assert p.hint.startswith("did you mean 'RLJob'?")
    assert p.origin.line == at(text, "kind")[0]


# ----------------------------------------------------------------------------- unknown keys, enums, types
@pytest.mark.parametrize(
    "typo, path, suggestion",
    [
        ("modle", "modle", "model"),
        ("rollout.temprature", "rollout.temprature", "temperature"),
        ("train.parallel.tensr", "train.parallel.tensr", "tensor"),
        ("data.eval[0].intervall", "data.eval[0].intervall", "interval"),
        ("cluster.gpus_per_nod", "cluster.gpus_per_nod", "gpus_per_node"),
    ],
)
def test_unknown_keys_say_did_you_mean(typo, path, suggestion):
    text = to_yaml(spec(G, **{typo: 3}))
    p = only(problems(text))
    assert p.path == path and p.message == f"unknown field '{path.rsplit('.', 1)[-1]}'"
    assert p.hint.startswith(f"did you mean '{suggestion}'?") and "valid keys here:" in p.hint
    assert (p.origin.line, p.origin.col) == at(text, path)


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("train.parallel.tp", "tensor"),
        ("train.parallel.pipeline-model-parallel-size", "pipeline"),
        ("train.parallel.cp", "context"),
        ("train.actor_num_gpus_per_node", "gpus_per_node"),
        ("rollout.rollout_batch_size", "batch_size"),
        ("rollout.num_rollout", "num_rollouts"),
        ("algorithm.advantage_estimator", "estimator"),
    ],
)
def test_megatron_and_slime_flag_names_suggest_the_spec_field(key, suggestion):
    """Edit distance cannot find 'tensor' for 'tp'; users coming from Megatron/slime flags get the field."""
    p = only(problems(spec(G, **{key: 2})))
    assert p.message == f"unknown field '{key.rsplit('.', 1)[-1]}'"
    assert p.hint.startswith(f"did you mean '{suggestion}'?"), p.hint


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("rollout.tp", "train.parallel.tensor"),  # rollout has no 'tensor': name the field's full path
        ("train.rollout_batch_size", "rollout.batch_size"),  # not train.micro_batch_size, the closest spelling
        ("tp", "train.parallel.tensor"),
        ("train.temperature", "rollout.temperature"),
    ],
)
def test_a_flag_name_in_the_wrong_section_is_answered_with_its_full_path(key, suggestion):
    p = only(problems(spec(G, **{key: 2})))
    assert p.hint.startswith(f"did you mean '{suggestion}'?") and "valid keys here:" in p.hint, p.hint


def test_every_flag_alias_names_a_real_field():
    from slime.spec.overrides import parse_path
    from slime.spec.schema import FLAG_ALIASES, subschema

    assert all(subschema("slime/v2", parse_path(target)) is not None for target in FLAG_ALIASES.values())


def test_each_missing_required_field_is_reported_once():
    found = problems({"apiVersion": "slime/v2"})
    paths = [p.path for p in found]
    assert sorted(paths) == sorted(set(paths)) and {"kind", "name", "model", "data"} <= set(paths), paths


def test_unknown_key_without_a_close_match_lists_the_valid_keys():
    p = only(problems(spec(G, **{"rollout.zzzz": 1})))
    assert "did you mean" not in p.hint and "temperature" in p.hint and "batch_size" in p.hint


@pytest.mark.parametrize(
    "path, typo, right",
    [
        ("rollout.backend", "sglng", "sglang"),
        ("algorithm.estimator", "gpro", "grpo"),
        ("cluster.launcher", "slrum", "slurm"),
        ("train.backend", "megatorn", "megatron"),
        ("algorithm.kl_loss_type", "low_var_k1", "low_var_kl"),
        ("logging.wandb.mode", "onlin", "online"),
    ],
)
def test_enum_typos_say_did_you_mean(path, typo, right):
    text = to_yaml(spec(G, **{path: typo}))
    p = only(problems(text))
    assert p.path == path and f"'{typo}' is not a valid value" in p.message
    assert p.hint.startswith(f"did you mean '{right}'?") and "valid values:" in p.hint
    assert p.origin.line == at(text, path)[0]


@pytest.mark.parametrize(
    "path, value, words",
    [
        ("train.seed", "abc", ["expected an integer", "'abc'"]),
        ("cluster.nodes", 0, ["less than the minimum of 1"]),
        ("rollout.top_p", 1.5, ["maximum of 1"]),
        ("name", "Bad_Name", ["'Bad_Name' has the wrong format"]),
        ("cluster.slurm.time_limit", "soon", ["wrong format"]),
        ("rollout.colocate", "maybe", ["expected true or false"]),
        ("train.optimizer.betas", [0.9], ["too short"]),
        ("data.eval", {"name": "x"}, ["expected a list"]),
        ("reward.custom", "not a plugin path", ["wrong format"]),
    ],
)
def test_type_and_constraint_errors_name_the_field(path, value, words):
    text = to_yaml(spec(G, **{path: value}))
    p = only(problems(text))
    assert p.path == path, p.format()
    for w in words:
        assert w in p.message, p.message
    assert p.origin.line == at(text, path)[0]


def test_a_missing_required_field_says_where_to_add_it():
    p = only(problems(spec(G, **{"data.prompts": DELETE})))
    assert p.path == "data.prompts" and p.message == "required field 'prompts' is missing"
    assert "add 'prompts:' under 'data'" in p.hint and "JSONL" in p.hint


def test_an_integer_written_as_a_float_is_reported_at_its_field():
    text = to_yaml(spec(G, **{"train.seed": 1.0}))
    p = only(problems(text))
    assert p.path == "train.seed" and "Expected `int`, got `float`" in p.message
    assert (p.origin.line, p.origin.col) == at(text, "train.seed")


# ----------------------------------------------------------------------------- YAML values JSON cannot hold
@pytest.mark.parametrize(
    "yaml_value, words",
    [
        ("!!binary aGVsbG8=", ["binary"]),
        ("!!set {a, b}", ["sets"]),
        ("!custom thing", ["tag '!custom'"]),
        (".nan", ["not a finite number"]),
        ("-.inf", ["not a finite number"]),
        ('"a\\0b"', ["NUL"]),
        ("123456789012345678901234567890", ["does not fit in 64 bits"]),
    ],
)
def test_odd_yaml_values_are_problems_with_a_line(yaml_value, words):
    text = to_yaml(G).replace("temperature", "x")  # no temperature key in G; put the value in description
    text = text.replace("name: gpu-base\n", f"name: gpu-base\ndescription: {yaml_value}\n")
    p = only(problems(text))
    assert p.path == "description"
    for w in words:
        assert w in p.message, p.message
    assert p.origin.line == 4


def test_timestamps_and_str_tags_stay_the_text_written():
    text = to_yaml(G).replace("name: gpu-base\n", "name: 2024-01-01\ndescription: !!str 42\n")
    loaded = load(text)
    assert loaded.spec.name == "2024-01-01" and loaded.spec.description == "42"


# ----------------------------------------------------------------------------- every problem at once
def test_five_independent_schema_mistakes_give_five_problems():
    bad = spec(
        G, **{"modle": 1, "rollout.backend": "sglng", "train.seed": "x", "data.prompts": DELETE, "name": "Bad Name"}
    )
    text = to_yaml(bad)
    found = problems(text)
    assert {p.path for p in found} == {"modle", "rollout.backend", "train.seed", "data.prompts", "name"}
    assert len(found) == 5 and all(p.origin and p.origin.line for p in found)
    assert "5 problems in spec" in SpecError(found).format()


# ----------------------------------------------------------------------------- --set overrides
def test_overrides_apply_before_validation():
    bad_file = spec(G, **{"rollout.temperature": 0.0})
    assert errors_at(problems(bad_file), "rollout.temperature")
    loaded = load(bad_file, overrides=["rollout.temperature=0.7", "train.seed=7", "data.eval[0].interval=5"])
    s = loaded.spec
    assert (s.rollout.temperature, s.train.seed, s.data.eval[0].interval) == (0.7, 7, 5)


def test_override_values_are_parsed_as_yaml():
    s = load(
        G,
        overrides=[
            "train.optimizer.betas=[0.8, 0.9]",
            "cluster.env={A: '1'}",
            "description=hello world",
            "data.eval[1]={name: b, path: /b.jsonl}",
        ],
    ).spec
    assert s.train.optimizer.betas == (0.8, 0.9) and s.cluster.env == {"A": "1"}
    assert s.description == "hello world" and [e.name for e in s.data.eval] == ["aime", "b"]


@pytest.mark.parametrize(
    "override, path, words",
    [
        ("train.seed=abc", "train.seed", ["expected an integer"]),
        ("rollout.temprature=1.0", "rollout.temprature", ["unknown field"]),
        ("rollout.temperature=0", "rollout.temperature", ["must be > 0"]),  # a rule, not the schema
        ("model={builtin: tinyy}", "model.builtin", ["not a valid value"]),
        ("model.builtin.x=1", "model.builtin", ["not a valid value"]),
        ("train.seed=2024-01-01", "train.seed", ["'2024-01-01'"]),
        ("description=.nan", "description", ["finite"]),
        # the file's version is checked (and an older one upgraded) before overrides: a --set one is a value
        ("apiVersion=slime/v9", "apiVersion", ["'slime/v9' is not a valid value"]),
    ],
)
def test_errors_in_overrides_point_at_the_override(override, path, words):
    found = problems(G, overrides=[override])
    p = only(found, path)
    assert p.origin.override == f"--set {override}" and str(p.origin) == f"--set {override}"
    assert p.format().startswith(f"--set {override}: error: {path}")
    for w in words:
        assert w in p.message


def test_did_you_mean_for_an_override():
    p = only(problems(G, overrides=["rollout.temprature=1.0"]))
    assert p.hint.startswith("did you mean 'temperature'?")


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.seed", ["bad override"]),
        ("=3", ["bad override"]),
        (".=3", ["bad override"]),
        ("[0]=1", ["bad override"]),
        ("data.eval[-1].path=x", ["bad override"]),
        ("data.eval[5].path=x", ["index 5 is out of range", "has 1 item(s)", "[1]"]),
        ("data.eval.name=x", ["'data.eval' is a list", "data.eval[0].name"]),
    ],
)
def test_malformed_overrides_are_never_dropped_silently(override, words):
    p = only(problems(G, overrides=[override]))
    assert p.origin.override == f"--set {override}"
    for w in words:
        assert w in p.message, p.message


def test_override_problems_and_file_problems_are_reported_together():
    found = problems(spec(G, **{"rollout.backend": "sglng"}), overrides=["train.seed", "train.sed=1"])
    assert {p.path for p in found} == {"", "rollout.backend", "train.sed"}


def test_a_malformed_override_does_not_hide_rule_problems():
    found = problems(spec(G, **{"rollout.temperature": 0.0}), overrides=["train.seed"])
    assert {p.path for p in found} == {"", "rollout.temperature"}


def test_sweep_grid_as_an_override():
    loaded = load(G, overrides=['sweep.grid={"train.seed": [1, 2], "rollout.temperature": [0.5, 1.0]}'])
    assert [(t.spec.train.seed, t.spec.rollout.temperature) for t in loaded.tasks] == [
        (1, 0.5),
        (1, 1.0),
        (2, 0.5),
        (2, 1.0),
    ]
    p = only(problems(G, overrides=['sweep.grid={"train.sed": [1, 2]}']))
    assert p.path == "sweep.grid.train.sed" and p.origin.override.startswith("--set sweep.grid=")
    assert "did you mean 'train.seed'?" in p.hint


# ----------------------------------------------------------------------------- resolved: defaults visible
def test_derived_values_are_filled_in_the_resolved_spec():
    s = load(G).spec
    assert (s.train.nodes, s.train.gpus_per_node) == (2, 8)
    assert s.rollout.gpus == 16 and s.rollout.num_engines == 8  # colocated: the actor's GPUs
    assert s.rollout.weight_sync == "disk" and s.rollout.over_sampling_batch_size == 32
    assert (s.train.global_batch_size, s.train.num_steps_per_rollout) == (256, 1)
    assert s.algorithm.eps_clip_high == s.algorithm.eps_clip == 0.2
    assert s.algorithm.normalize_std is True and s.algorithm.critic is None
    assert s.model.tokenizer == s.model.path and s.logging.wandb.group == "gpu-base"
    assert s.cluster.cpus_per_node is None  # SLURM decides unless given

    c = load(C).spec
    assert c.cluster.cpus_per_node == (os.cpu_count() or 1) and c.model.max_context_len == 256
    assert c.rollout.num_engines == 1 and c.rollout.gpus == 0 and c.train.num_steps_per_rollout == 1

    d = load(
        spec(
            G,
            **{"rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 4, "train.global_batch_size": 128},
        )
    ).spec
    assert d.rollout.weight_sync == "nccl" and d.rollout.num_engines == 2

    p = load(spec(G, **{"algorithm.estimator": "ppo", "algorithm.kl_coef": 0.01, "model.ref_path": "initial"})).spec
    assert p.algorithm.critic is not None and p.algorithm.critic.lr == 1e-5 and p.model.critic_path == p.model.path
    assert p.algorithm.normalize_std is False

    s2 = load(spec(G, **{"train.global_batch_size": DELETE, "train.num_steps_per_rollout": 4})).spec
    assert s2.train.global_batch_size == 64


def test_every_default_is_written_in_the_resolved_json():
    resolved = json.loads(msgspec.json.encode(load(C).spec))
    assert resolved["train"]["optimizer"] == {
        "name": "adam",
        "lr": 1e-6,
        "min_lr": 0.0,
        "lr_schedule": "constant",
        "warmup_steps": 0,
        "warmup_fraction": None,
        "weight_decay": 0.0,
        "betas": [0.9, 0.98],
        "eps": 1e-8,
        "clip_grad": 1.0,
        "distributed": False,  # derived: the torch backend keeps a full copy per rank
    }
    assert resolved["rollout"]["temperature"] == 1.0 and resolved["rollout"]["weight_sync"] == "disk"
    assert resolved["algorithm"]["lambda"] == 1.0 and resolved["cluster"]["bootstrap_timeout_s"] == 300.0


def test_num_rollouts_from_epochs_counts_the_prompt_file(tmp_path: Path):
    (tmp_path / "p.jsonl").write_text("".join(f'{{"prompt": "{i}"}}\n' for i in range(10)) + "\n")
    data = spec(C, **{"rollout.num_rollouts": DELETE, "rollout.epochs": 3, "data.prompts": "p.jsonl"})
    assert load(data, base_dir=tmp_path).spec.rollout.num_rollouts == (10 // 4) * 3


def test_relative_paths_become_absolute_against_the_spec_dir(tmp_path: Path):
    data = spec(
        C,
        **{
            "data.prompts": "data/train.jsonl",
            "data.eval": [{"name": "h", "path": "../held.jsonl"}],
            "logging.dir": "runs",
            "train.checkpoint": {"dir": "ck", "load": "~/resume"},
            "model.ref_path": "initial",
        },
    )
    (tmp_path / "sub").mkdir()
    spec_file = tmp_path / "sub" / "job.yaml"
    spec_file.write_text(to_yaml(data))
    s = load_spec(spec_file).spec  # cwd is not the spec dir: paths follow the file
    base = (tmp_path / "sub").resolve()
    assert s.data.prompts == str(base / "data" / "train.jsonl")
    assert s.data.eval[0].path == str(tmp_path.resolve() / "held.jsonl")
    assert s.logging.dir == str(base / "runs") and s.train.checkpoint.dir == str(base / "ck")
    assert s.train.checkpoint.load == str(Path("~/resume").expanduser().resolve())
    assert s.model.ref_path == "initial"
    assert all(Path(p).is_absolute() for p in (s.data.prompts, s.logging.dir))


def test_resolved_spec_is_frozen():
    s = load(C).spec
    with pytest.raises(AttributeError):
        s.train.seed = 3  # type: ignore[misc]


# ----------------------------------------------------------------------------- files
def test_load_spec_file_problems(tmp_path: Path):
    p = only(_file_problems(tmp_path / "missing.yaml"))
    assert "spec file not found" in p.message and p.origin.file.endswith("missing.yaml")
    p = only(_file_problems(tmp_path))
    assert "cannot read spec file" in p.message
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)) * 4)
    p = only(_file_problems(garbage))
    assert "cannot read spec file" in p.message
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert only(_file_problems(empty)).message == "the spec must be a YAML mapping"


def _file_problems(path: Path):
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


@pytest.mark.parametrize("key, value", [("cluster.slurm.time_limit", 30), ("cluster.slurm.mem", 500)])
def test_a_number_where_text_is_expected_says_to_quote_it(key, value):
    p = only(problems(spec(G, **{key: value})))
    assert p.path == key and f"write it in quotes, '{value}'" in p.message
