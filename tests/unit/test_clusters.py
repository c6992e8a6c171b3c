"""Cluster profiles (``slime.spec.clusters``): files, precedence field by field, errors with file:line,
the partition shapes (a spec asking more GPUs than the partition's nodes have), render and lock.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slime.spec import SpecError, load_spec_text
from slime.spec.clusters import PROJECT_FILE, profile_files
from tests.fixtures.slurm_script import spec_text

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "clusters.yaml"


@pytest.fixture(autouse=True)
def _profiles(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIME_CLUSTERS", str(FIXTURE))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))


def _spec(**cluster) -> str:
    doc = json.loads(spec_text(**cluster))
    for key in [k for k, v in cluster.items() if v is None]:
        del doc["cluster"][key]  # None: leave the field to the profile
    return json.dumps(doc)


def test_spec_wins_then_partition_then_profile_then_defaults_field_by_field():
    loaded = load_spec_text(
        _spec(profile="a100-apptainer", gpus_per_node=None, slurm={"qos": "high", "container": {"workdir": "/mine"}}),
        file="job.yaml",
    )
    c = loaded.spec.cluster
    assert c.slurm.qos == "high"  # the spec's
    assert c.slurm.container.workdir == "/mine" and c.slurm.container.image == "/images/slime.sif"  # merged
    assert c.gpus_per_node == 4 and c.cpus_per_node == 64  # partition a100's
    assert c.slurm.account == "proj-42" and c.network_interface == "ib0"  # the profile's
    assert c.slurm.max_requeues == 5  # the default
    src = loaded.site.sources
    assert src["cluster.slurm.qos"].startswith("spec (job.yaml:")
    assert src["cluster.gpus_per_node"].startswith(f"partition a100 of profile a100-apptainer ({FIXTURE}:")
    assert src["cluster.slurm.account"] == f"profile a100-apptainer ({FIXTURE}:14:9)"
    fields = {p: s for p, _, s in loaded.site.fields(loaded.spec)}
    assert fields["cluster.slurm.max_requeues"] == "default"


def test_the_partition_picked_by_the_spec_gives_its_shape():
    loaded = load_spec_text(
        _spec(profile="a100-apptainer", nodes=1, gpus_per_node=None, slurm={"partition": "a100-big"})
    )
    assert loaded.spec.cluster.gpus_per_node == 8 and loaded.spec.cluster.gpu.name == "A100-80GB"


def test_more_gpus_per_node_than_the_partition_has_is_refused_naming_both_places():
    """slime's bug class: 8 GPUs per node assumed on a 4-GPU partition."""
    with pytest.raises(SpecError) as err:
        load_spec_text(_spec(profile="a100-apptainer", gpus_per_node=8), file="job.yaml")
    (p,) = [p for p in err.value.problems if p.path == "cluster.gpus_per_node"]
    assert "partition 'a100' of cluster profile 'a100-apptainer' has 4 per node" in p.message
    assert f"{FIXTURE}:" in p.message and str(p.origin).startswith("job.yaml:")
    assert "lower cluster.gpus_per_node to at most 4" in p.hint


def test_unknown_profile_lists_the_known_ones_at_the_spec_line():
    with pytest.raises(SpecError) as err:
        load_spec_text(_spec(profile="a100"), file="job.yaml")
    (p,) = err.value.problems
    assert p.path == "cluster.profile" and "a100-apptainer, h100-pyxis, plain" in p.message
    assert str(p.origin).startswith("job.yaml:")


@pytest.mark.parametrize(
    "body, path, line",
    [
        (
            "clusters:\n  x:\n    cluster:\n      slurm:\n        gpu_request: gpus\n",
            "clusters.x.cluster.slurm.gpu_request",
            5,
        ),
        ("clusters:\n  x:\n    cluster:\n      nodez: 1\n", "clusters.x.cluster", 3),
        (
            "clusters:\n  x:\n    partitions:\n      p: {gpus_per_node: -1}\n",
            "clusters.x.partitions.p.gpus_per_node",
            4,
        ),
        ("clusters:\n  x:\n    cluster: {profile: y}\n", "clusters.x.cluster.profile", 3),
        ("clusters:\n  Bad_Name: {}\n", "clusters.Bad_Name", 2),
    ],
)
def test_a_bad_profile_file_is_a_spec_error_at_its_file_and_line(tmp_path, monkeypatch, body, path, line):
    f = tmp_path / "clusters.yaml"
    f.write_text(body)
    monkeypatch.setenv("SLIME_CLUSTERS", str(f))
    with pytest.raises(SpecError) as err:
        load_spec_text(_spec(profile="x"))
    (p,) = err.value.problems
    assert p.path.startswith(path) and p.origin.file == str(f) and p.origin.line == line, p.format()


