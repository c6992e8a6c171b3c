"""``slime-submit smoke SPEC [--fast] [--rollouts N] [--set ...] [--task N] [--dir D] [-v] [--json]``.

The end-to-end test of a spec before it waits in a GPU queue: validated as for a submit, scaled down
by :mod:`slime.spec.smoke` (changes and what they leave untested are printed), run locally for ``N``
rollouts with a checkpoint stop and resume (:mod:`slime.cli.smoke_driver`), judged stage by stage
(:mod:`slime.cli.smoke_report`); then, unless ``--fast``, the user's engine path on a tiny model of
their family (:mod:`slime.cli.smoke_engine`) where it runs on this CPU. Exit codes: 0 all passed ·
2 spec, data or plug-in wrong · 3 infrastructure · 1 a stage failed otherwise · 130 interrupted.
Not guaranteed: what the printed "not tested" list names (GPU engines, scale).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.core.errors import ExitCode

if TYPE_CHECKING:
    from slime.cli.smoke_report import Expect, Stage
    from slime.spec.load import LoadedSpec
    from slime.spec.smoke import SmokePlan

__all__ = ["DRIVER", "configure", "run"]

DRIVER = "slime.cli.smoke_driver"


def configure(p: argparse.ArgumentParser) -> None:
    from slime.cli.spec_args import add_spec_args

    add_spec_args(p, json_help="print the report as JSON")
    p.add_argument(
        "--rollouts",
        type=_rollouts,
        default=2,
        metavar="N",
        help="rollouts to run (default 2: one before the checkpoint, one after the resume; 1 skips the resume)",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="only the built-in tiny dense model (seconds); skip the engine check of your model family and layout",
    )
    p.add_argument("--task", type=int, default=0, metavar="N", help="which sweep task to run (default 0)")
    p.add_argument("--dir", default=None, metavar="D", help="keep the smoke's run dir under D (default: a temp dir)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the run's output instead of logging it")
    p.set_defaults(func=run)


def _rollouts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of rollouts >= 1")
    return n


# ----------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    from slime.cli.init_cmd import load_checked
    from slime.spec.smoke import scale_down

    loaded = load_checked(args.spec, overrides=args.overrides, check_paths=False)
    if not 0 <= args.task < len(loaded.tasks):
        from rich.console import Console

        Console(stderr=True, highlight=False).print(
            f"[red]usage error:[/] --task {args.task}: the spec has {len(loaded.tasks)} task(s), numbered from 0"
        )
        return ExitCode.SPEC
    root = Path(args.dir).resolve() if args.dir else Path(tempfile.mkdtemp(prefix="slime-smoke-"))
    spec = loaded.tasks[args.task].spec
    plan = scale_down(
        spec, rollouts=args.rollouts, logging_dir=str(root), tasks=len(loaded.tasks), missing_secrets=_missing(spec)
    )
    try:
        scaled = _load_scaled(plan, Path(args.spec))
    except BaseException:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        raise
    plan, engine = _engine_plan(plan, spec, root, fast=args.fast)
    if not args.json:
        _print_plan(plan, engine)
    t0 = time.monotonic()
    run_dir, returncode, log = _launch(scaled, root, verbose=args.verbose, json_output=args.json)
    stages = _judge(run_dir, plan, returncode)
    engine_report = _engine_run(spec, engine, root, verbose=args.verbose, json_output=args.json)
    stages += engine_report.pop("stage_rows", [])
    from slime.cli.report import smoke_report
    from slime.cli.smoke_report import exit_code

    code = exit_code(stages, returncode)
    seconds = time.monotonic() - t0
    kept = bool(args.dir) or code != ExitCode.OK
    report = {
        "ok": code == ExitCode.OK,
        "exit_code": int(code),
        "spec": args.spec,
        "task": args.task,
        "rollouts": plan.rollouts,
        "seconds": round(seconds, 1),
        "run_dir": str(run_dir) if kept else None,
        "log": str(log) if kept and log else None,
        "stages": [s.to_json() for s in stages],
        "changes": [c.to_json() for c in plan.changes],
        "untested": list(plan.untested),
        "engine": engine_report,
        "report": smoke_report(run_dir) if kept else None,  # the kept run's page (slime.cli.report)
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_stages(stages, report)
    if not kept:
        shutil.rmtree(root, ignore_errors=True)
    return code


def _engine_plan(plan: SmokePlan, spec: Any, root: Path, *, fast: bool) -> tuple[SmokePlan, tuple[Any, str | None]]:
    """The smoke plan (its "not tested" list updated when the engine check runs) and (the engine check's plan,
    None) when it runs, else (None, why not)."""
    from slime.cli.smoke_engine import engine_plan, skip_reason

    why = "--fast" if fast else skip_reason(spec)
    if why:
        return plan, (None, why)
    engine = engine_plan(spec, root / "engine" / "model")
    return _with_engine_untested(plan, spec, engine), (engine, None)


def _with_engine_untested(plan: SmokePlan, spec: Any, engine: Any) -> SmokePlan:
    """``plan`` whose "not tested" list says what the engine check covered: its lines replace the generic
    ones for the model and Megatron-core."""
    import dataclasses

    from slime.cli.smoke_engine import engine_untested

    generic = ("your model (", "Megatron-core training")
    kept = tuple(u for u in plan.untested if not u.startswith(generic))
    return dataclasses.replace(plan, untested=engine_untested(spec, engine) + kept)


def _engine_run(spec: Any, engine: tuple[Any, str | None], root: Path, *, verbose: bool, json_output: bool) -> dict:
    """Run the engine check (when planned): the report's ``engine`` section and its stages (``stage_rows``)."""
    from slime.cli.smoke_engine import run_engine_check
    from slime.cli.smoke_report import LOGPROB_TOLERANCE, Stage

    plan, why = engine
    if plan is None:
        return {"ran": False, "why": why}
    if not json_output:
        _console().print(f"engine check: your model family on Megatron, {plan.fold.world} gloo rank(s) ...")
    result = run_engine_check(spec, plan, root / "engine", tolerance=LOGPROB_TOLERANCE, verbose=verbose)
    rows = [Stage(r["stage"], r["status"], r["detail"]) for r in result["stages"]]
    return {
        "ran": True,
        "world": plan.fold.world,
        "kept": list(plan.fold.kept),
        "folded": list(plan.fold.folded),
        "changes": [_change_json(*c) for c in plan.changes],
        "seconds": result.get("seconds"),
        "reward": result.get("reward"),
        "not_run": "SGLang (it needs GPUs): the export was loaded by the built-in engine's loader instead",
        "stages": [s.to_json() for s in rows],
        "dir": str(root / "engine"),
        "stage_rows": rows,
    }


