"""Reading SLURM's answers (pure parts): records, GRES, memory, and the submit-time fit check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchers.slurm.cluster import NodeInfo, check_fits, gres_gpus, mem_mb, parse_record
from slime.core.errors import InfraError
from slime.spec import load_spec_text


def _spec(**cluster):
    doc = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "fit",
        "cluster": {"launcher": "slurm", "nodes": 2, "gpus_per_node": 2, **cluster},
        "model": {"builtin": "tiny"},
        "train": {"gpus_per_node": cluster.get("gpus_per_node", 2)},
        "rollout": {
            "colocate": True,
            "num_rollouts": 1,
            "max_prompt_len": 16,
            "max_response_len": 8,
            "batch_size": 4,
            "n_samples_per_prompt": 2,
        },
        "data": {"prompts": "/p.jsonl"},
    }
    return load_spec_text(json.dumps(doc), base_dir=Path("/")).spec


NODES = [
    NodeInfo(name="sn1", gpus=2, cpus=4, mem_mb=8000, state="IDLE", gres="gpu:2"),
    NodeInfo(name="sn2", gpus=2, cpus=4, mem_mb=8000, state="IDLE", gres="gpu:2"),
]


def test_parse_record_keeps_values_with_spaces():
    rec = parse_record("JobId=14 JobName=a b Account=x y'z Comment=hi #1 JobState=RUNNING")
    assert rec == {"JobId": "14", "JobName": "a b", "Account": "x y'z", "Comment": "hi #1", "JobState": "RUNNING"}


@pytest.mark.parametrize(
    "gres,n",
    [
        ("gpu:2", 2),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a:2,gpu:b:1", 3),
        ("(null)", 0),
        ("", 0),
        ("gpu:h100:8(S:0-1),mps:100", 8),
    ],
)
def test_gres_gpu_counts(gres, n):
    assert gres_gpus(gres) == n


def test_memory_units():
    assert (mem_mb("2G"), mem_mb("500M"), mem_mb("1T"), mem_mb("2048"), mem_mb("2048K")) == (
        2048,
        500,
        1048576,
        2048,
        2,
    )


def test_a_request_that_fits_passes():
    check_fits(_spec(cpus_per_node=4, slurm={"mem": "2G"}), NODES, "batch")


def test_more_gpus_per_node_than_any_node_has_names_the_gres_constraint():
    with pytest.raises(InfraError) as err:
        check_fits(_spec(gpus_per_node=4), NODES, "batch")
    msg = str(err.value)
    assert "cluster.gpus_per_node=4" in msg and "gres gpu:4" in msg and "'batch'" in msg
    assert "sn1 (gpu:2" in msg and "at most 2" in msg


def test_too_many_cpus_memory_or_nodes_are_named():
    with pytest.raises(InfraError, match="cluster.cpus_per_node=8.*at most 4"):
        check_fits(_spec(cpus_per_node=8), NODES, "batch")
    with pytest.raises(InfraError, match="cluster.slurm.mem=16G.*at most 8000M"):
        check_fits(_spec(slurm={"mem": "16G"}), NODES, "batch")
    with pytest.raises(InfraError, match=r"cluster.nodes=2: partition 'batch' has only 1 node.*excluded: sn2"):
        check_fits(_spec(slurm={"exclude": ["sn2"]}), NODES, "batch")


def test_an_exclude_host_list_is_expanded_as_sbatch_would(slurm_cluster):
    """`sn[2-2]` is the same exclusion as `sn2` (the spec's hint suggests host lists like gpu[03-05]).
    scontrol expands host lists only with a readable slurm.conf: the cluster fixture provides one (a
    collection-time skipif would find none on CI, where the cluster starts later, and always skip)."""
    with pytest.raises(InfraError, match=r"cluster.nodes=2: partition 'batch' has only 1 node.*excluded: sn2"):
        check_fits(_spec(slurm={"exclude": ["sn[2-2]"]}), NODES, "batch")
    check_fits(_spec(slurm={"exclude": ["gpu[03-05]"]}), NODES, "batch")  # names no node of the partition: fits
