"""Start and stop this job's Ray processes on one node, and only this job's.

``ray start --block`` runs as our child and owns the Ray processes it starts; teardown TERMs it,
then TERMs (later KILLs) every process carrying this node's ``SLIME_RAY_NODE=<temp dir>`` marker or
naming the temp dir, since Ray's agents can outlive their raylet and ignore SIGTERM. Never ``ray
stop`` (node-wide) and never kill by name. Ray gets a fixed environment (no usage stats, auth off
unless the job set it: the bootstrap sets token auth with the job's secret file, no drain wait,
workers at normal niceness, no inherited ``RAY_ADDRESS``). The CLI is
``$SLIME_RAY`` when set, else the ``ray`` next to this interpreter. See docs/design-notes.md.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from slime.core.ports import PortBlock, shared_dir
from slime.core.worker_env import apply_worker_env

__all__ = [
    "MARKER_ENV",
    "RayNode",
    "RayStartError",
    "pids_using",
    "prune_stale",
    "ray_env",
    "ray_executable",
    "temp_dir_for",
    "temp_root",
]

TEMP_ROOT_ENV = "SLIME_RAY_TMPDIR"


class RayStartError(RuntimeError):
    """``ray start`` exited before the node was up; ``tail`` holds its last output lines."""

    def __init__(self, message: str, tail: str, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.tail = tail
        self.port_conflict = port_conflict


def ray_executable() -> str:
    override = os.environ.get("SLIME_RAY")
    if override:
        return override
    local = Path(sys.executable).parent / "ray"
    if local.exists():
        return str(local)
    found = shutil.which("ray")
    if not found:
        raise RayStartError("the `ray` command is not installed next to this Python or on PATH", "")
    return found


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    # The GCS marks a node dead after this many missed 1 s health checks (Ray's default, 3 s x 5 plus
    # a 60 s wait for death info, lets a driver wait on a lost node's actors for up to a minute).
    env.setdefault("RAY_health_check_period_ms", "1000")
    env.setdefault("RAY_health_check_failure_threshold", "5")
    apply_worker_env(env)  # the run's workers inherit it from the raylet (no per-worker setup process)
    # Ray prestarts a worker per CPU for the first driver, here the bootstrap's preflight: its one probe task
    # per bundle takes one and the rest idle (each a Python process importing Ray); workers are tied to a
    # job, so the runtime's driver (the second) could never use them.
    env.setdefault("RAY_prestart_worker_first_driver", "0")
    env.update(extra or {})
    return env


def temp_root() -> Path:
    return Path(os.environ.get(TEMP_ROOT_ENV) or "/tmp/slime-ray")


def prune_stale(root: Path | None = None, max_age_s: float = 86400.0) -> list[Path]:
    """Remove this user's Ray dirs kept by failed jobs (see ``RayNode.stop``) once older than
    ``max_age_s`` and used by no process. Returns what was removed."""
    root = root or temp_root()
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    now = time.time()
    for d in entries:
        try:
            st = d.stat()
        except OSError:
            continue
        if not d.is_dir() or d.name == "ports" or st.st_uid != os.getuid() or now - st.st_mtime < max_age_s:
            continue
        if not pids_using(str(d)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def temp_dir_for(key: str, rank: int) -> Path:
    """Short on purpose: Ray's unix socket paths under it must stay below ~107 characters."""
    return temp_root() / f"{key}-{rank}"


MARKER_ENV = "SLIME_RAY_NODE"


def pids_using(temp_dir: str) -> list[int]:
    """PIDs (ours, not this process or its ancestors) that belong to the Ray node using ``temp_dir``.

    Matches the ``SLIME_RAY_NODE=<temp_dir>`` variable every process started by our ``ray start``
    inherits (Ray renames its agents' command lines, e.g. ``ray::DashboardAgent``, so the command
    line alone misses them), or ``temp_dir`` in the command line.
    """
    skip = {os.getpid()}
    pid = os.getppid()
    while pid > 1:  # our ancestors (e.g. the batch shell) may mention the dir in their arguments
        skip.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    env_marker = f"{MARKER_ENV}={temp_dir}\0".encode()
    out = []
    uid = os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            if env_marker in (entry / "environ").read_bytes() or temp_dir.encode() in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


