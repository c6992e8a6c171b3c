"""Sweeps: grid keys are real, sweepable field paths; values are validated; every task is validated,
and a task's own problems carry its index (problems every task shares are reported once)."""

from __future__ import annotations

import pytest

from tests.fixtures.spec_helpers import GPU_SPEC, load, position_of, problems, spec, to_yaml

G = GPU_SPEC


def with_grid(grid: dict, base: dict = G, **sweep) -> dict:
    return spec(base, sweep={"grid": grid, **sweep})


def only(found, path=None):
    found = [p for p in found if path is None or p.path == path]
    assert len(found) == 1, [p.format() for p in found]
    return found[0]


def test_grid_expands_to_the_cross_product_in_order():
    loaded = load(with_grid({"train.seed": [1, 2, 3], "rollout.temperature": [0.6, 1.0]}, max_parallel=2))
    assert loaded.is_sweep and len(loaded.tasks) == 6
    assert [t.index for t in loaded.tasks] == list(range(6))
    assert [t.overrides for t in loaded.tasks][:3] == [
        {"train.seed": 1, "rollout.temperature": 0.6},
        {"train.seed": 1, "rollout.temperature": 1.0},
        {"train.seed": 2, "rollout.temperature": 0.6},
    ]
    assert [(t.spec.train.seed, t.spec.rollout.temperature) for t in loaded.tasks][-1] == (3, 1.0)
    assert loaded.spec.train.seed == 1234  # the base spec is not swept
    assert all(t.spec.sweep is None for t in loaded.tasks)


def test_tasks_are_resolved_each_on_their_own():
    loaded = load(
        with_grid({"algorithm": [{"estimator": "grpo"}, {"estimator": "ppo"}], "data.eval[0].path": ["rel/a.jsonl"]})
    )
    grpo, ppo = (t.spec for t in loaded.tasks)
    assert grpo.algorithm.critic is None and ppo.algorithm.critic is not None
    assert ppo.model.critic_path == "/models/qwen"
    assert grpo.data.eval[0].path.endswith("/rel/a.jsonl") and grpo.data.eval[0].path.startswith("/")
    assert grpo.data.eval[0].name == "aime"


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("train.sed", "train.seed"),
        ("trian.seed", "train.seed"),
        ("rollout.temprature", "rollout.temperature"),
        ("train.optimizer.llr", "train.optimizer.lr"),
        ("train.optimzer.lr", "train.optimizer.lr"),
        ("train.parallel.tp", "train.parallel.tensor"),  # a Megatron flag name, in place
        ("train.lr", "train.optimizer.lr"),  # ... and one level off: its full path
    ],
)
def test_grid_keys_must_be_field_paths(key, suggestion):
    text = to_yaml(with_grid({key: [1, 2]}))
    p = only(problems(text))
    assert p.path == f"sweep.grid.{key}" and p.message == f"'{key}' is not a spec field path"
    assert p.hint.startswith(f"did you mean '{suggestion}'?")
    assert p.origin.line == position_of(text, "sweep.grid")[0] + 1


@pytest.mark.parametrize("key", ["cluster.nodes", "name", "logging.dir", "sweep.max_parallel", "apiVersion"])
def test_unsweepable_sections_are_rejected(key):
    p = only(problems(with_grid({key: [1, 2]})))
    assert p.message == f"'{key}' cannot be swept" and "sweepable sections: model, train" in p.hint


def test_values_are_validated_with_the_fields_schema():
    text = to_yaml(with_grid({"train.seed": [1, "x", -3], "algorithm.estimator": ["grpo", "gpro"]}))
    found = problems(text)
    assert {p.path for p in found} == {
        "sweep.grid.train.seed[1]",
        "sweep.grid.train.seed[2]",
        "sweep.grid.algorithm.estimator[1]",
    }
    est = only(found, "sweep.grid.algorithm.estimator[1]")
    assert "'gpro' is not a valid value" in est.message and est.hint.startswith("did you mean 'grpo'?")
    seed = only(found, "sweep.grid.train.seed[1]")
    assert "expected an integer" in seed.message
    lines = text.splitlines()
    assert lines[seed.origin.line - 1].strip() == "- x"


