"""Per-node, per-job Ray bootstrap: ``python -m launchers.node.bootstrap RUN_DIR --task N``.

Once per node: rank 0 starts a Ray head, the others join (meeting through ``slime.core.rendezvous``); the head waits
for every node (bounded, no fixed sleeps), runs the preflight, then the driver (``--driver`` / ``$SLIME_DRIVER``
choose another module). Jobs sharing nodes are isolated by port blocks, per-job temp dirs, explicit node IPs and a
teardown that stops only this job's processes. Exit codes: 0, 2 unreadable spec, 3 infrastructure (naming node and
fix), 128+N on signal N, else the driver's. Failures are recorded, not acted on (the submit side decides). TERM/INT
stop all; a stop request reaches the driver as one USR1. Each instance gets a new secret that every node's Ray, the
preflight and the driver use (``slime.core.auth``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from launchers.node.chain_inputs import check_inputs
from launchers.node.context import NodeContext, detect_node, head_ip, worker_ip
from launchers.node.driverproc import run_driver_process
from launchers.node.preflight_checks import needs_collective
from launchers.node.rayproc import RayNode, RayStartError, prune_stale, temp_dir_for, temp_root
from slime.core.auth import auth_enabled, new_secret, ray_auth_env, secret_path
from slime.core.errors import ExitCode, InfraError
from slime.core.paths import RunPaths
from slime.core.ports import Claim, PortBlock, PortsExhausted, claim_block
from slime.core.rendezvous import Rendezvous, head_poll_s
from slime.core.worker_env import apply_worker_env
from slime.spec.task import load_task_spec

__all__ = ["DRIVER_GRACE_S", "Bootstrap", "NodeFailure", "main", "object_store_bytes"]

DEFAULT_DRIVER = "slime.train"
DRIVER_GRACE_S = 60.0
# Workers keep trying this much longer than the head waits, so that the head (which names the
# missing nodes and writes the report) fails first; srun --kill-on-bad-exit then stops the workers.
WORKER_MARGIN_S = 15.0
COLLECTIVE_TIMEOUT_S = 60.0
NODE_LOSS_GRACE_S = 15.0  # a worker whose Ray died waits this long for the head to end the job


class NodeFailure(InfraError):
    """Named node(s) failed during bootstrap or preflight."""

    def __init__(self, hosts: list[str], message: str, stage: str = "bootstrap") -> None:
        super().__init__(message)
        self.hosts = hosts
        self.stage = stage


class Stopped(Exception):
    """A TERM/INT arrived."""


class HeadDone(Exception):
    """The head finished (or failed) before this worker joined."""


def node_env() -> dict[str, str]:
    """The GPU variables SLURM set for this node's step (the preflight compares them)."""
    return {
        k: os.environ[k]
        for k in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
        if k in os.environ
    }


def object_store_bytes(ctx: NodeContext) -> int | None:
    """``$SLIME_RAY_OBJECT_STORE_MB``, else 30% of the job's memory on the node, else Ray's default."""
    override = os.environ.get("SLIME_RAY_OBJECT_STORE_MB", "").strip()
    if override.isdigit():
        return int(override) << 20
    if ctx.mem_mb:
        return max(80 << 20, int(ctx.mem_mb * 0.3) << 20)
    return None


