"""Judge a smoke run from what it left in its run dir: one :class:`Stage` per step of the RL (or SFT) loop.

Stages, in loop order: start, data read, reward called, rollout, train step, weight sync, SFT
warm-up, checkpoint + resume, eval, final outputs. Every verdict comes from a file the run wrote
(``metrics.jsonl``, checkpoint and task ``state.json``, ``preflight.json``, ``tasks/<i>/smoke/``),
never from the exit code alone: a stage whose evidence is missing fails even if the run succeeded.
Only the standard library; nothing here runs anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.core.errors import ExitCode
from slime.core.paths import TaskPaths

__all__ = ["LOGPROB_TOLERANCE", "Expect", "Stage", "exit_code", "judge"]

# Bound on the mean |trainer - engine| log-prob of the sampled tokens, fp32 on CPU (the README's bound).
LOGPROB_TOLERANCE = 1e-3

PASSED, FAILED, SKIPPED, NOT_REACHED = "passed", "failed", "skipped", "not reached"


@dataclass(frozen=True)
class Stage:
    name: str
    status: str  # passed | failed | skipped (not configured) | not reached (the run ended before it)
    detail: str

    @property
    def ok(self) -> bool:
        return self.status in (PASSED, SKIPPED)

    def to_json(self) -> dict[str, str]:
        return {"stage": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Expect:
    """What the scaled spec asks the run to do (from the spec the smoke ran)."""

    rollouts: int
    steps_per_rollout: int
    eval_sets: tuple[str, ...] = ()
    critic: bool = False
    sft_steps: int = 0
    save_hf: bool = True
    sft_job: bool = False  # kind SFTJob: no rollouts, rewards or per-rollout syncs; evals add a held-out loss

    @property
    def rl(self) -> bool:
        return not self.sft_job

    @property
    def resume(self) -> bool:
        """Whether the run was stopped and resumed (it needs a rollout on each side of the checkpoint)."""
        return self.rollouts >= 2


class _Missing(Exception):
    """Evidence of a stage is absent or wrong: the message says which."""


@dataclass
class _Run:
    tp: TaskPaths
    expect: Expect
    returncode: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    phase1_rows: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, tp: TaskPaths, expect: Expect, returncode: int) -> _Run:
        smoke = tp.dir / "smoke"
        return cls(
            tp,
            expect,
            returncode,
            rows=_jsonl(tp.metrics),
            phase1_rows=_jsonl(smoke / "phase1-metrics.jsonl"),
            state=_json(tp.state) or {},
            phases=_json(smoke / "phases.json") or [],
        )

    def line(self, rollout_id: int) -> dict[str, Any]:
        found = [r for r in self.rows if r.get("rollout_id") == rollout_id]
        if len(found) != 1:
            raise _Missing(f"metrics.jsonl has {len(found)} line(s) for rollout {rollout_id}, expected 1")
        return found[0]

    def rollout_lines(self) -> list[dict[str, Any]]:
        return [self.line(r) for r in range(self.expect.rollouts)]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise _Missing(f"rollout {row.get('rollout_id')}: {key} is {v!r}, expected a finite number")
    return float(v)


def _checkpoint_state(tp: TaskPaths, rollout_id: int) -> dict[str, Any]:
    state = _json(tp.checkpoints / str(rollout_id) / "state.json")
    if not isinstance(state, dict):
        raise _Missing(f"no complete checkpoint {tp.checkpoints / str(rollout_id)}")
    return state


# ----------------------------------------------------------------------------- the stages
def _start(run: _Run) -> str:
    pre = _json(run.tp.preflight_json)
    if not isinstance(pre, dict):
        raise _Missing("no preflight.json: the bootstrap did not get that far")
    if pre.get("ok") is not True:
        raise _Missing(f"the {pre.get('stage') or 'preflight'} failed: {pre.get('error') or 'see preflight.txt'}")
    first = _json(run.tp.dir / "smoke" / "phase1-state.json") or run.state
    ranks, engines = first.get("ranks") or [], first.get("engines") or []
    if not ranks or not engines:
        raise _Missing("state.json names no trainer ranks or engines: the job did not start")
    return f"preflight passed; {len(ranks)} trainer rank(s), {len(engines)} engine(s)"


def _data_read(run: _Run) -> str:
    first = max(run.expect.rollouts - 2, 0)  # the first run's checkpoint
    state = _checkpoint_state(run.tp, first)
    data = (state.get("manager") or {}).get("data") or {}
    size, index, epoch = data.get("size"), data.get("index"), data.get("epoch")
    if not (isinstance(size, int) and size > 0 and isinstance(index, int) and isinstance(epoch, int)):
        raise _Missing(f"the checkpoint's data cursor is {data!r}: no rows were read")
    drawn = epoch * size + index
    if drawn <= 0:
        raise _Missing(f"{size} rows loaded but no prompt was drawn")
    return f"{size} prompt rows loaded; {drawn} drawn in {first + 1} rollout(s)"


def _reward(run: _Run) -> str:
    means = [_finite(r, "rollout/reward_mean") for r in run.rollout_lines()]
    return "reward mean per rollout: " + ", ".join(f"{m:.3g}" for m in means)


def _rollout(run: _Run) -> str:
    lines = run.rollout_lines()
    for r in lines:
        _finite(r, "rollout/response_len_mean")
        if r.get("check/stale_samples") != 0:
            raise _Missing(f"rollout {r['rollout_id']}: {r.get('check/stale_samples')!r} stale sample(s)")
    diff = _finite(lines[0], "check/step0_logprob_diff")
    if diff > LOGPROB_TOLERANCE:
        raise _Missing(f"engine and trainer log-probs differ by {diff:.3g} before any update (> {LOGPROB_TOLERANCE})")
    lens = ", ".join(f"{r['rollout/response_len_mean']:.3g}" for r in lines)
    return f"{len(lines)} rollouts; response length {lens}; step-0 log-prob diff {diff:.1e}"


def _train(run: _Run) -> str:
    lines, steps = run.rollout_lines(), run.expect.steps_per_rollout
    loss_key = "train/sft_loss" if run.expect.sft_job else "train/loss"
    start = run.line(-1).get("step", 0)
    for i, r in enumerate(lines):
        for key in (loss_key, "train/grad_norm"):
            _finite(r, key)
        if r.get("step") != start + (i + 1) * steps:
            raise _Missing(f"rollout {i}: step {r.get('step')!r}, expected {start + (i + 1) * steps}")
        if run.expect.critic and not any(k.startswith("critic/") for k in r):
            raise _Missing(f"rollout {i}: no critic/* metrics although the estimator is ppo")
    moved = sum(_finite(r, "train/grad_norm") > 0 for r in lines)
    note = "" if moved else " (every gradient was zero: no reward signal at this size)"
    return f"{steps} optimizer step(s) per rollout; loss {lines[-1][loss_key]:.3g}{note}"


def _weight_sync(run: _Run) -> str:
    previous = run.line(-1)
    for r in run.rollout_lines():
        version = previous.get("weight_version")
        if r.get("rollout/weight_version") != version:
            raise _Missing(
                f"rollout {r['rollout_id']} was sampled with weight version {r.get('rollout/weight_version')!r}, "
                f"but version {version!r} was synced before it"
            )
        if r.get("weight_version") != (version or 0) + 1:
            raise _Missing(f"rollout {r['rollout_id']}: weight_version {r.get('weight_version')!r} after its sync")
        diff = _finite(r, "train/logprob_diff")
        if diff > LOGPROB_TOLERANCE:
            raise _Missing(
                f"rollout {r['rollout_id']}: engine log-probs differ from the trainer's by {diff:.3g}: "
                "the engines do not serve the synced weights"
            )
        previous = r
    return f"versions {run.line(-1).get('weight_version')} -> {previous['weight_version']}; log-probs agree after each"


def _sft(run: _Run) -> str:
    first = run.line(-1)
    if first.get("sft/steps") != run.expect.sft_steps:
        raise _Missing(f"the first line reports {first.get('sft/steps')!r} SFT steps, expected {run.expect.sft_steps}")
    return f"{run.expect.sft_steps} step(s); loss {_finite(first, 'sft/loss'):.3g}"


def _resume(run: _Run) -> str:
    last = run.expect.rollouts - 1
    if not run.phases or run.phases[0].get("exit_code") != ExitCode.REQUEUE:
        got = run.phases[0].get("exit_code") if run.phases else None
        raise _Missing(f"the first run was to stop after rollout {last - 1} with exit 75; it exited {got!r}")
    ckpt = _checkpoint_state(run.tp, last - 1)
    where = str(run.tp.checkpoints / str(last - 1))
    if run.state.get("resumed_from") != where:
        raise _Missing(f"the second run did not resume from {where} (state.json: {run.state.get('resumed_from')!r})")
    kept = [r for r in run.rows if r.get("rollout_id", -2) < last]
    if kept != run.phase1_rows:
        raise _Missing("metrics.jsonl before the resume differs from what the first run wrote: rollouts were redone")
    resumed = run.line(last)
    want = {"step": ckpt["step"] + run.expect.steps_per_rollout, "weight_version": ckpt["weight_version"] + 1}
    for key, value in want.items():
        if resumed.get(key) != value:
            raise _Missing(f"rollout {last} has {key} {resumed.get(key)!r}; from the checkpoint it should be {value}")
    if run.state.get("state") != "succeeded":
        raise _Missing(f"the resumed run ended {run.state.get('state')!r}: {run.state.get('error')}")
    _checkpoint_state(run.tp, last)
    return f"stopped after rollout {last - 1} (exit 75), resumed from its checkpoint, rollout {last} continued"


def _outputs(run: _Run) -> str:
    if run.state.get("state") != "succeeded":
        raise _Missing(f"state.json says {run.state.get('state')!r}, not succeeded")
    if not isinstance(_json(run.tp.summary), dict):
        raise _Missing("no summary.json")
    _checkpoint_state(run.tp, run.expect.rollouts - 1)
    final = run.tp.final_model / "config.json"
    if final.is_file() != run.expect.save_hf:
        missing = "is missing" if run.expect.save_hf else "was written"
        raise _Missing(f"final_model/ {missing} (save_hf {run.expect.save_hf})")
    return "succeeded; final checkpoint, summary.json" + (", final_model/" if run.expect.save_hf else "")


def _eval(run: _Run) -> str:
    for rollout_id in (-1, run.expect.rollouts - 1):
        row = run.line(rollout_id)
        for name in run.expect.eval_sets:
            _finite(row, f"eval/{name}/accuracy")
            if run.expect.sft_job:  # the held-out loss of the SFT job, before training and after
                _finite(row, f"eval/{name}/loss")
    last, first = run.line(run.expect.rollouts - 1), run.line(-1)
    parts = []
    for n in run.expect.eval_sets:
        parts.append(f"{n}: accuracy {last[f'eval/{n}/accuracy']:.3g}")
        if run.expect.sft_job:
            parts[-1] += f", loss {first[f'eval/{n}/loss']:.3g} -> {last[f'eval/{n}/loss']:.3g}"
    return ", ".join(parts)


STAGES = (
    ("start", _start, None),
    ("data read", _data_read, None),
    ("reward called", _reward, "rl"),
    ("rollout", _rollout, "rl"),
    ("train step", _train, None),
    ("weight sync", _weight_sync, "rl"),
    ("SFT warm-up", _sft, "sft_steps"),
    ("checkpoint + resume", _resume, "resume"),
    ("eval", _eval, "eval_sets"),
    ("final outputs", _outputs, None),
)


_SKIPPED = {
    "sft_steps": "no SFT warm-up (algorithm.sft_warmup_steps: 0)",
    "eval_sets": "no eval sets (data.eval)",
    "resume": "one rollout: nothing to resume (--rollouts 2 or more)",
    "rl": "kind SFTJob: no rollouts or rewards (the engines serve the evals)",
}


def _failure(run: _Run) -> str:
    """Why the run ended, in its own words (the task's state.json), else its exit code."""
    error = run.state.get("error")
    if error:
        return f"the run failed (exit {run.state.get('exit_code')}): {error}"
    if run.returncode:
        return f"the run exited {run.returncode}; see the log"
    return ""


def judge(tp: TaskPaths, expect: Expect, returncode: int) -> list[Stage]:
    """The stages of the smoke run in ``tp`` (see the module doc). After the first stage whose evidence
    is missing, a failed run's later stages are "not reached" (the first names the run's error)."""
    run = _Run.read(tp, expect, returncode)
    out: list[Stage] = []
    stopped = False
    for name, check, needs in STAGES:
        if needs and not getattr(expect, needs):
            out.append(Stage(name, SKIPPED, _SKIPPED[needs]))
            continue
        if stopped:
            out.append(Stage(name, NOT_REACHED, ""))
            continue
        try:
            out.append(Stage(name, PASSED, check(run)))
        except _Missing as exc:
            why = _failure(run)
            out.append(Stage(name, FAILED, f"{exc}" + (f"; {why}" if why else "")))
            stopped = bool(why)
    return out


def exit_code(stages: list[Stage], returncode: int) -> int:
    """0 when every stage passed; else the run's own code when it failed (2 bad input, 3 infrastructure,
    1 a bug), and 1 when the run exited 0 but left a stage without its evidence (a bug)."""
    if all(s.ok for s in stages):
        return ExitCode.OK
    if returncode not in (ExitCode.OK, ExitCode.REQUEUE):
        return returncode
    return ExitCode.BUG
