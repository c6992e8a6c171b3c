"""Job management subcommands: ``status``, ``logs``, ``cancel``, ``list``, ``rerun`` (all with ``--json``).

``TARGET`` is, in order: omitted (the newest run under ``--dir``), a run directory, a job id
listed in a run's ``jobs.json``, a short id (the run dir name's hash, a unique prefix, or the whole
name), or a job id the run's launcher finds (SLURM's ``WorkDir``). State, logs, cancel and job ids
come from the run's launcher object; tables are drawn by :mod:`slime.cli.jobs_view`, ``status
--watch`` by :mod:`slime.cli.watch`. Exit codes: 0 ok, 2 usage, 3 SLURM failed. Imports only the
standard library, slime.core and slime.cli.runids at import time (shell completion builds every
parser on each TAB). Resolution details: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from slime.cli.runids import short_id
from slime.core.errors import ExitCode
from slime.core.states import RunState

__all__ = [
    "configure_cancel",
    "configure_list",
    "configure_logs",
    "configure_rerun",
    "configure_status",
    "find_runs",
    "resolve_target",
]

WATCH_DEFAULT_S = 2.0
WATCH_MIN_S, WATCH_MAX_S = 0.2, 3600.0
_JOB_ID = re.compile(r"\d+(_\d+)?")
_PLAIN_JOB_ID = re.compile(r"\d+")


class UsageError(Exception):
    """Bad target or option: exit code 2, message printed like the CLI's other usage errors."""


def _guard(func):
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except UsageError as exc:
            from slime.cli.commands import _error

            _error(getattr(args, "json", False), "usage", str(exc))
            return ExitCode.SPEC

    return run


def _default_dir() -> Path:
    return Path(os.environ.get("SLIME_RUNS_DIR") or "runs")


