"""The rollout loop (``slime.runtime.rollout.collect``) with the real prompt source over the real arithmetic
prompts, and generation/scoring given as plain async functions (the engine-backed path is tested in
``tests/integration/test_runtime_data_path.py``): draw order, rounds, drop reasons, the fallback of
``keep_when_insufficient``, abort and the partial-rollout buffer, and the state that a checkpoint keeps.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from slime.data.jsonl import PromptDataset
from slime.rl.filters import Verdict, load_filter
from slime.rl.sample import Sample, SampleStatus
from slime.runtime.rollout.collect import CollectConfig, collect, mask_offpolicy
from slime.runtime.rollout.source import Group, PromptSource

REPO = Path(__file__).resolve().parents[2]
N = 4
nonzero_std = load_filter("nonzero_std")  # what the rollout manager loads for the built-in name


def source(seed=0) -> PromptSource:
    ds = PromptDataset(REPO / "specs/data/arith/train.jsonl", shuffle=True, seed=seed)
    return PromptSource(ds, n=N, encode=lambda text: [ord(c) for c in text])


class Engine:
    """Generation as the loop sees it: ``finish`` says which draw positions finish and in what order
    (position → delay); the others run until ``abort``, which cuts them with 2 tokens generated."""

    def __init__(self, delays: dict[int, float] | None = None, default: float | None = 0.0) -> None:
        self.delays, self.default = delays or {}, default
        self.gate = asyncio.Event()
        self.aborts = 0
        self.positions: list[int] = []

    async def generate(self, group: Group, position: int) -> None:
        self.positions.append(position)
        delay = self.delays.get(position, self.default)
        if delay is None:
            await self.gate.wait()
        else:
            await asyncio.sleep(delay)
        for s in group.samples:
            s.group_index = position
            cut = delay is None
            s.tokens = list(s.tokens) + [7, 8] + ([] if cut else [9])
            s.response_length += 2 if cut else 3
            s.loss_mask, s.rollout_log_probs = [1] * s.response_length, [-0.5] * s.response_length
            s.status = SampleStatus.ABORTED if cut else SampleStatus.COMPLETED

    async def abort(self) -> int:
        self.aborts += 1
        self.gate.set()
        return 1


def scorer(rewards_by_position):
    """Rewards of a group by its position: a list of N rewards, or a constant."""

    async def score(samples):
        for j, s in enumerate(samples):
            r = rewards_by_position(s.group_index)
            s.reward = r[j] if isinstance(r, list) else r

    return score


MIXED, FLAT0, FLAT1 = [1.0, 0.0, 0.0, 0.0], 0.0, 1.0


def run(coro):
    return asyncio.run(coro)


def test_groups_are_kept_in_draw_order_whatever_finishes_first():
    src = source()
    # position 0 is flat (dropped), 1..5 mixed; later positions finish first
    eng = Engine({p: 0.01 * (6 - p) for p in range(6)})
    cfg = CollectConfig(batch_size=3, over_sampling=6, max_rounds=2)
    kept, m = run(
        collect(
            src,
            0,
            cfg,
            generate=eng.generate,
            score=scorer(lambda p: FLAT0 if p == 0 else MIXED),
            keep=nonzero_std,
            abort=eng.abort,
        )
    )
    assert [g.samples[0].group_index for g in kept] == [1, 2, 3]  # the first passing ones, not the first to finish
    assert [g.draw for g in kept] == [1, 2, 3]
    assert (m["rollout/groups_generated"], m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (4, 3, 1)
    assert m["rollout/groups_dropped/zero_std_0.0"] == 1 and m["rollout/rounds"] == 1 and m["rollout/groups_drawn"] == 6
    assert m["rollout/groups_short"] == 0 and m["rollout/groups_buffered"] == 0 and len(src.buffer) == 0
    assert all(not any(s.metadata.get("partial") for s in g.samples) for g in kept)


def test_a_round_is_drawn_whenever_the_batch_could_no_longer_fill_up_to_max_rounds():
    src = source()
    eng = Engine()
    # positions 0-3 (round 1) flat: the second round is drawn after the first drop (3 pending + 0 kept < 4)
    cfg = CollectConfig(batch_size=4, over_sampling=4, max_rounds=3)
    kept, m = run(
        collect(
            src,
            0,
            cfg,
            generate=eng.generate,
            score=scorer(lambda p: FLAT1 if p < 4 else MIXED),
            keep=nonzero_std,
            abort=eng.abort,
        )
    )
    assert m["rollout/rounds"] == 2 and [g.draw for g in kept] == [4, 5, 6, 7]
    assert m["rollout/groups_dropped/zero_std_1.0"] == 4 and eng.positions == list(range(8))
    # all flat: max_rounds rounds, then train on what passed (nothing) and say so
    src, eng = source(), Engine()
    kept, m = run(
        collect(src, 0, cfg, generate=eng.generate, score=scorer(lambda p: FLAT0), keep=nonzero_std, abort=eng.abort)
    )
    assert kept == [] and m["rollout/rounds"] == 3 and m["rollout/groups_short"] == 4
    assert m["rollout/groups_generated"] == m["rollout/groups_dropped"] == 12
    assert src.dataset.state_dict()["index"] == 12  # the dropped prompts are used up, as in slime
    assert eng.aborts == 0  # nothing was left running


def test_keep_when_insufficient_keeps_a_rejected_group_only_when_it_could_not_be_replaced():
    def fallback(samples):
        v = nonzero_std(samples)
        return Verdict(v.keep, v.reason, keep_when_insufficient=True)

    src, eng = source(), Engine()
    cfg = CollectConfig(batch_size=2, over_sampling=3, max_rounds=1)
    # 3 groups, positions 0 and 1 flat, 2 mixed: 0 is dropped (2 more could fill), 1 is kept (only 1 left)
    kept, m = run(
        collect(
            src,
            0,
            cfg,
            generate=eng.generate,
            score=scorer(lambda p: MIXED if p == 2 else FLAT0),
            keep=fallback,
            abort=eng.abort,
        )
    )
    assert [g.draw for g in kept] == [1, 2] and m["rollout/groups_dropped"] == 1


def test_partial_rollout_buffers_what_is_left_and_the_next_rollout_takes_it_first():
    src = source()
    eng = Engine({0: 0.0, 1: 0.0, 2: 0.0}, default=None)  # 3..5 run until aborted
    cfg = CollectConfig(batch_size=2, over_sampling=6, max_rounds=1, partial=True)
    kept, m = run(
        collect(src, 0, cfg, generate=eng.generate, score=scorer(lambda p: MIXED), keep=None, abort=eng.abort)
    )
    assert [g.draw for g in kept] == [0, 1] and eng.aborts == 1
    assert m["rollout/groups_aborted"] == 3 and m["rollout/groups_buffered"] == 4 and m["rollout/buffer_groups"] == 4
    assert [g.draw for g in src.buffer] == [2, 3, 4, 5]  # finished-but-unneeded 2, then the aborted ones
    assert [g.samples[0].status for g in src.buffer] == [SampleStatus.COMPLETED] + [SampleStatus.ABORTED] * 3
    assert all(s.metadata["partial"] == {"start_rollout_id": 0} for g in src.buffer for s in g.samples)
    assert all(s.reward is None for g in src.buffer for s in g.samples)  # buffered groups are scored when examined
    # the buffer goes into the checkpoint: JSON, and restored exactly
    state = json.loads(json.dumps(src.state_dict()))
    restored = source()
    restored.load_state_dict(state)
    assert [g.to_dict() for g in restored.buffer] == [g.to_dict() for g in src.buffer] and restored.draws == 6
    # next rollout: buffered groups first (the loop's generate continues them), then fresh prompts
    taken = restored.take(5, rollout_id=1)
    assert [g.draw for g in taken] == [2, 3, 4, 5, 6] and [g.start_rollout for g in taken] == [0, 0, 0, 0, 1]
    assert taken[1].samples[0].response_length == 2 and taken[1].samples[0].tokens[-2:] == [7, 8]
    # without partial rollout the same leftovers are dropped
    src2, eng2 = source(), Engine({0: 0.0, 1: 0.0, 2: 0.0}, default=None)
    _, m2 = run(
        collect(
            src2,
            0,
            CollectConfig(2, 6),
            generate=eng2.generate,
            score=scorer(lambda p: MIXED),
            keep=None,
            abort=eng2.abort,
        )
    )
    assert m2["rollout/groups_buffered"] == 0 and len(src2.buffer) == 0 and eng2.aborts == 1


def test_a_failing_reward_aborts_what_runs_and_raises_it():
    src, eng = source(), Engine({0: 0.0}, default=None)

    async def bad(samples):
        raise ValueError("reward function exploded")

    with pytest.raises(ValueError, match="exploded"):
        run(collect(src, 0, CollectConfig(2, 4), generate=eng.generate, score=bad, keep=None, abort=eng.abort))
    assert eng.aborts == 1


def test_old_state_without_a_buffer_loads_as_empty():
    src = source()
    src.take(3, 0)
    restored = source()
    restored.load_state_dict({"data": src.dataset.state_dict()})
    assert len(restored.buffer) == 0 and restored.dataset.state_dict()["index"] == 3


def test_offpolicy_masking_is_per_token():
    cont = Sample(tokens=[1, 2, 3, 4, 5], response_length=4, loss_mask=[1, 0, 1, 1], token_versions=[6, 6, 7, 7])
    done_earlier = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], weight_version=6)
    fresh = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], weight_version=7)
    assert mask_offpolicy([cont, done_earlier, fresh], current=7) == 4
    assert cont.loss_mask == [0, 0, 1, 1] and done_earlier.loss_mask == [0, 0] and fresh.loss_mask == [1, 1]
