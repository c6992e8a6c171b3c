"""Every problem in one pass: schema problems and the rule problems they cannot have caused, together.

slime.spec.partial cuts fields with schema problems out, runs the rules while
recording what each reads, and keeps only findings that read nothing cut out
(directly or through a derived value). Checked here: mixed mistakes are all
reported; a substituted default never invents a problem (a property over the
rule cases); and resolve.DERIVED_FROM, which the taint relies on, matches what
resolve() actually derives (by changing each input and watching the output).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.spec.load import parse_path
from slime.spec.resolve import DERIVED_FROM, resolve
from slime.spec.types import Spec
from tests.fixtures.spec_helpers import CPU_SPEC, DELETE, GPU_SPEC, problems, spec
from tests.fixtures.spec_rule_cases import CASES

G, C = GPU_SPEC, CPU_SPEC


def test_schema_and_rule_mistakes_are_reported_together():
    bad = spec(
        G,
        **{
            "modle": 1,
            "rollout.backend": "sglng",
            "train.seed": "x",  # schema
            "rollout.temperature": 0.0,
            "algorithm.dual_clip_c": 0.5,
        },
    )  # rules
    found = problems(bad)
    assert {p.path for p in found} == {
        "modle",
        "rollout.backend",
        "train.seed",
        "rollout.temperature",
        "algorithm.dual_clip_c",
    }
    rule = next(p for p in found if p.path == "rollout.temperature")
    assert rule.origin.line and "must be > 0" in rule.message


def test_a_cut_field_does_not_invent_rule_problems():
    # With cluster.gpus_per_node cut out it would default to 0 and "megatron needs GPUs" would fire.
    found = problems(spec(G, **{"cluster.gpus_per_node": "eight"}))
    assert [p.path for p in found] == ["cluster.gpus_per_node"]
    # Derived values count too: the trainer world size uses train.nodes, derived from cluster.nodes
    # (defaulting to 1 it would make tensor 16 "not divide the 8 trainer GPUs")...
    found = problems(spec(G, **{"cluster.nodes": "two", "train.parallel.tensor": 16}))
    assert [p.path for p in found] == ["cluster.nodes"]
    # ...but a batch problem that does not involve the node count is still reported.
    found = problems(spec(G, **{"cluster.nodes": "two", "train.global_batch_size": 96}))
    assert [p.path for p in found] == ["cluster.nodes", "train.global_batch_size"]


def test_rules_do_not_run_when_a_required_field_is_missing():
    found = problems(spec(G, **{"data.prompts": DELETE, "rollout.temperature": 0.0}))
    assert [p.path for p in found] == ["data.prompts"]


def test_a_rule_keeps_findings_made_before_it_read_a_cut_field():
    # sampling yields the temperature finding before it reads model.max_context_len (derived from the
    # broken model.builtin): that finding stands; nothing about the context length is reported.
    found = problems(spec(C, **{"rollout.temperature": 0.0, "model.builtin": "tiiny"}))
    assert {p.path for p in found} == {"rollout.temperature", "model.builtin"}


def _errors(found) -> set[tuple[str, str]]:
    return {(p.path, p.message) for p in found if p.severity == "error"}


def _leaves(node: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, prefix + (k,))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, prefix + (i,))]
    return [prefix]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), pick=st.integers(min_value=0), junk=st.sampled_from(["junk", -7, [1], {"x": 1}]))
def test_rule_problems_next_to_a_schema_problem_are_real(case, pick, junk):
    """Break one more field of a spec that already breaks a rule: every rule problem still reported must
    be one the spec had with that field intact (so none came from the substituted default)."""
    _, _, base, bad_edits, *_ = case
    valid_typed = spec(base, **bad_edits)
    before = _errors(problems(valid_typed))
    leaves = [p for p in _leaves(valid_typed) if p[0] not in ("apiVersion", "kind")]
    path = leaves[pick % len(leaves)]
    broken = json.loads(json.dumps(valid_typed))
    node = broken
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = junk
    after = problems(broken)
    schema_paths = {
        p.path
        for p in after
        if p.path.split(".")[0] == path[0] and parse_path(p.path)[: len(path)] == path[: len(parse_path(p.path))]
    }
    rule_problems = {(p.path, p.message) for p in after if p.severity == "error" and p.path not in schema_paths}
    assert rule_problems <= before, (path, junk, rule_problems - before)


# ----------------------------------------------------------------------------- DERIVED_FROM matches resolve()
def _closure(target: str) -> set[tuple]:
    out, todo = set(), [target]
    while todo:
        t = todo.pop()
        for i in DERIVED_FROM.get(t, ()):
            if parse_path(i) not in out:
                out.add(parse_path(i))
                todo.append(i)
    return out | {parse_path(target)}


def _flat(node: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    if isinstance(node, dict):
        return {k: v for key, val in node.items() for k, v in _flat(val, prefix + (key,)).items()}
    if isinstance(node, list) and node and isinstance(node[0], dict):
        return {k: v for i, val in enumerate(node) for k, v in _flat(val, prefix + (i,)).items()}
    return {prefix: node}


def _resolved(data: dict, base_dir: Path) -> dict[tuple, Any] | None:
    try:
        return _flat(json.loads(msgspec.json.encode(resolve(msgspec.convert(data, Spec), base_dir))))
    except msgspec.ValidationError:
        return None


def _bases(tmp: Path) -> list[dict]:
    (tmp / "p.jsonl").write_text("".join(f'{{"prompt": "{i}"}}\n' for i in range(20)))
    return [
        G,
        C,
        spec(G, **{"algorithm.estimator": "ppo"}),
        spec(G, **{"rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 6}),
        spec(C, **{"rollout.num_rollouts": DELETE, "rollout.epochs": 2, "data.prompts": str(tmp / "p.jsonl")}),
        spec(G, **{"train.global_batch_size": DELETE, "train.num_steps_per_rollout": 2}),
    ]


_EXTRA = [
    ("cluster.nodes", 3),
    ("cluster.gpus_per_node", 4),
    ("cluster.gpus_per_node", 0),
    ("cluster.launcher", "slurm"),
    ("cluster.launcher", "local"),
    ("model.path", "/other"),
    ("model.builtin", "tiny"),
    ("algorithm.estimator", "ppo"),
    ("algorithm.estimator", "gspo"),
    ("train.nodes", 1),
    ("train.gpus_per_node", 4),
    ("rollout.colocate", False),
    ("rollout.colocate", True),
    ("rollout.gpus", 8),
    ("rollout.gpus_per_engine", 4),
    ("rollout.backend", "builtin"),
    ("rollout.backend", "sglang"),
    ("rollout.epochs", 3),
    ("rollout.batch_size", 8),
    ("rollout.n_samples_per_prompt", 1),
    ("train.num_steps_per_rollout", 2),
    ("train.global_batch_size", 128),
    ("algorithm.eps_clip", 0.3),
    ("name", "other-name"),
    ("rollout.num_engines", 2),
    ("data.prompts", "/x.jsonl"),
]


def _changes(data: dict) -> list[tuple[tuple, Any]]:
    out = [(parse_path(p), v) for p, v in _EXTRA]
    for path in _leaves(data):
        value = data
        for part in path:
            value = value[part]
        if isinstance(value, bool):
            out.append((path, not value))
        elif isinstance(value, int):
            out.append((path, value + 1))
        elif isinstance(value, float):
            out.append((path, value / 2))
        elif isinstance(value, str) and path[0] != "apiVersion" and path != ("kind",):
            out.append((path, value + "x"))
    return out


def test_derived_from_matches_what_resolve_derives(tmp_path):
    derived = {parse_path(k): k for k in DERIVED_FROM}
    checked = 0
    for base in _bases(tmp_path):
        before = _resolved(base, tmp_path)
        assert before is not None
        for path, value in _changes(base):
            changed_data = json.loads(json.dumps(base))
            node = changed_data
            for part in path[:-1]:
                node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
            node[path[-1]] = value
            after = _resolved(changed_data, tmp_path)
            if after is None:
                continue
            checked += 1
            for leaf in set(before) | set(after):
                if before.get(leaf) == after.get(leaf) or leaf[: len(path)] == path:
                    continue
                owner = next((d for d in derived if leaf[: len(d)] == d), None)
                assert owner is not None, f"resolve() changed {leaf} when {path} changed: add it to DERIVED_FROM"
                allowed = _closure(derived[owner])
                assert any(path[: len(a)] == a or a[: len(path)] == path for a in allowed), (
                    f"{derived[owner]} moved when {path} changed: add it to DERIVED_FROM[{derived[owner]!r}]"
                )
    assert checked > 100


@pytest.mark.parametrize("key", sorted(DERIVED_FROM))
def test_derived_from_names_real_fields(key):
    from slime.spec.schema import subschema

    for path in (key, *DERIVED_FROM[key]):
        assert subschema("slime/v2", parse_path(path)) is not None, path
