"""Checkpoints are atomic and pruned: a save that dies half way leaves the previous one usable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slime.runtime.checkpoint import STATE_FILE, CheckpointError, CheckpointStore

REPO = Path(__file__).resolve().parents[2]


def save(store: CheckpointStore, rollout_id: int, payload: bytes = b"x") -> Path:
    tmp = store.begin(rollout_id)
    (tmp / "actor-rank0.pt").write_bytes(payload)
    return store.commit(tmp, rollout_id, {"rollout_id": rollout_id})


def test_latest_is_the_newest_complete_and_old_ones_are_pruned(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    assert store.latest() is None
    for r in (3, 7, 11):
        save(store, r)
    assert [r for r, _ in store.complete()] == [7, 11]
    assert store.latest() == tmp_path / "11"
    assert store.read_state(store.latest()) == {"rollout_id": 11}
    # saving the same rollout again replaces it whole
    save(store, 11, b"new")
    assert (tmp_path / "11" / "actor-rank0.pt").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["11", "7"]


def test_an_exception_during_save_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    save(store, 1, b"good")
    tmp = store.begin(2)
    (tmp / "actor-rank0.pt").write_bytes(b"half")
    store.abort(tmp)  # what the driver does when a rank's save raises
    assert store.latest() == tmp_path / "1"
    assert not tmp.exists()


_CRASHING_SAVER = r"""
import os, sys, time
sys.path.insert(0, {repo!r})
from slime.runtime.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], keep=2)
tmp = store.begin(2)
with open(tmp / "actor-rank0.pt", "wb") as fh:
    fh.write(b"partial" * 1000)
    fh.flush()
    print("writing", flush=True)
    time.sleep(60)  # killed here, mid-save
"""


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    save(store, 1, b"good")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_SAVER.format(repo=str(REPO)), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the killed save should have left its temp dir behind"
    assert store.latest() == tmp_path / "1"
    assert (store.latest() / "actor-rank0.pt").read_bytes() == b"good"
    # the next save cleans the leftovers up
    save(store, 3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert [r for r, _ in store.complete()] == [1, 3]


def test_a_directory_without_state_is_not_a_checkpoint(tmp_path):
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "actor-rank0.pt").write_bytes(b"x")
    store = CheckpointStore(tmp_path, keep=1)
    assert store.latest() is None
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        store.read_state(tmp_path / "5")
    (tmp_path / "6").mkdir()
    (tmp_path / "6" / STATE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        store.read_state(tmp_path / "6")


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
