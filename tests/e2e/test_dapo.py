"""``specs/dapo.yaml`` end to end, shortened: ``slime-submit specs/dapo.yaml`` through the local launcher with
fewer rollouts. What a broken data path would fail:

* every group in the saved rollouts (``tasks/0/rollouts/*.parquet``, read with pandas) has rewards that
  differ — a filter that keeps flat groups fails this;
* the metrics show groups dropped (by reason) and rounds used, and kept + dropped = examined;
* the held-out accuracy after the shortened run clears a threshold well above the warm-up's (0.77) —
  a filter that dropped everything, or a trainer that learned nothing from the kept groups, fails it.

Real parts only (the CLI, Ray, the built-in engine over HTTP, torch training of the tiny model); the run is
deterministic on a given platform, so the accuracy asserted is not luck. It starts from the session's one run
of the SFT warm-up the spec shares with specs/quickstart.yaml (``quickstart_warmup``,
tests/fixtures/warm_start.py) instead of repeating it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pd = pytest.importorskip("pandas")

from tests.fixtures.quickstart import submit  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("learning"), pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 30
THRESHOLD = 0.84  # measured: see the README's data-path section; the warm-up alone gives 0.77


def test_shortened_dapo_trains_only_informative_groups_and_learns(tmp_path, quickstart_warmup):
    start, warm = quickstart_warmup
    sets = {
        **start,
        "logging.dir": str(tmp_path / "runs"),
        "rollout.num_rollouts": ROLLOUTS,
        "data.eval[0].interval": ROLLOUTS,
        "data.eval[0].max_prompts": 200,
        "train.checkpoint.interval": ROLLOUTS,
        "logging.progress": False,
    }
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out, elapsed = submit(REPO / "specs" / "dapo.yaml", sets, timeout=540, env=env)
    task = Path(out["run_dir"]) / "tasks" / "0"
    rows = [json.loads(line) for line in (task / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["rollout_id"] for r in rows] == list(range(ROLLOUTS))

    # saved rollouts: one file per rollout, every trained group has reward std > 0
    files = sorted((task / "rollouts").glob("rollout_*.parquet"))
    assert [f.name for f in files] == [f"rollout_{r:06d}.parquet" for r in range(ROLLOUTS)]
    for f, r in zip(files, rows):
        df = pd.read_parquet(f)
        assert len(df) == r["rollout/samples"] and df["group_index"].nunique() == r["rollout/groups_kept"]
        stds = df.groupby("group_index")["reward"].std(ddof=0)
        assert (stds > 0).all(), f"{f.name}: a trained group has equal rewards: {stds[stds == 0].index.tolist()}"

    # metrics: groups dropped by reason, rounds used
    for r in rows:
        assert r["rollout/groups_generated"] == r["rollout/groups_kept"] + r["rollout/groups_dropped"]
        reasons = sum(v for k, v in r.items() if k.startswith("rollout/groups_dropped/"))
        assert reasons == r["rollout/groups_dropped"] and 1 <= r["rollout/rounds"] <= 4
    assert sum(r["rollout/groups_dropped"] for r in rows) > 0
    assert max(r["rollout/rounds"] for r in rows) >= 1

    final = out["final_metrics"]
    # it started from the warmed-up model (measured here on 200 of the held-out prompts; the untrained one: ~0)
    assert final["eval/accuracy_initial"] == pytest.approx(warm["eval/accuracy"], abs=0.05)
    assert final["eval/accuracy"] >= THRESHOLD, final["eval/accuracy"]
    assert final["check/step0_logprob_diff"] <= 1e-3 and 0.0 <= final["check/step0_kl"] < 1e-6
    dropped = sum(r["rollout/groups_dropped"] for r in rows)
    print(
        f"\ndapo (shortened, {ROLLOUTS} rollouts): {elapsed:.0f} s wall; held-out accuracy "
        f"{final['eval/accuracy_initial']:.3f} -> {final['eval/accuracy']:.3f}; groups dropped {dropped}, "
        f"rounds {sum(r['rollout/rounds'] for r in rows)}, short {sum(r['rollout/groups_short'] for r in rows)}"
    )