class RayNode:
    """One ``ray start --block`` process of this job on this node."""

    def __init__(self, temp_dir: Path, log: IO[str] | None = None) -> None:
        self.temp_dir = temp_dir
        self.log = log  # where Ray's own output goes (a node log file); None = our stdout
        self.proc: subprocess.Popen | None = None
        self.started = threading.Event()  # "Ray runtime started." was printed
        self._tail: collections.deque[str] = collections.deque(maxlen=25)
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------------ start
    def command(
        self,
        *,
        head: bool,
        ip: str,
        ports: PortBlock,
        num_cpus: int,
        num_gpus: int,
        resources: dict[str, float],
        head_address: str | None = None,
        object_store_bytes: int | None = None,
        dashboard: bool = False,
    ) -> list[str]:
        cmd = [
            ray_executable(),
            "start",
            "--block",
            f"--node-ip-address={ip}",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}",
            f"--resources={json.dumps(resources)}",
            f"--node-manager-port={ports.node_manager}",
            f"--object-manager-port={ports.object_manager}",
            f"--min-worker-port={ports.min_worker}",
            f"--max-worker-port={ports.max_worker}",
            f"--dashboard-agent-grpc-port={ports.dashboard_agent_grpc}",
            f"--dashboard-agent-listen-port={ports.dashboard_agent_listen}",
            f"--metrics-export-port={ports.metrics_export}",
            f"--runtime-env-agent-port={ports.runtime_env_agent}",
            "--disable-usage-stats",
        ]
        if os.environ.get("SLIME_RAY_LOG_TO_DRIVER") != "1":
            # Its only job is streaming worker output to drivers, which the runtime does not ask for
            # (slime.runtime.job: log_to_driver only with that variable), so it would only cost CPU.
            cmd.append("--include-log-monitor=false")
        if object_store_bytes:
            cmd.append(f"--object-store-memory={object_store_bytes}")
        if head:
            cmd += ["--head", f"--port={ports.gcs}"]
            # Even without the dashboard Ray runs a minimal dashboard head on 8265 (--port-retries=0): pin it,
            # or a second job's head on the same node fails to bind and `ray start --block` kills its cluster.
            cmd.append(f"--dashboard-port={ports.dashboard}")
            if dashboard:
                cmd += ["--include-dashboard=true", "--dashboard-host=127.0.0.1"]  # reach it through a tunnel
            else:
                cmd.append("--include-dashboard=false")
            if _ray_client_available():  # `ray start` has no way to turn it off: pin its port then
                cmd.append(f"--ray-client-server-port={ports.client_server}")
            if os.environ.get("SLIME_RAY_MONITOR") != "1":
                # The autoscaler's monitor: a job's allocation is fixed, so there is nothing to scale (it only costs
                # CPU). `ray status` reads what it reports: SLIME_RAY_MONITOR=1 keeps it.
                cmd.append("--no-monitor")
        else:
            if not head_address:
                raise ValueError("a worker needs the head address")
            cmd.append(f"--address={head_address}")
        return cmd

    def start(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        if self.proc is not None:  # a previous attempt: make sure nothing of it is left
            self.stop(grace=5.0, remove_temp=False)
        if self.temp_dir.exists():  # an earlier run of this same job (requeue) on this node
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        shared_dir(self.temp_dir.parent)  # shared by every user's jobs, like /tmp
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.started.clear()
        self._tail.clear()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ray_env({**(env or {}), MARKER_ENV: str(self.temp_dir)}),
            stdin=subprocess.DEVNULL,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._pump, args=(self.proc,), daemon=True)
        self._reader.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        if proc.stdout is None:  # set by Popen(stdout=PIPE) above; explicit so -O keeps it
            return
        out = self.log or sys.stdout
        for line in proc.stdout:
            self._tail.append(line.rstrip("\n"))
            if "Ray runtime started" in line:
                self.started.set()
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 12) -> str:
        return "\n".join(list(self._tail)[-n:])

    def failure(self, what: str) -> RayStartError:
        if self._reader is not None:
            self._reader.join(timeout=2)
        tail = self.tail()
        conflict = any(s in tail.lower() for s in ("address already in use", "is already in use", "failed to bind"))
        code = self.proc.returncode if self.proc is not None else None
        return RayStartError(f"{what} (ray start exited with {code})", tail, port_conflict=conflict)

    def wait_port(self, ip: str, port: int, deadline: float, stop: threading.Event) -> None:
        """Until our head's GCS accepts connections on ``ip:port`` (RayStartError if our Ray exits first).

        Faster than waiting for ``ray start`` to report (notably under load), and safe because
        the port block is claimed by this job on this host (``slime.core.ports.claim_block``); the head
        also checks that every node in its cluster was started by this job."""
        while not stop.is_set():
            if not self.alive:
                raise self.failure(f"the Ray head did not come up on {ip}:{port}")
            try:
                socket.create_connection((ip, port), timeout=0.5).close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RayStartError(
                    f"the Ray head's GCS at {ip}:{port} did not accept connections in time", self.tail()
                )
            stop.wait(0.05)

    def wait_started(self, deadline: float, stop: threading.Event, give_up: Callable[[], bool] | None = None) -> bool:
        """Until our ``ray start`` prints that the node is up (True), or it exits, the deadline passes,
        ``stop`` is set or ``give_up()`` says so (False). Only our own process's word counts: a port
        that accepts connections may belong to another job's Ray."""
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            if self.started.wait(0.05):
                return True
            if not self.alive:
                return self.started.is_set()
            n += 1
            if give_up is not None and n % 4 == 0 and give_up():
                return False
        return self.started.is_set()

    # ------------------------------------------------------------------ stop
    def stop(self, grace: float = 10.0, remove_temp: bool = True) -> list[int]:
        """Stop this node's Ray: TERM ``ray start``, then its leftover processes. Returns the leftovers' PIDs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        found = pids_using(str(self.temp_dir)) if self.proc is not None else []
        left = found
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end and (left := [p for p in left if _alive(p)]):
                time.sleep(0.05)
        if remove_temp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _ray_client_available() -> bool:
    """Ray starts its client server only with ``grpc`` installed (ray[client]); then pin its port too."""
    import importlib.util

    return importlib.util.find_spec("grpc") is not None
