"""``slime-submit clusters list|show|check NAME``: the cluster profiles (``slime.spec.clusters``).

``list``: every profile of the clusters files seen from here; ``show``: the fields a profile sets, with
file:line, and its partitions; ``check``: the profile's launcher asks its cluster (the plug-in's
``site_check`` hook) and prints one row per fact; exit 2 naming the profile field on a mismatch, 3
when the cluster cannot be asked. Tables are rich's; ``--json`` prints one document.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slime.core.errors import ExitCode

__all__ = ["configure"]


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("list", "the profiles of the clusters files seen from here"),
        ("show", "what a profile sets (with file:line) and its partitions"),
        ("check", "ask the cluster whether the profile is right (partition, GPUs/GRES, CPUs, time limit)"),
    ):
        a = sub.add_parser(name, help=help_text)
        if name != "list":
            a.add_argument("name", metavar="NAME", help="profile name")
        a.add_argument("--json", action="store_true", help="print JSON for scripts")
        a.set_defaults(func=run)


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    from slime.spec.clusters import find_profile, load_profiles, profile_files

    files = profile_files(Path.cwd())
    if args.action == "list":
        return _list(load_profiles(files), files, args.json)
    site = find_profile(args.name, Path.cwd())
    if args.action == "show":
        return _show(site, args.json)
    return _check(site, args.json)


def _list(sites: dict, files: list[Path], as_json: bool) -> int:
    rows = []
    for name, s in sorted(sites.items()):
        sl = getattr(s.cluster, s.cluster.launcher, None)
        partition = getattr(sl, "partition", None)
        rows.append(
            [
                name,
                s.cluster.launcher,
                partition or "-",
                ", ".join(s.profile.partitions) or "-",
                s.profile.summary,
                str(s.file),
            ]
        )
    if as_json:
        keys = ("name", "launcher", "partition", "partitions", "summary", "file")
        print(json.dumps({"files": [str(f) for f in files], "profiles": [dict(zip(keys, r)) for r in rows]}, indent=2))
        return ExitCode.OK
    from rich.table import Table

    table = Table(title=f"cluster profiles ({', '.join(map(str, files)) or 'no clusters file found'})")
    for col in ("name", "launcher", "partition", "partitions", "summary", "file"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    _console().print(table)
    return ExitCode.OK


def _show(site, as_json: bool) -> int:
    import msgspec

    from slime.spec.clusters import leaves

    sets = [(p, v, str(site.at(*p.split(".")))) for p, v in leaves(site.raw, ("cluster",))]
    shapes = {k: msgspec.to_builtins(v) for k, v in site.profile.partitions.items()}
    if as_json:
        doc = {"name": site.name, "file": str(site.file), "summary": site.profile.summary}
        print(
            json.dumps(
                {**doc, "sets": {p: {"value": v, "at": at} for p, v, at in sets}, "partitions": shapes}, indent=2
            )
        )
        return ExitCode.OK
    from rich.table import Table

    table = Table(title=f"cluster profile {site.name!r}: {site.profile.summary}".rstrip(": "))
    for col in ("field", "value", "written at"):
        table.add_column(col, overflow="fold")
    for p, v, at in sets:
        table.add_row(p, json.dumps(v), at)
    con = _console()
    con.print(table)
    if shapes:
        parts = Table(title="partitions (what a job there gets per node)")
        for col in ("partition", "GPUs", "CPUs", "GPU model"):
            parts.add_column(col)
        for name, sh in shapes.items():
            gpu = (sh.get("gpu") or {}).get("name") or "-"
            parts.add_row(name, str(sh["gpus_per_node"]), str(sh.get("cpus_per_node") or "-"), gpu)
        con.print(parts)
    return ExitCode.OK


def _check(site, as_json: bool) -> int:
    from slime.spec.plugin import hook, profile

    check = hook(profile("launcher", site.cluster.launcher), "site_check")
    if check is None:
        print(f"the {site.cluster.launcher} launcher has nothing to check against (no site_check hook)")
        return ExitCode.OK
    rows = check(site)
    bad = [r for r in rows if not r.ok]
    if as_json:
        print(json.dumps({"name": site.name, "ok": not bad, "checks": [r.__dict__ for r in rows]}, indent=2))
    else:
        _check_table(site, rows)
    return ExitCode.SPEC if bad else ExitCode.OK


def _check_table(site, rows) -> None:
    from rich.table import Table

    table = Table(title=f"cluster profile {site.name!r} ({site.file}) against the {site.cluster.launcher} cluster")
    for col in ("check", f"field of clusters.{site.name}", "line", "profile says", "cluster has", ""):
        table.add_column(col, overflow="fold")
    for r in rows:
        line = r.at.split(":")[-2] if r.at.count(":") >= 2 else "-"
        verdict = "[green]ok[/]" if r.ok else "[red]MISMATCH[/]"
        table.add_row(r.check, r.field.removeprefix(f"clusters.{site.name}."), line, r.want, r.have, verdict)
    con = _console()
    con.print(table)
    for r in rows:
        if not r.ok:
            con.print(f"[red]mismatch[/]: {r.field} ({r.at}) says {r.want}; the cluster has {r.have}")
