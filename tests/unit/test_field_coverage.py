"""No spec field is accepted and ignored: every leaf of the JSON Schema has a row in
``tests/fixtures/field_coverage.py`` naming what reads it (with a test showing the effect) or the rule refusing
what nothing honours, and the row is checked against the code.

Checks: the table's fields are exactly the schema's leaves; each consumer ``module:qualname`` exists
(found by parsing the module's file, nothing imported) and its body mentions the field (an
attribute ``.name`` or the string ``"name"``); each rule is a registered rule of ``slime.spec.rules``
or of a plug-in's hooks;
each test node id names a test function that exists (parsed the same way; parametrisation aside).
``Gap`` rows are listed, and fail once their consumer reads the field (the row must then change).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import msgspec
import pytest

from slime.spec import rules
from slime.spec.schema import schema_for
from slime.spec.types import Spec
from tests.fixtures.field_coverage import FIELDS, Fixed, Gap, Read, Refused

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the schema's leaves
def _deref(node: object, defs: dict) -> dict:
    while isinstance(node, dict) and "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node if isinstance(node, dict) else {}


def _object(node: object, defs: dict) -> dict | None:
    """The object schema (with properties) of ``node``, through ``$ref`` and ``anyOf [X, null]``."""
    node = _deref(node, defs)
    for option in node.get("anyOf", [node]):
        option = _deref(option, defs)
        if option.get("type") == "object" and "properties" in option:
            return option
    return None


def schema_leaves() -> list[str]:
    root = schema_for("slime/v2")
    defs = root["$defs"]
    out: list[str] = []

    def walk(node: object, path: str) -> None:
        obj = _object(node, defs)
        if obj is not None:
            for key, sub in obj["properties"].items():
                walk(sub, f"{path}.{key}" if path else key)
            return
        plain = _deref(node, defs)
        items, values = plain.get("items"), plain.get("additionalProperties")
        if plain.get("type") == "array" and _object(items, defs):
            walk(items, path + "[]")
        elif plain.get("type") == "object" and isinstance(values, dict) and _object(values, defs):
            walk(values, path + ".*")
        else:
            out.append(path)

    walk(defs["Spec"], "")
    return out


def test_the_leaf_walk_sees_every_kind_of_field():
    leaves = schema_leaves()
    assert {"apiVersion", "train.parallel.tensor", "data.eval[].max_prompts", "cluster.secrets.*.env"} <= set(leaves)
    assert "algorithm.lambda" in leaves and "algorithm.lam" not in leaves  # the field as written in a spec
    assert len(leaves) == len(set(leaves)) > 100


def test_every_schema_leaf_has_a_row_and_every_row_a_leaf():
    leaves = set(schema_leaves())
    missing, stale = sorted(leaves - set(FIELDS)), sorted(set(FIELDS) - leaves)
    assert not missing, (
        f"fields without a row in tests/fixtures/field_coverage.py (add what reads or refuses them): {missing}"
    )
    assert not stale, f"rows for fields the schema no longer has: {stale}"


def test_every_field_is_honoured_or_refused_and_none_is_a_gap():
    unused = [f for f, entries in FIELDS.items() if not any(isinstance(e, Read | Refused | Fixed) for e in entries)]
    assert not unused, f"fields neither read nor refused: {unused}"
    gaps = {f: e.why for f, entries in FIELDS.items() for e in entries if isinstance(e, Gap)}
    print("known gaps:", gaps)  # the report lists them
    assert not gaps, f"accepted-and-ignored fields: {gaps}"


# ----------------------------------------------------------------------------- consumers
def _python_name(field: str) -> str:
    """The name code uses for the field: its Python attribute (``lambda`` is ``lam``)."""
    encoded = field.rsplit(".", 1)[-1].removesuffix("[]")
    for struct in _structs():
        for f in msgspec.structs.fields(struct):
            if f.encode_name == encoded:
                return f.name
    return encoded


@cache
def _structs() -> tuple[type, ...]:
    import slime.spec.types as types

    return tuple(v for v in vars(types).values() if isinstance(v, type) and issubclass(v, msgspec.Struct))


@cache
def _module_tree(module: str) -> ast.Module | None:
    base = REPO.joinpath(*module.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        if file.is_file():
            return ast.parse(file.read_text())
    return None


def _find(tree: ast.AST, qualname: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        node = next(
            (
                n
                for n in body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
    return node


def _mentions(node: ast.AST, name: str) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr == name:
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and name in (n.value, n.value.replace("-", "_")):
            return True
    return False


def _reads(consumer: str, field: str) -> bool | str:
    module, _, qualname = consumer.partition(":")
    parsed = _module_tree(module)
    if parsed is None:
        return f"module {module} not found"
    node = _find(parsed, qualname)
    if node is None:
        return f"{qualname} is not defined in {module}"
    return _mentions(node, _python_name(field))


READS = [(f, e.consumer) for f, entries in FIELDS.items() for e in entries if isinstance(e, Read)]


@pytest.mark.parametrize(("field", "consumer"), READS, ids=[f"{f}<-{c}" for f, c in READS])
def test_the_consumer_reads_the_field(field, consumer):
    found = _reads(consumer, field)
    assert found is True, found or f"{consumer} does not mention {_python_name(field)!r} (for {field})"


def test_known_gaps_are_still_gaps():
    for field, entries in FIELDS.items():
        for e in entries:
            if isinstance(e, Gap):
                assert _reads(e.consumer, field) is not True, (
                    f"{field}: {e.consumer} reads it now: replace the Gap row with Read(...) and its test"
                )


# ----------------------------------------------------------------------------- rules and tests
def _plugin_rules() -> list:
    from slime.spec.plugin import KINDS, hook, profiles

    hooks = [(p, name) for kind in KINDS for p in profiles(kind).values() for name in ("RULES", "WARNINGS")]
    return [fn for p, name in hooks for fn in hook(p, name, ())]


# the spec core's rules and every installed plug-in's (its hooks module's RULES and WARNINGS)
RULE_NAMES = {f.__name__ for f in rules.RULES + rules.RAW_RULES + rules.WARNINGS + _plugin_rules()}


def test_every_named_rule_exists():
    named = {e.rule for entries in FIELDS.values() for e in entries if isinstance(e, Refused)}
    assert named <= RULE_NAMES, f"unknown rules: {named - RULE_NAMES}"


@cache
def _tests_in(path: str) -> frozenset[str]:
    file = REPO / path
    if not file.is_file():
        return frozenset()
    tree = ast.parse(file.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= {f"{cls.name}::{m.name}" for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
    return frozenset(n for n in names if n.split("::")[-1].startswith("test"))


def test_every_referenced_test_exists():
    missing = []
    for field, entries in FIELDS.items():
        tests = [t for e in entries if isinstance(e, Read | Refused) for t in e.tests]
        if any(isinstance(e, Read | Refused) for e in entries) and not tests:
            missing.append(f"{field}: no test named")
        for node in tests:
            path, _, name = node.partition("::")
            if name.split("[")[0] not in _tests_in(path):
                missing.append(f"{field}: {node}")
    assert not missing, "tests that do not exist:\n" + "\n".join(missing)


def test_fixed_fields_have_a_single_value():
    root = schema_for("slime/v2")
    spec_props = root["$defs"]["Spec"]["properties"]
    for field, entries in FIELDS.items():
        if any(isinstance(e, Fixed) for e in entries):
            sub = spec_props[field] if "." not in field else None
            if sub is None:
                section, name = field.rsplit(".", 1)
                struct = {"train.optimizer": "Optimizer"}[section]
                sub = root["$defs"][struct]["properties"][name]
            values = sub.get("enum") or ([sub["const"]] if "const" in sub else [])
            assert len(values) == 1, f"{field} is Fixed but allows {values}"
    assert msgspec.structs.fields(Spec)  # the types module imports cleanly
