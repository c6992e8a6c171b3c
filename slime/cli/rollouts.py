"""``slime-submit rollouts RUN [--rollout K|--all] [filters] [--sort S] [--page P] [--sample I] [--side-by-side]``.

Browse a run's saved rollouts (``debug.save_rollouts``) in the terminal: a page of samples as a table
(filtered by group, reward, length, status; sorted), one sample in full (``--sample I``: prompt, response,
label, and per token the engine's vs the trainer's log-prob coloured by their difference, the loss mask,
the version, the agent's turns and tool calls), or a group's samples side by side (``--group G
--side-by-side``). Reads lazily (:mod:`slime.cli.rollout_store`): the index of the rollouts shown, then
only the page's rows. ``--json`` prints the page's records. Exit codes: 0 ok · 2 no such run/rollout/sample.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from slime.core.errors import ExitCode

__all__ = ["configure", "run"]

TOKENS_SHOWN = 200  # token rows of --sample, unless --tokens says otherwise


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target", nargs="?", default=None, metavar="RUN", help="run dir, short id or job id (default: newest)"
    )
    p.add_argument("--dir", type=Path, default=None, metavar="D", help="where short ids and job ids are looked up")
    p.add_argument("--task", type=int, default=None, metavar="N", help="sweep task N (default 0)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rollout", type=int, default=None, metavar="K", help="rollout K (default: the last saved)")
    which.add_argument("--all", action="store_true", help="every saved rollout (reads each file's small columns)")
    p.add_argument("--group", type=int, default=None, metavar="G", help="only group G")
    p.add_argument("--min-reward", type=float, default=None, metavar="R")
    p.add_argument("--max-reward", type=float, default=None, metavar="R")
    p.add_argument("--min-len", type=int, default=None, metavar="N", help="response tokens at least N")
    p.add_argument("--max-len", type=int, default=None, metavar="N", help="response tokens at most N")
    p.add_argument("--status", default=None, help="completed, truncated, aborted, failed")
    p.add_argument(
        "--sort",
        default="order",
        choices=("order", "reward", "len", "group"),
        help="order (as saved; the default), reward, len (response tokens) or group",
    )
    p.add_argument("--desc", action="store_true", help="sort descending")
    p.add_argument("--page", type=int, default=1, metavar="P", help="page P (from 1)")
    p.add_argument("--page-size", type=int, default=20, metavar="N")
    p.add_argument("--sample", type=int, default=None, metavar="I", help="show sample I (its index) in full")
    p.add_argument("--side-by-side", action="store_true", help="with --group: the group's samples side by side")
    p.add_argument("--tokens", type=int, default=TOKENS_SHOWN, metavar="N", help="token rows of --sample (0: all)")
    p.add_argument("--json", action="store_true", help="print the page's samples as JSON")
    p.set_defaults(func=run)


class _Usage(Exception):
    pass


def _where(args: argparse.Namespace) -> tuple[Path, Path, dict[str, Any], str]:
    """(task dir, rollouts dir, task spec, label) of the run and task asked for."""
    from slime.cli.jobs import UsageError, resolve_target
    from slime.cli.report_data import load_run

    try:
        paths, implied = resolve_target(args.target, args.dir)
    except UsageError as exc:
        raise _Usage(str(exc)) from None
    task = args.task if args.task is not None else (implied or 0)
    run = load_run(paths.root)
    t = next((t for t in run.tasks if t.index == task), None)
    if t is None:
        raise _Usage(f"{paths.root} has no task {task} (tasks: {', '.join(str(t.index) for t in run.tasks)})")
    return t.paths.dir, t.rollouts_dir, (t.spec or run.resolved), f"{run.label} task {task}"


def _chosen(args: argparse.Namespace, rdir: Path, ids: list[int]) -> list[int]:
    if not ids:
        raise _Usage(f"no saved rollouts in {rdir} (a run saves them with debug.save_rollouts: true)")
    if args.all:
        return ids
    if args.rollout is None:
        return [ids[-1]]
    if args.rollout not in ids:
        raise _Usage(f"rollout {args.rollout} is not saved in {rdir}: rollouts {ids[0]}..{ids[-1]} ({len(ids)} files)")
    return [args.rollout]


def run(args: argparse.Namespace) -> int:
    from slime.cli import rollout_store as store
    from slime.cli.report import missing_modules

    try:
        if missing_modules(("pyarrow",)):
            raise _Usage("reading saved rollouts needs pyarrow: pip install 'slime-submit[runtime]'")
        task_dir, rdir, spec, label = _where(args)
        ids = store.saved_rollouts(rdir)
        chosen = _chosen(args, rdir, ids)
        flt = store.Filter(args.group, args.min_reward, args.max_reward, args.min_len, args.max_len, args.status)
        sort = f"-{args.sort}" if args.desc and args.sort in ("reward", "len") else args.sort
        rows = store.select(store.read_index(rdir, chosen), flt, sort)
        if args.sample is not None:
            rows = [r for r in rows if r.index == args.sample][:1]
            if not rows:
                raise _Usage(f"no sample {args.sample} among the {label} rollout(s) {_span(chosen)} that match")
        elif args.side_by_side and args.group is None:
            raise _Usage("--side-by-side shows one group: give --group G")
    except _Usage as exc:
        from slime.cli.commands import _error

        _error(args.json, "usage", str(exc))
        return ExitCode.SPEC
    from slime.cli import rollouts_view as view

    vocab = store.vocab(task_dir, spec)
    if args.sample is not None or args.side_by_side:
        samples = store.read_samples(rdir, [(r.rollout_id, r.row) for r in rows])
        if args.json:
            print(json.dumps(samples, indent=1, default=str))
        elif args.sample is not None:
            view.print_sample(samples[0], vocab, args.tokens)
        else:
            view.print_group(samples, vocab)
        return ExitCode.OK
    size = max(1, args.page_size)
    pages = max(1, -(-len(rows) // size))
    page = min(max(args.page, 1), pages)
    shown = rows[(page - 1) * size : page * size]
    samples = store.read_samples(rdir, [(r.rollout_id, r.row) for r in shown])
    if args.json:
        doc = {"rollouts": chosen, "matched": len(rows), "page": page, "pages": pages, "samples": samples}
        print(json.dumps(doc, indent=1, default=str))
        return ExitCode.OK
    head = f"{label}: {len(ids)} saved rollout(s) {_span(ids)}; showing {_span(chosen)}: {len(rows)} sample(s) match"
    view.print_page(samples, f"{head}; page {page}/{pages}")
    return ExitCode.OK


def _span(ids: list[int]) -> str:
    return str(ids[0]) if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
