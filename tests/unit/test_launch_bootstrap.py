"""Bootstrap helpers without Ray: port blocks, node context and addresses, rendezvous files,
process sweeping by marker, and the ``ray start`` command line.

Real sockets, real subprocesses; the SLURM step environment is given as the variables SLURM sets
(no step can be launched in a unit test).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launchers.node.bootstrap import main as bootstrap_main
from launchers.node.bootstrap import object_store_bytes
from launchers.node.context import (
    NodeContext,
    detect_node,
    head_ip,
    interface_ipv4,
    interfaces,
    resolve_ipv4,
    route_source,
    worker_ip,
)
from launchers.node.rayproc import MARKER_ENV, RayNode, pids_using, prune_stale, ray_env, temp_dir_for
from slime.core.auth import new_secret
from slime.core.errors import ExitCode, InfraError
from slime.core.paths import TaskPaths
from slime.core.ports import (
    BLOCK,
    PortBlock,
    PortsExhausted,
    candidates,
    choose_block,
    claim_block,
    port_free,
    port_range,
)
from slime.core.rendezvous import HEAD_READS_PER_S, Rendezvous, head_poll_s
from slime.spec import load_spec_text


def _spec(**cluster):
    doc = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "boot",
        "cluster": {"launcher": "slurm", "nodes": 2, "gpus_per_node": 0, **cluster},
        "model": {"builtin": "tiny"},
        "rollout": {
            "num_rollouts": 1,
            "max_prompt_len": 16,
            "max_response_len": 8,
            "batch_size": 4,
            "n_samples_per_prompt": 2,
        },
        "data": {"prompts": "/p.jsonl"},
    }
    return load_spec_text(json.dumps(doc), base_dir=Path("/")).spec


# --------------------------------------------------------------------------- ports
def test_port_blocks_are_deterministic_in_range_and_differ_between_jobs():
    low, high = port_range()
    assert (low, high) == (20000, 32000) or "SLIME_RAY_PORT_RANGE" in os.environ
    a, b = next(candidates("123-0", (20000, 32000))), next(candidates("124-0", (20000, 32000)))
    assert a == next(candidates("123-0", (20000, 32000)))
    firsts = {next(candidates(f"{j}-0", (20000, 32000))).base for j in range(1000, 1040)}
    assert len(firsts) > 20  # spread over the 60 blocks
    for blk in (a, b):
        assert blk.base >= 20000 and blk.base + BLOCK <= 32000 and (blk.base - 20000) % BLOCK == 0
    fixed = [
        a.gcs,
        a.node_manager,
        a.object_manager,
        a.dashboard_agent_grpc,
        a.dashboard_agent_listen,
        a.metrics_export,
        a.runtime_env_agent,
        a.dashboard,
        a.client_server,
        a.gloo,
        a.nccl,
    ]
    assert len(set(fixed)) == len(fixed) and max(fixed) < a.min_worker < a.max_worker == a.base + BLOCK - 1
    all_blocks = list(candidates("x", (20000, 32000)))
    assert len({blk.base for blk in all_blocks}) == len(all_blocks) == 60


def test_a_taken_port_moves_the_job_to_the_next_block():
    rng = (40000, 40000 + 3 * BLOCK)
    first = next(candidates("job-7", rng))
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        assert not port_free(s.getsockname()[1])  # the real check: a bound port is taken
    taken = first.base + 57  # one worker port of the derived block (a pure predicate: other tests use ports too)
    chosen = choose_block("job-7", low_high=rng, is_free=lambda p: p != taken)
    assert chosen != first and chosen == list(candidates("job-7", rng))[1]
    with pytest.raises(PortsExhausted, match="SLIME_RAY_PORT_RANGE"):
        choose_block("job-7", low_high=rng, is_free=lambda p: False)


def test_two_bootstraps_with_colliding_keys_never_claim_the_same_block(tmp_path):
    """Two jobs whose keys hash to the same block, starting together, must still get different blocks."""
    rng = (40000, 40000 + 4 * BLOCK)
    claims = tmp_path / "ports"
    free = lambda p: True  # noqa: E731 - claims are what is tested here, not sockets
    a = claim_block("job-1", host="sn1", directory=claims, low_high=rng, is_free=free)
    b = claim_block("job-1", host="sn1", directory=claims, low_high=rng, is_free=free)  # same first candidate
    assert a.block != b.block and a.path.exists() and b.path.exists()
    c = claim_block("job-1", host="sn2", directory=claims, low_high=rng, is_free=free)  # claims are per host
    assert c.block == a.block
    a.release()
    assert not a.path.exists()
    assert claim_block("job-1", host="sn1", directory=claims, low_high=rng, is_free=free).block == a.block
    # A claim left by a dead process is stale and taken over.
    dead = claims / f"sn3-{a.block.base}"
    dead.write_text(json.dumps({"pid": 2**22 + 12345, "key": "gone"}))
    assert claim_block("job-1", host="sn3", directory=claims, low_high=rng, is_free=free).block == a.block
    assert json.loads(dead.read_text())["pid"] == os.getpid()


def test_no_free_block_names_each_block_and_the_port_in_use(tmp_path):
    rng = (40000, 40000 + 2 * BLOCK)
    bases = sorted(b.base for b in candidates("job-9", rng))
    with pytest.raises(PortsExhausted) as err:
        claim_block(
            "job-9",
            host="sn1",
            directory=tmp_path / "ports",
            low_high=rng,
            is_free=lambda p: p not in {bases[0] + 5, bases[1] + 7},
        )
    text = str(err.value)
    assert f"{bases[0]}: port {bases[0] + 5} in use" in text and f"{bases[1]}: port {bases[1] + 7} in use" in text
    assert "on sn1" in text and "SLIME_RAY_PORT_RANGE" in text


def test_port_range_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLIME_RAY_PORT_RANGE", "41000-42000")
    assert port_range() == (41000, 42000)
    monkeypatch.setenv("SLIME_RAY_PORT_RANGE", "80-100")
    with pytest.raises(ValueError, match="SLIME_RAY_PORT_RANGE"):
        port_range()


# --------------------------------------------------------------------------- node context, addresses
def test_node_context_from_the_slurm_step_environment(monkeypatch):
    for k, v in {
        "SLURM_JOB_ID": "4242",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "gpu[07-08],cpu3",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_ON_NODE": "16",
        "SLURM_MEM_PER_NODE": "10000",
        "SLURM_RESTART_COUNT": "2",
        "SLURM_NTASKS": "3",
    }.items():
        monkeypatch.setenv(k, v)
    ctx = detect_node(5, _spec())
    assert (ctx.rank, ctx.num_nodes, ctx.hostnames) == (1, 3, ("gpu07", "gpu08", "cpu3"))
    assert (ctx.job_id, ctx.restart, ctx.gpus, ctx.cpus, ctx.mem_mb) == ("4242", 2, 4, 16, 10000)
    assert ctx.in_slurm and ctx.head_host == "gpu07" and ctx.key == "4242-5" and ctx.instance == "4242.2"
    assert object_store_bytes(ctx) == 3000 << 20
    local = detect_node(0, _spec(cpus_per_node=3), local=True)  # --local ignores SLURM variables
    assert (local.rank, local.num_nodes, local.in_slurm, local.cpus) == (0, 1, False, 3)
    assert local.job_id == f"local{os.getpid()}"
    # the spec's launcher owns the node environment: a local-launcher job inside an allocation is not a step
    mine = detect_node(0, _spec(launcher="local", nodes=1, cpus_per_node=3))
    assert (mine.rank, mine.num_nodes, mine.in_slurm, mine.cpus) == (0, 1, False, 3)
    monkeypatch.delenv("SLURM_NODEID")  # a slurm spec outside a job step: the single local node
    outside = detect_node(0, _spec(cpus_per_node=3))
    assert (outside.rank, outside.num_nodes, outside.in_slurm, outside.cpus) == (0, 1, False, 3)


def test_addresses_come_from_routes_and_interfaces_without_public_probes():
    assert interface_ipv4("lo") == "127.0.0.1"
    assert interface_ipv4("no-such-if0") is None
    assert ("lo", "127.0.0.1") in interfaces()
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert "127.0.0.1" in resolve_ipv4("localhost") and resolve_ipv4("no-such-host.invalid") == []
    ctx = NodeContext(task=0, rank=0, num_nodes=1, hostnames=("h",), hostname="h", job_id="1")
    assert head_ip(ctx, _spec(network_interface="lo")) == "127.0.0.1"
    with pytest.raises(InfraError, match="cluster.network_interface 'nope0'.*interfaces here: lo"):
        head_ip(ctx, _spec(network_interface="nope0"))
    # A worker takes the local address on its route to the head; loopback cannot reach other nodes.
    with pytest.raises(InfraError, match="no route to the Ray head"):
        worker_ip(ctx, _spec(), "127.0.0.1")
    non_lo = [ip for name, ip in interfaces() if name != "lo"]
    if non_lo:
        assert worker_ip(ctx, _spec(), non_lo[0]) == non_lo[0]
    two = NodeContext(task=0, rank=0, num_nodes=2, hostnames=("h", "no-such-host.invalid"), hostname="h", job_id="1")
    with pytest.raises(InfraError, match="cluster.network_interface"):
        head_ip(two, _spec())


# --------------------------------------------------------------------------- rendezvous
def test_rendezvous_files_are_per_instance_and_stale_ones_are_cleared(tmp_path):
    old = Rendezvous(tmp_path, "77.0")
    old.publish_head(ip="10.0.0.1", port=1)
    old.mark_done(0)
    new = Rendezvous(tmp_path, "77.1")  # the same job after a requeue
    assert new.head() is None and not new.done()
    new.write_node(1, host="n2", state="failed", error="boom")
    new.clean_stale()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-77.1-1.json"]
    stop = threading.Event()
    threading.Timer(0.3, lambda: new.publish_head(ip="10.0.0.2", port=20000)).start()
    head = new.wait_head(time.monotonic() + 10, stop)
    assert head["ip"] == "10.0.0.2" and head["port"] == 20000 and head["instance"] == "77.1"
    assert new.nodes(3) == {1: new.node(1)} and new.node(1)["error"] == "boom"
    t = time.monotonic()
    assert Rendezvous(tmp_path, "78.0").wait_head(time.monotonic() + 0.3, stop) is None
    assert time.monotonic() - t < 2


def test_waiting_nodes_read_the_head_record_at_a_bounded_total_rate(tmp_path):
    """Up to 100 nodes poll every 0.1 s; past that, all nodes together read at most HEAD_READS_PER_S times a second."""
    assert [head_poll_s(n) for n in (1, 2, 100)] == [0.1, 0.1, 0.1]
    for n in (101, 250, 1000, 4096):
        assert n / head_poll_s(n) <= HEAD_READS_PER_S + 1e-9 and head_poll_s(n) > 0.1
    reads = []

    class Counting(Rendezvous):
        def head(self):
            reads.append(time.monotonic())
            return super().head()

    rdv, stop = Counting(tmp_path, "9.0"), threading.Event()
    assert rdv.wait_head(time.monotonic() + 1.0, stop, poll=head_poll_s(500)) is None
    assert 2 <= len(reads) <= 3  # a 0.5 s poll: about two reads in a second, not ten


# --------------------------------------------------------------------------- Ray processes
def test_ray_environment_and_temp_dir(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    env = ray_env()
    assert "RAY_ADDRESS" not in env and env["RAY_AUTH_MODE"] == "disabled"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0" and env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # an explicit choice is kept
    assert ray_env()["RAY_AUTH_MODE"] == "token"
    # The run's workers inherit the quiet/offline variables from the raylet (no per-worker runtime_env
    # setup process); a value the user set is kept.
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["TRANSFORMERS_VERBOSITY"] == "error"
    assert env["RAY_prestart_worker_first_driver"] == "0"  # no idle workers for the preflight's job
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert ray_env()["HF_HUB_OFFLINE"] == "0"
    path = temp_dir_for("123456789-12", 3)
    assert str(path) == "/tmp/slime-ray/123456789-12-3" or os.environ.get("SLIME_RAY_TMPDIR")
    # Ray's unix sockets live in <temp>/session_<date>_<time>_<pid>/sockets/plasma_store: < 107 chars.
    assert len(f"{path}/session_2026-11-30_01-00-00_123456_1234567/sockets/plasma_store") < 107


def test_ray_start_command_pins_every_port_and_resource(tmp_path, monkeypatch):
    monkeypatch.delenv("SLIME_RAY_LOG_TO_DRIVER", raising=False)
    node = RayNode(tmp_path / "t")
    blk = PortBlock(24000)
    head = node.command(
        head=True,
        ip="10.0.0.1",
        ports=blk,
        num_cpus=4,
        num_gpus=2,
        resources={"slime_node_0": 1.0},
        object_store_bytes=100 << 20,
    )
    for flag in (
        "--head",
        "--block",
        "--port=24000",
        "--node-manager-port=24001",
        "--object-manager-port=24002",
        "--min-worker-port=24012",
        "--max-worker-port=24199",
        "--node-ip-address=10.0.0.1",
        "--num-cpus=4",
        "--num-gpus=2",
        '--resources={"slime_node_0": 1.0}',
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={tmp_path / 't'}",
        f"--object-store-memory={100 << 20}",
        "--dashboard-agent-grpc-port=24003",
        "--dashboard-agent-listen-port=24004",
        "--dashboard-port=24007",
        "--metrics-export-port=24005",
        "--runtime-env-agent-port=24006",
        "--include-log-monitor=false",
        "--no-monitor",  # no autoscaler: the allocation is fixed
    ):
        assert flag in head, flag
    worker_kw = dict(
        head=False,
        ip="10.0.0.2",
        ports=blk,
        num_cpus=1,
        num_gpus=0,
        resources={"slime_node_1": 1.0},
        head_address="10.0.0.1:24000",
    )
    worker = node.command(**worker_kw)
    assert "--address=10.0.0.1:24000" in worker and "--head" not in worker and "--include-log-monitor=false" in worker
    assert not any(f.startswith(("--include-dashboard", "--port=", "--ray-client", "--no-monitor")) for f in worker)
    with pytest.raises(ValueError):
        node.command(head=False, ip="x", ports=blk, num_cpus=1, num_gpus=0, resources={})
    # Worker output streamed to the driver needs Ray's log monitor: kept when it is asked for.
    monkeypatch.setenv("SLIME_RAY_LOG_TO_DRIVER", "1")
    assert not any(f.startswith("--include-log-monitor") for f in node.command(**worker_kw))
    # `ray status` reads what the autoscaler's monitor reports: kept when asked for.
    monkeypatch.setenv("SLIME_RAY_MONITOR", "1")
    assert "--no-monitor" not in node.command(**{**worker_kw, "head": True, "head_address": None})


def test_stop_ends_the_started_process_and_every_process_carrying_its_marker(tmp_path):
    """A fake ``ray start`` (SLIME_RAY) that leaves a renamed grandchild behind, like Ray's agents."""
    fake = tmp_path / "fake-ray"
    fake.write_text(f"""#!{sys.executable}
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(600)"], start_new_session=True)
print("Ray runtime started.", flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(600)
""")
    fake.chmod(0o755)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not ours: must survive
    try:
        node = RayNode(tmp_path / "ray-tmp", log=open(tmp_path / "log", "w"))  # noqa: SIM115
        node.start([str(fake), "start"])
        assert node.wait_started(time.monotonic() + 20, threading.Event())
        end = time.monotonic() + 10
        while len(pids_using(str(node.temp_dir))) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        ours = pids_using(str(node.temp_dir))
        assert node.proc.pid in ours and len(ours) == 2
        grandchild = next(p for p in ours if p != node.proc.pid)
        assert f"{MARKER_ENV}={node.temp_dir}".encode() in Path(f"/proc/{grandchild}/environ").read_bytes()
        left = node.stop(grace=5)
        assert left == [grandchild]  # it ignored TERM, so it was KILLed
        assert pids_using(str(tmp_path / "ray-tmp")) == [] and not node.temp_dir.exists()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_waiting_for_ray_stops_when_told_to_give_up(tmp_path):
    fake = tmp_path / "fake-ray"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")  # never says it started
    fake.chmod(0o755)
    node = RayNode(tmp_path / "t", log=open(tmp_path / "log", "w"))  # noqa: SIM115
    node.start([str(fake)])
    flag = threading.Event()
    threading.Timer(0.5, flag.set).start()
    t = time.monotonic()
    assert not node.wait_started(time.monotonic() + 30, threading.Event(), give_up=flag.is_set)
    assert time.monotonic() - t < 5
    node.stop(grace=2)
    assert not node.alive


