"""The layout of the test suite itself: test modules never import each other, every test sits in a tier.

Test modules share code only through ``tests/fixtures/`` (helpers, data, pytest plug-ins): an import of
another test module (``tests.unit.test_x``, ``tests.slurm_cluster``, or ``test_x`` after a ``sys.path``
insert) couples two files that are edited, moved and deselected independently. Every import counts,
including function-level ones. Every test file lives in a tier directory whose name is a declared
marker, because ``tests/conftest.py`` marks tests by directory (``pytest -m unit`` etc.).
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIER_DIRS = ("unit", "integration", "e2e", "gpu")


def _imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source``; a relative import as ``.`` plus its module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module))
            if node.module == "tests":  # from tests import unit
                found += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
    return found


def _forbidden(module: str) -> bool:
    """An import of test code other than tests.fixtures (relative imports: write tests.fixtures.x)."""
    parts = module.split(".")
    if module.startswith(".") or parts[0].startswith("test_"):
        return True
    return parts[0] == "tests" and len(parts) > 1 and parts[1] != "fixtures"


def test_test_modules_import_no_other_test_module():
    files = sorted(TESTS.glob("**/test_*.py")) + sorted((TESTS / "fixtures").glob("**/*.py"))
    bad = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in files
        for line, module in _imports(path.read_text())
        if _forbidden(module)
    ]
    assert not bad, "shared test code belongs in tests/fixtures/:\n" + "\n".join(bad)


def test_the_checker_sees_each_kind_of_cross_import():
    samples = {
        "from tests.unit.test_spec_rules import CASES": True,
        "import tests.slurm_cluster": True,
        "from tests import conftest": True,
        "from .test_engine_api import server": True,
        "def f():\n    from test_slurm_render import spec_text": True,
        "from tests.fixtures.ranks import spawn_ranks": False,
        "from tests import fixtures": False,
        "import testing_tools, pytest": False,
    }
    for code, expected in samples.items():
        modules = [m for _, m in _imports(code)]
        assert any(_forbidden(m) for m in modules) is expected, (code, modules)


def test_every_test_file_is_in_a_declared_tier_directory(request):
    strays = [
        str(p.relative_to(TESTS)) for p in TESTS.glob("**/test_*.py") if p.relative_to(TESTS).parts[0] not in TIER_DIRS
    ]
    assert not strays, f"test files outside the tier directories {TIER_DIRS}: {strays}"
    cfg = configparser.ConfigParser()
    cfg.read(TESTS.parent / "setup.cfg")
    declared = {line.split(":")[0].strip() for line in cfg["tool:pytest"]["markers"].splitlines() if line.strip()}
    assert set(TIER_DIRS) | {"slurm", "slow"} <= declared
    assert request.node.get_closest_marker("unit") is not None  # conftest marked this test by its directory


def test_xdist_keeps_each_group_on_one_worker(tmp_path):
    """``ci/test.sh`` runs pytest-xdist with ``--dist loadgroup``; tests/conftest.py's groups must really reach
    the scheduler (a pytest release once broke that silently: every SLURM test then ran at once on one cluster)."""
    # the suite's own hook, not a copy of it
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: x\n")
    body = "import time\n\ndef _where():\n    time.sleep(0.2)\n"
    (tmp_path / "test_cluster.py").write_text(
        "import pytest\npytestmark = pytest.mark.slurm\n"
        + body
        + "".join(f"\ndef test_c{i}():\n    _where()\n" for i in range(4))
    )
    (tmp_path / "test_shared.py").write_text(
        "import pytest\n"
        + body
        + "\n@pytest.fixture(scope='module')\ndef shared():\n    return 1\n"
        + "".join(f"\ndef test_s{i}(shared):\n    _where()\n" for i in range(3))
    )
    (tmp_path / "test_free.py").write_text(body + "".join(f"\ndef test_f{i}():\n    _where()\n" for i in range(4)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ran = re.findall(r"\[(gw\d+)\].* PASSED (test_\w+)\.py::(test_\w+)(@\w+)?", proc.stdout)
    assert len(ran) == 11, proc.stdout[-3000:]
    workers = {f: {w for w, mod, _, _ in ran if mod == f} for f in ("test_cluster", "test_shared")}
    assert all(len(w) == 1 for w in workers.values()), workers
    groups = {mod: g for _, mod, _, g in ran}
    assert groups["test_cluster"] == "@slurm" and groups["test_shared"] == "@test_shared" and not groups["test_free"]


def test_a_test_that_leaves_ray_initialised_fails_by_name_and_the_next_test_gets_a_clean_process(tmp_path):
    """tests/conftest.py's teardown guard: Ray auto-starts on e.g. ``ray.get_gpu_ids()``, and a test that starts
    it by accident made a later test on its xdist worker fail (``local_ray``: "already initialised"). Ray here
    is a stand-in module with Ray's ``init``/``is_initialized``/``shutdown`` (the guard calls only those): what
    is under test is the guard, not Ray, and a real local Ray would cost this check ten seconds."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_teardown  # noqa: F401\n")
    (tmp_path / "ray.py").write_text(
        "_on = False\n\ndef init():\n    global _on\n    _on = True\n\n"
        "def is_initialized():\n    return _on\n\ndef shutdown():\n    global _on\n    _on = False\n"
    )
    (tmp_path / "test_leak.py").write_text(
        "import ray\n\ndef test_leaks():\n    ray.init()\n\n"
        "def test_clean():\n    pass\n\ndef test_after():\n    assert not ray.is_initialized()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rE", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{TESTS.parent}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "3 passed, 1 error" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "ERROR at teardown of test_leaks" in proc.stdout
    assert "Failed: test_leak.py::test_leaks left Ray initialised in the test process" in proc.stdout
