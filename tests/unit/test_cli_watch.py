"""``status --watch [SECONDS]``: refreshes until the run ends, JSON lines with ``--json``, Ctrl-C exits
130 without a message. (The screen redrawn in place in a real terminal: tests/integration/
test_cli_terminal.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.cli.main import main
from tests.fixtures.run_records import ROOT, Replay, finished, make_run

pytestmark = pytest.mark.timeout(120)


def test_watch_json_follows_the_run_until_it_ends(tmp_path, capsys):
    paths = make_run(tmp_path / "runs", "quickstart-20260101-000000-abcdef")
    replay = Replay(paths, delay=0.15)
    try:
        rc = main(["status", "abc", "--dir", str(tmp_path / "runs"), "--watch", "0.2", "--json"])
    finally:
        replay.stop()
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(docs) >= 3
    assert all(d["state"] == "running" for d in docs[:-1]) and docs[-1]["state"] == "succeeded"
    rollouts = [d["tasks"][0]["rollout_id"] for d in docs if d["tasks"][0]["rollout_id"] is not None]
    assert len(set(rollouts)) >= 2 and rollouts == sorted(rollouts) and rollouts[-1] == 11  # it moved, to the end


def test_watch_of_an_ended_run_draws_once_and_returns(tmp_path, capsys, monkeypatch):
    paths = make_run(tmp_path / "runs", "quickstart-20260101-000000-abcdef")
    finished(paths)
    monkeypatch.setenv("COLUMNS", "80")
    t0 = time.monotonic()
    rc = main(["status", "--dir", str(tmp_path / "runs"), "--watch", "30"])
    out = capsys.readouterr().out
    assert rc == 0 and time.monotonic() - t0 < 20  # no 30 s wait for a run that has ended
    assert "run ended (succeeded); stopped watching" in out and out.count("TASK") == 1


def test_watch_seconds_and_targets(tmp_path, capsys):
    paths = make_run(tmp_path / "runs", "quickstart-20260101-000000-abcdef")
    finished(paths)
    d = str(tmp_path / "runs")
    # `--watch RUN`: argparse gives the run to --watch; it is taken back as the target
    assert main(["status", "--dir", d, "--watch", "abcdef", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_dir"] == str(paths.root)
    for argv, message in (
        (["--watch", "0"], "between 0.2 and 3600"),
        (["--watch", "123456"], "put it before --watch"),
        (["abcdef", "--watch", "soon"], "SECONDS must be a number"),
    ):
        assert main(["status", "--dir", d, *argv, "--json"]) == 2
        assert message in json.loads(capsys.readouterr().out)["message"], argv


def test_ctrl_c_stops_watching_with_130_and_no_message(tmp_path):
    paths = make_run(tmp_path / "runs", "quickstart-20260101-000000-abcdef")
    replay = Replay(paths, delay=5)  # runs for a minute
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slime.cli.main", "status", str(paths.root), "--watch", "0.3", "--json"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as a terminal delivers it: a process started in the background by a non-interactive
            # shell (as CI may start the suite) inherits SIGINT ignored, and Python then never raises
            # KeyboardInterrupt. The disposition a user's shell gives is the default one.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        first = proc.stdout.readline()  # watching
        assert json.loads(first)["state"] == "running"
        ignored = _sigign(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"status --watch did not stop within 30 s of SIGINT (its SigIgn mask then: {ignored})")
    finally:
        replay.stop()
    assert proc.returncode == 130 and err == ""
    assert all(json.loads(line)["state"] == "running" for line in out.splitlines())


def _sigign(pid: int) -> str:
    """The ignored-signals mask of ``pid`` (``/proc/PID/status``), for the failure message."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return line.split()[1]
    return "?"
