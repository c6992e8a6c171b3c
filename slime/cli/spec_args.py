"""The arguments every spec-taking command shares: the spec file(s), ``--set`` and ``--json``."""

from __future__ import annotations

import argparse

from slime.cli.complete import spec_field_completer

__all__ = ["add_spec_args"]


class _ClusterProfile(argparse.Action):
    """``--cluster NAME`` is ``--set cluster.profile=NAME``: one path, so lock.json records it like any override."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.overrides.append(f"cluster.profile={values}")


def add_spec_args(p: argparse.ArgumentParser, *, many: bool = False, json_help: str = "print JSON for scripts") -> None:
    if many:
        p.add_argument("specs", nargs="+", metavar="SPEC", help="spec file(s)")
    else:
        p.add_argument("spec", metavar="SPEC", help="spec file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field before validation (value parsed as YAML); repeatable",
    ).completer = spec_field_completer("=")  # type: ignore[attr-defined]
    p.add_argument(
        "--cluster",
        dest="overrides",
        action=_ClusterProfile,
        metavar="NAME",
        help="take site settings from this cluster profile (clusters.yaml; `slime-submit clusters list`)",
    )
    p.add_argument("--json", action="store_true", help=json_help)
