"""The loop's state and the checkpoints that carry it (``slime.runtime.train_state``): round trips through
``state.json``, the format older checkpoints have, and the world-size check at resume.

Trainer groups (Ray actors) are stood in for by ``_Ranks``, which writes and reads one real file per rank
through the same ``call("save" | "load", dir)`` the runtime uses; the checkpoint store is the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.runtime.checkpoint import STATE_FILE, CheckpointError, CheckpointStore
from slime.runtime.train_state import ResumePoint, TrainState, restore_checkpoint, save_checkpoint


class _Ranks:
    def __init__(self, role: str, n: int, value: str = "") -> None:
        self.role, self.ranks, self.value = role, [object()] * n, value

    def call(self, method: str, ckpt: str) -> list[None]:
        for i in range(len(self.ranks)):
            f = Path(ckpt) / f"{self.role}-rank{i}.txt"
            if method == "save":
                f.write_text(self.value)
            else:
                self.value = f.read_text()
        return [None] * len(self.ranks)


def test_train_state_round_trips_through_its_state_dict():
    st = TrainState(rollout_id=7, step=16, weight_version=9, data={"data": {"epoch": 1, "offset": 24}})
    back = TrainState()
    back.load_state_dict(json.loads(json.dumps(st.state_dict())))
    assert back == st and back.data is not st.data
    with pytest.raises(ValueError, match=r"missing \['manager', 'weight_version'\]"):
        TrainState().load_state_dict({"rollout_id": 1, "step": 2})


def test_a_checkpoint_round_trips_the_state_and_every_rank(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    assert ResumePoint.find(store, None) is None  # fresh
    st = TrainState(rollout_id=3, step=8, weight_version=4, data={"data": {"offset": 32}})
    path = save_checkpoint(store, st, [_Ranks("actor", 2, "a"), _Ranks("critic", 2, "c")])
    assert path == tmp_path / "ckpt" / "3" and sorted(p.name for p in path.iterdir()) == [
        "actor-rank0.txt",
        "actor-rank1.txt",
        "critic-rank0.txt",
        "critic-rank1.txt",
        STATE_FILE,
    ]
    doc = json.loads((path / STATE_FILE).read_text())
    # the keys checkpoints have always had (older runs' checkpoints load, later ones stay readable), plus the
    # optional "prefetched" (an async run's rollout generated ahead; None here)
    assert set(doc) == {"format", "rollout_id", "step", "weight_version", "world_size", "manager", "saved_at"} | {
        "prefetched"
    }
    assert (doc["format"], doc["world_size"], doc["manager"], doc["prefetched"]) == (
        1,
        2,
        {"data": {"offset": 32}},
        None,
    )

    point = ResumePoint.find(store, "/elsewhere/ignored")  # its own checkpoint wins over load
    assert point is not None and point.path == path and not point.from_load
    actor, critic, back = _Ranks("actor", 2), _Ranks("critic", 2), TrainState()
    restore_checkpoint(point, back, [actor, critic])
    assert back == st and (actor.value, critic.value) == ("a", "c")


def test_resume_refuses_another_world_size_and_an_incomplete_state(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    save_checkpoint(store, TrainState(rollout_id=0, step=1, weight_version=1), [_Ranks("actor", 2)])
    point = ResumePoint.find(store, None)
    with pytest.raises(ValueError, match="saved by 2 trainer ranks, this job has 1; resume with the same"):
        restore_checkpoint(point, TrainState(), [_Ranks("actor", 1)])
    (point.path / STATE_FILE).write_text(json.dumps({"rollout_id": 0, "step": 1}))
    with pytest.raises(CheckpointError, match=r"lacks \['manager', 'weight_version'\]"):
        ResumePoint.find(store, None)


def test_a_load_checkpoint_is_the_start_point_until_the_run_has_its_own(tmp_path):
    other = CheckpointStore(tmp_path / "pretrained", keep=1)
    start = save_checkpoint(other, TrainState(rollout_id=9, step=20, weight_version=10), [_Ranks("actor", 1)])
    mine = CheckpointStore(tmp_path / "mine", keep=1)
    point = ResumePoint.find(mine, str(start))
    assert point is not None and point.path == start and point.from_load


def test_an_async_checkpoint_carries_its_prefetched_rollout_and_older_ones_have_none(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    st = TrainState(rollout_id=4, step=5, weight_version=6, prefetched=5)
    path = save_checkpoint(store, st, [_Ranks("actor", 1)], {"prefetched_rollout.json": '{"rollout_id": 5}'})
    assert json.loads((path / "prefetched_rollout.json").read_text()) == {"rollout_id": 5}
    back = TrainState()
    restore_checkpoint(ResumePoint.find(store, None), back, [_Ranks("actor", 1)])
    assert back == st and back.prefetched == 5
    old = {"rollout_id": 1, "step": 2, "weight_version": 3, "manager": {}}  # written before "prefetched" existed
    back.load_state_dict(old)
    assert back.prefetched is None and back.rollout_id == 1