class Bootstrap:
    def __init__(
        self, run_dir: Path, task: int, *, preflight_only: bool = False, driver: str | None = None, local: bool = False
    ) -> None:
        self.t0 = time.monotonic()
        self.paths = RunPaths(run_dir)
        self.tp = self.paths.task(task)
        try:
            self.spec = load_task_spec(self.tp.resolved)
        except ValueError as exc:
            raise InfraError(f"{exc}. The run dir must be on a filesystem every node sees (logging.dir)") from None
        self.ctx = detect_node(task, self.spec, local=local)
        self.preflight_only = preflight_only
        self.driver = driver or os.environ.get("SLIME_DRIVER") or DEFAULT_DRIVER
        self.rdv = Rendezvous(self.tp.rendezvous, self.ctx.instance)
        self.stop = threading.Event()
        self.signum: int | None = None
        self.usr1 = False  # USR1 came (local runs): a stop request for the driver
        self.driver_proc: subprocess.Popen | None = None
        self.collective: subprocess.Popen | None = None
        self.ray: RayNode | None = None
        self.claim: Claim | None = None
        self.address: str | None = None
        self.ip: str | None = None
        self.block: PortBlock | None = None
        self.connected = False
        self.tp.logs.mkdir(parents=True, exist_ok=True)
        self.node_log: IO[str] = open(self.tp.node_log(self.ctx.hostname), "a", buffering=1)  # noqa: SIM115

    # ------------------------------------------------------------------ output
    def say(self, msg: str) -> None:
        line = f"slime[{self.ctx.hostname}:{self.ctx.rank}] +{time.monotonic() - self.t0:.1f}s {msg}"
        for out in (sys.stdout, self.node_log):
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    def node_state(self, state: str, **info: Any) -> None:
        """This node's rendezvous record; every record carries what the preflight compares."""
        ctx = self.ctx
        self.rdv.write_node(
            ctx.rank, host=ctx.hostname, state=state, num_cpus=ctx.cpus, num_gpus=ctx.gpus, env=node_env(), **info
        )

    # ------------------------------------------------------------------ signals
    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        self.stop.set()
        if self.driver_proc is not None and self.driver_proc.poll() is None:
            self.driver_proc.send_signal(signum)

    def _on_usr1(self, signum: int, _frame: Any) -> None:
        self.usr1 = True  # launchers.node.driverproc delivers it once the driver handles USR1

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped()

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        ctx = self.ctx
        os.environ.pop("RAY_ADDRESS", None)
        apply_worker_env(os.environ)  # see the module doc
        self.say(
            f"bootstrap of task {ctx.task}: node {ctx.rank} of {ctx.num_nodes} ({', '.join(ctx.hostnames)}), "
            f"job {ctx.job_id}, {ctx.gpus} GPU(s), {ctx.cpus} CPU(s)"
        )
        rc = ExitCode.BUG
        prune_stale()  # Ray dirs that failed jobs kept for debugging, after a day
        self.start_collective()
        try:
            rc = self.run_head() if ctx.rank == 0 else self.run_worker()
        except (Stopped, SystemExit):  # SystemExit: Ray's own SIGTERM handler, active inside ray.init
            self.signum = self.signum or signal.SIGTERM
            rc = 128 + self.signum
            if ctx.rank != 0 and self.rdv.done():
                rc = 0  # srun stops workers once the head exited: the head's exit code is the job's
            self.say(f"stopped by signal {self.signum}")
        except HeadDone:
            self.say("the head finished before this node joined")
            rc = 0
        except NodeFailure as exc:
            rc = self.node_failure(exc)
        except (InfraError, PortsExhausted) as exc:
            rc = self.node_failure(NodeFailure([ctx.hostname], str(exc)))
        except Exception:  # noqa: BLE001 - a bug: say so with the traceback
            self.say("internal error (a bug):\n" + traceback.format_exc())
            rc = ExitCode.BUG
        finally:
            if ctx.rank != 0 and rc != ExitCode.OK and self.rdv.done():
                # The head finished first and its exit code is the job's. A nonzero exit here would make
                # srun (--kill-on-bad-exit) signal the head in its teardown, and the job would end 143.
                self.say(f"exiting 0: the head finished first (exit code {self.rdv.done_rc()}) and speaks for the job")
                rc = ExitCode.OK
            self.teardown(rc)
        return rc

    def start_collective(self) -> None:
        """The preflight's cross-node all_reduce, in a subprocess that imports torch while Ray starts."""
        ctx, c = self.ctx, self.spec.cluster
        if not needs_collective(ctx.num_nodes, c.gpus_per_node):
            return  # one node, no GPUs: the preflight skips the check (no torch import for nothing)
        cmd = [
            sys.executable,
            "-m",
            "launchers.node.collective",
            str(self.paths.root),
            "--task",
            str(ctx.task),
            "--rank",
            str(ctx.rank),
            "--world",
            str(ctx.num_nodes),
            "--instance",
            ctx.instance,
            "--wait",
            str(c.bootstrap_timeout_s + WORKER_MARGIN_S + 60),
            "--timeout",
            str(COLLECTIVE_TIMEOUT_S),
        ]
        # Niced: on a busy node Ray's start-up gets the CPU first; on an idle one this costs nothing.
        self.collective = subprocess.Popen(
            cmd,
            stdout=self.node_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: os.nice(10),
        )

    def _start_ray(self, *, head: bool, ip: str, deadline: float, head_address: str | None = None) -> PortBlock:
        """Start Ray on this node (claiming a port block), moving to the next block on a port conflict.

        The head publishes its address as soon as its ``ray start`` is launched: the workers' own
        start-up (seconds of Python imports) then overlaps the head's, and ``ray start --address``
        waits for the GCS by itself. A head that has to move to another port block publishes again;
        workers re-read the address on each attempt."""
        ctx = self.ctx
        self.ray = self.ray or RayNode(temp_dir_for(ctx.key, ctx.rank), log=self.node_log)
        tried: set[int] = set()
        while True:
            self._release_claim()
            self.claim = claim_block(ctx.key, host=ctx.hostname, directory=temp_root() / "ports", skip=tried)
            block = self.claim.block
            cmd = self.ray.command(
                head=head,
                ip=ip,
                ports=block,
                num_cpus=ctx.cpus,
                num_gpus=ctx.gpus,
                resources={f"slime_node_{ctx.rank}": 1.0},
                head_address=head_address,
                object_store_bytes=object_store_bytes(ctx),
                dashboard=os.environ.get("SLIME_RAY_DASHBOARD") == "1",
            )
            self.ray.start(cmd)
            if head:
                self.rdv.publish_head(host=ctx.hostname, ip=ip, port=block.gcs, gloo_port=block.gloo)
            try:
                if head:
                    self.ray.wait_port(ip, block.gcs, deadline, self.stop)
                    self._check_stop()
                    return block
                # Workers stop trying once the head is done (it failed, or finished without them).
                if self.ray.wait_started(deadline, self.stop, give_up=self.rdv.done):
                    return block
                self._check_stop()
                if not head and self.rdv.done():
                    raise HeadDone()
                raise self.ray.failure(
                    f"ray start on {ctx.hostname} did not come up"
                    + (f" joining the head at {head_address}" if head_address else "")
                    + (" in time" if self.ray.alive else "")
                )
            except RayStartError as exc:
                if exc.port_conflict and len(tried) < 3 and time.monotonic() < deadline:
                    tried.add(block.base)
                    self.say(f"port block {block.base} is taken; trying the next one")
                    continue
                raise

    def _release_claim(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    # ------------------------------------------------------------------ auth
    def use_secret(self, path: Path) -> None:
        """Token auth for this node's Ray and every process the job starts here (``slime.core.auth``)."""
        os.environ.pop("RAY_AUTH_TOKEN", None)  # would win over the file
        os.environ.update(ray_auth_env(path))

    def _take_secret(self, deadline: float) -> None:
        """A worker uses the head's secret. The head writes it before it publishes its address, but a
        shared filesystem may show it later."""
        if not auth_enabled():
            return
        path = secret_path(self.tp.auth, self.ctx.instance)
        end = min(deadline, time.monotonic() + 30.0)
        while not path.is_file():
            self._check_stop()
            if self.rdv.done():
                raise HeadDone()
            if time.monotonic() > end:
                raise NodeFailure(
                    [self.ctx.hostname],
                    f"the job's secret {path} is not visible on {self.ctx.hostname}. Fix: the run dir "
                    "must be on a filesystem every node of the job sees (logging.dir)",
                )
            self.stop.wait(0.1)
        self.use_secret(path)

    # ------------------------------------------------------------------ head
    def run_head(self) -> int:
        ctx, spec = self.ctx, self.spec
        deadline = self.t0 + spec.cluster.bootstrap_timeout_s
        self.rdv.clean_stale()
        ip = head_ip(ctx, spec)
        if auth_enabled():  # a new secret per instance: a requeued job's old one is refused
            self.use_secret(new_secret(self.tp.auth, ctx.instance))
        try:
            block = self._start_ray(head=True, ip=ip, deadline=deadline)
        except RayStartError as exc:
            raise NodeFailure(
                [ctx.hostname],
                f"the Ray head did not start on {ctx.hostname}: {exc}\n{exc.tail}\n"
                f"Fix: see {self.tp.node_log(ctx.hostname)}",
            ) from None
        self.ip, self.block, self.address = ip, block, f"{ip}:{block.gcs}"
        self.node_state("joined", ip=ip, ports=block.to_json(), temp_dir=str(self.ray.temp_dir))
        self.say(f"Ray head up at {self.address} (temp dir {self.ray.temp_dir})")
        import ray

        try:
            ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
        except ConnectionError as exc:  # the head came up but never registered (seen on an overloaded node)
            raise NodeFailure(
                [ctx.hostname],
                f"could not connect to the Ray head started on {ctx.hostname} at "
                f"{self.address}: {exc}. Fix: see {self.ray.temp_dir}/session_latest/"
                "logs (gcs_server.out, raylet.out); an overloaded node starts Ray "
                "slowly: retry, or give the job more CPUs",
            ) from None
        self.install_signals()  # ray.init replaced our SIGTERM handler with sys.exit
        self.connected = True
        self.wait_nodes(deadline)
        return self.preflight_then_driver()

    def wait_nodes(self, deadline: float) -> None:
        import ray

        from slime.placement import node_rank_of

        ctx = self.ctx
        want = set(range(ctx.num_nodes))
        ours = {r: f"{temp_dir_for(ctx.key, r)}/" for r in want}
        shown: tuple[frozenset[int], int] | None = None
        while True:
            self._check_stop()
            joined = set()
            for n in ray.nodes():
                if not n.get("Alive"):
                    continue
                r = node_rank_of(n.get("Resources", {}))
                sock = n.get("ObjectStoreSocketName") or ""
                if r not in ours or not sock.startswith(ours[r]):  # not started by this job's bootstrap
                    host = n.get("NodeManagerHostname", "?")
                    raise NodeFailure(
                        [host],
                        f"node {host} ({n.get('NodeManagerAddress')}, Ray dir {sock}) joined "
                        f"this job's Ray cluster but was not started by it. Fix: this is a "
                        "port collision with another Ray; set SLIME_RAY_PORT_RANGE to a "
                        "range only slime jobs use",
                    )
                joined.add(r)
            if want <= joined:
                self.say(f"all {ctx.num_nodes} node(s) joined the Ray cluster")
                return
            missing = sorted(want - joined)
            if self.ray is not None and not self.ray.alive:
                raise NodeFailure([ctx.hostname], f"the Ray head on {ctx.hostname} exited: {self.ray.tail(6)}")
            now = time.monotonic()
            tick = int((now - self.t0) // 10)
            if shown != (frozenset(joined), tick):
                shown = (frozenset(joined), tick)
                self.say(
                    f"waiting for nodes: {len(joined & want)}/{ctx.num_nodes} joined; missing "
                    f"{', '.join(self._host(r) for r in missing)} ({deadline - now:.0f} s left)"
                )
            if now > deadline:
                raise NodeFailure([self._host(r) for r in missing], self._missing_message(missing, joined))
            self.stop.wait(0.2)

    def _host(self, rank: int) -> str:
        return self.ctx.hostnames[rank] if rank < len(self.ctx.hostnames) else f"rank{rank}"

    def _missing_message(self, missing: list[int], joined: set[int]) -> str:
        ctx, timeout = self.ctx, self.spec.cluster.bootstrap_timeout_s
        states = self.rdv.nodes(ctx.num_nodes)
        parts = []
        for r in missing:
            st = states.get(r)
            if st is None:
                why = "its bootstrap never reported (not started, or cannot write the run dir)"
            else:
                why = f"state {st.get('state')}" + (f", last error: {st['error']}" if st.get("error") else "")
            parts.append(f"{self._host(r)} ({why}; log: {self.tp.node_log(self._host(r))})")
        names = ", ".join(self._host(r) for r in missing)
        return (
            f"Ray bootstrap timed out after {timeout:g} s: {len(joined)} of {ctx.num_nodes} node(s) joined; "
            f"missing: {'; '.join(parts)}. Fix: check the node(s) ({names}) and their logs; exclude a broken "
            f"node with cluster.slurm.exclude: [{names}] (or cluster.slurm.on_preflight_failure: "
            "requeue_excluding); if the "
            "nodes are only slow to start, raise cluster.bootstrap_timeout_s"
        )

    def preflight_then_driver(self) -> int:
        from launchers.node.preflight import run_preflight, write_report

        ctx = self.ctx
        self.say("running the preflight")
        result = run_preflight(
            self.spec, ctx, rdv=self.rdv, ports=self.block, timeout_s=min(self.spec.cluster.bootstrap_timeout_s, 120.0)
        )
        result.report["bootstrap_seconds"] = round(time.monotonic() - self.t0, 3)
        text = write_report(self.tp, result.report)
        sys.stdout.write(text)
        sys.stdout.flush()
        if not result.ok:
            raise NodeFailure(result.bad_nodes or [], f"preflight failed: {result.error}", stage="preflight")
        self.say(
            f"preflight passed in {result.report['seconds']:.1f} s ({time.monotonic() - self.t0:.1f} s since start)"
        )
        if self.preflight_only:
            return ExitCode.OK
        import ray

        ray.shutdown()
        self.install_signals()  # ray.shutdown leaves SIGTERM at its default: no teardown
        self.connected = False
        return self.run_driver()

    def run_driver(self) -> int:
        ctx = self.ctx
        cmd = [sys.executable, "-m", self.driver, str(self.paths.root), "--task", str(ctx.task)]
        env = {
            **os.environ,
            "RAY_ADDRESS": self.address or "",
            "SLIME_RUN_DIR": str(self.paths.root),
            "SLIME_TASK": str(ctx.task),
            "SLIME_NUM_NODES": str(ctx.num_nodes),
        }
        self.say(f"starting the driver: {' '.join(cmd)}")

        def started(proc: subprocess.Popen) -> None:
            self.driver_proc = proc

        rc = run_driver_process(
            cmd,
            env,
            stop=self.stop,
            grace_s=DRIVER_GRACE_S,
            say=self.say,
            on_start=started,
            stop_requested=lambda: self.usr1 or self.rdv.stop_requested(),
        )
        self.say(f"driver exited with code {rc}")
        if self.stop.is_set() and rc == 0:
            return 128 + (self.signum or signal.SIGTERM)
        return rc

    # ------------------------------------------------------------------ worker
    def run_worker(self) -> int:
        ctx, spec = self.ctx, self.spec
        deadline = self.t0 + spec.cluster.bootstrap_timeout_s + WORKER_MARGIN_S
        self.node_state("waiting for head")
        head = self.rdv.wait_head(deadline, self.stop, poll=head_poll_s(ctx.num_nodes))
        self._check_stop()
        if head is None:
            if self.rdv.done():
                self.say("the head finished before this node joined")
                return ExitCode.OK
            raise NodeFailure(
                [ctx.head_host],
                f"the Ray head on {ctx.head_host} did not publish its address within "
                f"{spec.cluster.bootstrap_timeout_s:g} s; see its log "
                f"{self.tp.node_log(ctx.head_host)}",
            )
        self._take_secret(deadline)
        ip, attempt = worker_ip(ctx, spec, head["ip"]), 0
        while True:
            head = self.rdv.head() or head  # the head republishes if it had to move to another port block
            address = f"{head['ip']}:{head['port']}"
            self.node_state("starting", ip=ip, attempt=attempt + 1)
            try:
                block = self._start_ray(head=False, ip=ip, deadline=deadline, head_address=address)
                break
            except RayStartError as exc:
                attempt += 1
                last = exc.tail.strip().splitlines()[-1] if exc.tail.strip() else str(exc)
                self.node_state("failed", ip=ip, attempt=attempt, error=f"{exc}: {last}")
                self.say(f"ray start failed (attempt {attempt}): {last}")
                if time.monotonic() > deadline or self.rdv.done():
                    raise NodeFailure(
                        [ctx.hostname], f"Ray could not start on {ctx.hostname} after {attempt} attempt(s): {last}"
                    ) from None
                self.stop.wait(min(0.5 * 2**attempt, 5.0))
                self._check_stop()
        self.node_state("joined", ip=ip, ports=block.to_json(), temp_dir=str(self.ray.temp_dir))
        self.say(f"joined the Ray head at {address} as {ip}")
        while True:
            if self.rdv.done():
                return ExitCode.OK
            if not self.ray.alive:
                # Said at once (the head may fail because of it and finish first), judged below.
                code = self.ray.proc.returncode if self.ray.proc is not None else None
                lost = (
                    f"Ray on {ctx.hostname} exited unexpectedly (ray start exit code {code})\nits last lines:\n"
                    f"{self.ray.tail(5)}"
                )
                self.node_state("lost", ip=ip, error=lost)
                # The head may be finishing right now, or its driver reporting the loss in its own words
                # (slime.train names the node, exit 3); past this grace the loss ends the step from here.
                end = time.monotonic() + NODE_LOSS_GRACE_S
                while time.monotonic() < end and not self.rdv.done():
                    self.stop.wait(0.2)
                if self.rdv.done() and self.rdv.done_rc() == 0:
                    self.node_state("stopped", ip=ip)  # a normal end: the head finished first
                    return ExitCode.OK
                raise NodeFailure([ctx.hostname], lost)
            self.stop.wait(0.2)
            self._check_stop()

    # ------------------------------------------------------------------ failure, teardown
    def node_failure(self, exc: NodeFailure) -> int:
        """Record the failure (this node's rendezvous record; the head's report) and give exit code 3."""
        ctx = self.ctx
        self.say(f"FAILED ({exc.stage}): {exc}")
        if ctx.hostname in exc.hosts:  # read by the SLURM restart helper (launchers.slurm.restarts.bad_nodes)
            self.node_state("failed", error=str(exc)[:2000])
        if ctx.rank != 0:
            return ExitCode.INFRA
        if exc.stage == "bootstrap":  # the cluster doctor's answer, even without a preflight
            from launchers.node.preflight import write_report

            write_report(
                self.tp,
                {
                    "ok": False,
                    "stage": "bootstrap",
                    "task": ctx.task,
                    "job_id": ctx.job_id,
                    "instance": ctx.instance,
                    "error": str(exc),
                    "bad_nodes": exc.hosts,
                    "nodes": [],
                    "slots": [],
                    "checks": [
                        {"name": "bootstrap", "ok": False, "node": h, "message": str(exc), "fix": None}
                        for h in exc.hosts
                    ],
                },
            )
        return ExitCode.INFRA

    def teardown(self, rc: int) -> None:
        if self.collective is not None and self.collective.poll() is None:
            self.collective.kill()  # it had no go-ahead (or hangs): nothing of value is lost
            self.collective.wait()
        if self.connected:
            try:
                import ray

                ray.shutdown()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
            self.connected = False
        if self.ctx.rank == 0:
            self.rdv.mark_done(rc)  # workers stop their Ray now, in parallel with ours
        if self.ray is not None and self.ray.proc is None:  # Ray was never launched (e.g. no free ports)
            self.ray.stop(remove_temp=True)  # its temp dir, if any
        elif self.ray is not None:
            t = time.monotonic()
            keep = rc != 0 and self.signum is None  # a failure, not a cancel/preemption: keep Ray's logs
            leftovers = self.ray.stop(remove_temp=not keep)
            self.say(
                f"stopped this job's Ray on {self.ctx.hostname} in {time.monotonic() - t:.1f} s"
                + (f" (signalled leftover processes {leftovers})" if leftovers else "")
            )
            if keep:
                self.say(f"kept Ray's logs in {self.ray.temp_dir} (removed after a day)")
        self._release_claim()
        self.node_log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launchers.node.bootstrap", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--preflight-only", action="store_true")
    p.add_argument("--driver", default=None, help="python module run after the preflight (default slime.train)")
    p.add_argument("--local", action="store_true", help="ignore SLURM variables: a single local node")
    args = p.parse_args(argv)
    try:
        boot = Bootstrap(
            args.run_dir.resolve(), args.task, preflight_only=args.preflight_only, driver=args.driver, local=args.local
        )
    except InfraError as exc:
        print(f"slime bootstrap: {exc}", file=sys.stderr)
        return ExitCode.SPEC
    problem = check_inputs(boot.paths, boot.tp, record=boot.ctx.rank == 0)
    if problem:  # an earlier chain step's output this step uses is missing: bad input, not infrastructure
        boot.say(f"chain input missing: {problem}")
        return ExitCode.SPEC
    boot.install_signals()
    return boot.run()


if __name__ == "__main__":
    sys.exit(main())
