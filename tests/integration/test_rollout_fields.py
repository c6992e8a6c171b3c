"""The rollout manager against a real built-in engine: the data keys, the response cap and each eval set's
size, samples and temperature do what the spec says (field-coverage audit, tests/fixtures/field_coverage.py).

Real parts: the engine's HTTP server on the tiny model, the rollout manager, the tokenizer; the reward is a
custom plug-in (this module's :func:`record`) that scores 0 and notes what it was asked to score.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace

from slime.backends.rollout.builtin.server import start_server
from slime.models.tiny import build_tiny_model
from slime.rl.sample import SampleStatus
from slime.runtime.rollout_manager import RolloutManager
from slime.spec import load_spec
from slime.spec.types import EvalSet, Reward

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)
SCORED: list = []


def record(sample) -> float:
    """The custom reward: remembers each sample it scores."""
    SCORED.append(sample)
    return 0.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("rollout-fields") / "tiny", seed=0)


@pytest.fixture(scope="module")
def server(model_dir):
    srv = start_server(model_dir, seed=0, num_threads=1, max_running_requests=64)
    yield srv
    srv.stop()


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "q.jsonl"
    lines = [
        {"question": f"{i:02d}+11=", "answer": str(i + 11), "meta": {"row": i}, "prompt": "unused"} for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def make(*, data=None, rollout=None, reward=True):
    s = load_spec(REPO / "specs" / "quickstart.yaml").spec
    r = replace(s.rollout, **(rollout or {}))
    r = replace(r, over_sampling_batch_size=r.batch_size)  # resolved: batch_size
    s = replace(s, data=replace(s.data, **(data or {})), rollout=r)
    if reward:
        s = replace(s, reward=Reward(type="custom", custom=f"{__name__}:record"))
    return s


def manager(spec, server, model_dir) -> RolloutManager:
    SCORED.clear()
    mgr = RolloutManager(spec, [server.url], str(model_dir))
    mgr.setup()
    return mgr


def test_data_keys_pick_the_prompt_label_and_metadata(rows, server, model_dir):
    data = dict(prompts=str(rows), input_key="question", label_key="answer", metadata_key="meta", eval=())
    in_order = make(data={**data, "shuffle": False}, rollout={"batch_size": 3, "n_samples_per_prompt": 1})
    mgr = manager(in_order, server, model_dir)
    got = mgr.generate(0).samples
    assert [s.label for s in got] == ["11", "12", "13"]  # file order, the answer key
    assert [s.metadata["row"] for s in got] == [0, 1, 2] and "prompt" not in got[0].metadata
    assert got[0].prompt == "00+11=" and "<|im_start|>" not in mgr.tokenizer.decode(got[0].tokens)
    mgr.close()
    templated = make(
        data={**data, "shuffle": True, "apply_chat_template": True},
        rollout={"batch_size": 3, "n_samples_per_prompt": 1, "max_prompt_len": 64},
    )
    mgr = manager(templated, server, model_dir)
    again = mgr.generate(0).samples
    assert [s.label for s in again] != ["11", "12", "13"]  # a seeded shuffle
    assert again[0].prompt.startswith("<|im_start|>") and again[0].prompt.rstrip().endswith("assistant")
    mgr.close()


def test_responses_stop_at_max_response_len(server, model_dir):
    s = make(rollout={"batch_size": 2, "n_samples_per_prompt": 4, "max_response_len": 2})
    mgr = manager(s, server, model_dir)
    got = mgr.generate(0).samples
    assert max(x.response_length for x in got) <= 2
    assert any(x.status == SampleStatus.TRUNCATED for x in got)
    assert len(SCORED) == len(got) == 8  # every sample went through the reward
    mgr.close()


def test_eval_sets_take_their_size_samples_and_temperature(rows, server, model_dir):
    sets = (
        EvalSet(name="greedy", path=str(rows), max_prompts=3, n_samples_per_prompt=2, temperature=0.0),
        EvalSet(name="sampled", path=str(rows), max_prompts=2, n_samples_per_prompt=3, temperature=1.0),
    )
    keys = {"prompts": str(rows), "input_key": "question", "label_key": "answer"}
    s = make(data={"eval": sets, **keys}, rollout={"max_response_len": 6})
    mgr = manager(s, server, model_dir)
    metrics = mgr.evaluate(["greedy"])
    assert set(metrics) >= {"eval/greedy/accuracy", "eval/accuracy"} and "eval/sampled/accuracy" not in metrics
    greedy = list(SCORED)
    assert [x.prompt for x in greedy] == ["00+11="] * 2 + ["01+11="] * 2 + ["02+11="] * 2  # 3 prompts x 2
    assert all(greedy[i].response == greedy[i + 1].response for i in range(0, 6, 2))  # temperature 0
    SCORED.clear()
    mgr.evaluate(["sampled"])
    sampled = list(SCORED)
    assert len(sampled) == 6 and len({x.prompt for x in sampled}) == 2
    assert any(len({x.response for x in sampled[i : i + 3]}) > 1 for i in (0, 3))  # temperature 1
    mgr.close()
