"""The CLI's spec commands: exit codes (0 ok, 2 spec/usage error), never a traceback for bad input,
``--json`` shapes, ``schema`` usable by jsonschema, ``explain`` for a leaf, a section and a typo.

Bad-input cases run the real ``slime-submit`` entry point in a subprocess (what a user
sees); the rest call ``slime.cli.main.main`` in process and read stdout/stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from slime.cli.main import main
from tests.fixtures.spec_helpers import GPU_SPEC, position_of, spec, to_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("specs/*.yaml"))


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def write(tmp_path: Path, data, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data if isinstance(data, str) else to_yaml(data))
    return p


# ----------------------------------------------------------------------------- bad input, real process
@pytest.mark.parametrize(
    "case, make, words",
    [
        ("missing file", lambda d: d / "nope.yaml", ["spec file not found"]),
        ("directory", lambda d: d, ["cannot read spec file"]),
        ("binary garbage", lambda d: write(d, bytes(range(256)) * 8), ["cannot read spec file"]),
        ("empty file", lambda d: write(d, ""), ["must be a YAML mapping"]),
        ("yaml syntax", lambda d: write(d, "apiVersion: slime/v2\nmodel: [\n"), ["YAML syntax error"]),
        ("not a mapping", lambda d: write(d, "- 1\n- 2\n"), ["must be a YAML mapping"]),
        ("schema", lambda d: write(d, spec(GPU_SPEC, **{"rollout.temprature": 1})), ["did you mean 'temperature'"]),
    ],
)
def test_bad_input_exits_2_without_a_traceback(tmp_path, case, make, words):
    target = make(tmp_path)
    proc = cli("validate", str(target))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    for w in words:
        assert w in proc.stderr + proc.stdout


def test_engine_option_typos_exit_2_at_validate_with_a_suggestion(tmp_path):
    """train.megatron.args / rollout.sglang.args are checked against the pinned engines' tables (options.json,
    server_args.json) at validate, not when megatron-core or SGLang start on the allocated nodes."""
    edits = {
        "train.megatron.args": {"recompute-granularty": "full"},
        "rollout.sglang.args": {"mem-fraction-statc": 0.7},
    }
    proc = cli("validate", str(write(tmp_path, spec(GPU_SPEC, **edits))))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: train.megatron.args.recompute-granularty: 'recompute-granularty' is not a megatron-core " in (
        proc.stderr
    )
    assert "did you mean 'recompute-granularity'" in proc.stderr
    assert "error: rollout.sglang.args.mem-fraction-statc: 'mem-fraction-statc' is not a server flag of SGLang " in (
        proc.stderr
    )
    assert "did you mean 'mem-fraction-static'" in proc.stderr and "2 problems; nothing was submitted" in proc.stderr


@pytest.mark.parametrize("args", [["render"], ["submit", "--dry-run"], ["submit"]])
def test_render_and_submit_reject_bad_specs_before_anything_runs(tmp_path, args):
    target = write(tmp_path, spec(GPU_SPEC, **{"rollout.temprature": 1}))
    proc = cli(*args, str(target))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "did you mean 'temperature'" in proc.stderr and "nothing was submitted" in proc.stderr
    assert list(tmp_path.iterdir()) == [target]  # no run dir was created


@pytest.mark.parametrize("args", [["render"], ["submit", "--dry-run"]])
def test_a_preview_warns_about_missing_cluster_paths_where_submit_refuses(tmp_path, args):
    """GPU_SPEC's /models and /data exist only on a cluster: a preview from a laptop still shows the script."""
    target = write(tmp_path, spec(GPU_SPEC, **{"logging.dir": str(tmp_path / "runs")}))
    proc = cli(*args, str(target))
    assert proc.returncode == 0, proc.stderr
    assert "warning: data.prompts: file not found: /data/prompts.jsonl" in proc.stderr
    assert "warning: model.path: checkpoint directory not found" in proc.stderr
    assert "#SBATCH" in proc.stdout and "nothing was submitted" not in proc.stderr
    assert list(tmp_path.iterdir()) == [target]  # a preview creates nothing
    proc = cli("submit", str(target))
    assert proc.returncode == 2 and "error: data.prompts: file not found" in proc.stderr
    assert "nothing was submitted" in proc.stderr and list(tmp_path.iterdir()) == [target]


def test_bare_spec_argument_means_submit(tmp_path):
    proc = cli(str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "spec file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, rc", [([], 2), (["validate"], 2), (["explain"], 2), (["--help"], 0), (["validate", "--bogus", "x.yaml"], 2)]
)
def test_usage(args, rc):
    proc = cli(*args)
    assert proc.returncode == rc and "Traceback" not in proc.stderr


def test_error_output_names_file_line_col_path_and_hint(tmp_path):
    target = write(tmp_path, spec(GPU_SPEC, **{"rollout.temperature": 0.0}))
    line, col = position_of(target.read_text(), "rollout.temperature")
    proc = cli("validate", str(target))
    assert proc.returncode == 2
    assert f"{target}:{line}:{col}: error: rollout.temperature: temperature must be > 0" in proc.stderr
    assert "hint: use e.g. 1.0" in proc.stderr and "1 problem; nothing was submitted." in proc.stderr


# ----------------------------------------------------------------------------- validate
def test_validate_examples_ok(capsys):
    rc, out, err = run(capsys, "validate", *map(str, EXAMPLES))
    assert rc == 0, err
    for p in EXAMPLES:
        assert f"valid: {p} (" in out


