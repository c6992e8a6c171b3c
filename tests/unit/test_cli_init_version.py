"""``slime-submit init`` (starter specs with named placeholders that validate reports) and ``--version``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ruamel.yaml import YAML

from slime.cli.init_cmd import TEMPLATES
from slime.cli.main import main
from slime.provenance import TRACKED_PACKAGES, package_versions
from tests.fixtures.run_records import ROOT

pytestmark = pytest.mark.timeout(120)

GRPO_HOLES = ["cluster.slurm.partition", "model.path", "data.prompts", "data.eval[0].path", "logging.dir"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ----------------------------------------------------------------------------- init
@pytest.mark.parametrize("template", ["quickstart", "agent"])
def test_local_templates_validate_as_written_from_any_directory(template, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, "init", "--template", template, "-o", "my-job.yaml")
    assert rc == 0 and "run it: slime-submit my-job.yaml" in err
    text = (tmp_path / "my-job.yaml").read_text()
    doc = YAML(typ="safe").load(text)
    assert doc["name"] == "my-job" and doc["logging"]["dir"] == "runs"
    assert doc["data"]["prompts"] == str(ROOT / "specs" / "data" / "arith" / "train.jsonl")
    assert "<FILL" not in text and "# Runs as written" in text
    rc, out, err = run(capsys, "validate", "my-job.yaml", "--check-paths", "--json")
    assert rc == 0, out
    assert json.loads(out)["results"][0]["ok"] is True


def test_grpo_slurm_names_its_placeholders_and_validate_lists_them(tmp_path, capsys):
    spec = tmp_path / "grpo.yaml"
    rc, _, err = run(capsys, "init", "--template", "grpo-slurm", "-o", str(spec))
    assert rc == 0 and f"fill in: {', '.join(GRPO_HOLES)}" in err
    text = spec.read_text()
    header = text[: text.index("apiVersion:")]
    assert all(f"#   {hole}\n" in header for hole in GRPO_HOLES), header
    # commented: each section carries the schema's description of it; the example's comments stay
    assert "# Where the job runs and with what resources.\ncluster:" in text
    assert "# The trainer.\ntrain:" in text and "# SGLang 0.5.23 splits it" in text
    rc, out, _ = run(capsys, "validate", str(spec), "--json")
    problems = json.loads(out)["results"][0]["problems"]
    assert rc == 2 and [p["path"] for p in problems] == GRPO_HOLES
    assert all(p["message"].startswith("placeholder not filled in: ") and p["line"] for p in problems)
    part = next(p for p in problems if p["path"] == "cluster.slurm.partition")
    assert "SLURM partition" in part["message"] and "--set cluster.slurm.partition=VALUE" in part["hint"]
    assert text.splitlines()[part["line"] - 1].strip().startswith("partition: '<FILL")
    # the human output names each field at its line
    rc, _, err = run(capsys, "validate", str(spec))
    assert rc == 2 and f"{spec}:{part['line']}:5: error: cluster.slurm.partition: placeholder not filled in" in err
    assert "5 problems; nothing was submitted." in err
    # --set fills one; filling all makes it valid
    sets = [
        "cluster.slurm.partition=gpu",
        "model.path=/models/m",
        "data.prompts=/d/p.jsonl",
        "data.eval.0.path=/d/e.jsonl",
        "logging.dir=/scratch/runs",
    ]
    rc, out, _ = run(capsys, "validate", str(spec), "--set", sets[0], "--json")
    assert [p["path"] for p in json.loads(out)["results"][0]["problems"]] == GRPO_HOLES[1:]
    rc, out, _ = run(capsys, "validate", str(spec), *[a for s in sets for a in ("--set", s)], "--json")
    assert rc == 0, out


def test_placeholders_are_refused_by_render_and_submit_too(tmp_path, capsys):
    spec = tmp_path / "grpo.yaml"
    assert main(["init", "--template", "grpo-slurm", "-o", str(spec)]) == 0
    for argv in (["render", str(spec)], [str(spec)], [str(spec), "--dry-run"]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and "model.path: placeholder not filled in" in err, argv
    assert not (tmp_path / "<FILL").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["grpo.yaml"]


def test_init_never_overwrites_without_force_and_prints_without_o(tmp_path, capsys):
    spec = tmp_path / "mine.yaml"
    spec.write_text("my own work\n")
    rc, out, err = run(capsys, "init", "-o", str(spec))
    assert rc == 2 and "exists; pass --force" in err and spec.read_text() == "my own work\n"
    rc, _, _ = run(capsys, "init", "-o", str(spec), "--force")
    assert rc == 0 and spec.read_text().startswith("# Starter spec from `slime-submit init --template quickstart`")
    rc, out, _ = run(capsys, "init", "--template", "agent")
    assert rc == 0 and "agent:" in out and out.startswith("# Starter spec")
    rc, _, err = run(capsys, "init", "--template", "nope")
    assert rc == 2 and "invalid choice: 'nope'" in err


def test_every_template_placeholder_is_a_field_of_its_example():
    yaml = YAML(typ="safe")
    for name, template in TEMPLATES.items():
        doc = yaml.load((ROOT / "specs" / template.example).read_text())
        for path in template.fill:
            node = doc
            for part in path:
                node = node[part]  # KeyError/IndexError: the example no longer has the field
            assert node is not None, (name, path)


# ----------------------------------------------------------------------------- --version
def test_version_and_verbose_versions(capsys):
    from slime.cli.version import slime_version

    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out == f"slime-submit {slime_version()}\n"
    rc, out, _ = run(capsys, "--version", "-v")
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith(f"slime-submit {slime_version()} (")
    assert lines[1].startswith(f"python {sys.version.split()[0]} ")
    versions = package_versions()
    assert lines[2:] == [f"{n} {versions[n] or 'not installed'}" for n in TRACKED_PACKAGES]
    rc, _, err = run(capsys, "-v")
    assert rc == 2 and "-v/--verbose goes with --version" in err


def test_version_imports_no_engine():
    code = (
        "import sys\nfrom slime.cli.main import main\nrc = main(['--version', '-v'])\n"
        "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'transformers', 'megatron'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert "HEAVY []" in out.stdout and "torch " in out.stdout, out


def test_a_subcommands_own_version_flag_is_not_the_top_level_one(capsys):
    from slime.cli import extra
    from slime.cli.main import SUBCOMMANDS, build_parser

    extra.register(SUBCOMMANDS)
    args = build_parser().parse_args(["patches", "check", "--version", "0.5.23"])
    assert args.version == "0.5.23" and args.show_version is False