def _common(p: argparse.ArgumentParser, *, target: bool = True, task: bool = True) -> None:
    if target:
        p.add_argument(
            "target",
            nargs="?",
            metavar="RUN_DIR|JOB_ID",
            help="a run dir or a SLURM job id (default: the newest run under --dir)",
        )
    if task:
        p.add_argument("--task", type=int, default=None, metavar="N", help="only sweep task N")
    p.add_argument(
        "--dir", type=Path, default=None, metavar="D", help="where runs live (default: $SLIME_RUNS_DIR, else ./runs)"
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


# ----------------------------------------------------------------------------- finding runs
def _known() -> str:
    from launchers import LAUNCHERS

    return ", ".join(sorted(LAUNCHERS.names()))


def _launcher(paths):
    """The launcher object of the run (``launchers.base.Launcher``)."""
    from launchers import LAUNCHERS, get_launcher
    from launchers.status import launcher_name

    name = launcher_name(paths)
    if name not in LAUNCHERS:
        raise UsageError(f"unknown launcher {name!r} in jobs.json; known: {_known()}")
    return get_launcher(name)


def _is_run(d: Path) -> bool:
    return (d / "jobs.json").is_file() or (d / "lock.json").is_file()


def _warn_jobs(paths) -> str | None:
    """Say (on stderr, so --json output stays parseable) that the run's jobs.json is ignored, and why."""
    problem = paths.jobs_problem()
    if not problem:
        return None
    from rich.markup import escape

    _console(stderr=True).print(
        f"[yellow]warning:[/] {escape(str(paths.jobs))} {escape(problem)}; ignoring it "
        "(job ids and PID records unknown: the state comes from the run dir's other records)"
    )
    return f"{paths.jobs} {problem}; ignored"


def find_runs(parent: Path) -> list:
    """Run dirs directly under ``parent``, newest first (by submit time)."""
    from launchers.status import run_started
    from slime.core.paths import RunPaths

    try:
        dirs = [d for d in Path(parent).iterdir() if d.is_dir() and not d.name.startswith(".") and _is_run(d)]
    except OSError:
        return []
    runs = [RunPaths(d.resolve()) for d in dirs]
    return sorted(runs, key=lambda p: run_started(p) or 0.0, reverse=True)


def resolve_target(target: str | None, search: Path | None) -> tuple[Any, int | None]:
    """(RunPaths, task or None) for a TARGET (see the module doc)."""
    from slime.core.paths import RunPaths

    parent = search or _default_dir()
    if target is None:
        runs = find_runs(parent)
        if not runs:
            raise UsageError(f"no runs under {parent.resolve()}; pass a run dir or a job id, or --dir")
        return runs[0], None
    p = Path(target).expanduser()
    if p.is_dir():
        if not _is_run(p):
            raise UsageError(f"{p} is not a run dir (it has no jobs.json or lock.json)")
        return RunPaths(p.resolve()), None
    runs = find_runs(parent)
    if _PLAIN_JOB_ID.fullmatch(target):  # a job id the runs' own jobs.json list goes before a short id
        found = _find_job_in_records(target, runs)
        if found is not None:
            return found
    matches = _short_id_matches(target, runs)
    if len(matches) == 1:
        return matches[0], None
    if matches:
        listed = ", ".join(f"{short_id(m.root.name)} ({m.root.name})" for m in matches)
        raise UsageError(
            f"{target!r} matches {len(matches)} runs under {parent.resolve()}: {listed}; give more of the id"
        )
    if _JOB_ID.fullmatch(target):
        found = _find_job(target, runs)
        if found is not None:
            return found
        raise UsageError(
            f"job {target}: no run under {parent.resolve()} lists it (nor has it as a short id) and SLURM "
            "does not know its run dir; pass the run dir instead (or --dir where the run lives)"
        )
    raise UsageError(
        f"{target!r} is neither a run dir nor a job id, nor the short id of a run under {parent.resolve()} "
        "(the hash a run dir's name ends with: `slime-submit list` shows them)"
    )


def _short_id_matches(target: str, runs: list) -> list:
    """Runs under --dir whose short id starts with ``target``, or whose dir name is ``target``."""
    exact = [p for p in runs if p.root.name == target]
    if exact:
        return exact
    return [p for p in runs if short_id(p.root.name).startswith(target.lower())]


def _find_job_in_records(job_id: str, runs: list) -> tuple[Any, int | None] | None:
    """The run whose ``jobs.json`` lists the job: ``Launcher.find_run``'s base implementation, which
    reads the launchers' records only (a launcher's own may also ask SLURM, which comes later)."""
    from launchers import LAUNCHERS, get_launcher
    from launchers.base import Launcher
    from launchers.status import launcher_name

    for name in LAUNCHERS.names():
        found = Launcher.find_run(get_launcher(name), job_id, [p for p in runs if launcher_name(p) == name])
        if found is not None:
            return found
    return None


def _find_job(job_id: str, runs: list) -> tuple[Any, int | None] | None:
    """Ask each launcher about the job id, among its own runs (newest first)."""
    from launchers import LAUNCHERS, get_launcher
    from launchers.status import launcher_name

    for name in LAUNCHERS.names():
        found = get_launcher(name).find_run(job_id, [p for p in runs if launcher_name(p) == name])
        if found is not None:
            return found
    return None


def _task_arg(args: argparse.Namespace, implied: int | None, n: int) -> int | None:
    task = args.task if args.task is not None else implied
    if task is not None and not 0 <= task < n:
        raise UsageError(f"--task {task}: the run has tasks 0..{n - 1}")
    return task


# ----------------------------------------------------------------------------- output helpers
def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        choices=("wide",),
        default=None,
        help="wide: every column, at full width (the default drops and shortens columns to fit the terminal)",
    )


def _print_view(view, wide: bool) -> None:
    """Print a list/status view: fitted to the terminal, or (``-o wide``) as wide as the table needs."""
    con = _console()
    if wide:
        from rich.console import Console

        con = Console(highlight=False, soft_wrap=True, width=max(con.width, view.natural_width()))
    con.print(view)


# ----------------------------------------------------------------------------- status
def configure_status(p: argparse.ArgumentParser) -> None:
    _common(p)
    _output(p)
    p.add_argument(
        "-w",
        "--watch",
        nargs="?",
        const=str(WATCH_DEFAULT_S),
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_DEFAULT_S:g}) until the run ends; Ctrl-C stops (exit 130)",
    )
    p.set_defaults(func=_guard(status))


def _status_doc(paths, launcher, task: int | None, problem: str | None) -> tuple[Any, dict]:
    from launchers.chain import chain_states

    st = launcher.status(paths)
    doc = st.to_json()
    doc["problem"] = problem
    _add_diagnoses(paths, doc)
    doc["chain"] = chain_states(paths)  # None unless the run is a step of `slime-submit chain`
    if task is not None:
        doc["tasks"] = [t for t in doc["tasks"] if t["task"] == task]
    return st, doc


def _add_diagnoses(paths, doc: dict) -> None:
    """Each task's newest failure record (``diagnosis.json``): what ``why`` explains, as one line."""
    import msgspec

    from slime.diagnosis.record import read

    for t in doc["tasks"]:
        records = read(paths.task(int(t["task"])))
        t["diagnosis"] = msgspec.to_builtins(records[-1]) if records else None


