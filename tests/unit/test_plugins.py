"""Plug-ins own their part of the spec: a launcher and a rollout backend installed as a separate
distribution (tests/plugins, registered by its entry-point metadata) validate their own sections and
render with no edit outside their package; and the spec core names no plug-in."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime.spec.plugin import KINDS, profiles

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"

SPEC = """\
apiVersion: slime/v2
kind: RLJob
name: pbs-toy
cluster:
  launcher: pbs
  gpus_per_node: 4
  pbs:
    queue: gpuq
    walltime: "02:00:00"
model:
  builtin: tiny
train:
  precision: bf16
rollout:
  backend: toy
  colocate: true
  gpus_per_engine: 2
  batch_size: 4
  n_samples_per_prompt: 4
  num_rollouts: 2
  max_prompt_len: 64
  max_response_len: 64
  toy:
    replicas: {replicas}
    args:
      batch-window: 3
data:
  prompts: prompts.jsonl
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    return tmp_path


def test_a_plugin_launcher_and_engine_validate_and_render_their_own_sections(spec_dir: Path) -> None:
    (spec_dir / "job.yaml").write_text(SPEC.format(replicas=2))
    ok = _cli("validate", "job.yaml", cwd=spec_dir)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    out = _cli("render", "job.yaml", cwd=spec_dir)
    assert out.returncode == 0, out.stderr
    assert "#PBS -q gpuq" in out.stdout and "#PBS -l walltime=02:00:00" in out.stdout
    assert "#PBS -l select=1:ngpus=4" in out.stdout
    assert "toy-serve --replicas 2 --batch-window 3" in out.stdout  # the engine's own preview
    explained = _cli("explain", "cluster.pbs.walltime", cwd=spec_dir)
    assert explained.returncode == 0 and "PBS walltime" in explained.stdout


def test_a_plugin_rule_and_a_plugin_schema_refuse_with_the_field_named(spec_dir: Path) -> None:
    (spec_dir / "job.yaml").write_text(SPEC.format(replicas=3).replace('"02:00:00"', "2h"))
    bad = _cli("validate", "job.yaml", "--json", cwd=spec_dir)
    assert bad.returncode == 2
    problems = {p["path"]: p["message"] for p in json.loads(bad.stdout)["results"][0]["problems"]}
    assert "cluster.pbs.walltime" in problems  # the plug-in's schema (a pattern)
    (spec_dir / "job.yaml").write_text(SPEC.format(replicas=3))
    bad = _cli("validate", "job.yaml", "--json", cwd=spec_dir)
    problems = {p["path"]: p["message"] for p in json.loads(bad.stdout)["results"][0]["problems"]}
    assert bad.returncode == 2 and "3 replicas do not fit an engine of 2 GPU(s)" in problems["rollout.toy.replicas"]


def test_a_section_of_a_plugin_not_selected_is_refused_and_unknown_names_list_the_installed(spec_dir: Path) -> None:
    text = (
        SPEC.format(replicas=2)
        .replace("launcher: pbs", "launcher: local")
        .replace("gpus_per_node: 4", "gpus_per_node: 4\n  fake_gpus: false")
    )
    (spec_dir / "job.yaml").write_text(text)
    bad = _cli("validate", "job.yaml", "--json", cwd=spec_dir)
    problems = {p["path"]: p for p in json.loads(bad.stdout)["results"][0]["problems"]}
    assert "cluster.pbs" in problems and "cluster.launcher: pbs" in problems["cluster.pbs"]["hint"]
    (spec_dir / "job.yaml").write_text(SPEC.format(replicas=2).replace("launcher: pbs", "launcher: pbz"))
    bad = _cli("validate", "job.yaml", cwd=spec_dir)
    assert bad.returncode == 2 and "pbs" in bad.stdout + bad.stderr and "slurm" in bad.stdout + bad.stderr


def test_the_plugins_touch_no_file_outside_their_package() -> None:
    """Everything that names them lives under tests/plugins (and this test)."""
    hits = subprocess.run(
        ["git", "grep", "--untracked", "-l", "-w", "-e", "pbs_launcher", "-e", "toy_engine", "--", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert hits and all(h.startswith("tests/plugins/") or h == "tests/unit/test_plugins.py" for h in hits), hits


def _names() -> set[str]:
    return {n for kind in KINDS for n in profiles(kind)}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            out.add(id(body[0].value))
    return out


def test_the_spec_core_names_no_launcher_or_backend() -> None:
    """No string in slime/spec (but docstrings, and the agent sandbox's own 'local' backend) names an
    installed launcher or backend: what a plug-in decides, its profile says."""
    import re

    names = _names()
    assert {"local", "slurm", "torch", "megatron", "builtin", "sglang"} <= names
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b", re.I)
    found = []
    for path in sorted((ROOT / "slime" / "spec").rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        sandbox = (ast.ClassDef, ast.FunctionDef)  # the agent sandbox's own backends ('local', 'e2b')
        for part in (n for n in ast.walk(tree) if isinstance(n, sandbox) and "sandbox" in n.name.lower()):
            skip |= {id(c) for c in ast.walk(part)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value.replace("model.builtin", "")  # the built-in model's field, not the engine
                if word.search(text):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "\n".join(found)
