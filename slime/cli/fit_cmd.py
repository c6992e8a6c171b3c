"""``slime-submit fit SPEC``: each role's memory per GPU (and each node's RAM) as a table, with the headroom.

The same estimate ``validate`` and ``submit`` refuse with (``slime.fit``); here a spec that cannot
fit is still shown, term by term, and the exit status says whether it fits (0) or not (2).
"""

from __future__ import annotations

import argparse
import json

from slime.cli.spec_args import add_spec_args

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    add_spec_args(p, json_help="print the breakdown as JSON (bytes)")
    p.add_argument("--gpu", metavar="NAME", help="the GPU model, if the spec has no cluster.gpu (e.g. H100-80GB)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from slime.cli.commands import _console, _error
    from slime.cli.init_cmd import load_checked
    from slime.core.errors import ExitCode
    from slime.fit.check import findings, skipped
    from slime.fit.plan import estimate

    overrides = list(args.overrides) + ([f"cluster.gpu={{name: {args.gpu}}}"] if args.gpu else [])
    with skipped():  # the table of a spec that cannot fit is what this command is for
        loaded = load_checked(args.spec, overrides=overrides)
    spec = loaded.spec
    report = estimate(spec)
    if report is None:
        _error(args.json, "usage", _why_not(spec))
        return ExitCode.SPEC
    found = findings(spec, report)
    if args.json:
        print(json.dumps(_as_json(report, found), indent=2))
    else:
        con = _console()
        for role in report.roles:
            con.print(_table(report, role))
        for sev, (path, message, hint) in found:
            color = "red" if sev == "error" else "yellow"
            con.print(f"[{color}]{sev}[/]: [cyan]{escape(path)}[/]: {escape(message)}")
            con.print(f"    [dim]hint:[/] {escape(hint or '')}")
        if not found:
            con.print("[green]fits[/]: every role has headroom")
    return ExitCode.SPEC if any(sev == "error" for sev, _ in found) else ExitCode.OK


def _why_not(spec) -> str:
    from slime.fit.plan import gpu_bytes
    from slime.spec.resolve import model_config

    if spec.cluster.gpus_per_node == 0 or spec.cluster.fake_gpus:
        return "a CPU-only (or fake-GPU) job has no GPU memory to fit"
    if gpu_bytes(spec) is None:
        return "the GPU's memory is unknown: set cluster.gpu.name (e.g. H100-80GB) or pass --gpu NAME"
    if model_config(spec.model.path) is None:
        return f"{spec.model.path}/config.json is not readable here, so the model's size is unknown"
    return "the estimate models the megatron trainer and SGLang engines only"


def _table(report, role):
    from rich.table import Table

    from slime.fit.breakdown import gib

    title = f"{role.role} ({role.gpus} x {report.gpu})" if role.gpus else role.role
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("term")
    t.add_column("GiB", justify="right")
    for name, size in role.memory.terms:
        if size:
            t.add_row(name, f"{size / (1 << 30):.2f}")
    t.add_row("[bold]total[/]", f"[bold]{role.memory.total / (1 << 30):.2f}[/]")
    if role.capacity and role.engine is None:
        color = {"ok": "green", "tight": "yellow", "over": "red"}[role.verdict]
        t.add_row("capacity", f"{role.capacity / (1 << 30):.2f}")
        t.add_row(f"[{color}]headroom ({role.verdict})[/]", f"[{color}]{gib(role.headroom).split()[0]}[/]")
    if role.engine is not None:
        e = role.engine
        t.add_row("KV tokens", f"{e.kv_tokens}")
        color = {"ok": "green", "tight": "yellow", "over": "red"}[role.verdict]
        t.add_row("full-length samples at once", f"{e.concurrent_fit} of {e.demand_tokens // e.request_tokens}")
        t.add_row(f"[{color}]KV pool / demand ({role.verdict})[/]", f"[{color}]{e.kv_tokens / e.demand_tokens:.1f}x[/]")
    t.caption = "; ".join(role.memory.notes) or None
    return t


def _as_json(report, found) -> dict:
    roles = []
    for r in report.roles:
        row = {"role": r.role, "gpus": r.gpus, "terms": dict(r.memory.terms), "total": r.memory.total}
        row |= {"capacity": r.capacity or None, "headroom": r.headroom if r.capacity else None, "verdict": r.verdict}
        if r.engine is not None:
            row |= {"kv_tokens": r.engine.kv_tokens, "demand_tokens": r.engine.demand_tokens}
        roles.append(row)
    problems = [{"severity": s, "path": p, "message": m, "hint": h} for s, (p, m, h) in found]
    return {
        "ok": not any(p["severity"] == "error" for p in problems),
        "gpu": report.gpu,
        "roles": roles,
        "problems": problems,
    }