def _change_json(path: str, before: Any, after: Any, reason: str) -> dict[str, Any]:
    import msgspec

    return {"path": path, "before": msgspec.to_builtins(before), "after": msgspec.to_builtins(after), "reason": reason}


def _missing(spec: Any) -> frozenset[str]:
    """The spec's secrets whose reference does not resolve on this machine (unset variable, unreadable file)."""
    out = set()
    for name, ref in spec.cluster.secrets.items():
        ok = (ref.env in os.environ) if ref.env else os.access(os.path.expanduser(ref.file or ""), os.R_OK)
        if not ok:
            out.add(name)
    return frozenset(out)


def _load_scaled(plan: SmokePlan, source: Path) -> LoadedSpec:
    """The scaled spec, validated like any spec, its data files required here (SpecError: exit 2)."""
    from slime.spec import SpecError, load_spec_text
    from slime.spec.errors import Problem

    try:
        return load_spec_text(
            plan.yaml, file=f"{source} (scaled down for smoke)", base_dir=source.resolve().parent, check_paths=True
        )
    except SpecError as exc:
        note = Problem(
            path="",
            message="the scaled-down spec the smoke would run is refused (above); its data files must exist here",
            hint="point data at local files with --set data.prompts=... (and data.eval[i].path=...)",
        )
        raise SpecError([*exc.problems, note]) from None


