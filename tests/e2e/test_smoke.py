"""``slime-submit smoke`` end to end: every example spec in ``specs/`` passes every stage (CI's check that
each example still runs), a plug-in that raises ends in exit 2 with the failing stage named, and a
property test runs random valid variations of the quickstart through it.

Real parts only: the CLI as a subprocess, the local launcher, a private Ray per run, the preflight,
``slime.train`` twice (stopped after a checkpoint, then resumed), the built-in engine and torch.

Time (CI's budget): every smoke is its own test, so that pytest-xdist spreads them over its workers: one
test per example, the fixed PPO case, and the property test in ``SHARDS`` shards, each drawing its own
cases (``SLIME_SMOKE_EXAMPLES`` in all, default 2: one per shard, about two minutes each on CI; shard ``i``
is seeded ``SEED + i``; set it higher for a longer search). The examples whose data lives on a cluster get
the shipped arithmetic files with ``--set``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from slime.spec import SpecError, load_spec_text

pytest.importorskip("ray")
pytest.importorskip("torch")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]
REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "specs" / "data" / "arith"
TRAIN, HELDOUT = f"data.prompts={DATA / 'train.jsonl'}", f"data.eval[0].path={DATA / 'heldout.jsonl'}"
# Examples whose data lives on a cluster: point it at the shipped files.
SETS = {
    "ppo.yaml": [TRAIN],
    "grpo-disaggregated.yaml": [TRAIN],
    "grpo-multinode.yaml": [TRAIN, HELDOUT],
    "grpo-pd.yaml": [TRAIN],
}
EXAMPLES = sorted(p.name for p in (REPO / "specs").glob("*.yaml"))
PROPERTY_EXAMPLES = int(os.environ.get("SLIME_SMOKE_EXAMPLES", "2"))
SHARDS, SEED = 2, 20261201


@dataclass(frozen=True)
class Result:
    returncode: int
    report: dict | None
    stderr: str
    seconds: float

    def explain(self) -> str:
        return f"exit {self.returncode}\n{json.dumps(self.report, indent=1)}\n{self.stderr[-4000:]}"


def smoke(spec: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """``slime-submit smoke SPEC --json ARGS``; a run the machine failed (exit 3) is retried once: on a 2-core
    machine loaded far past its cores (load 25) Ray's raylet aborts when its dashboard agent takes over ~17 s
    to start, and the bootstrap reports exit 3. What is tested here is the spec and the runtime, not the load."""
    first = _smoke_once(spec, *args, env=env)
    if first.returncode != 3:
        return first
    print(f"smoke of {spec.name} failed on infrastructure (exit 3); retrying once")
    return _smoke_once(spec, *args, env=env)


def _smoke_once(spec: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # the example's W&B secret must resolve (the smoke disables W&B; the launcher checks secrets first)
    base.setdefault("WANDB_API_KEY", "not-used-by-smoke")
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "smoke", str(spec), "--json", *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    return Result(proc.returncode, report, proc.stderr, time.monotonic() - t)


# ----------------------------------------------------------------------------- the property test
def _quickstart() -> dict:
    spec = YAML(typ="safe", pure=True).load((REPO / "specs" / "quickstart.yaml").read_text())
    spec["data"]["prompts"] = str(DATA / "train.jsonl")
    return spec


@st.composite
def variations(draw) -> dict:
    """A variation of the quickstart across the RL settings a smoke exercises (not all of them valid)."""
    spec = _quickstart()
    a, t, r, d = spec["algorithm"], spec["train"], spec["rollout"], spec["data"]
    a["estimator"] = draw(
        st.sampled_from(["grpo", "ppo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
    )
    a["sft_warmup_steps"] = draw(st.sampled_from([0, 2]))
    kl = draw(st.sampled_from(["none", "reward", "loss"]))
    if kl != "none":
        spec["model"]["ref_path"] = "initial"
        a["kl_coef" if kl == "reward" else "kl_loss_coef"] = draw(st.sampled_from([0.01, 0.1]))
        a["kl_loss_type"] = draw(st.sampled_from(["k1", "k2", "k3", "low_var_kl"]))
    a["loss_agg"] = draw(st.sampled_from(["token_mean", "seq_mean_token_mean"]))
    a["entropy_coef"] = draw(st.sampled_from([0.0, 0.01]))
    a["eps_clip"] = draw(st.sampled_from([0.1, 0.2]))
    if draw(st.booleans()):
        a["eps_clip_high"] = 0.28
    if draw(st.booleans()):
        a["dual_clip_c"] = 3.0
    a["normalize_std"] = draw(st.sampled_from([None, True, False]))
    if a["estimator"] in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        a["gamma"], a["lambda"] = draw(st.sampled_from([1.0, 0.99])), draw(st.sampled_from([1.0, 0.95]))
    r["n_samples_per_prompt"] = draw(st.sampled_from([1, 2, 4]))
    r["batch_size"] = 4
    r["temperature"] = draw(st.sampled_from([1.0, 0.7]))
    r["top_k"] = draw(st.sampled_from([-1, 5]))
    if draw(st.booleans()):
        r["over_sampling_batch_size"] = draw(st.sampled_from([4, 8]))
    t["num_steps_per_rollout"] = draw(st.sampled_from([1, 2]))
    t.pop("global_batch_size")
    t["micro_batch_size"] = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        t["dynamic_batch"] = {"enabled": True, "max_tokens_per_gpu": draw(st.sampled_from([12, 64]))}
    spec["train"]["checkpoint"]["save_hf"] = draw(st.booleans())
    r["colocate"] = draw(st.booleans())
    sync = draw(st.sampled_from([None, "disk", "nccl"]))
    if sync:
        r["weight_sync"] = sync
    evals = draw(st.sampled_from([0, 1, 2]))
    d["eval"] = [
        {
            "name": f"set{i}",
            "path": str(DATA / "heldout.jsonl"),
            "interval": draw(st.sampled_from([1, 2])),
            "temperature": draw(st.sampled_from([0.0, 1.0])),
            "n_samples_per_prompt": draw(st.sampled_from([1, 2])),
            "max_prompts": 4,
        }
        for i in range(evals)
    ]
    return spec


def _explicit() -> dict:
    """The case CI always runs first: PPO with a critic and a KL loss, engines on their own (CPU) slot with
    the collective sync over gloo, dual clip, per-sample loss averaging, dynamic batches, two eval sets,
    no HF copy at the end."""
    spec = _quickstart()
    spec["model"]["ref_path"] = "initial"
    spec["algorithm"].update(
        estimator="ppo", kl_loss_coef=0.05, kl_loss_type="k3", dual_clip_c=3.0, loss_agg="seq_mean_token_mean"
    )
    spec["rollout"].update(colocate=False, weight_sync="nccl", n_samples_per_prompt=2, batch_size=4)
    spec["train"].pop("global_batch_size")
    spec["train"].update(
        num_steps_per_rollout=2, micro_batch_size=2, dynamic_batch={"enabled": True, "max_tokens_per_gpu": 24}
    )
    spec["train"]["checkpoint"]["save_hf"] = False
    heldout = str(DATA / "heldout.jsonl")
    spec["data"]["eval"] = [
        {"name": "greedy", "path": heldout, "interval": 1, "max_prompts": 4},
        {
            "name": "sampled",
            "path": heldout,
            "interval": 2,
            "temperature": 1.0,
            "n_samples_per_prompt": 2,
            "max_prompts": 2,
        },
    ]
    return spec


def _dump(spec: dict) -> str:
    import io

    buf = io.StringIO()
    YAML(typ="safe", pure=True).dump(spec, buf)
    return buf.getvalue()


def _check_validated_spec_smokes(spec: dict, rollouts: int, where: Path, *, drawn: bool = True) -> None:
    """A spec that validates passes its smoke, or (exit 3) the machine failed it; never exit 1, 2 or a traceback."""
    text = _dump(spec)
    try:
        load_spec_text(text, file="variation.yaml", base_dir=where)
    except SpecError:
        if not drawn:
            raise
        assume(False)  # only specs that validate are promised to run
    case = where / f"case-{time.monotonic_ns()}"
    case.mkdir()
    (case / "spec.yaml").write_text(text)
    result = smoke(case / "spec.yaml", "--rollouts", str(rollouts), "--dir", str(case / "runs"))
    # exit 1 is a bug, exit 2 a validated spec the runtime refused (a gap in validate); exit 3 is the machine's
    assert result.returncode in (0, 3), "this validated spec failed its smoke:\n" + text + result.explain()
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    if result.returncode == 3:
        print("infrastructure failure (exit 3), not the spec's:", result.explain()[-2000:])


def test_the_fixed_ppo_case_passes_the_smoke_without_a_bug(tmp_path):
    _check_validated_spec_smokes(_explicit(), 2, tmp_path, drawn=False)


@pytest.mark.skipif(PROPERTY_EXAMPLES == 0, reason="SLIME_SMOKE_EXAMPLES=0: the fixed case only")
@pytest.mark.parametrize("shard", range(SHARDS))
def test_a_spec_that_validates_passes_the_smoke_without_a_bug(shard, tmp_path):
    """The property: ``PROPERTY_EXAMPLES`` drawn cases over the shards, each shard with its own fixed seed (the
    same cases every run: CI is reproducible). No shrinking: each step would be another smoke run."""

    @seed(SEED + shard)
    @settings(
        max_examples=max(1, -(-PROPERTY_EXAMPLES // SHARDS)),
        deadline=None,
        phases=(Phase.generate,),
        database=None,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
    )
    @given(variations(), st.sampled_from([1, 2]))
    def case(spec: dict, rollouts: int) -> None:
        _check_validated_spec_smokes(spec, rollouts, tmp_path)

    case()


# ----------------------------------------------------------------------------- the examples, and a failure
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_spec_passes_every_stage_of_the_smoke(tmp_path, name):
    sets = [a for s in SETS.get(name, []) for a in ("--set", s)]
    result = smoke(REPO / "specs" / name, *sets, "--dir", str(tmp_path))
    assert result.returncode == 0 and result.report and result.report["ok"], result.explain()
    stages = {s["stage"]: s for s in result.report["stages"]}
    assert all(s["status"] in ("passed", "skipped") for s in stages.values()), result.explain()
    assert stages["checkpoint + resume"]["status"] == "passed"
    assert "Traceback" not in result.stderr
    changed = {c["path"] for c in result.report["changes"]}
    if name in ("grpo-multinode.yaml", "grpo-disaggregated.yaml", "ppo.yaml"):
        assert {"train.backend", "rollout.backend", "model.path"} <= changed
        assert any(u.startswith("SGLang engines") for u in result.report["untested"])
    if name == "ppo.yaml":
        assert stages["train step"]["status"] == "passed"  # with critic/* metrics (smoke_report checks them)
    if name == "sweep.yaml":
        assert "the other 3 sweep task(s)" in result.report["untested"]
    print(f"smoke {name}: {result.seconds:.0f} s wall ({result.report['seconds']:.0f} s in the run)")


def test_a_reward_plug_in_that_raises_ends_in_exit_2_naming_the_stage_and_the_error(tmp_path):
    (tmp_path / "broken_reward.py").write_text(
        textwrap.dedent(
            """
            def score(sample):
                raise ZeroDivisionError("the plug-in divided by zero")
            """
        )
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = smoke(
        REPO / "specs" / "quickstart.yaml",
        "--set",
        "reward={type: custom, custom: 'broken_reward:score'}",
        "--dir",
        str(tmp_path / "runs"),
        env=env,
    )
    assert result.returncode == 2 and result.report is not None, result.explain()
    stages = {s["stage"]: s for s in result.report["stages"]}
    failed = [s for s in result.report["stages"] if s["status"] == "failed"]
    assert len(failed) == 1 and "the plug-in divided by zero" in failed[0]["detail"], result.explain()
    assert stages["start"]["status"] == "passed" and stages["eval"]["status"] == "not reached"
    assert result.report["run_dir"] and Path(result.report["log"]).is_file()  # kept for a look
