"""``specs/agent-local.yaml`` end to end: SFT warm-up on tool demonstrations, agent
rollouts through the OpenAI adapter with calculator calls run in bubblewrap sandboxes,
trajectories -> samples -> GRPO updates with the torch backend.

Two views of the same pipeline:

* ``test_agent_local_through_cli`` runs the spec through ``slime-submit`` (local
  launcher, Ray, the RL runtime with the agent hook in its rollout manager) with its full
  warm-up but 2 rollouts instead of 10 (CI time), and checks from the run dir that the
  held-out answer accuracy rose from the untrained policy's (``sft/before/*``, greedy agent
  episodes on prompts never trained on) by at least 0.30 by the end, that tool calls ran in
  sandboxes (the per-rollout counts in ``metrics.jsonl``), that every episode went through
  the adapter and that masks and log-probs line up. The full spec's three seeds are
  measured by hand (README, Agents);
* ``test_agent_local_parts`` drives the same parts in-process (spec, ``TorchTrainBackend``,
  built-in engine, ``fill_samples``, ``train_data``), starting from the CLI run's final policy, so it
  can inspect every sample (every leaf of a forked episode is a training sample):
  tool calls executed in sandboxes (outputs against independently computed sums),
  masks against the decoded text, one GRPO update.

Everything is real: processes, HTTP on 127.0.0.1, sandboxes, torch training.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.agent.context import GenerateContext  # noqa: E402
from slime.agent.generate import agent_sft_sample, fill_samples, shutdown_adapters  # noqa: E402
from slime.backends.base import RankInfo  # noqa: E402
from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from slime.backends.rollout.client import EngineClient  # noqa: E402
from slime.backends.train.torch_backend import TorchTrainBackend  # noqa: E402
from slime.rl.sample import (  # noqa: E402
    Sample,
    SampleStatus,
    episode_id,
)
from slime.runtime.train_data import collate, sequence_scores, token_advantages  # noqa: E402
from slime.spec import load_spec  # noqa: E402
from tests.fixtures.agent_runs import check_agent_rollouts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "specs" / "agent-local.yaml"
# test_agent_local_parts' one rollout: 4 inputs x 4 episodes, trained in one step of 16.
SHORT = [
    "rollout.batch_size=4",
    "rollout.n_samples_per_prompt=4",
    "train.global_batch_size=16",
    "train.micro_batch_size=16",
    "rollout.num_rollouts=1",
]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("learning"), pytest.mark.timeout(1500)]


def _sum_of(expression: str) -> str | None:
    """The value of an ``a+b`` expression, computed here independently of the sandbox."""
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*", expression)
    return str(int(m.group(1)) + int(m.group(2))) if m else None


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """The shortened spec through ``slime-submit``, once: its run dir, wall time and the spec's overrides."""
    tmp = tmp_path_factory.mktemp("agent-cli")
    short = {"rollout.num_rollouts": 2}
    args = [
        "submit",
        str(SPEC),
        *[a for k, v in short.items() for a in ("--set", f"{k}={v}")],
        "--set",
        f"logging.dir={tmp}",
        "--set",
        "logging.progress=false",
        "--json",
    ]
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args], cwd=REPO, capture_output=True, text=True, timeout=1440
    )
    elapsed = time.monotonic() - t
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    return Path(out["run_dir"]), elapsed, short


