"""Shared pytest configuration: the test tiers as markers, and the shared fixtures as plug-ins.

Tiers come from the directory a test lives in (``tests/unit`` → ``unit``, ``tests/integration`` →
``integration``, ``tests/e2e`` → ``e2e``, ``tests/gpu`` → ``gpu``), so ``pytest -m unit`` runs exactly
one directory's tests without anyone marking them by hand. ``slurm`` (the real local SLURM cluster)
is added to every test that uses the ``slurm_cluster`` fixture, directly or through another fixture;
a module may also mark itself ``slurm`` (a module whose tests share state with its cluster tests).
``slow`` is marked by hand where a test takes tens of seconds or more. The markers are declared in
``setup.cfg`` (``--strict-markers``); the README's "Tests" section says how to run each tier.

Fixtures live in their own modules, loaded here as plug-ins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.local_ray",  # local_ray: a private Ray per test module
    "tests.fixtures.slurm_cluster",  # slurm_cluster: the real local SLURM cluster
    "tests.fixtures.tiny_models",  # tiny_model(**shape): tiny HF checkpoints, built once per session
    "tests.fixtures.warm_start",  # quickstart_warmup: the quickstart's SFT warm-up, run once per session
]

TESTS = Path(__file__).resolve().parent
#: directory under tests/ -> the tier marker its tests get
TIERS = {"unit": "unit", "integration": "integration", "e2e": "e2e", "gpu": "gpu"}


def tier_of(path: Path) -> str | None:
    """The tier of a test file: its first directory under ``tests/`` (None outside the tiers)."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return TIERS.get(parts[0]) if len(parts) > 1 else None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier:
            item.add_marker(tier)
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker("slurm")
        group = xdist_group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def xdist_group_of(item: pytest.Item) -> str | None:
    """Which tests pytest-xdist (``--dist loadgroup``) keeps on one worker: every SLURM test (one cluster per
    machine), and the tests of a module that share a module-scoped fixture (built once, not once per worker).
    A module may name a group itself (``pytest.mark.xdist_group("learning")``: the long CPU-bound learning
    runs, one at a time, so that their thresholds and time limits hold on two cores)."""
    if item.get_closest_marker("xdist_group"):
        return None  # the test (or its module) names its group itself
    if item.get_closest_marker("slurm"):
        return "slurm"
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        if defs and defs[-1].scope in ("module", "class", "package"):
            return item.path.stem
    return None


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """A test that leaves Ray initialised in the test process fails its teardown, by name.

    Ray auto-initialises on the first ``ray.get``/``.remote()``; a test that does so by accident would
    otherwise fail whichever later test on the same xdist worker needs its own Ray (``local_ray``)."""
    result = yield
    ray = sys.modules.get("ray")
    if ray is None or "local_ray" in getattr(item, "fixturenames", ()) or not ray.is_initialized():
        return result
    ray.shutdown()
    raise pytest.fail.Exception(f"{item.nodeid} left Ray initialised in the test process (shut it down)")
