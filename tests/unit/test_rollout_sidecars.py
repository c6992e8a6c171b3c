"""The trainer's sidecars of a saved rollout (``slime.runtime.rollout.saved``): who writes them, what they
hold, and how readers join them to the rollout's samples (by row and ids: a sidecar that names another
sample, a missing one or a duplicate never puts wrong log-probs on a sample). A real run writing them is
tests/integration/test_runtime_replay.py's part.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("torch")

import torch

from slime.cli import rollout_store as store
from slime.rl.sample import Sample, SampleStatus
from slime.runtime.rollout.saved import (
    read_rollout,
    read_trainer,
    saved_ids,
    trainer_log_probs,
    trainer_path,
    write_rollout,
    write_trainer,
)
from slime.runtime.step_plan import train_inputs
from slime.runtime.trainer_group import TrainerGroup, _save_log_probs


def samples(n: int = 6) -> list[Sample]:
    return [
        Sample(
            group_index=i // 2,
            index=i,
            prompt=f"p{i}",
            tokens=[1, 2, 3] + [10 + k for k in range(i + 1)],
            response=f"r{i}",
            response_length=i + 1,
            reward=float(i % 2),
            loss_mask=[1] * (i + 1),
            rollout_log_probs=[-0.5 - k for k in range(i + 1)],
            status=SampleStatus.COMPLETED,
        )
        for i in range(n)
    ]


def entry(row: int, s: Sample, shift: float = 0.25, **ids) -> dict:
    lps = [x + shift for x in s.rollout_log_probs]
    return {"row": row, "group_index": s.group_index, "index": s.index, "trainer_log_probs": lps, **ids}


def test_the_join_is_by_row_and_ids_whatever_the_order_and_a_missing_or_wrong_entry_is_engine_only(tmp_path):
    ss = samples()
    write_rollout(tmp_path, 3, ss)
    assert trainer_log_probs(tmp_path, 3, ss) == [None] * 6  # no sidecar: engine-only, as before
    # rank 1 wrote rows 5, 3 (any order); rank 0 rows 2, 0 and a duplicate of row 3; row 1 is in none;
    # row 4's entry names another sample, row 0's has the wrong length
    write_trainer(tmp_path, 3, 1, [entry(5, ss[5]), entry(3, ss[3], shift=0.125)])
    short = entry(0, ss[0]) | {"trainer_log_probs": []}
    write_trainer(tmp_path, 3, 0, [entry(2, ss[2]), short, entry(3, ss[3], shift=1.0), entry(4, ss[4], index=99)])
    got = trainer_log_probs(tmp_path, 3, ss)
    assert got[0] is None and got[1] is None and got[4] is None
    assert got[2] == [x + 0.25 for x in ss[2].rollout_log_probs]
    assert got[3] == [x + 1.0 for x in ss[3].rollout_log_probs]  # the duplicate: the lowest rank's entry
    assert got[5] == [x + 0.25 for x in ss[5].rollout_log_probs]
    assert sorted(read_trainer(tmp_path, 3)) == [0, 2, 3, 4, 5]
    # replay (debug.mode: train_only) reads the rollout alone; the sidecars are not rollouts
    assert read_rollout(tmp_path, 3) == ss and saved_ids(tmp_path) == [3]
    assert trainer_path(tmp_path, 3, 1).name == "trainer_000003.r1.parquet"
    assert not list(tmp_path.glob(".*"))  # no temp file left behind


def test_rewriting_a_rollout_drops_its_old_sidecars_only(tmp_path):
    ss = samples()
    write_rollout(tmp_path, 0, ss)
    write_rollout(tmp_path, 1, ss)
    for rid in (0, 1):
        write_trainer(tmp_path, rid, 0, [entry(0, ss[0])])
    write_rollout(tmp_path, 0, ss[:2])  # rollout 0 generated again (a resumed attempt): not those samples
    assert read_trainer(tmp_path, 0) == {} and sorted(read_trainer(tmp_path, 1)) == [0]


def test_the_viewer_store_shows_the_sidecar_log_probs(tmp_path):
    ss = samples(4)
    write_rollout(tmp_path, 0, ss)
    write_trainer(tmp_path, 0, 0, [entry(1, ss[1]), entry(2, ss[2], group_index=7)])
    assert store.saved_rollouts(tmp_path) == [0] and store.count_rows(tmp_path, 0) == 4
    shown = [s["trainer_lp"] for s in store.iter_samples(tmp_path, [0])]
    assert shown == [None, [x + 0.25 for x in ss[1].rollout_log_probs], None, None]
    (one,) = store.read_samples(tmp_path, [(0, 1)])
    assert one["trainer_lp"] == shown[1] and one["engine_lp"] == ss[1].rollout_log_probs


def test_a_rank_saves_each_samples_log_probs_over_its_response_tokens(tmp_path):
    ss = samples(3)
    inputs = train_inputs(ss)
    assert [(x["row"], x["group_index"], x["index"]) for x in inputs] == [(0, 0, 0), (1, 0, 1), (2, 1, 2)]
    T = max(len(s.tokens) for s in ss)
    lp = torch.arange(3 * (T - 1), dtype=torch.float32).reshape(3, T - 1)  # position t scores token t+1
    _save_log_probs(inputs[1:], lp[1:], str(tmp_path), 5, 2)
    got = read_trainer(tmp_path, 5)
    for row in (1, 2):
        P, L = len(ss[row].tokens) - ss[row].response_length, len(ss[row].tokens)
        assert got[row].log_probs == lp[row, P - 1 : L - 1].tolist()
        assert (got[row].group_index, got[row].index) == (ss[row].group_index, ss[row].index)
    assert trainer_path(tmp_path, 5, 2).is_file()


class _Rank:
    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.prepare = SimpleNamespace(options=lambda num_returns: SimpleNamespace(remote=self._remote))

    def _remote(self, *args):
        self.calls.append(args)
        return ("metrics", "returns")


def test_one_rank_per_model_replica_writes_named_by_its_data_parallel_rank(tmp_path):
    group = TrainerGroup.__new__(TrainerGroup)
    calls: list = []
    group.ranks = [_Rank(calls) for _ in range(4)]
    group.coords = [(0, 2), (0, 2), (1, 2), (1, 2)]  # two replicas of two model-parallel ranks each
    shards = [["a"], ["a"], ["b"], ["b"]]
    group.prepare(shards, [None] * 4, None, (tmp_path, 7))
    assert [c[3] for c in calls] == [(str(tmp_path), 7, 0), None, (str(tmp_path), 7, 1), None]
    calls.clear()
    group.prepare(shards, [None] * 4, None)  # debug.save_rollouts off: no rank writes
    assert [c[3] for c in calls] == [None] * 4