@pytest.mark.parametrize(
    "grid, words",
    [
        ({}, ["the sweep grid is empty"]),
        ({"train.seed": []}, ["has no values"]),
        (
            {"train.optimizer": [{"lr": 1e-6}], "train.optimizer.lr": [1e-5]},
            ["overlaps the grid key 'train.optimizer'"],
        ),
        ({"data.eval[0].path": ["/a"], "data.eval.0.path": ["/b"]}, ["overlaps"]),
        ({"": [1]}, ["is not a spec field path"]),
    ],
)
def test_grids_that_cannot_expand(grid, words):
    p = only(problems(with_grid(grid)))
    assert p.path.startswith("sweep.grid")
    for w in words:
        assert w in p.message


def test_every_task_is_validated_and_task_errors_carry_the_index():
    text = to_yaml(with_grid({"train.seed": [1, 2], "rollout.temperature": [1.0, 0.0]}))
    found = problems(text)
    assert [p.task for p in found] == [1, 3]
    p = found[0]
    assert p.path == "rollout.temperature" and "must be > 0" in p.message
    assert "[sweep task 1]" in p.format()
    # The swept value was written under the grid key: that is where to fix it.
    key_line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith("rollout.temperature:"))
    assert p.origin.line == key_line


def test_a_problem_every_task_has_is_reported_once():
    found = problems(with_grid({"train.seed": [1, 2, 3]}, base=spec(G, **{"algorithm.kl_coef": 0.1})))
    p = only(found)
    assert p.task is None and p.path == "algorithm.kl_coef" and "(in all 3 sweep tasks)" in p.message


def test_task_specific_layout_errors():
    found = problems(with_grid({"rollout.gpus_per_engine": [2, 3]}))
    p = only(found, "rollout.gpus")
    assert p.task == 1 and "not divisible by gpus_per_engine 3" in p.message


def test_list_index_past_the_end_in_a_grid_key():
    p = only(problems(with_grid({"data.eval[3].path": ["/a.jsonl"]})))
    assert "index 3 is out of range" in p.message and p.path == "sweep.grid.data.eval[3].path"


def test_a_sweep_that_cannot_expand_still_reports_base_problems():
    found = problems(with_grid({"train.sed": [1]}, base=spec(G, **{"rollout.temperature": 0.0})))
    assert {p.path for p in found} == {"sweep.grid.train.sed", "rollout.temperature"}


def test_sweep_max_parallel_is_checked():
    p = only(problems(with_grid({"train.seed": [1]}, max_parallel=0)))
    assert p.path == "sweep.max_parallel"


def test_a_thousand_task_grid_is_fully_validated():
    loaded = load(
        with_grid(
            {
                "train.seed": list(range(50)),
                "rollout.temperature": [0.6, 0.8, 1.0, 1.2, 1.4],
                "algorithm.eps_clip": [0.1, 0.2, 0.3, 0.4],
            }
        )
    )
    assert len(loaded.tasks) == 1000
    assert {t.spec.train.seed for t in loaded.tasks} == set(range(50))
    assert loaded.tasks[999].spec.algorithm.eps_clip_high == 0.4  # derived per task


def test_paths_are_checked_in_every_task_not_only_the_first(tmp_path):
    """A sweep over data.prompts with a missing file in task 1: submit (check_paths) refuses it up front."""
    from tests.fixtures.spec_helpers import CPU_SPEC

    (tmp_path / "a.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    data = with_grid({"data.prompts": ["a.jsonl", "missing.jsonl"]}, base=spec(CPU_SPEC, **{"data.prompts": "a.jsonl"}))
    found = problems(data, base_dir=tmp_path, check_paths=True)
    assert [(p.path, p.task) for p in found] == [("data.prompts", 1)] and "missing.jsonl" in found[0].message
    assert problems(data, base_dir=tmp_path) == []  # without check_paths nothing is read