def status(args: argparse.Namespace) -> int:
    from slime.provenance import update_lock_from_preflight

    interval = _watch_interval(args)
    paths, implied = resolve_target(args.target, args.dir)
    problem = _warn_jobs(paths)
    launcher = _launcher(paths)
    st, doc = _status_doc(paths, launcher, None, problem)
    task = _task_arg(args, implied, len(st.tasks))
    update_lock_from_preflight(paths.root)
    if interval is not None:
        from slime.cli.watch import watch_status

        return watch_status(lambda: _status_doc(paths, launcher, task, problem), interval, args)
    if task is not None:
        doc["tasks"] = [t for t in doc["tasks"] if t["task"] == task]
    if args.json:
        print(json.dumps(doc, indent=2))
        return ExitCode.OK
    from slime.cli.jobs_view import StatusView

    _print_view(StatusView(doc, wide=args.output == "wide"), args.output == "wide")
    return ExitCode.OK


def _watch_interval(args: argparse.Namespace) -> float | None:
    """``--watch [SECONDS]``: argparse hands ``--watch RUN`` the run as SECONDS; take it back as the target."""
    if args.watch is None:
        return None
    try:
        seconds = float(args.watch)
    except ValueError:
        if args.target is not None:
            raise UsageError(f"--watch {args.watch}: SECONDS must be a number") from None
        args.target, seconds = args.watch, WATCH_DEFAULT_S
    if not WATCH_MIN_S <= seconds <= WATCH_MAX_S:
        raise UsageError(
            f"--watch {args.watch}: SECONDS must be between {WATCH_MIN_S:g} and {WATCH_MAX_S:g} "
            f"(to watch a run whose id is all digits, put it before --watch)"
        )
    return seconds


# ----------------------------------------------------------------------------- logs
def configure_logs(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p.add_argument("--node", default=None, metavar="NAME", help="that node's bootstrap log instead of the job log")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines (before following)")
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    p.set_defaults(func=_guard(logs))


def _tail(text: str, n: int | None) -> str:
    if n is None:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[-n:]) if n > 0 else ""


def logs(args: argparse.Namespace) -> int:
    from launchers.status import task_count

    paths, implied = resolve_target(args.target, args.dir)
    _warn_jobs(paths)
    launcher = _launcher(paths)
    n = task_count(paths)
    task = _task_arg(args, implied, n)
    task = 0 if task is None else task
    if not args.follow:
        files = launcher.log_files(paths, task, args.node)
        out = [
            {
                "path": str(f),
                "exists": f.exists(),
                "text": _tail(f.read_text(errors="replace"), args.tail) if f.exists() else "",
            }
            for f in files
        ]
        if args.json:
            print(json.dumps({"run_dir": str(paths.root), "task": task, "node": args.node, "files": out}, indent=2))
            return ExitCode.OK
        if not any(f["exists"] for f in out):
            from rich.markup import escape

            st = launcher.status(paths).tasks[task].state
            follow = f"slime-submit logs -f {shlex.quote(str(paths.root))} --task {task}"
            where = ", ".join(f["path"] for f in out)
            _console(stderr=True).print(
                f"no log yet for task {task} ({st}): {escape(where)}"
                + (f"; wait for it with `{escape(follow)}`" if st.is_active else "")
            )
        for f in out:
            if f["exists"]:
                if len(out) > 1:
                    sys.stdout.write(f"==> {f['path']} <==\n")
                sys.stdout.write(f["text"])
        sys.stdout.flush()
        if n > 1 and args.task is None and implied is None and not args.json:
            _console(stderr=True).print(f"[dim](task {task} of {n}; --task N for another)[/]")
        return ExitCode.OK
    return _follow(paths, launcher, task, args)


def _follow(paths, launcher, task: int, args: argparse.Namespace) -> int:
    """Print new bytes as they arrive; stop once the task is no longer active (polled every ~2 s).
    The log files are listed again on every poll: a log that appears later (``logs -f`` started
    before the job wrote one, a node that joined late) is followed from its start."""
    pos: dict[Path, int] = {}
    first = True

    def drain() -> None:
        nonlocal first
        for f in launcher.log_files(paths, task, args.node):
            try:
                size = f.stat().st_size
            except OSError:
                continue
            start = pos.get(f, 0)
            if size < start:  # truncated (a requeue without append): start over
                start = 0
            if size == start:
                continue
            with f.open("rb") as fh:
                fh.seek(start)
                data = fh.read(size - start).decode("utf-8", "replace")
            pos[f] = size
            if first and args.tail is not None and start == 0:
                data = _tail(data, args.tail)
            if args.json:
                print(json.dumps({"path": str(f), "text": data}), flush=True)
            else:
                sys.stdout.write(data)
                sys.stdout.flush()
        first = False

    last_check, state = 0.0, None
    while True:
        drain()
        now = time.monotonic()
        if now - last_check >= 2.0:
            last_check = now
            state = launcher.status(paths).tasks[task].state
            if not state.is_active:
                drain()  # what the job wrote while it ended
                break
        time.sleep(max(0.05, args.poll))
    if args.json:
        print(json.dumps({"run_dir": str(paths.root), "task": task, "state": state, "done": True}), flush=True)
    else:
        _console(stderr=True).print(f"[dim]task {task} is {state}; stopped following[/]")
    return ExitCode.OK


