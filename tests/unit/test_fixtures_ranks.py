"""The rank spawner of tests/fixtures/ranks.py: each rank is told its place, a failing rank fails the test
at once with its stderr (its waiting peer is killed, not waited for), and a hung group is killed at the
deadline."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tests.fixtures.ranks import REPO, spawn_ranks

SHOW = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'MASTER_PORT', 'X')}))"


def test_each_rank_gets_its_place_one_port_and_the_extra_env():
    outs = spawn_ranks([sys.executable, "-c", SHOW], 3, env=lambda r: {"X": f"x{r}"})
    rows = [json.loads(o) for o in outs]
    assert [(r["RANK"], r["WORLD_SIZE"], r["X"]) for r in rows] == [
        ("0", "3", "x0"),
        ("1", "3", "x1"),
        ("2", "3", "x2"),
    ]
    assert len({r["MASTER_PORT"] for r in rows}) == 1


def test_a_failing_rank_fails_at_once_and_its_waiting_peer_is_killed(tmp_path):
    marker = tmp_path / "pid"
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1': sys.exit('rank one broke')\n"
        f"open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(600)\n"
    )
    t = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="rank 1 of 2 exited 1:\nrank one broke"):
        spawn_ranks([sys.executable, "-c", code], 2, timeout=120)
    assert time.monotonic() - t < 60
    if marker.exists():  # rank 0 got as far as writing its pid: it must be gone
        with pytest.raises(ProcessLookupError):
            os.kill(int(marker.read_text()), 0)


def test_a_hung_group_is_killed_at_the_deadline_naming_the_ranks():
    with pytest.raises(pytest.fail.Exception, match=r"rank\(s\) \[0, 1\] of 2 still running after 2 s"):
        spawn_ranks([sys.executable, "-c", "import time; time.sleep(600)"], 2, timeout=2)


def test_ranks_import_this_checkout():
    (out,) = spawn_ranks([sys.executable, "-c", "import tests.fixtures.ranks as r; print(r.REPO)"], 1)
    assert out.strip() == str(REPO)
