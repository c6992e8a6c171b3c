"""Job chains before anything runs: ``${runs.STEP.OUTPUT}`` references, the chain's validation and
dry run (``launchers.chain.plan``), plain submits refusing a reference, and the node's input check.

Real spec files in a temp dir, the real loader and launchers' dry runs (which write nothing); no
scheduler is asked anything here (the chain on the real SLURM cluster: tests/e2e/test_slurm_chain.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launchers import chain
from launchers.base import SubmitOptions
from launchers.node.chain_inputs import check_inputs
from slime.cli.init_cmd import load_checked
from slime.core.paths import RunPaths, TaskPaths
from slime.spec import SpecError
from slime.spec.refs import find_refs, substitute

BASE = """apiVersion: slime/v2
kind: RLJob
name: {name}
cluster: {{launcher: {launcher}, nodes: 1, gpus_per_node: 0, cpus_per_node: 2}}
model: {model}
rollout: {{num_rollouts: 1, batch_size: 2, n_samples_per_prompt: 2, max_prompt_len: 16, max_response_len: 8}}
data: {{prompts: p.jsonl}}
logging: {{dir: runs}}
"""


def write(tmp: Path, name: str, *, model: str = "{builtin: tiny}", launcher: str = "local", extra: str = "") -> str:
    (tmp / "p.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    path = tmp / f"{name}.yaml"
    path.write_text(BASE.format(name=name, model=model, launcher=launcher) + extra)
    return str(path)


def plan(files: list[str], *overrides: str):
    return chain.plan(files, overrides, SubmitOptions(), load_checked)


def messages(exc: pytest.ExceptionInfo[SpecError]) -> list[tuple[str, str, str]]:
    return [(str(p.origin), p.path, p.message) for p in exc.value.problems]


def test_find_refs_lists_each_reference_and_names_the_field_of_a_malformed_one():
    data = {
        "model": {"path": "${runs.sft.final_model}"},
        "description": "from ${runs.a.run_dir} and ${runs.b.checkpoints}",
        "data": {"eval": [{"path": "${runs.sft.weights}"}, {"path": "${runs.sft}"}]},
    }
    found, problems = find_refs(data)
    assert [(f.field, [(r.step, r.output) for r in f.refs]) for f in found] == [
        ("model.path", [("sft", "final_model")]),
        ("description", [("a", "run_dir"), ("b", "checkpoints")]),
    ]
    assert [(p.path, p.message) for p in problems] == [
        ("data.eval[0].path", "bad reference '${runs.sft.weights}': expected ${runs.STEP.OUTPUT}"),
        ("data.eval[1].path", "bad reference '${runs.sft}': expected ${runs.STEP.OUTPUT}"),
    ]
    outputs = {("a", "run_dir"): "/r/a", ("b", "checkpoints"): "/r/b/c"}
    assert substitute(found[1].value, outputs) == "from /r/a and /r/b/c"


def test_plan_fills_a_reference_with_the_earlier_steps_would_be_path_and_records_it(tmp_path):
    first = write(tmp_path, "sft")
    second = write(
        tmp_path, "rl", model="{path: '${runs.sft.final_model}'}", extra="description: after ${runs.sft.run_dir}\n"
    )
    launcher, steps = plan([first, second])
    assert launcher.name == "local" and [s.name for s in steps] == ["sft", "rl"]
    sft_dir = steps[0].run_dir
    assert sft_dir is not None and not sft_dir.exists()  # a dry run: nothing written yet
    final_model = str(TaskPaths(sft_dir, 0).final_model)
    rl = steps[1].dry.request
    assert rl.spec.model.path == final_model and rl.spec.description == f"after {sft_dir}"
    # the filled values are --set overrides of the step, so its lock.json records them
    assert f"model.path={json.dumps(final_model)}" in rl.loaded.overrides
    assert [(i["field"], i["ref"], i["path"]) for i in steps[1].inputs] == [
        ("model.path", "${runs.sft.final_model}", final_model),
        ("description", "${runs.sft.run_dir}", str(sft_dir)),
    ]
    assert not any(w.path == "model.path" for w in rl.loaded.warnings)  # its not existing yet is expected


def test_plan_refuses_references_to_later_or_unknown_steps_and_duplicate_names(tmp_path):
    a = write(tmp_path, "a", model="{path: '${runs.b.final_model}'}")
    b = write(tmp_path, "b", extra="description: ${runs.nope.run_dir}\n")
    with pytest.raises(SpecError) as exc:
        plan([a, b])
    assert messages(exc) == [
        (a, "model.path", "${runs.b.final_model} names a later step"),
        (b, "description", "${runs.nope.run_dir} names no step of this chain"),
    ]
    with pytest.raises(SpecError) as exc:
        plan([write(tmp_path, "a"), a])
    assert ("name", "step name 'a' is also step 1's") in [(p.path, p.message) for p in exc.value.problems]


def test_plan_refuses_a_final_model_the_earlier_step_never_writes_and_a_swept_source(tmp_path):
    a = write(tmp_path, "a", extra="train: {checkpoint: {save_hf: false}}\n")
    b = write(tmp_path, "b", model="{path: '${runs.a.final_model}'}")
    with pytest.raises(SpecError) as exc:
        plan([a, b])
    assert messages(exc) == [(a, "train.checkpoint.save_hf", "step 'a' writes no final_model, which step 'b' uses")]
    swept = write(tmp_path, "a", extra="sweep: {grid: {train.seed: [1, 2]}}\n")
    with pytest.raises(SpecError) as exc:
        plan([swept, b])
    assert messages(exc) == [(b, "", "${runs.a.final_model}: step 'a' is a sweep")]


def test_plan_refuses_a_chain_over_two_launchers_and_a_one_step_chain(tmp_path):
    a = write(tmp_path, "a")
    b = write(tmp_path, "b", launcher="slurm")
    with pytest.raises(SpecError) as exc:
        plan([a, b])
    assert messages(exc) == [(b, "cluster.launcher", "'slurm', but the chain's first step uses 'local'")]
    with pytest.raises(SpecError) as exc:
        plan([a])
    assert [p.message for p in exc.value.problems] == ["a chain needs at least two specs"]


def test_a_spec_with_a_reference_submitted_alone_is_refused_naming_the_field(tmp_path):
    b = write(tmp_path, "b", model="{path: '${runs.sft.final_model}'}")
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "validate", b, "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (problem,) = json.loads(proc.stdout)["results"][0]["problems"]
    assert problem["path"] == "model.path" and "earlier run of a chain" in problem["message"]
    assert "slime-submit chain" in problem["hint"]


def test_the_node_check_names_a_missing_input_and_records_what_it_found(tmp_path):
    paths, earlier = RunPaths(tmp_path / "run"), tmp_path / "earlier"
    tp = paths.task(0)
    assert check_inputs(paths, tp, record=True) is None  # not a chain step
    tp.dir.mkdir(parents=True)
    earlier.mkdir()
    inputs = [
        {"field": "description", "ref": "${runs.a.run_dir}", "step": "a", "output": "run_dir", "path": str(earlier)},
        {
            "field": "model.path",
            "ref": "${runs.a.final_model}",
            "step": "a",
            "output": "final_model",
            "path": str(earlier / "m"),
        },
    ]
    paths.chain_refs.write_text(json.dumps(inputs))
    problem = check_inputs(paths, tp, record=True)
    assert problem is not None and problem.startswith(
        f"model.path: ${{runs.a.final_model}} is {earlier / 'm'}, which step 'a'"
    )
    assert "description" not in problem
    assert [r["exists"] for r in json.loads(tp.chain_inputs.read_text())] == [True, False]
    (earlier / "m").mkdir()
    assert check_inputs(paths, tp, record=False) is None