# ----------------------------------------------------------------------------- cancel
def configure_cancel(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.set_defaults(func=_guard(cancel))


def cancel(args: argparse.Namespace) -> int:
    from launchers.status import task_count

    if args.target is None:
        raise UsageError("cancel needs a RUN_DIR or JOB_ID (it never guesses which run to stop)")
    paths, implied = resolve_target(args.target, args.dir)
    _warn_jobs(paths)
    task = _task_arg(args, implied, task_count(paths))
    result = _launcher(paths).cancel(paths, task)
    from launchers.chain import cancel_after

    later = cancel_after(paths) if task is None else []  # the chain's steps after it that have not started
    if args.json:
        print(json.dumps({**result.to_json(), "chain_cancelled": later}, indent=2))
    else:
        con = _console()
        if result.cancelled:
            what = ", ".join(str(c) for c in result.cancelled)
            tasks = result.tasks if result.tasks is not None else result.cancelled
            con.print(
                f"cancelled {what} (task{'s' if len(result.tasks or ()) != 1 else ''} "
                f"{', '.join(str(t) for t in tasks)}) of {paths.root}"
            )
        else:
            con.print(result.message or "nothing to cancel")
        for step in later:
            con.print(
                f"cancelled pending chain step {step['name']!r} (job {', '.join(step['cancelled'])}): {step['run_dir']}"
            )
    return ExitCode.OK


# ----------------------------------------------------------------------------- list
def configure_list(p: argparse.ArgumentParser) -> None:
    _common(p, target=False, task=False)
    _output(p)
    p.add_argument("--limit", type=int, default=20, metavar="N", help="at most N runs, newest first (default 20)")
    p.add_argument(
        "--report",
        action="store_true",
        help="a REPORT column: each run's report.html as a file:// link ('-': none yet; 'slime-submit report ID' "
        "writes one); --json rows always carry 'report'",
    )
    p.set_defaults(func=_guard(list_runs))


def _report(root: Path) -> str | None:
    """The run's report page (``slime-submit report``'s default output), when it has been written."""
    from slime.cli.report import report_path

    page = report_path(root)
    return str(page) if page.is_file() else None


def _run_states(runs: list) -> dict[Path, Any]:
    """Each run's status, asked of its launcher in one batch per launcher."""
    from launchers import LAUNCHERS, get_launcher
    from launchers.status import launcher_name

    by_launcher: dict[str, list] = {}
    for p in runs:
        by_launcher.setdefault(launcher_name(p), []).append(p)
    states: dict[Path, Any] = {}
    for launcher, group in by_launcher.items():
        if launcher in LAUNCHERS:  # an unknown one is that run's problem, not the whole list's
            states.update(get_launcher(launcher).statuses(group))
    return states


def _list_row(p, st) -> tuple[dict, str | None]:
    """One run's row of ``list`` and its note (None when nothing is wrong)."""
    from launchers.status import launcher_name

    if st is None:
        launcher = launcher_name(p)
        row = {
            "name": p.root.name,
            "run_dir": str(p.root),
            "launcher": launcher,
            "job_ids": [],
            "state": RunState.UNKNOWN,
            "started": None,
            "last_step": None,
            "tasks": 0,
            "preflight_only": False,
            "problem": f"{p.root}: unknown launcher {launcher!r}; known: {_known()}",
            "report": _report(p.root),
        }
        return row, "unknown launcher"
    from launchers.chain import read_chain

    bad = p.jobs_problem()  # a damaged jobs.json reads as absent: the state shown is flagged
    chain = read_chain(p)
    row = {
        "name": st.name,
        "run_dir": st.run_dir,
        "launcher": st.launcher,
        "job_ids": st.job_ids,
        "state": st.state,
        "started": st.started,
        "last_step": st.last_step,
        "tasks": len(st.tasks),
        "preflight_only": st.preflight_only,
        "problem": f"{p.jobs} {bad}; ignored" if bad else None,
        "report": _report(p.root),
        "chain": {"chain": chain.get("chain"), "step": chain["index"] + 1, "of": len(chain["steps"])}
        if chain
        else None,
    }
    return row, "jobs.json unreadable" if bad else None


def list_runs(args: argparse.Namespace) -> int:
    parent = args.dir or _default_dir()
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    runs = find_runs(parent)[: args.limit]
    states = _run_states(runs)
    rows, notes = [], {}
    for p in runs:
        row, note = _list_row(p, states.get(p.root))
        rows.append(row)
        if note:
            notes[p.root] = note
    if args.json:
        print(json.dumps({"dir": str(Path(parent).resolve()), "runs": rows}, indent=2))
        return ExitCode.OK
    from rich.markup import escape

    from slime.cli.jobs_view import ListView

    wide = args.output == "wide"
    view = ListView(
        str(Path(parent).resolve()), rows, {str(k): v for k, v in notes.items()}, wide=wide, report=args.report
    )
    _print_view(view, wide)
    con = _console()
    if args.report and any(r["report"] is None for r in rows):
        con.print("[dim]REPORT -: not written yet; `slime-submit report ID --open` writes and opens it[/]")
    for r in rows:
        if r["problem"]:
            con.print(
                f"[yellow]warning:[/] {escape(r['problem'])}; see `slime-submit status "
                f"{escape(shlex.quote(r['run_dir']))}`"
            )
    return ExitCode.OK


# ----------------------------------------------------------------------------- rerun
def configure_rerun(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="RUN_DIR|JOB_ID", help="the run to submit again")
    p.add_argument("--dir", type=Path, default=None, metavar="D", help="where to look up a job id")
    p.add_argument("--force", action="store_true", help="submit even if that spec's job is still pending/running")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted; change nothing")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_guard(rerun))


def _script_identical(old: Path, old_root: str, new_text: str | None, new_root: Path) -> bool | None:
    if new_text is None or not old.exists():
        return None
    return old.read_text().replace(old_root, str(new_root)) == new_text


def _print_dry_run(request, as_json: bool, rerun_of: Path, spec_sha: str, same: bool | None) -> None:
    if not as_json:
        sys.stdout.write(request.render())
        return
    doc = {
        "run_dir": str(request.run_dir),
        "rerun_of": str(rerun_of),
        "spec_sha256": spec_sha,
        "script_identical": same,
        "command": list(request.command),
    }
    print(json.dumps(doc, indent=2))


def _print_submitted(submission, rerun_of: Path, same: bool | None) -> None:
    con = _console()
    if submission.job_ids:
        con.print(f"submitted job {', '.join(submission.job_ids)} (rerun of {rerun_of})")
    con.print(f"run dir: {submission.run_dir}")
    if same is False:
        con.print(
            "[yellow]note:[/] the batch script differs from the original's beyond the run dir "
            "(slime-submit changed since); the resolved spec is identical"
        )


def rerun(args: argparse.Namespace) -> int:
    from launchers import get_launcher
    from launchers.base import SubmitOptions
    from slime.core.errors import InfraError
    from slime.provenance import loaded_from_run, read_lock, rerun_extra, spec_sha256

    paths, _ = resolve_target(args.target, args.dir)
    lock = read_lock(paths.root)
    loaded = loaded_from_run(paths, lock)
    extra, env = rerun_extra(paths, lock)
    os.environ.update(env)  # e.g. SLIME_DRIVER, which the job reads from its environment
    launcher = get_launcher(lock["launcher"])
    options = SubmitOptions(
        preflight_only=bool((lock.get("options") or {}).get("preflight_only")), force=args.force, extra=extra
    )
    dry = launcher.dryrun(loaded, options)
    request = dry.request
    if spec_sha256(request.file("resolved.json")) != lock["spec_sha256"]:
        raise InfraError(
            f"rerun of {paths.root} would not submit the recorded resolved spec (hash differs): a bug; please report it"
        )
    try:
        new_script = request.file(paths.script.name)
    except KeyError:
        new_script = None
    same = _script_identical(paths.script, str(lock.get("run_dir") or paths.root), new_script, request.run_dir)
    if args.dry_run:
        _print_dry_run(request, args.json, paths.root, lock["spec_sha256"], same)
        return ExitCode.OK
    submission = launcher.submit(dry)
    out = {
        **submission.to_json(),
        "rerun_of": str(paths.root),
        "spec_sha256": lock["spec_sha256"],
        "script_identical": same,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_submitted(submission, paths.root, same)
    return submission.returncode
