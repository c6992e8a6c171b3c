"""``slime-submit chain A.yaml B.yaml ...``: validate every step, then submit (SLURM) or run (local) them in order.

Each step starts after the previous one succeeded (``--on ok``, SLURM ``afterok``) or ended
(``--on any``, ``afterany``); a later step uses an earlier one's output as ``${runs.NAME.OUTPUT}``
(``slime.spec.refs``). The chain itself: ``launchers.chain``. Prints a table of the steps.
"""

from __future__ import annotations

import argparse
import json

from slime.cli.spec_args import add_spec_args
from slime.core.errors import ExitCode

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    add_spec_args(p, many=True, json_help="print the steps as JSON")
    p.add_argument(
        "--on",
        choices=("ok", "any"),
        default="ok",
        help="start each step after the previous one succeeded (ok, the default) or ended in any way (any)",
    )
    p.add_argument("--force", action="store_true", help="submit even if a step's spec is already pending/running")
    p.add_argument("--no-fit-check", action="store_true", help="skip the memory fit check (recorded in lock.json)")
    p.set_defaults(func=run)


def _row(i: int, st) -> dict:
    return {
        "step": i + 1,
        "name": st.name,
        "spec": st.file,
        "run_dir": str(st.run_dir) if (st.job_ids or st.returncode is not None) else None,
        "job_ids": list(st.job_ids),
        "returncode": st.returncode,
        "inputs": st.inputs,
        "note": st.note,
    }


def run(args: argparse.Namespace) -> int:
    from launchers import chain
    from launchers.base import SubmitOptions
    from slime.cli.commands import print_problems
    from slime.cli.init_cmd import load_checked

    launcher, steps = chain.plan(list(args.specs), tuple(args.overrides), SubmitOptions(force=args.force), load_checked)
    if not args.json:
        for st in steps:
            print_problems(list(st.dry.request.loaded.warnings))
    chain.submit(launcher, steps, args.on)
    rows = [_row(i, st) for i, st in enumerate(steps)]
    rc = next((st.returncode for st in steps if st.returncode), ExitCode.OK)
    if args.json:
        print(json.dumps({"ok": rc == 0, "launcher": launcher.name, "on": args.on, "steps": rows}, indent=2))
        return rc
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"chain ({launcher.name}, each step after the previous {'succeeded' if args.on == 'ok' else 'ended'})"
    )
    for col in ("STEP", "NAME", "JOB IDS", "EXIT", "RUN DIR", "NOTE"):
        table.add_column(col, overflow="fold")
    for r in rows:
        exit_code = "" if r["returncode"] is None else str(r["returncode"])
        table.add_row(
            str(r["step"]), r["name"], ",".join(r["job_ids"]), exit_code, r["run_dir"] or "-", r["note"] or ""
        )
    Console(highlight=False, soft_wrap=True).print(table)
    return rc
