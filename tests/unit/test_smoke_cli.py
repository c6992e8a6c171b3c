"""``slime-submit smoke``'s answers that come before any run: a spec error, data that is not here, a
task or rollout count that does not exist — each exit 2 with the field or flag named, nothing started.
(The runs themselves: tests/e2e/test_smoke.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from slime.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_data_that_lives_on_a_cluster_is_named_with_the_set_that_fixes_it(capsys, tmp_path):
    rc = main(["smoke", str(REPO / "specs" / "ppo.yaml"), "--json", "--dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 2 and out["ok"] is False
    by_path = {p["path"]: p for p in out["problems"]}
    assert "file not found: /data/gsm8k-train.jsonl" in by_path["data.prompts"]["message"]
    note = by_path[""]
    assert "scaled-down spec" in note["message"] and "--set data.prompts=" in note["hint"]
    assert not any(tmp_path.iterdir())  # nothing ran


def test_an_invalid_spec_is_refused_before_scaling(capsys):
    rc = main(["smoke", str(REPO / "specs" / "quickstart.yaml"), "--set", "rollout.temperature=0"])
    assert rc == 2 and "temperature must be > 0" in capsys.readouterr().err


def test_a_task_that_does_not_exist_and_too_few_rollouts_are_usage_errors(capsys):
    assert main(["smoke", str(REPO / "specs" / "quickstart.yaml"), "--task", "3"]) == 2
    assert "--task 3: the spec has 1 task(s)" in capsys.readouterr().err
    assert main(["smoke", str(REPO / "specs" / "quickstart.yaml"), "--rollouts", "0"]) == 2
    assert "give a number of rollouts >= 1" in capsys.readouterr().err


def test_smoke_is_a_listed_subcommand(capsys):
    assert main(["smoke", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--rollouts N" in text and "--set PATH=VALUE" in text and "--task N" in text
