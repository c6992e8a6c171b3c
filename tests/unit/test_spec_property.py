"""Property-based: random mutations of valid specs never raise anything but SpecError.

Mutations: delete keys, replace values with random scalars/strings/nested values
(including NaN, huge integers, NUL bytes, odd unicode), insert unknown keys, damage
the YAML text, and random ``--set`` overrides. When loading fails, every problem
has a path and a message. A second property checks the shortcut in
``slime.spec.load``: whatever msgspec accepts, the JSON Schema accepts too (so
skipping jsonschema for specs that convert cleanly hides no error).
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from slime.spec import SpecError, load_spec_text
from slime.spec.schema import schema_for
from slime.spec.types import Spec
from slime.spec.values import normalise
from tests.fixtures.spec_helpers import CPU_SPEC, GPU_SPEC

ROOT = Path(__file__).resolve().parents[2]
BASES = [GPU_SPEC, CPU_SPEC] + [
    YAML(typ="safe", pure=True).load(p.read_text()) for p in sorted(ROOT.glob("specs/*.yaml"))
]
FIELDS = [
    "train.seed",
    "rollout.gpus",
    "cluster.nodes",
    "cluster.gpus_per_node",
    "train.parallel.tensor",
    "rollout.temperature",
    "algorithm.estimator",
    "rollout.colocate",
    "model",
    "model.builtin",
    "sweep",
    "sweep.grid",
    "data.eval[0].name",
    "data.eval[1]",
    "data.eval.x",
    "x.y",
    "apiVersion",
    "name",
    "train.dynamic_batch",
    "cluster.secrets.K",
    "agent.sandbox.backend",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=20),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "tiny",
            "grpo",
            "ppo",
            "sglang",
            "megatron",
            "slurm",
            "local",
            "initial",
            "a.b:c",
            "/tmp/x",
            "04:00:00",
            "1-00:00:00",
            "64G",
            "train.seed",
            "\x00",
            "e2b",
            "nccl",
            "delta",
            "remote",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
override_values = st.one_of(
    st.sampled_from(
        [
            "1",
            "0",
            "-1",
            "8",
            "abc",
            "[1, 2]",
            "{a: 1}",
            "null",
            "",
            "true",
            "1.5",
            ".inf",
            "{",
            '{"train.seed": [1, 2]}',
            '{"rollout.gpus": [0, 4, 5]}',
            "{grid: {train.seed: [1, 2]}}",
            "!!binary aGk=",
            "!foo x",
            "2024-01-01",
            "[[[]]]",
            "{train.seed: []}",
        ]
    ),
    st.text(max_size=10),
)
overrides = st.lists(
    st.builds(lambda f, v: f"{f}={v}", st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), override_values)
    | st.text(max_size=10),
    max_size=3,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw) -> dict:
    data = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = _paths(data)[1:]
        if not paths:
            break
        path = paths[draw(st.integers(min_value=0, max_value=len(paths) - 1))]
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["delete", "replace", "insert"]))
        target = parent[path[-1]]
        if op == "delete":
            del parent[path[-1]]
        elif op == "insert" and isinstance(target, dict):
            key = draw(
                st.one_of(
                    st.sampled_from(["foo", "nodes", "gpus", "seed", "grid", "x.y", "lambda"]), st.text(max_size=6)
                )
            )
            target[key] = draw(values)
        else:
            parent[path[-1]] = draw(values)
    return data


def _render(data: dict, how: str, damage: tuple[int, str]) -> str:
    if how == "json":
        return json.dumps(data)
    buf = io.StringIO()
    YAML(typ="rt").dump(data, buf)
    text = buf.getvalue()
    if how == "damaged":
        at = damage[0] % (len(text) + 1)
        text = text[:at] + damage[1] + text[at:]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=mutated(),
    how=st.sampled_from(["json", "yaml", "damaged"]),
    damage=st.tuples(
        st.integers(min_value=0),
        st.sampled_from(
            [":", "-", " ", "\n", "[", "{", "'", '"', "&a", "*a", "!", "#", "\t", "? ", "|", ">", "%", "\n  x: 1"]
        ),
    ),
    sets=overrides,
    check_paths=st.booleans(),
)
def test_mutated_specs_only_ever_raise_spec_error(data, how, damage, sets, check_paths, tmp_path_factory):
    text = _render(data, how, damage)
    try:
        loaded = load_spec_text(text, file="fuzz.yaml", base_dir=ROOT, overrides=sets, check_paths=check_paths)
    except SpecError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p.path, str) and p.message and p.severity in ("error", "warning")
            json.dumps(p.to_json())
        assert exc.format()
    else:
        assert loaded.tasks and all(t.spec is not None for t in loaded.tasks)
        msgspec.json.encode(loaded.spec)  # the resolved spec always serialises (resolved.json)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated())
def test_what_msgspec_accepts_the_schema_accepts(data):
    plain, bad = normalise(data, {})
    if bad:
        return
    try:
        msgspec.convert(plain, Spec)
    except msgspec.ValidationError:
        return
    errors = [e.message for e in Draft202012Validator(schema_for("slime/v2")).iter_errors(plain)]
    assert not errors, errors