def test_a_failing_ray_start_reports_its_output(tmp_path, monkeypatch):
    fake = tmp_path / "fake-ray"
    fake.write_text("#!/bin/sh\necho 'Failed to bind: Address already in use' >&2\nexit 1\n")
    fake.chmod(0o755)
    node = RayNode(tmp_path / "t", log=open(tmp_path / "log", "w"))  # noqa: SIM115
    node.start([str(fake)])
    assert not node.wait_started(time.monotonic() + 10, threading.Event())
    err = node.failure("could not join")
    assert err.port_conflict and "Address already in use" in err.tail and "exited with 1" in str(err)


def test_task_spec_is_read_from_the_run_dir_or_named_when_missing(tmp_path, capsys):
    from slime.spec.task import load_task_spec

    tp = TaskPaths(tmp_path, 0)
    with pytest.raises(ValueError, match="resolved.json does not exist"):
        load_task_spec(tp.resolved)
    # the bootstrap says it as a usage error (exit 2) with what to check on a node
    assert bootstrap_main([str(tmp_path), "--task", "0", "--local"]) == ExitCode.SPEC
    assert "filesystem every node sees" in capsys.readouterr().err
    tp.dir.mkdir(parents=True)
    tp.resolved.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="cannot read the task's resolved spec"):
        load_task_spec(tp.resolved)
    import msgspec

    spec = _spec()
    tp.resolved.write_text(json.dumps({"task": 0, "spec": msgspec.to_builtins(spec)}))
    assert load_task_spec(tp.resolved) == spec


