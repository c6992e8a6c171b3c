"""The local launcher's exit code when its bootstrap dies by a signal (the OOM killer's SIGKILL):
said on stderr with the logs to read, and 128+N like a shell, not Popen's -N (which became 247)."""

from __future__ import annotations

import sys
from pathlib import Path

from launchers.local.launcher import _run_foreground, shell_exit_code


def test_a_bootstrap_killed_by_sigkill_exits_137_and_says_so(tmp_path, capfd):
    rc = _run_foreground([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert rc == -9
    assert shell_exit_code(rc, "task 0's bootstrap", tmp_path / "logs") == 137
    err = capfd.readouterr().err
    assert "task 0's bootstrap was killed by SIGKILL (9) (out of memory? see dmesg)" in err
    assert str(tmp_path / "logs") in err


def test_ordinary_exit_codes_pass_through_silently(capfd):
    assert [shell_exit_code(rc, "x", Path("/l")) for rc in (0, 2, 3, 75)] == [0, 2, 3, 75]
    assert capfd.readouterr().err == ""