def _expect(spec: Any) -> Expect:
    from slime.cli.smoke_report import Expect

    return Expect(
        rollouts=spec.rollout.num_rollouts,
        steps_per_rollout=spec.train.num_steps_per_rollout or 1,
        eval_sets=tuple(e.name for e in spec.data.eval),
        critic=spec.algorithm.estimator == "ppo",
        sft_steps=spec.algorithm.sft_warmup_steps,
        save_hf=spec.train.checkpoint.save_hf,
        sft_job=spec.kind == "SFTJob",
    )


def _judge(run_dir: Path, plan: SmokePlan, returncode: int) -> list[Stage]:
    from slime.cli.smoke_report import judge
    from slime.core.paths import TaskPaths

    return judge(TaskPaths(run_dir, 0), _expect(plan.spec), returncode)


def _launch(scaled: LoadedSpec, root: Path, *, verbose: bool, json_output: bool) -> tuple[Path, int, Path | None]:
    """Run the scaled spec with the local launcher and the smoke driver: (run dir, exit code, log file)."""
    from launchers import get_launcher
    from launchers.base import SubmitOptions

    launcher = get_launcher("local")
    dry = launcher.dryrun(scaled, SubmitOptions(force=True, extra={"driver": DRIVER}))
    root.mkdir(parents=True, exist_ok=True)
    log = None if verbose else root / f"{dry.request.run_dir.name}.log"
    if not json_output:
        where = "below" if log is None else str(log)
        _console().print(f"running {dry.request.run_dir} (output: {where}) ...")
    with _output_to(log):
        submission = launcher.submit(dry)
    return submission.run_dir, submission.returncode, log


@contextlib.contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Our stderr (where the local launcher streams the job's output) goes to ``log`` meanwhile."""
    if log is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


# ----------------------------------------------------------------------------- output
def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def _short(value: Any) -> str:
    import msgspec

    text = json.dumps(msgspec.to_builtins(value)) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _print_plan(plan: SmokePlan, engine: tuple[Any, str | None]) -> None:
    from rich.markup import escape

    con = _console()
    con.print(f"[bold]changed to fit a CPU smoke run[/] ({len(plan.changes)}):")
    for c in plan.changes:
        con.print(
            f"  [cyan]{escape(c.path)}[/]: {escape(_short(c.before))} -> {escape(_short(c.after))}  "
            f"[dim]{escape(c.reason)}[/]"
        )
    eplan, why = engine
    if eplan is None:
        con.print(f"[bold]engine check[/] (your model family on your train backend): not run: {escape(why or '')}")
    else:
        con.print(f"[bold]changed for the engine check[/] ({len(eplan.changes)}; SGLang stays the built-in engine):")
        for path, before, after, reason in eplan.changes:
            change = f"{escape(_short(before))} -> {escape(_short(after))}"
            con.print(f"  [cyan]{escape(path)}[/]: {change}  [dim]{escape(reason)}[/]")
    con.print("[bold]not tested[/] (a real run shows these):")
    for item in plan.untested:
        con.print(f"  - {escape(item)}")


_STYLE = {"passed": "green", "failed": "red", "skipped": "dim", "not reached": "yellow"}


def _print_stages(stages: list[Stage], report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = _console()
    table = Table(title=f"smoke: {escape(report['spec'])} ({report['rollouts']} rollouts, {report['seconds']:.0f} s)")
    table.add_column("stage", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("evidence")
    for s in stages:
        table.add_row(escape(s.name), f"[{_STYLE[s.status]}]{s.status}[/]", escape(s.detail))
    con.print(table)
    if report["ok"]:
        con.print("[green]every stage passed[/]")
    else:
        con.print(f"[red]smoke failed[/] (exit {report['exit_code']}); run dir kept: {escape(str(report['run_dir']))}")
        if report["log"]:
            con.print(f"its output: {escape(report['log'])}")
    if report.get("report"):
        con.print(f"report: {escape(report['report'])}")