def test_prune_removes_only_old_unused_dirs(tmp_path):
    old, new, busy = tmp_path / "1-0-0", tmp_path / "2-0-0", tmp_path / "3-0-0"
    for d in (old, new, busy, tmp_path / "ports"):
        d.mkdir()
    past = time.time() - 3 * 86400
    for d in (old, busy, tmp_path / "ports"):
        os.utime(d, (past, past))
    user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(busy)])
    try:
        assert prune_stale(tmp_path) == [old]
        assert not old.exists() and new.exists() and busy.exists() and (tmp_path / "ports").exists()
    finally:
        user.kill()
        user.wait()


def test_a_worker_that_failed_exits_0_when_the_head_finished_meanwhile(tmp_path, monkeypatch):
    """The head speaks for the job: a worker whose ``ray start`` kept failing until its deadline, and which
    finds the head done by the time it exits, exits 0, not 3. A 3 there would make srun
    (``--kill-on-bad-exit``) signal the head in its teardown (see also ``launchers.slurm.restarts.step_rc``).
    Its own failure stays recorded for the head's report."""
    import msgspec

    import launchers.node.bootstrap as boot_mod

    tp = TaskPaths(tmp_path, 0)
    tp.dir.mkdir(parents=True)
    spec = _spec(network_interface="lo", bootstrap_timeout_s=0.5)
    tp.resolved.write_text(json.dumps({"task": 0, "spec": msgspec.to_builtins(spec)}))
    fake = tmp_path / "fake-ray"
    fake.write_text("#!/bin/sh\necho 'injected failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    env = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2"}
    for k, v in {**env, "SLURM_JOB_NODELIST": f"headnode,{host}", "SLIME_RAY": str(fake)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(boot_mod, "prune_stale", lambda: None)  # leave other jobs' Ray dirs alone
    monkeypatch.setattr(boot_mod, "WORKER_MARGIN_S", 0.0)
    monkeypatch.setattr(boot_mod.Bootstrap, "start_collective", lambda self: None)  # no torch import here
    rdv = Rendezvous(tp.rendezvous, "77.0")
    new_secret(tp.auth, "77.0")  # as the head does before it publishes its address
    rdv.publish_head(ip="127.0.0.1", port=1, host="headnode")
    recorded = boot_mod.Bootstrap.node_failure

    def node_failure_then_the_head_ends(self, exc):
        rc = recorded(self, exc)
        rdv.mark_done(3)  # the head reports the missing node and finishes while this one is exiting
        return rc

    monkeypatch.setattr(boot_mod.Bootstrap, "node_failure", node_failure_then_the_head_ends)
    boot = boot_mod.Bootstrap(tmp_path, 0)
    assert boot.ctx.rank == 1 and boot.ctx.instance == "77.0"
    assert boot.run() == ExitCode.OK
    node = json.loads(rdv.node_file(1).read_text())
    assert node["state"] == "failed" and "injected failure" in node["error"]
