"""Shell completion, through the shells' own machinery: the script ``slime-submit completion SHELL``
prints, loaded into bash (and fish, when installed), asked to complete partial command lines.

bash: the test sources the script, sets ``COMP_WORDS``/``COMP_CWORD``/``COMP_LINE``/``COMP_POINT`` as
readline would and calls the completion function ``complete -p slime-submit`` names, then prints
``COMPREPLY``. ``slime-submit`` on ``PATH`` is a two-line wrapper running this checkout's CLI, so each
completion is a real process start. fish: ``complete -C LINE`` (fish's own non-interactive entry).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.cli.main import main
from tests.fixtures.run_records import ROOT, make_run

pytestmark = pytest.mark.timeout(180)

SCHEMA = json.loads((ROOT / "slime" / "spec" / "schema" / "v1.json").read_text())

BASH_HARNESS = r"""
source "$1"; shift
fn=$(complete -p slime-submit | sed -E 's/.* -F ([^ ]+) .*/\1/')
for line in "$@"; do
  COMP_LINE="$line"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"
  [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMP_TYPE=9; COMPREPLY=()
  "$fn" slime-submit "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  printf '%s\n' "== $line" "${COMPREPLY[@]}"
done
"""


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory):
    """PATH with a ``slime-submit`` that runs this checkout's CLI; the completion scripts."""
    d = tmp_path_factory.mktemp("completion")
    (d / "bin").mkdir()
    exe = d / "bin" / "slime-submit"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m slime.cli.main "$@"\n')
    exe.chmod(0o755)
    env = {**os.environ, "PATH": f"{d / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("SLIME_RUNS_DIR", None)
    scripts = {}
    for shell in ("bash", "zsh", "fish"):
        out = subprocess.run([str(exe), "completion", shell], env=env, capture_output=True, text=True, check=True)
        scripts[shell] = d / f"slime-submit.{shell}"
        scripts[shell].write_text(out.stdout)
    return env, scripts, d


def bash_complete(shell_env, *lines: str, cwd: Path | None = None) -> dict[str, list[str]]:
    env, scripts, _ = shell_env
    proc = subprocess.run(
        ["bash", "-c", BASH_HARNESS, "harness", str(scripts["bash"]), *lines],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[str]] = {}
    for row in proc.stdout.splitlines():
        if row.startswith("== "):
            current = out.setdefault(row[3:], [])
        else:
            current.append(row)
    return out


def section_fields(*path: str) -> list[str]:
    node = SCHEMA["$defs"]["Spec"]
    for part in path:
        node = node["properties"][part]
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else node
    return list(node["properties"])


def test_set_completes_field_paths_from_the_schema(shell_env):
    got = bash_complete(
        shell_env,
        "slime-submit validate x.yaml --set train.par",
        "slime-submit validate x.yaml --set train.parallel.",
        "slime-submit specs/quickstart.yaml --set train.parallel.te",  # the implicit `submit`
        "slime-submit render x.yaml --set rollout.batch_",
    )
    parallel = sorted(f"train.parallel.{f}=" for f in section_fields("train", "parallel"))
    assert {"train.parallel.tensor=", "train.parallel.pipeline="} <= set(parallel)
    assert got["slime-submit validate x.yaml --set train.par"] == parallel  # the lone section opens itself
    assert got["slime-submit validate x.yaml --set train.parallel."] == parallel
    # one completion: bash adds no space after the '=' (the script's nospace for [=/:]$)
    assert got["slime-submit specs/quickstart.yaml --set train.parallel.te"] == ["train.parallel.tensor="]
    assert got["slime-submit render x.yaml --set rollout.batch_"] == ["rollout.batch_size="]


def test_explain_completes_sections_and_fields(shell_env):
    got = bash_complete(
        shell_env, "slime-submit explain rollout.", "slime-submit explain data.ev", "slime-submit explain tr"
    )
    rollout = got["slime-submit explain rollout."]
    assert len(rollout) == len(section_fields("rollout")) and "rollout.n_samples_per_prompt" in rollout
    assert all(c.startswith("rollout.") and not c.endswith("=") for c in rollout)
    # a list of sections completes its items' fields as .0.
    eval_fields = section_fields("data") and list(SCHEMA["$defs"]["EvalSet"]["properties"])
    assert got["slime-submit explain data.ev"] == sorted(f"data.eval.0.{f}" for f in eval_fields)
    assert "train.parallel." in got["slime-submit explain tr"] and "train.seed" in got["slime-submit explain tr"]


def test_subcommands_flags_and_run_ids(shell_env, tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "quickstart-20260101-000000-a1b2c3")
    make_run(runs, "quickstart-20260101-000100-a1ffee")
    make_run(runs, "other-20260102-000000-c0ffee")
    got = bash_complete(
        shell_env,
        "slime-submit st",
        "slime-submit --vers",
        "slime-submit status --w",
        f"slime-submit status --dir {runs} ",
        f"slime-submit logs --dir {runs} a1",
        f"slime-submit cancel --dir {runs} oth",
        "slime-submit rerun ",
        cwd=tmp_path,  # ./runs: the default --dir
    )
    assert got["slime-submit st"] == ["status "]
    assert got["slime-submit --vers"] == ["--version "]
    assert got["slime-submit status --w"] == ["--watch "]
    assert got[f"slime-submit status --dir {runs} "] == ["c0ffee", "a1ffee", "a1b2c3"]  # newest first
    assert got[f"slime-submit logs --dir {runs} a1"] == ["a1ffee", "a1b2c3"]
    # no id starts with 'oth': run dir names do
    assert got[f"slime-submit cancel --dir {runs} oth"] == ["other-20260102-000000-c0ffee "]
    assert got["slime-submit rerun "] == ["c0ffee", "a1ffee", "a1b2c3"]


def test_fish_completes_with_descriptions(shell_env, tmp_path):
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed (ci/install.sh installs it as a Debian package)")
    env, scripts, _ = shell_env
    make_run(tmp_path / "runs", "quickstart-20260101-000000-a1b2c3")
    cmd = (
        f"source {scripts['fish']}; complete -C 'slime-submit explain train.par'; echo ==; "
        f"complete -C 'slime-submit status --dir {tmp_path / 'runs'} '"
    )
    out = subprocess.run(["fish", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    fields, ids = out.stdout.split("==\n")
    assert fields.split() == sorted(f"train.parallel.{f}" for f in section_fields("train", "parallel"))
    assert ids.strip() == "a1b2c3\tquickstart, started 2026-01-01 00:00"


def test_zsh_script_parses(shell_env):
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed (ci/install.sh installs it as a Debian package)")
    _, scripts, _ = shell_env
    assert scripts["zsh"].read_text().startswith("#compdef slime-submit")
    proc = subprocess.run(["zsh", "-n", str(scripts["zsh"])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_completion_imports_nothing_heavy(shell_env):
    """Every TAB starts Python: the parser and completers stay off the spec layer, rich and engines."""
    env, _, _ = shell_env
    line = "slime-submit explain rollout.b"
    env = {**env, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line))}
    out_file = shell_env[2] / "completions.txt"
    env["_ARGCOMPLETE_STDOUT_FILENAME"] = str(out_file)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "slime.cli.main"], env=env, capture_output=True, text=True
    )
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert sorted(out_file.read_text().split("\x0b")) == ["rollout.backend", "rollout.batch_size"]
    imported = {row.split("|")[-1].strip().split(".")[0] for row in proc.stderr.splitlines() if "|" in row}
    heavy = {"torch", "ray", "transformers", "megatron", "sglang", "msgspec", "rich", "ruamel", "jsonschema"}
    assert imported & heavy == set(), imported & heavy
    assert not any(
        row.split("|")[-1].strip().startswith(("launchers", "slime.spec")) for row in proc.stderr.splitlines()
    )
    print(f"completion process: {took:.2f} s")


def test_completion_prints_each_shells_script(capsys):
    for shell, marker in (("bash", "complete -o nospace"), ("zsh", "compdef"), ("fish", "complete --command")):
        assert main(["completion", shell]) == 0
        assert marker in capsys.readouterr().out
    assert main(["completion", "tcsh"]) == 2
    assert "invalid choice: 'tcsh'" in capsys.readouterr().err