def test_validate_json_shapes(capsys, tmp_path):
    good = ROOT / "specs" / "quickstart.yaml"
    bad = write(tmp_path, spec(GPU_SPEC, **{"rollout.backend": "sglng"}))
    sweep = write(tmp_path, spec(GPU_SPEC, sweep={"grid": {"train.seed": [1, 2, 3]}}), "sweep.yaml")
    rc, out, _ = run(capsys, "validate", "--json", str(good), str(bad), str(sweep))
    assert rc == 2
    doc = json.loads(out)
    assert doc["ok"] is False and [r["ok"] for r in doc["results"]] == [True, False, True]
    ok, failed, swept = doc["results"]
    assert ok == {"spec": str(good), "ok": True, "tasks": 1, "warnings": []}
    assert swept["tasks"] == 3
    (problem,) = failed["problems"]
    assert set(problem) == {"path", "message", "hint", "severity", "task", "file", "line", "col", "override"}
    assert problem["path"] == "rollout.backend" and problem["file"] == str(bad)
    assert (problem["line"], problem["col"]) == position_of(bad.read_text(), "rollout.backend") and problem[
        "hint"
    ].startswith("did you mean 'sglang'?")
    assert problem["severity"] == "error" and problem["task"] is None and problem["override"] is None


def test_validate_json_ok_document(capsys):
    rc, out, _ = run(capsys, "validate", "--json", "specs/quickstart.yaml")
    assert rc == 0 and json.loads(out) == {
        "ok": True,
        "results": [{"spec": "specs/quickstart.yaml", "ok": True, "tasks": 1, "warnings": []}],
    }


def test_validate_with_overrides(capsys):
    rc, _, err = run(capsys, "validate", "specs/quickstart.yaml", "--set", "rollout.temperature=0")
    assert rc == 2 and "--set rollout.temperature=0: error: rollout.temperature" in err
    rc, out, _ = run(capsys, "validate", "specs/quickstart.yaml", "--set", 'sweep.grid={"train.seed": [1, 2]}')
    assert rc == 0 and "(2 tasks)" in out
    rc, out, _ = run(capsys, "validate", "--json", "specs/quickstart.yaml", "--set", "train.seed")
    assert rc == 2 and json.loads(out)["results"][0]["problems"][0]["override"] == "--set train.seed"


def test_validate_reports_warnings_but_succeeds(capsys):
    rc, out, err = run(
        capsys,
        "validate",
        "--json",
        "specs/quickstart.yaml",
        "--set",
        "rollout.max_prompt_len=250",
        "--set",
        "rollout.max_response_len=100",
    )
    assert rc == 0
    (w,) = json.loads(out)["results"][0]["warnings"]
    assert w["severity"] == "warning" and w["path"] == "rollout.max_response_len"


# ----------------------------------------------------------------------------- schema
def test_schema_is_json_that_validates_the_examples(capsys):
    rc, out, _ = run(capsys, "schema")
    assert rc == 0
    schema = json.loads(out)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    for p in EXAMPLES:
        assert not list(validator.iter_errors(YAML(typ="safe", pure=True).load(p.read_text()))), p
    bad = YAML(typ="safe", pure=True).load((ROOT / "specs" / "quickstart.yaml").read_text())
    bad["rollout"]["temperature"] = "hot"
    assert list(validator.iter_errors(bad))


def test_schema_unknown_version(capsys):
    rc, _, err = run(capsys, "schema", "--api-version", "slime/v9")
    assert rc == 2 and "slime/v2" in err


# ----------------------------------------------------------------------------- explain
def test_explain_a_leaf(capsys):
    rc, out, _ = run(capsys, "explain", "rollout.temperature", "--json")
    assert rc == 0
    assert json.loads(out) == {
        "field": "rollout.temperature",
        "type": "number (minimum=0)",
        "default": 1.0,
        "description": "Sampling temperature (> 0 for RL).",
    }
    rc, out, _ = run(capsys, "explain", "rollout.temperature")
    assert rc == 0 and "default: 1.0" in out and "Sampling temperature" in out


def test_explain_a_section_lists_its_fields(capsys):
    rc, out, _ = run(capsys, "explain", "train.parallel", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fields"] == [
        "tensor",
        "pipeline",
        "context",
        "expert",
        "expert_tensor",
        "sequence_parallel",
    ]
    assert doc["description"] == "Tensor/pipeline/context/expert parallel sizes."


def test_explain_list_items_and_renamed_fields(capsys):
    rc, out, _ = run(capsys, "explain", "data.eval[0].interval", "--json")
    assert rc == 0 and json.loads(out)["default"] == 10
    rc, out, _ = run(capsys, "explain", "algorithm.lambda", "--json")
    assert rc == 0 and json.loads(out)["description"] == "GAE lambda (PPO)."


def test_explain_a_typo_suggests_the_field(capsys):
    rc, out, err = run(capsys, "explain", "rollout.temprature")
    assert rc == 2 and "did you mean 'rollout.temperature'?" in err
    rc, out, _ = run(capsys, "explain", "rollout.temprature", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["ok"] is False and "did you mean" in doc["message"]


@pytest.mark.parametrize(
    "field, words",
    [
        ("tp", "did you mean 'train.parallel.tensor'?"),
        ("train.rollout_batch_size", "did you mean 'rollout.batch_size'?"),
        ("data.eval.name", "'data.eval' is a list: name an item's field, e.g. 'data.eval[0].name'"),
    ],
)
def test_explain_answers_flag_names_and_list_fields(capsys, field, words):
    rc, _, err = run(capsys, "explain", field)
    assert rc == 2 and words in err, err
