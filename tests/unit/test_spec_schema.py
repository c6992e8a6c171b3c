"""The JSON Schema and the typed objects agree: committed == generated, fields <-> properties, defaults,
descriptions; and the schema validates the example specs with the plain jsonschema library."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import msgspec
import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from slime.spec.schema import committed_schema_path, dump_schema, generate_schema, schema_for, subschema
from slime.spec.types import Spec

ROOT = Path(__file__).resolve().parents[2]


def _structs() -> dict[str, type]:
    """Every Struct class reachable from Spec, by name."""
    found: dict[str, type] = {}

    def visit(t) -> None:
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls.__name__ in found:
                return
            found[t.cls.__name__] = t.cls
            for f in t.fields:
                visit(f.type)
        elif isinstance(t, msgspec.inspect.Metadata):
            visit(t.type)
        elif isinstance(t, msgspec.inspect.UnionType):
            for u in t.types:
                visit(u)
        elif isinstance(t, (msgspec.inspect.DictType,)):
            visit(t.value_type)
        elif isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)):
            visit(t.item_type)

    visit(msgspec.inspect.type_info(Spec))
    return found


STRUCTS = _structs()


def test_the_struct_walk_found_every_section():
    assert {
        "Spec",
        "Cluster",
        "Container",
        "SecretRef",
        "Model",
        "Train",
        "Parallel",
        "DynamicBatch",
        "Optimizer",
        "Checkpoint",
        "Rollout",
        "Data",
        "EvalSet",
        "Reward",
        "Algorithm",
        "Critic",
        "Agent",
        "SandboxSpec",
        "Sweep",
        "Logging",
        "Wandb",
    } <= set(STRUCTS)


def test_committed_schema_equals_the_generated_one():
    committed = committed_schema_path().read_text()
    assert committed == dump_schema(), (
        f"slime/spec/schema/{committed_schema_path().name} is stale: run "
        "python -c 'from slime.spec.schema import write_committed_schema; write_committed_schema()'"
    )
    assert schema_for("slime/v2") == json.loads(dump_schema("slime/v2"))


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_every_field_has_a_description(name):
    cls = STRUCTS[name]
    assert (cls.__doc__ or "").strip(), f"{name} has no docstring"
    hints = typing.get_type_hints(cls, include_extras=True)
    for field in msgspec.structs.fields(cls):
        metas = [m for m in getattr(hints[field.name], "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        descriptions = [m.description for m in metas if m.description]
        assert descriptions and descriptions[-1].strip(), f"{name}.{field.name} has no description"


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_schema_properties_map_to_struct_fields_and_back(name):
    cls = STRUCTS[name]
    definition = generate_schema()["$defs"][name]
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    assert set(definition["properties"]) == set(fields)
    assert definition.get("additionalProperties") is False  # unknown keys are rejected
    required = {n for n, f in fields.items() if f.required}
    assert set(definition.get("required", [])) == required
    for encode_name, f in fields.items():
        prop = definition["properties"][encode_name]
        assert prop.get("description"), f"{name}.{encode_name}"
        if f.default is not msgspec.NODEFAULT:
            assert prop.get("default", "<none>") == msgspec.to_builtins(f.default), f"{name}.{encode_name}"
        elif f.default_factory is not msgspec.NODEFAULT:
            # Sections default to their own defaults; the schema leaves them out rather than repeat them.
            built = msgspec.to_builtins(f.default_factory())
            assert prop.get("default", built) == built


def test_field_paths_resolve_through_the_schema():
    assert subschema("slime/v2", ("train", "parallel", "tensor"))["minimum"] == 1
    assert subschema("slime/v2", ("data", "eval", 0, "interval"))["default"] == 10
    assert subschema("slime/v2", ("algorithm", "lambda"))["default"] == 1.0
    assert subschema("slime/v2", ("cluster", "secrets", "ANY", "env")) is not None
    assert subschema("slime/v2", ("train", "nope")) is None


@pytest.mark.parametrize("path", sorted(ROOT.glob("specs/*.yaml")), ids=lambda p: p.name)
def test_committed_schema_validates_the_example_specs(path):
    validator = Draft202012Validator(json.loads(committed_schema_path().read_text()))
    errors = list(validator.iter_errors(YAML(typ="safe", pure=True).load(path.read_text())))
    assert not errors, [e.message for e in errors]


def test_committed_schema_is_a_valid_draft_2020_12_schema():
    schema = json.loads(committed_schema_path().read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")
