"""``slime.patches`` against the real pinned megatron-core artifact from the package index.

The shipped patch set is empty (nothing upstream needs changing yet), so the
first test checks exactly that: 0 patches, artifact fetched and its SHA-256
verified against ``patches/pins.toml``. The others use a temporary patches
directory with a patch generated from the real wheel's source (one that applies
and one that does not) to exercise check/apply/record end to end.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from slime import patches

ROOT = Path(__file__).resolve().parents[2]
TARGET_FILE = "megatron/core/package_info.py"


def test_shipped_pins_check_cleanly_with_zero_patches():
    result = patches.check("megatron-core")
    assert result.version == "0.16.1" and result.ok and result.patches == []
    assert result.sha256 == patches.load_pins()["megatron-core"].sha256[result.artifact]
    assert result.summary().startswith("megatron-core 0.16.1: 0 patches, pinned ")
    assert "fetched + verified" in result.summary()


@pytest.fixture(scope="module")
def wheel_source(tmp_path_factory) -> tuple[Path, str]:
    """The pinned wheel (verified) and the text of one of its files."""
    dest = tmp_path_factory.mktemp("wheel")
    artifact, _ = patches.fetch(patches.load_pins()["megatron-core"], dest)
    with zipfile.ZipFile(artifact) as z:
        return artifact, z.read(TARGET_FILE).decode()


def _patch_dir(tmp_path: Path, original: str, *, applies: bool) -> Path:
    root = tmp_path / "patches"
    (root / "megatron-core" / "0.16.1").mkdir(parents=True)
    shutil.copyfile(ROOT / "patches" / "pins.toml", root / "pins.toml")
    # A patch made against a different upstream text (MINOR changed) must not apply.
    base = original if applies else original.replace("MINOR = 16", "MINOR = 99")
    changed = base.replace("MAJOR = ", "# slime: test patch\nMAJOR = ", 1)
    diff = "".join(
        difflib.unified_diff(base.splitlines(True), changed.splitlines(True), f"a/{TARGET_FILE}", f"b/{TARGET_FILE}")
    )
    assert diff
    (root / "megatron-core" / "0.16.1" / "0001-test.patch").write_text(diff)
    return root


def test_check_reports_patches_that_apply_and_that_do_not(tmp_path, wheel_source):
    _, original = wheel_source
    good = patches.check("megatron-core", root=_patch_dir(tmp_path / "good", original, applies=True))
    assert good.ok and [p["name"] for p in good.patches] == ["0001-test.patch"]
    assert "1 patch, all apply cleanly" in good.summary()
    bad = patches.check("megatron-core", root=_patch_dir(tmp_path / "bad", original, applies=False))
    assert not bad.ok and "package_info.py" in bad.patches[0]["output"]
    assert "FAILED: 0001-test.patch" in bad.summary()


def test_apply_patches_a_target_once_and_records_it(tmp_path, wheel_source, monkeypatch):
    artifact, original = wheel_source
    target = tmp_path / "site-packages"
    with zipfile.ZipFile(artifact) as z:
        z.extractall(target)
    root = _patch_dir(tmp_path, original, applies=True)
    records = patches.apply("megatron-core", target=target, root=root)
    assert [r["patch"] for r in records] == ["0001-test.patch"] and len(records[0]["sha256"]) == 64
    assert "# slime: test patch" in (target / TARGET_FILE).read_text()
    assert patches.apply("megatron-core", target=target, root=root) == records  # idempotent: not re-applied
    assert (target / TARGET_FILE).read_text().count("# slime: test patch") == 1
    # provenance reads the record next to the installed package (the target stands in for site-packages)
    monkeypatch.setattr(patches, "_installed_root", lambda pin: target)
    assert [r["patch"] for r in patches.applied_patches(root) if r["engine"] == "megatron-core"] == ["0001-test.patch"]


def test_apply_refuses_a_patch_that_does_not_fit(tmp_path, wheel_source):
    artifact, original = wheel_source
    target = tmp_path / "site-packages"
    with zipfile.ZipFile(artifact) as z:
        z.extractall(target)
    with pytest.raises(patches.PatchError, match="0001-test.patch does not apply"):
        patches.apply("megatron-core", target=target, root=_patch_dir(tmp_path, original, applies=False))
    assert (target / TARGET_FILE).read_text() == original
    assert not (target / ".slime-patches-megatron-core.json").exists()


def test_a_tampered_pin_is_refused(tmp_path):
    root = tmp_path / "patches"
    root.mkdir()
    text = (ROOT / "patches" / "pins.toml").read_text()
    (root / "pins.toml").write_text(text.replace("38f6bef63cd4ebc4", "0000000000000000"))
    with pytest.raises(patches.PatchError, match="does not match the pin"):
        patches.check("megatron-core", root=root)


def test_cli_check_and_usage_errors():
    cli = [sys.executable, "-m", "slime.cli.main", "patches"]
    proc = subprocess.run(
        [*cli, "check", "--engine", "megatron-core", "--json"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out[0]["engine"] == "megatron-core" and out[0]["ok"] is True and out[0]["patches"] == []
    proc = subprocess.run(
        [*cli, "check", "--engine", "megatron-core", "--version", "0.15.0"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2 and "pinned to 0.16.1, not 0.15.0" in proc.stderr


def test_cli_apply_without_the_engine_installed_says_what_to_install():
    """sglang is GPU-only and never installed here: apply must say so, not crash."""
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "patches", "apply", "--engine", "sglang"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "sglang is not installed here; install sglang==" in proc.stderr
