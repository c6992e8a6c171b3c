"""The job commands in a real terminal: tmux at 80x24 runs ``slime-submit`` as a person types it
(``send-keys``) and the screen is read back (``capture-pane``).

"No wrapped rows" is checked by tmux itself: ``capture-pane -J`` joins the screen lines the terminal
wrapped, so a screen without wrapping reads the same with and without ``-J``. ``status --watch``
is sampled while it runs: the table is on the screen once (redrawn in place, never scrolled), its
rollout count moves, and the watch ends by itself with the run (exit 0), or with Ctrl-C (exit 130,
no message). Runs: tests/fixtures/run_records.py (the launchers' files, a real process replaying a
real quickstart's metrics). Skipped where tmux is not installed (ci/install.sh installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.run_records import ROOT, Replay, finished, make_run

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (ci/install.sh installs it)"),
]


class Tmux:
    """One detached tmux session of 80x24 on a private server socket, running bash."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.sock = str(tmp / "tmux.sock")
        shell = "bash --norc --noprofile"
        self.tmux("new-session", "-d", "-x", "80", "-y", "24", "-s", "t", "-c", str(tmp), shell, env=env)
        self.tmux("set-option", "-g", "status", "off")  # all 24 rows are the terminal's
        self.send("PS1='$ '")
        self.clear()

    def clear(self) -> None:
        """Clear the screen and wait for the bare prompt (so typed lines start on a clean screen)."""
        self.send("clear")
        deadline = time.monotonic() + 30
        while [ln for ln in self.screen() if ln] != ["$"]:
            assert time.monotonic() < deadline, "\n".join(self.screen())
            time.sleep(0.1)

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(["tmux", "-S", self.sock, *args], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def send(self, line: str) -> None:
        self.tmux("send-keys", "-t", "t", line, "Enter")

    def screen(self) -> list[str]:
        return self._lines(self.tmux("capture-pane", "-p", "-t", "t"))

    def screens(self) -> tuple[list[str], list[str]]:
        """The screen as drawn and with wrapped lines joined (-J), captured by one tmux command
        sequence, so a redraw cannot fall between the two."""
        out = self.tmux(
            "capture-pane", "-p", "-t", "t", ";", "display-message", "-p", "__SPLIT__", ";",
            "capture-pane", "-p", "-J", "-t", "t",
        )  # fmt: skip
        plain, joined = out.split("__SPLIT__\n")
        return self._lines(plain), self._lines(joined)

    @staticmethod
    def _lines(text: str) -> list[str]:
        return [ln.rstrip() for ln in text.rstrip("\n").split("\n")]

    def run(self, command: str, timeout: float = 90) -> tuple[int, list[str]]:
        """Clear, type ``command``, wait for it to end; (exit code, the screen)."""
        self.clear()
        self.send(f"{command}; echo __rc=$?__")
        return self.wait_rc(timeout)

    def wait_rc(self, timeout: float) -> tuple[int, list[str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            for ln in screen:
                m = re.fullmatch(r"__rc=(\d+)__", ln)
                if m:
                    return int(m.group(1)), screen
            time.sleep(0.2)
        raise AssertionError("command did not finish:\n" + "\n".join(self.screen()))

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)


def assert_unwrapped(screens: tuple[list[str], list[str]]) -> None:
    """Same lines with -J as without: the terminal wrapped nothing; and nothing past 80 columns."""
    screen, joined = screens
    assert [ln for ln in screen if ln] == [ln for ln in joined if ln], "\n".join(joined)
    assert all(len(ln) <= 80 for ln in screen)


@pytest.fixture
def term(tmp_path):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "slime-submit"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m slime.cli.main "$@"\n')
    exe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX", "SLIME_RUNS_DIR")}
    env.update(PATH=f"{tmp_path / 'bin'}:{env['PATH']}", PYTHONPATH=str(ROOT), TERM="xterm-256color")
    t = Tmux(tmp_path, env)
    yield t
    t.close()


@pytest.fixture
def runs(tmp_path):
    d = tmp_path / "runs"
    a = make_run(d, "quickstart-20260101-000000-a1b2c3", started=time.time() - 3000)
    finished(a)
    long_name = "a-very-long-experiment-name-for-the-learning-rate-sweep"
    b = make_run(d, f"{long_name}-20260101-000100-b0b0b0", overrides=(f"name={long_name}",))
    finished(b, lines=5)
    c = make_run(
        d,
        "sweep-20260101-000200-c0ffee",
        overrides=("name=sweep", "sweep.grid={'train.optimizer.lr': [1.0e-4, 3.0e-4, 1.0e-3]}"),
    )
    for t in range(3):
        finished(c, t, lines=4 + t)
    return d


def test_list_and_status_read_at_80_columns(term, runs):
    rc, screen = term.run("slime-submit list --dir runs")  # the session's directory is runs' parent
    assert rc == 0
    assert_unwrapped(term.screens())
    rows = [ln for ln in screen if re.match(r"^[0-9a-f]{6}  ", ln)]
    assert [r.split()[0] for r in rows] == ["c0ffee", "b0b0b0", "a1b2c3"], "\n".join(screen)
    assert "…" in rows[1]  # the long name is cut on its line
    print("\n".join(screen))  # the captured screen, for the record

    rc, screen = term.run("slime-submit status c0f --dir runs")
    assert rc == 0
    assert_unwrapped(term.screens())
    header = next(ln for ln in screen if ln.startswith("TASK"))
    assert header.split() == ["TASK", "STATE", "ROLLOUT", "ELAPSED", "METRIC", "EVAL", "THROUGHPUT"]
    assert len([ln for ln in screen if re.match(r"^ +\d  succeeded", ln)]) == 3


def test_status_watch_redraws_in_place_until_the_run_ends(term, tmp_path):
    d = tmp_path / "runs"
    paths = make_run(d, "quickstart-20260101-000000-d00d00")
    replay = Replay(paths, delay=0.8)  # 13 metrics lines: ~10 s
    try:
        term.clear()
        term.send("slime-submit status d00 --dir runs --watch 0.5; echo __rc=$?__")
        seen, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            screen, joined = term.screens()
            if any(ln.startswith("__rc=") for ln in screen):
                break
            if any(ln.startswith("TASK") for ln in screen):
                seen.append(screen)
                # redrawn in place: one table on the screen at any time, never a scrolled pile
                assert sum(ln.startswith("TASK") for ln in screen) == 1, "\n".join(screen)
                assert_unwrapped((screen, joined))
            time.sleep(0.3)
        rc, final = term.wait_rc(10)
    finally:
        replay.stop()
    assert rc == 0, "\n".join(final)
    progress = []
    for screen in seen:
        row = next((ln for ln in screen if re.match(r"^ +0  ", ln)), None)
        if row:
            progress.append(int(row.split()[2].split("/")[0]))
    assert len(set(progress)) >= 3 and progress == sorted(progress), progress  # it moved, in place
    running = next(s for s in seen if any(" running " in f" {ln} " for ln in s))
    assert any("every 0.5s" in ln and "Ctrl-C stops watching" in ln for ln in running)
    assert sum(ln.startswith("TASK") for ln in final) == 1
    assert any("run ended (succeeded); stopped watching" in ln for ln in final)
    assert_unwrapped(term.screens())
    print("\n".join(running))  # a captured watch screen, for the record
    print("\n".join(final))


def test_ctrl_c_ends_the_watch_quietly(term, tmp_path):
    d = tmp_path / "runs"
    paths = make_run(d, "quickstart-20260101-000000-e0e0e0")
    replay = Replay(paths, delay=10)
    try:
        term.clear()
        term.send("slime-submit status e0e --dir runs --watch 0.5; echo __rc=$?__")
        deadline = time.monotonic() + 60
        while not any("Ctrl-C stops watching" in ln for ln in term.screen()):
            assert time.monotonic() < deadline, "\n".join(term.screen())
            time.sleep(0.2)
        term.tmux("send-keys", "-t", "t", "C-c")
        rc, screen = term.wait_rc(30)
    finally:
        replay.stop()
    assert rc == 130
    text = "\n".join(screen)
    assert "Traceback" not in text and "interrupted" not in text and "error" not in text
