"""``clusters check`` for SLURM (``launchers.slurm.sitecheck``) against recorded ``scontrol`` answers.

``scontrol`` is a stand-in on PATH (a process boundary: no slurmctld in a unit test) that prints
partition and node records in SLURM 22.05's ``-o`` format; tests/e2e/test_slurm_sites.py runs the
same check against the real local cluster.
"""

from __future__ import annotations

import pytest

from launchers.slurm.sitecheck import check_site
from slime.spec.clusters import load_profiles
from tests.fixtures.fake_slurm import FakeSlurm

PARTITIONS = (
    "PartitionName=a100 Default=YES MaxTime=1-00:00:00 Nodes=g[1-2] State=UP\n"
    "PartitionName=a100-big MaxTime=UNLIMITED Nodes=h1 State=UP"
)
NODES = (
    "NodeName=g1 CPUTot=64 RealMemory=500000 Gres=gpu:a100:4(S:0-1) State=IDLE Partitions=a100\n"
    "NodeName=g2 CPUTot=32 RealMemory=500000 Gres=gpu:a100:4(S:0-1) State=IDLE Partitions=a100\n"
    "NodeName=h1 CPUTot=128 RealMemory=900000 Gres=gpu:h100:8 State=IDLE Partitions=a100-big"
)
SCONTROL = f"""#!/bin/bash
case "$2" in
partition) printf '%s\\n' '{PARTITIONS}' ;;
node) printf '%s\\n' '{NODES}' ;;
esac
"""


@pytest.fixture
def profile(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path)
    fake.add("scontrol", SCONTROL)
    fake.activate(monkeypatch)

    def make(text: str):
        path = tmp_path / "clusters.yaml"
        path.write_text(text)
        return load_profiles([path])["s"]

    return make


def _bad(rows) -> dict[str, str]:
    return {r.field: r.have for r in rows if not r.ok}


def test_a_matching_profile_passes_every_check(profile):
    site = profile(
        "clusters:\n  s:\n    cluster:\n      launcher: slurm\n      gpus_per_node: 4\n"
        "      slurm: {partition: a100, gpu_type: a100, time_limit: '12:00:00'}\n"
        "    partitions:\n      a100: {gpus_per_node: 4, cpus_per_node: 32}\n"
    )
    rows = check_site(site)
    assert all(r.ok for r in rows) and {r.check for r in rows} >= {"partition exists", "GRES type of a100"}


def test_each_mismatch_names_its_profile_field_and_line(profile):
    site = profile(
        "clusters:\n  s:\n    cluster:\n      launcher: slurm\n      gpus_per_node: 4\n"
        "      slurm: {partition: a100, gpu_type: h100, time_limit: '2-00:00:00'}\n"
        "    partitions:\n      a100: {gpus_per_node: 4, cpus_per_node: 64}\n      a100-big: {gpus_per_node: 16}\n"
        "      gone: {gpus_per_node: 1}\n"
    )
    rows = check_site(site)
    bad = _bad(rows)
    assert set(bad) == {
        "clusters.s.cluster.slurm.gpu_type",  # a100 nodes have a100 GRES, and a100-big's have h100
        "clusters.s.partitions.a100.cpus_per_node",
        "clusters.s.partitions.a100-big.gpus_per_node",
        "clusters.s.partitions.gone",
        "clusters.s.cluster.slurm.time_limit",
    }
    assert bad["clusters.s.partitions.a100.cpus_per_node"] == "g1: 64, g2: 32"
    assert bad["clusters.s.cluster.slurm.time_limit"] == "MaxTime=1-00:00:00"
    assert "partitions: a100, a100-big" in bad["clusters.s.partitions.gone"]
    at = {r.field: r.at for r in rows}
    assert at["clusters.s.partitions.a100-big.gpus_per_node"].endswith(":9:18")


def test_without_a_partition_the_default_one_is_checked(profile):
    site = profile("clusters:\n  s:\n    cluster:\n      launcher: slurm\n      gpus_per_node: 8\n")
    (wrong,) = [r for r in check_site(site) if not r.ok]
    assert wrong.field == "clusters.s.cluster.gpus_per_node" and wrong.have == "g1: 4, g2: 4"