def test_agent_local_through_cli(cli_run):
    spec = load_spec(SPEC, check_paths=True).spec
    run_dir, elapsed, short = cli_run
    rows = [json.loads(x) for x in (run_dir / "tasks/0/metrics.jsonl").read_text().splitlines()]
    warm, rollouts = rows[0], rows[1:]
    assert warm["rollout_id"] == -1 and warm["sft/steps"] == spec.algorithm.sft_warmup_steps
    assert warm["sft/loss"] < warm["sft/loss_first"] / 4
    # The agent learned the task: held-out accuracy, untrained policy -> after the warm-up -> the end.
    start, warmed = warm["sft/before/heldout/accuracy"], warm["eval/heldout/accuracy"]
    end = rollouts[-1]["eval/heldout/accuracy"]
    assert end >= start + 0.30, (start, warmed, end)
    assert [r["rollout_id"] for r in rollouts] == list(range(short["rollout.num_rollouts"]))
    episodes = spec.rollout.batch_size * spec.rollout.n_samples_per_prompt
    # Episodes through the adapter, tool calls in sandboxes: the per-rollout counts the runtime wrote.
    counts = check_agent_rollouts(rollouts)
    calls, sandboxed, ok = counts["calls"], counts["sandboxed"], counts["ok"]
    # masks and log-probs line up: the trainer recomputes the engine's log-probs on the mask-1 tokens
    assert rollouts[0]["check/step0_logprob_diff"] < 1e-3
    assert json.loads((run_dir / "tasks/0/state.json").read_text())["state"] == "succeeded"
    rewards = [r["rollout/reward_mean"] for r in rollouts]
    print(
        f"\nagent-local (2 rollouts): {elapsed:.0f} s wall; {episodes} episodes/rollout; tool calls {calls:.0f}, "
        f"sandboxed {sandboxed:.0f}, ok {ok:.0f}; rewards {rewards}; held-out accuracy untrained {start:.2f}, "
        f"after the warm-up {warmed:.2f}, end {end:.2f}"
    )


def _rollout(ctx, rows, spec) -> list[Sample]:
    """What the rollout manager does for an agent spec: one episode per input sample, every leaf kept."""
    r = spec.rollout
    n = r.n_samples_per_prompt
    params = [
        {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_response_len}
    ] * (len(rows) * n)
    samples = [
        Sample(
            group_index=g,
            index=g * n + i,
            prompt=row["prompt"],
            label=row["label"],
            tokens=ctx.tokenizer.encode(row["prompt"], add_special_tokens=False),
        )
        for g, row in enumerate(rows)
        for i in range(n)
    ]
    per_input = asyncio.run(fill_samples(ctx, samples, params))
    assert len(per_input) == len(samples) and all(per_input)  # every input accounted for
    return [s for leaves in per_input for s in leaves]


