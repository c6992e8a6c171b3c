"""On-policy distillation vs the reward alone: two learning curves of one student from the same bench run.

Run by hand (not part of the test suite)::

    python tests/bench/opd.py                                  # teacher: 300 SFT steps; student: 30; 30 rollouts
    python tests/bench/opd.py --types engine --rollouts 40 --out /tmp/opd.png

What runs: the built-in tiny model gets the quickstart's SFT warm-up in this process twice, a long one
(the teacher) and a short one (the student, which then still gets most sums wrong). Then
``slime-submit specs/quickstart.yaml`` runs start from the same student with the same seed, one after the
other: **reward** (GRPO on the exact-match reward) and, per ``--types``, **opd-trainer** (the same, plus
``algorithm.opd`` with the teacher on the trainer ranks) and **opd-engine** (the teacher served by a second
built-in engine that scores each sample at rollout time). Printed: a table of the rollout reward (moving
mean over 5 rollouts) and the held-out accuracy of each at the same rollouts; written: the curves in one
PNG (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def sft_model(steps: int, tmp: Path, name: str) -> Path:
    """The built-in tiny model after ``steps`` steps of the quickstart's SFT warm-up, as an HF dir."""
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.train.torch_backend import TorchTrainBackend
    from slime.models.tiny import ensure_builtin_model
    from slime.runtime.rollout_manager import RolloutManager
    from slime.runtime.train_data import collate
    from slime.spec import load_spec

    torch.manual_seed(0)
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    model = ensure_builtin_model("tiny", tmp / "models")
    backend = TorchTrainBackend()
    backend.init(spec, RankInfo(rank=0, world_size=1, master_addr="", master_port=0, device="cpu"), model)
    mgr = RolloutManager(spec, [], str(model))
    gbs = spec.train.global_batch_size
    for step in range(steps):
        backend.train_step(collate(mgr.sft_samples(gbs), kind="sft"), step=step)
    return backend.export_weights(tmp / name)


def run(tmp: Path, name: str, student: Path, rollouts: int, extra: dict) -> list[dict]:
    """One ``slime-submit`` run of the quickstart from ``student``; its metrics rows."""
    sets = {
        "logging.dir": str(tmp / name),
        "logging.progress": False,
        "model.builtin": None,
        "model.path": str(student),
        "algorithm.sft_warmup_steps": 0,
        "rollout.num_rollouts": rollouts,
        "data.eval[0].interval": 10,
        "data.eval[0].max_prompts": 200,
        **extra,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "slime.cli.main", str(REPO / "specs" / "quickstart.yaml"), *args, "--json"]
    print(f"running {name} ({rollouts} rollouts) ...", flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout[proc.stdout.rindex('{\n  "run_dir"') :])
    lines = (Path(out["run_dir"]) / "tasks/0/metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def smooth(xs: list[float], k: int = 5) -> list[float]:
    return [sum(xs[max(0, i - k + 1) : i + 1]) / len(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def report(curves: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rich.console import Console
    from rich.table import Table

    reward = {n: smooth([r["rollout/reward_mean"] for r in rows if r["rollout_id"] >= 0]) for n, rows in curves.items()}
    evals = {
        n: {r["rollout_id"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r} for n, rows in curves.items()
    }
    table = Table(title="rollout reward (mean of 5) and held-out accuracy, same student, same seed")
    table.add_column("rollout")
    for n in curves:
        table.add_column(f"{n}: reward")
        table.add_column(f"{n}: eval acc")
    for i in range(0, len(next(iter(reward.values()))), 5):
        cells = []
        for n in curves:
            acc = evals[n].get(i)
            cells += [f"{reward[n][i]:.3f}", "" if acc is None else f"{acc:.3f}"]
        table.add_row(str(i), *cells)
    last = len(next(iter(reward.values()))) - 1
    table.add_row(str(last), *[c for n in curves for c in (f"{reward[n][last]:.3f}", f"{evals[n].get(last, 0):.3f}")])
    Console().print(table)
    for n, rows in curves.items():
        steps = [r for r in rows if r["rollout_id"] >= 0]
        mean = {k: sum(r.get(k, 0.0) for r in steps) / max(1, len(steps)) for k in ("time/step_s", "rollout/teacher_s")}
        kl = [r["train/opd_kl"] for r in steps if "train/opd_kl" in r]
        line = f"{n}: step {mean['time/step_s']:.3f} s, teacher {mean['rollout/teacher_s']:.3f} s per rollout"
        print(line + (f"; opd_kl first 5 {sum(kl[:5]) / 5:.3f} -> last 5 {sum(kl[-5:]) / 5:.3f}" if kl else ""))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for (n, ys), color in zip(reward.items(), ("tab:blue", "tab:orange", "tab:green")):
        ax.plot(range(len(ys)), ys, color=color, label=f"{n}: rollout reward (mean of 5)")
        pts = sorted(evals[n].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o--", color=color, label=f"{n}: held-out accuracy")
    ax.set_xlabel("rollout")
    ax.set_ylabel("reward / accuracy")
    ax.set_title("on-policy distillation vs the reward alone (quickstart task)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"curves: {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher-steps", type=int, default=300, help="SFT steps of the teacher")
    ap.add_argument("--student-steps", type=int, default=30, help="SFT steps of the student")
    ap.add_argument("--rollouts", type=int, default=30)
    ap.add_argument("--kl-coef", type=float, default=1.0)
    ap.add_argument("--types", default="trainer,engine", help="OPD types to run beside the reward alone")
    ap.add_argument("--out", type=Path, default=Path("opd_curves.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="opd-bench-") as d:
        tmp = Path(d)
        teacher = sft_model(args.teacher_steps, tmp, "teacher")
        student = sft_model(args.student_steps, tmp, "student")
        curves = {"reward": run(tmp, "reward", student, args.rollouts, {})}
        for kind in args.types.split(","):
            opd = {"algorithm.opd": {"teacher": str(teacher), "type": kind, "kl_coef": args.kl_coef}}
            curves[f"opd-{kind}"] = run(tmp, f"opd-{kind}", student, args.rollouts, opd)
        report(curves, args.out)


if __name__ == "__main__":
    main()
