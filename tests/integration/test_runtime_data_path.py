"""The data path against real built-in engines over HTTP: dynamic sampling, partial rollout (real aborts,
continuation across rollouts, per-token versions, off-policy masking, the buffer in the checkpoint state),
saved rollouts (Parquet, opened with pandas), eval sampling settings and pass@k.

The rollout manager runs in this process (a plain object, as the Ray actor runs it); the reward is the
custom plug-in ``tests/fixtures/parity_reward.py:parity`` so that groups are mixed or flat at random, as a
learning policy's are.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace

from slime.backends.rollout.builtin.server import start_server
from slime.backends.rollout.client import EngineClient
from slime.models.tiny import build_tiny_model
from slime.rl.sample import SampleStatus
from slime.runtime.rollout.saved import read_rollout, rollout_path, saved_ids
from slime.runtime.rollout_manager import RolloutManager
from slime.spec import load_spec
from slime.spec.types import DynamicSampling

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("data-path") / "tiny", seed=0)


@pytest.fixture(scope="module")
def servers(model_dir):
    wide = start_server(model_dir, seed=0, num_threads=1, max_running_requests=64)
    narrow = start_server(model_dir, seed=1, num_threads=1, max_running_requests=8)  # later groups queue
    for s in (wide, narrow):
        s.engine.weight_version = "3"
    yield wide, narrow
    for s in (wide, narrow):
        s.stop()


@pytest.fixture(scope="module")
def parity_reward():
    return "tests.fixtures.parity_reward:parity"


def make_spec(parity_reward, **rollout):
    s = load_spec(REPO / "specs" / "quickstart.yaml").spec
    ev = replace(s.data.eval[0], max_prompts=12)
    r = replace(s.rollout, **{"batch_size": 4, "n_samples_per_prompt": 4, "over_sampling_batch_size": 6, **rollout})
    return replace(
        s,
        rollout=r,
        reward=replace(s.reward, type="custom", custom=parity_reward),
        data=replace(s.data, eval=(ev,)),
    )


def set_version(url, version):
    async def go():
        async with EngineClient(url) as c:
            await c.post("/update_weight_version", {"new_version": version})

    asyncio.run(go())


def groups_of(samples):
    out: dict[int, list] = {}
    for s in samples:
        out.setdefault(s.group_index, []).append(s)
    return out


def snapshot(batch):
    return [(s.group_index, s.index, s.prompt, s.tokens, s.reward) for s in batch.samples]


def log_probs(batch):
    return [x for s in batch.samples for x in s.rollout_log_probs]


def test_dynamic_sampling_trains_only_mixed_groups_repeatably_and_saves_them(
    parity_reward, servers, model_dir, tmp_path
):
    spec = make_spec(parity_reward, dynamic_sampling=DynamicSampling(filter="nonzero_std", max_rounds=4))
    a = RolloutManager(spec, [servers[0].url], str(model_dir), rollouts_dir=str(tmp_path / "rollouts"))
    batches = [a.generate(r, 3) for r in range(3)]
    dropped = 0
    for b in batches:
        m = b.metrics
        assert m["rollout/groups_kept"] == len(groups_of(b.samples)) == 4 - m["rollout/groups_short"]
        assert m["rollout/groups_generated"] == m["rollout/groups_kept"] + m["rollout/groups_dropped"]
        reasons = {k: v for k, v in m.items() if k.startswith("rollout/groups_dropped/")}
        assert sum(reasons.values()) == m["rollout/groups_dropped"]
        assert set(reasons) <= {"rollout/groups_dropped/zero_std_0.0", "rollout/groups_dropped/zero_std_1.0"}
        assert 1 <= m["rollout/rounds"] <= 4 and m["rollout/groups_buffered"] == 0
        for group in groups_of(b.samples).values():
            assert len(group) == 4 and statistics.pstdev(s.reward for s in group) > 0  # only mixed groups train
        assert [s.index for s in b.samples] == list(range(len(b.samples)))
        dropped += m["rollout/groups_dropped"]
    assert dropped > 0, "no group was ever flat: the filter was not exercised"
    # the same run again, on two engines: the same samples (kept groups are the first to pass in draw order);
    # log-probs equal up to float rounding (the engines' batch shapes differ: 64 and 8 slots)
    b2 = RolloutManager(spec, [s.url for s in servers], str(model_dir))
    again = [b2.generate(r, 3) for r in range(3)]
    assert [snapshot(b) for b in again] == [snapshot(b) for b in batches]
    for x, y in zip(again, batches):
        assert log_probs(x) == pytest.approx(log_probs(y), abs=1e-5)
    # saved rollouts: one Parquet file per rollout, read back equal, opened by pandas
    assert saved_ids(tmp_path / "rollouts") == [0, 1, 2]
    for r, b in enumerate(batches):
        back = read_rollout(tmp_path / "rollouts", r)
        assert [x.to_dict() for x in back] == [json.loads(json.dumps(x.to_dict())) for x in b.samples]
    import pandas as pd

    df = pd.read_parquet(rollout_path(tmp_path / "rollouts", 1))
    assert len(df) == len(batches[1].samples) and (df.groupby("group_index")["reward"].std() > 0).all()
    assert list(df["response_tokens"].iloc[0]) == batches[1].samples[0].response_tokens
    assert not list((tmp_path / "rollouts").glob(".*"))  # no temp file left behind
    for m in (a, b2):
        m.close()


def test_partial_rollout_aborts_buffers_and_continues_with_versions_and_masks(parity_reward, servers, model_dir):
    narrow = servers[1]
    spec = make_spec(
        parity_reward, over_sampling_batch_size=8, max_response_len=120, partial=True, partial_mask_offpolicy=True
    )
    mgr = RolloutManager(spec, [narrow.url], str(model_dir))
    first = mgr.generate(0, 3)
    m = first.metrics
    assert m["rollout/groups_kept"] == 4 and m["rollout/groups_buffered"] == 4 == m["rollout/buffer_groups"]
    assert m["rollout/groups_aborted"] >= 1 and m["rollout/masked_offpolicy_tokens"] == 0
    buffered = [s for g in mgr.source.buffer for s in g.samples]
    cut = [s for s in buffered if s.status == SampleStatus.ABORTED and s.response_length > 0]
    assert cut, "no request was cut mid-response: the abort did not reach a running request"
    assert all(s.metadata["partial"] == {"start_rollout_id": 0} and s.weight_version == 3 for s in cut)
    before = [[(list(s.tokens), s.response_length) for s in g.samples] for g in mgr.source.buffer]
    state = json.loads(json.dumps(mgr.state_dict()))  # what a checkpoint holds: the buffer too
    assert len(state["buffer"]) == 4

    set_version(narrow.url, "4")  # as a weight sync would
    try:
        again = RolloutManager(spec, [narrow.url], str(model_dir))
        again.load_state_dict(state)  # resumed from the checkpoint state
        second = again.generate(1, 4)
    finally:
        set_version(narrow.url, "3")
    assert second.metrics["rollout/groups_resumed"] >= 1
    continued = 0
    samples = groups_of(second.samples)
    assert [g for g in samples if g < 4] == [0, 1, 2, 3]  # the 4 buffered groups come first and are kept
    for g in range(4):
        for s, (old_tokens, old_len) in zip(samples[g], before[g]):
            assert s.metadata["partial"] == {"start_rollout_id": 0}
            assert s.tokens[: len(old_tokens)] == old_tokens  # earlier tokens kept
            versions = s.token_versions or [s.weight_version] * s.response_length
            assert versions[:old_len] == [3] * old_len and set(versions[old_len:]) <= {4}
            assert s.loss_mask == [0] * old_len + [1] * (s.response_length - old_len)  # older policy: masked
            continued += 0 < old_len < s.response_length
            s.check_lengths()
    assert continued >= 1, "no partial response was continued"
    assert second.metrics["rollout/masked_offpolicy_tokens"] == sum(
        1 for s in second.samples for x in s.loss_mask if x == 0
    )
    mgr.close()
    again.close()


def test_eval_sampling_settings_and_pass_at_k(parity_reward, servers, model_dir):
    spec = make_spec(parity_reward)
    ev = replace(
        spec.data.eval[0], n_samples_per_prompt=4, temperature=1.0, max_response_len=2, top_k=5, pass_at_k=(1, 2, 4)
    )
    spec = replace(spec, data=replace(spec.data, eval=(ev,)))
    mgr = RolloutManager(spec, [servers[0].url], str(model_dir))
    out = mgr.evaluate()
    assert out["eval/heldout/response_len"] <= 2.0  # the set's own max_response_len, not the rollout's 4
    p1, p2, p4 = (out[f"eval/heldout/pass@{k}"] for k in (1, 2, 4))
    assert p1 == pytest.approx(out["eval/heldout/accuracy"])  # every prompt has 4 samples: pass@1 = accuracy
    assert p1 <= p2 <= p4 and 0 < p4 < 1
    assert mgr.evaluate() == out  # seeded: repeatable
    mgr.close()