def test_agent_local_parts(cli_run, tmp_path):
    """Starts from the CLI run's final policy (its SFT warm-up on tool demonstrations, asserted to have learned
    in ``test_agent_local_through_cli``, then 2 GRPO rollouts): a second warm-up here would cost CI minutes and
    test the same trainer code again."""
    torch.set_num_threads(1)  # 2 shared CPU cores; the engine runs in this process too
    spec = load_spec(SPEC, overrides=SHORT, check_paths=True).spec
    assert spec.agent.tools == ("calculator",) and spec.agent.sandbox.backend == "local"
    model_dir = cli_run[0] / "tasks" / "0" / "final_model"
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in Path(spec.data.prompts).read_text().splitlines()]
    rng = random.Random(spec.train.seed)

    actor = TorchTrainBackend()
    actor.init(
        spec,
        RankInfo(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, device="cpu"),
        model_dir,
        role="actor",
    )
    # Demonstrations like the warm-up's: the policy fits them (an untrained one is at ~5.5; 0.002 measured).
    demos = [
        agent_sft_sample(spec, tok, r["prompt"], r["label"]) for r in rng.sample(rows, spec.train.global_batch_size)
    ]
    sft_batch = collate(demos, kind="sft", pad_id=tok.pad_token_id)  # scored, not trained on: weights unchanged
    m = sft_batch.response_mask
    sft_loss = float(-(actor.log_probs(sft_batch, temperature=1.0) * m).sum() / m.sum())
    assert sft_loss < 0.5, f"the warmed-up policy does not fit the tool demonstrations: SFT loss {sft_loss:.3f}"

    engine = start_server(actor.export_weights(tmp_path / "weights-0"), seed=0)
    try:
        ctx = GenerateContext.for_spec(spec, [EngineClient(engine.url)], tok)
        samples = _rollout(ctx, rng.sample(rows, spec.rollout.batch_size), spec)
    finally:
        shutdown_adapters()
        engine.stop()

    n_eps = spec.rollout.batch_size * spec.rollout.n_samples_per_prompt
    assert sorted({s.index for s in samples}) == list(range(n_eps))  # every input's episode, leaves after it
    for s in samples:  # a forked episode's leaves share the input's group, index and session
        twins = [t for t in samples if t.index == s.index]
        assert {t.group_index for t in twins} == {s.group_index}
        assert 1 <= len(twins) <= max(1, s.metadata["agent"].get("leaves", 1))  # unusable leaves are left out
    episodes = {s.index: s.metadata["agent"] for s in samples}
    calls = [c for ep in episodes.values() for c in ep["tool_calls"]]
    # Tool calls happened and ran in sandboxes: the outputs are the calculator's, not the model's.
    assert calls, "the warmed-up policy made no tool call"
    checked = 0
    for ep in episodes.values():
        for c in ep["tool_calls"]:
            if not c.get("sandbox_id"):  # an unknown tool or arguments that are not an object: never run
                assert not c["ok"] and c["output"].startswith("error:"), c
                continue
            assert c["sandbox_id"] == ep["sandbox_id"] and c["sandbox_id"].startswith("local-"), (c, ep)
            expected = _sum_of(str((c["arguments"] or {}).get("expression", "")))
            if expected is not None:
                assert (c["ok"], c["output"]) == (True, expected), c
                checked += 1
            elif not c["ok"]:
                assert c["output"].startswith("error:"), c
    assert checked, f"no a+b calculator call to check among {calls}"

    for s in samples:
        s.check_lengths()
        if s.status == SampleStatus.FAILED:  # inert: keeps the group whole, trains nothing
            assert (s.loss_mask, s.reward) == ([0], 0.0)
            continue
        assert s.reward in (0.0, 1.0) and s.response_length == len(s.loss_mask) > 0
        resp = s.tokens[-s.response_length :]
        model_text = tok.decode([t for t, m in zip(resp, s.loss_mask) if m])
        env_text = tok.decode([t for t, m in zip(resp, s.loss_mask) if not m])
        agent = s.metadata["agent"]
        if agent["tool_calls"] and agent["turns"] > 1 and agent.get("leaves", 1) == 1:
            # The turn the environment inserted (the tool result) is mask 0, never trained; the model's
            # own text may contain any markup it sampled, so only the inserted turn is looked for.
            inserted = f"<|im_start|>user\n<tool_response>\n{agent['tool_calls'][0]['output']}\n</tool_response>"
            assert inserted in env_text and inserted not in model_text
            assert "<tool_call>" in model_text

    # One GRPO update as the runtime does it; the trainer's log-probs of the mask-1 tokens equal the engine's.
    batch = collate([s.to_dict() for s in samples], kind="rl", pad_id=tok.pad_token_id)
    old = actor.log_probs(batch, temperature=spec.rollout.temperature)
    mask = batch.response_mask
    assert float(((old - batch.rollout_log_probs).abs() * mask).max()) < 1e-3
    scores = sequence_scores(
        [s.reward for s in samples],
        estimator="grpo",
        group_ids=[s.group_index for s in samples],
        episode_ids=[episode_id(s) for s in samples],
        normalize_std=True,
    )
    adv, _ = token_advantages(torch.tensor(scores), mask, estimator="grpo")
    batch.advantages, batch.old_log_probs = adv, old
    before = [p.detach().clone() for p in actor.model.parameters()]
    metrics = actor.train_step(batch, step=0)
    assert all(math.isfinite(v) for v in metrics.values())
    changed = any(not torch.equal(a, p) for a, p in zip(before, actor.model.parameters()))
    assert changed == bool(adv.abs().sum() > 0)
    rewards = [s.reward for s in samples]
    print(
        f"\nsft loss {sft_loss:.3f}; episodes {n_eps}, with tool calls "
        f"{sum(1 for e in episodes.values() if e['tool_calls'])}, reward mean {sum(rewards) / n_eps:.3f}, "
        f"metrics {metrics}"
    )
