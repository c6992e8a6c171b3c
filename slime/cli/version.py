"""``slime-submit --version [-v]``: the package version; with ``-v`` also what a run's ``lock.json`` records.

``-v`` adds Python (version and interpreter) and the engine packages ``slime.provenance`` tracks
(``TRACKED_PACKAGES``: torch, ray, transformers, megatron-core, sglang), read from package
metadata exactly as the lock reads them: nothing is imported, so it is quick and safe on a login
node without GPUs. Not guaranteed: that an installed engine imports (metadata only says it is there).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from pathlib import Path

from slime.core.errors import ExitCode

__all__ = ["print_version", "slime_version"]


def slime_version() -> str:
    try:
        return importlib.metadata.version("slime-submit")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        from slime import __version__

        return __version__


def print_version(args: argparse.Namespace) -> int:
    if not args.show_version:
        print("slime-submit: error: -v/--verbose goes with --version (`slime-submit --version -v`)", file=sys.stderr)
        return ExitCode.SPEC
    where = Path(__file__).resolve().parents[2]
    print(f"slime-submit {slime_version()}" + (f" ({where})" if args.version_verbose else ""))
    if args.version_verbose:
        from slime.provenance import package_versions

        print(f"python {platform.python_version()} ({sys.executable})")
        for name, version in package_versions().items():
            print(f"{name} {version or 'not installed'}")
    return ExitCode.OK