def test_files_project_then_user_and_an_earlier_name_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("SLIME_CLUSTERS")
    user = tmp_path / "cfg" / "slime-submit" / "clusters.yaml"
    user.parent.mkdir(parents=True)
    user.write_text("clusters:\n  s: {cluster: {slurm: {partition: user}}}\n  u: {}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    proj = tmp_path / "proj"
    (proj / "specs").mkdir(parents=True)
    (proj / PROJECT_FILE).write_text("clusters:\n  s: {cluster: {slurm: {partition: project}}}\n")
    assert profile_files(proj / "specs") == [proj / PROJECT_FILE, user]
    loaded = load_spec_text(_spec(profile="s"), base_dir=proj / "specs")
    assert loaded.spec.cluster.slurm.partition == "project"


def test_missing_slime_clusters_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIME_CLUSTERS", str(tmp_path / "nope.yaml"))
    with pytest.raises(SpecError) as err:
        load_spec_text(_spec(profile="x"))
    assert "nope.yaml" in str(err.value.problems[0].origin) and "SLIME_CLUSTERS" in err.value.problems[0].hint


def _cli(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_render_shows_each_field_and_its_source_and_the_lock_records_the_profile(tmp_path, monkeypatch):
    import os

    from launchers.base import SubmitOptions
    from launchers.slurm.launcher import SlurmLauncher
    from slime.provenance import build_lock

    spec = tmp_path / "job.yaml"
    spec.write_text(_spec(profile=None, slurm={"qos": "high"}))
    env = {**os.environ, "SLIME_CLUSTERS": str(FIXTURE), "XDG_CONFIG_HOME": str(tmp_path / "no")}
    proc = _cli("render", str(spec), "--cluster", "a100-apptainer", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = {ln.split()[1]: ln for ln in proc.stdout.splitlines() if ln.startswith("# cluster.")}
    assert lines["cluster.slurm.qos"].split()[2:4] == ['"high"', "spec"]
    assert '"a100"' in lines["cluster.slurm.gpu_type"] and "profile a100-apptainer" in lines["cluster.slurm.gpu_type"]
    assert lines["cluster.slurm.max_failures"].endswith("default")
    assert "#SBATCH --gres=gpu:a100:2" in proc.stdout and "module load cuda/12.4" in proc.stdout
    as_json = json.loads(
        _cli("render", str(spec), "--cluster", "a100-apptainer", "--json", env=env, cwd=tmp_path).stdout
    )
    assert as_json["cluster_profile"]["fields"]["cluster.slurm.qos"]["from"].startswith("spec (")

    image = tmp_path / "slime.sif"
    image.write_bytes(b"sif image bytes")
    loaded = load_spec_text(
        _spec(slurm={"container": {"runtime": "apptainer", "image": str(image)}}),
        overrides=["cluster.profile=a100-apptainer"],
        file=str(spec),
    )
    dry = SlurmLauncher().dryrun(loaded, SubmitOptions(run_name="r"))
    lock = build_lock(dry.request, dry.options)
    prof = lock["cluster_profile"]
    assert prof["name"] == "a100-apptainer" and prof["file"] == str(FIXTURE)
    assert prof["profile"]["partitions"]["a100"]["gpus_per_node"] == 4  # a rerun needs no profile file
    assert prof["fields"]["cluster.slurm.gpu_type"] == {
        "value": "a100",
        "from": f"profile a100-apptainer ({FIXTURE}:19:9)",
    }
    import hashlib

    assert lock["container"]["file_sha256"] == hashlib.sha256(b"sif image bytes").hexdigest()
    assert lock["spec"]["overrides"] == ["cluster.profile=a100-apptainer"]


def test_image_identity_pins_digests_and_files_and_says_when_a_tag_pins_nothing(tmp_path):
    from slime.provenance import image_identity

    assert image_identity("nvcr.io/nvidia/pytorch@sha256:abc")["digest"] == "sha256:abc"
    assert image_identity("nvcr.io#nvidia/pytorch:25.01-py3")["pinned"] is False


def test_a_spec_that_picks_another_launcher_keeps_the_profiles_generic_settings():
    doc = json.loads(_spec(profile="a100-apptainer", nodes=1, gpus_per_node=0))
    doc["cluster"]["launcher"] = "local"
    loaded = load_spec_text(json.dumps(doc))
    assert loaded.spec.cluster.slurm is None and loaded.spec.cluster.env == {"NCCL_IB_HCA": "mlx5"}


def test_clusters_list_and_show_tables(tmp_path):
    import os

    env = {**os.environ, "SLIME_CLUSTERS": str(FIXTURE), "XDG_CONFIG_HOME": str(tmp_path / "no")}
    listed = _cli("clusters", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)["profiles"]}
    assert rows["a100-apptainer"]["partitions"] == "a100, a100-big" and rows["plain"]["partition"] == "gpu"
    shown = _cli("clusters", "show", "a100-apptainer", env=env, cwd=tmp_path)
    assert shown.returncode == 0 and "cluster.slurm.gpu_type" in shown.stdout and "a100-big" in shown.stdout
    missing = _cli("clusters", "show", "nope", env=env, cwd=tmp_path)
    assert missing.returncode == 2 and "unknown cluster profile 'nope'" in missing.stderr


def test_a_hostile_profile_name_is_refused_by_its_pattern():
    with pytest.raises(SpecError) as err:
        load_spec_text(_spec(profile="ci; touch x"))
    assert err.value.problems[0].path == "cluster.profile"


def test_a_rerun_needs_no_profile_file_and_keeps_the_record(tmp_path, monkeypatch):
    from launchers.base import SubmitOptions, create_run_dir
    from launchers.slurm.launcher import SlurmLauncher
    from slime import provenance

    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(FIXTURE.read_text())
    monkeypatch.setenv("SLIME_CLUSTERS", str(profiles))
    loaded = load_spec_text(_spec(profile="h100-pyxis", gpus_per_node=4, logdir=str(tmp_path / "runs")))
    dry = SlurmLauncher().dryrun(loaded, SubmitOptions(run_name="p1"))
    paths = create_run_dir(dry.request)
    provenance.write_lock(paths, dry.request, dry.options)
    profiles.unlink()  # the site's file is gone (or changed) by the time of the rerun
    lock = provenance.read_lock(paths.root)
    again = SlurmLauncher().dryrun(provenance.loaded_from_run(paths, lock), SubmitOptions(run_name="p2")).request
    assert again.spec.cluster.slurm.partition == "h100" and "--container-image=" in again.file("job.sbatch")
    relock = provenance.build_lock(again, SubmitOptions())
    assert json.loads(json.dumps(relock["cluster_profile"]["fields"])) == lock["cluster_profile"]["fields"]
