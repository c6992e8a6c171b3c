"""Spec versions: every shipped slime/v1 example upgrades to the committed slime/v2 file (the golden),
validates, and renders exactly as its v2 file does; comments survive; v1 loads with a notice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launchers import get_launcher
from launchers.base import SubmitOptions
from slime.backends.preview import engine_previews
from slime.cli.upgrade_cmd import upgrade_text
from slime.spec import load_spec, load_spec_text

ROOT = Path(__file__).resolve().parents[2]
V1 = sorted((ROOT / "tests" / "fixtures" / "v1_specs").glob("*.yaml"))


#: examples of what slime/v1 could not express (kind SFTJob, prefill/decode engine groups are new in v2): no v1
#: original to upgrade from
V2_ONLY = {"sft.yaml": "kind: SFTJob", "grpo-pd.yaml": "    pd:"}


def test_every_shipped_example_has_its_v1_original() -> None:
    assert {p.name for p in V1} == {p.name for p in (ROOT / "specs").glob("*.yaml")} - set(V2_ONLY)
    assert all(what in (ROOT / "specs" / name).read_text() for name, what in V2_ONLY.items())


@pytest.mark.parametrize("v1", V1, ids=lambda p: p.stem)
def test_v1_upgrades_to_the_committed_v2_file(v1: Path) -> None:
    new, was = upgrade_text(v1.read_text())
    assert was == "slime/v1"
    assert new == (ROOT / "specs" / v1.name).read_text()


def _rendered(loaded) -> dict:
    dry = get_launcher(loaded.spec.cluster.launcher).dryrun(loaded, SubmitOptions(run_name="golden"))
    out = dry.with_engines(engine_previews(loaded)).to_json()
    out["files"].pop("spec.yaml")  # the file as written: v1 text on one side, v2 on the other
    return out


@pytest.mark.parametrize("v1", V1, ids=lambda p: p.stem)
def test_v1_and_its_v2_file_render_identically(v1: Path) -> None:
    v2 = ROOT / "specs" / v1.name
    old = load_spec_text(v1.read_text(), file=str(v2), base_dir=v2.parent)
    new = load_spec(v2)
    assert old.written_version == "slime/v1" and new.written_version == "slime/v2"
    assert [w.message for w in old.warnings if w.path == "apiVersion"] == [
        "a slime/v1 spec, upgraded to slime/v2 in memory"
    ]
    assert not [w for w in new.warnings if w.path == "apiVersion"]
    assert _rendered(old) == _rendered(new)


def _comments(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"#(.*)$", text, re.M)]


def test_comments_and_order_survive_the_upgrade() -> None:
    text = (ROOT / "tests" / "fixtures" / "v1_specs" / "smoke-slurm.yaml").read_text()
    text = text.replace("  partition: batch", "  partition: batch   # the CI cluster's only partition")
    new, _ = upgrade_text(text)
    assert _comments(text) and _comments(new) == _comments(text)
    assert re.search(r"\n  slurm:\n(    \w+: .*\n)*    partition: batch +# the CI cluster's only partition\n", new)
    assert new.index("cpus_per_node") < new.index("slurm:") < new.index("bootstrap_timeout_s")


def test_v1_overrides_and_sweep_keys_move_with_the_fields() -> None:
    text = (ROOT / "tests" / "fixtures" / "v1_specs" / "sweep.yaml").read_text()
    loaded = load_spec_text(text, base_dir=ROOT / "specs", overrides=["cluster.partition=other"])
    assert loaded.spec.cluster.slurm.partition == "other"
    grid = "sweep:\n  grid:\n    rollout.engine_args.max_running_requests: [4, 8]\n"
    quick = (ROOT / "tests" / "fixtures" / "v1_specs" / "quickstart.yaml").read_text()
    loaded = load_spec_text(quick + grid, base_dir=ROOT / "specs")
    assert [t.spec.rollout.builtin.args for t in loaded.tasks] == [
        {"max_running_requests": 4},
        {"max_running_requests": 8},
    ]


def test_a_current_file_is_left_alone() -> None:
    text = (ROOT / "specs" / "quickstart.yaml").read_text()
    assert upgrade_text(text) == (text, None)
