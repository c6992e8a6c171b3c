"""``slime-submit patches check|apply|list``: verify and apply our patches to the pinned engines.

Exit codes: 0 ok · 1 a patch does not apply or an artifact fails its hash ·
2 usage (unknown engine, wrong version) · 3 the package index is unreachable.
Imports only the standard library until a subcommand runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slime.core.errors import ExitCode


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="patches_command", metavar="ACTION")
    for name, help_text in (
        ("check", "download each pinned engine, verify its hash, dry-run every patch"),
        ("apply", "apply the patches to the installed pinned engine(s) and record them"),
        ("list", "show pins and patches recorded as applied here"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--engine",
            action="append",
            default=[],
            metavar="NAME",
            help="engine from patches/pins.toml (repeatable; default: every engine with patches for "
            "apply, every pinned engine for check)",
        )
        p.add_argument("--version", default=None, help="must equal the pinned version (a guard against drift)")
        p.add_argument("--patches-dir", type=Path, default=None, help="default: $SLIME_PATCHES_DIR or ./patches")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "apply":
            p.add_argument(
                "--target",
                type=Path,
                default=None,
                help="package root to patch (default: where the engine is installed)",
            )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slime import patches

    action = getattr(args, "patches_command", None)
    if action is None:
        print("usage: slime-submit patches {check,apply,list} [--engine NAME]", file=sys.stderr)
        return ExitCode.SPEC
    root = args.patches_dir
    try:
        pins = patches.load_pins(root)
        engines = args.engine or [e for e in pins if action != "apply" or patches.patch_files(e, pins[e].version, root)]
        unknown = [e for e in engines if e not in pins]
        if unknown:
            print(f"error: unknown engine(s) {unknown}; pinned: {', '.join(sorted(pins))}", file=sys.stderr)
            return ExitCode.SPEC
        if action == "list":
            info = {
                "pins": {
                    e: {
                        "version": p.version,
                        "why": p.why,
                        "patches": [f.name for f in patches.patch_files(e, p.version, root)],
                    }
                    for e, p in pins.items()
                    if e in engines
                },
                "applied": patches.applied_patches(root),
            }
            print(json.dumps(info, indent=2) if args.json else _list_text(info))
            return ExitCode.OK
        if action == "check":
            results = [patches.check(e, args.version, root=root) for e in engines]
            if args.json:
                print(json.dumps([{**r.__dict__, "ok": r.ok} for r in results], indent=2))
            else:
                for r in results:
                    print(r.summary())
                    for p in r.patches:
                        if not p["ok"]:
                            print("    " + p["output"].replace("\n", "\n    "))
            return ExitCode.OK if all(r.ok for r in results) else 1
        applied = [rec for e in engines for rec in patches.apply(e, args.version, target=args.target, root=root)]
        print(
            json.dumps(applied, indent=2)
            if args.json
            else "\n".join(f"{r['engine']} {r['version']}: {r['patch']} applied" for r in applied)
            or "nothing to apply: no patches for the selected engines"
        )
        return ExitCode.OK
    except patches.PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        usage = ("unknown engine", "is pinned to", "is not installed here")
        return ExitCode.SPEC if any(w in str(exc) for w in usage) else 1


def _list_text(info: dict) -> str:
    lines = []
    for engine, pin in info["pins"].items():
        lines.append(f"{engine} {pin['version']}: {len(pin['patches'])} patch(es) {pin['patches'] or ''}".rstrip())
        lines.append(f"    used for: {pin['why']}")
    lines.append(f"applied here: {len(info['applied'])}")
    lines += [f"    {r['engine']} {r['version']} {r['patch']} ({r['applied_at']})" for r in info["applied"]]
    return "\n".join(lines)
