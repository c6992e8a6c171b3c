"""``slime.runtime.failures.lost_node_error``: a lost peer/node becomes an InfraError naming the host.

Ray's node table is passed in as data (the rows ``ray.nodes()`` returns, with the fields this code
reads): a dead node cannot be produced on one machine in a unit test. The real path — sn2's Ray
SIGKILLed under ``slime.train`` on the SLURM cluster — is
``tests/e2e/test_slurm_preemption.py::test_a_node_lost_during_real_training_...``.
"""

from __future__ import annotations

import ray.exceptions as rex

from slime.core.errors import ExitCode, InfraError
from slime.runtime.failures import classify, lost_node_error, name_lost_nodes

GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[10.77.0.12]:14030. This is typically caused by a remote worker crashing."
)
SN1 = {"NodeManagerHostname": "sn1", "NodeManagerAddress": "10.77.0.11", "Alive": True}
SN2 = {"NodeManagerHostname": "sn2", "NodeManagerAddress": "10.77.0.12", "Alive": True}


def wrapped(cause: BaseException) -> rex.RayTaskError:
    """What the driver gets from ray.get: the remote traceback names the reporting actor's own IP."""
    tb = (
        'ray::TrainerRank.prepare() (pid=1, ip=10.77.0.11, actor_id=ab)\n  File "x.py", line 1, in prepare\n'
        f"RuntimeError: {cause}"
    )
    return rex.RayTaskError("TrainerRank.prepare", tb, cause)


def test_a_collective_error_naming_a_peer_names_that_node_and_not_the_reporter():
    err = lost_node_error(wrapped(RuntimeError(GLOO)), named_wait_s=0, nodes=lambda: [SN1, SN2])
    assert isinstance(err, InfraError) and classify(err) == ExitCode.INFRA
    text = str(err)
    assert text.startswith("lost sn2 (10.77.0.12) during training (a trainer or engine process there died")
    assert "sn1" not in text and "cluster.slurm.exclude: [sn2]" in text and "Connection closed by peer" in text


def test_a_node_ray_marks_dead_is_named_as_dead():
    dead = {**SN2, "Alive": False}
    err = lost_node_error(wrapped(RuntimeError(GLOO)), named_wait_s=5, nodes=lambda: [SN1, dead])
    assert str(err).startswith("lost sn2 (10.77.0.12) during training (Ray marks the node dead")


def test_the_wait_for_ray_to_mark_the_node_dead_ends_once_it_does():
    calls = []

    def table():
        calls.append(1)
        return [SN1, {**SN2, "Alive": len(calls) < 3}]

    err = lost_node_error(wrapped(RuntimeError(GLOO)), named_wait_s=30, nodes=table)
    assert len(calls) == 3 and "Ray marks the node dead" in str(err)


def test_an_unreachable_server_outside_the_cluster_is_not_a_node_loss():
    exc = wrapped(ConnectionError("http://192.0.2.7:8000/reward: cannot connect: Connection refused"))
    assert lost_node_error(exc, named_wait_s=0, wait_s=0, nodes=lambda: [SN1, SN2]) is None


def test_errors_that_are_not_about_a_peer_are_left_alone():
    assert lost_node_error(ValueError("bad label"), nodes=lambda: [SN1, {**SN2, "Alive": False}]) is None
    assert lost_node_error(wrapped(RuntimeError("shape mismatch")), nodes=lambda: [SN1, SN2]) is None


def test_an_unreadable_node_table_still_names_the_ip():
    def broken():
        raise ConnectionError("GCS unreachable")

    err = lost_node_error(wrapped(RuntimeError(GLOO)), named_wait_s=0, nodes=broken)
    assert str(err).startswith("lost 10.77.0.12 during training")


def test_name_lost_nodes_reads_only_the_loss_lines():
    text = "ray::X (ip=10.77.0.11)\nhttp://10.77.0.12:3/generate: cannot connect: [Errno 104] Connection reset by peer"
    assert name_lost_nodes(text, [SN1, SN2]) == ([], ["sn2 (10.77.0.12)"])


def test_the_symptom_is_the_error_message_not_a_source_line_of_the_remote_traceback():
    text = (
        'Traceback (most recent call last):\n  File "client.py", line 180, in _request\n'
        '    raise EngineUnavailable(url, f"cannot connect after {attempts} attempt(s): {last}")\n'
        "slime.backends.rollout.client.EngineUnavailable: http://10.77.0.12:37865/generate: cannot connect "
        "after 1 attempt(s): [Errno 104] Connection reset by peer"
    )
    err = lost_node_error(RuntimeError(text), named_wait_s=0, nodes=lambda: [SN1, SN2])
    assert str(err).startswith("lost sn2 (10.77.0.12)")
    assert "the driver saw: slime.backends.rollout.client.EngineUnavailable: http://10.77.0.12:37865" in str(err)
