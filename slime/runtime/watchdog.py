"""The stall watchdog: each driver phase has a deadline; one missed dumps every run process's stacks.

``with watchdog.phase("rollout", rollout=r):`` arms a deadline from ``cluster.stall_timeout_s``
(``slime.diagnosis.phases``); ``beat()`` pushes it back, also a worker's ``slime.diagnosis.beats.beat``
(read from the job's beat board every poll). A thread checks it; when one passes it dumps the stacks
of every run process on every node (py-spy, else a worker's faulthandler dump), names the one behind
and the frame it waits in, writes ``tasks/<i>/diagnosis/<stamp>/`` and a ``diagnosis.json`` record, then
calls ``on_stall`` (the driver's: record, tear down, exit 124) from its own thread: the main thread may
be blocked in a call no signal interrupts (``ray.get``). Not guaranteed: stacks of a node whose Ray is gone.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from slime.core.errors import ExitCode
from slime.core.paths import TaskPaths
from slime.diagnosis import beats
from slime.diagnosis import record as records
from slime.diagnosis.phases import beat_key, phase_timeout_s
from slime.diagnosis.stacks import ProcStacks, behind, descendants, dump

__all__ = ["Watchdog", "dump_all", "job_processes", "start_board"]

GRACE_S = 60.0  # on_stall has this long to tear the job down before the process exits by itself
BOARD_READ_S = 5.0  # a board read that takes longer is skipped: the deadline decides


class Watchdog:
    def __init__(
        self,
        setting: float | None,
        tp: TaskPaths,
        *,
        processes: Callable[[], list[tuple[str, int, str | None]]],
        on_stall: Callable[[records.Diagnosis], None],
        say: Callable[[str], None],
        poll_s: float = 0.5,
        hard_exit: Callable[[], None] | None = None,
    ) -> None:
        self.setting, self.tp, self.processes, self.say, self.poll_s = setting, tp, processes, say, poll_s
        self.on_stall = on_stall
        self.hard_exit = hard_exit or _hard_exit  # ends this process: a test in a shared process passes its own
        self.firing = threading.Event()  # set when a stall is found: the main thread leaves the ending to us
        self.name: str | None = None
        self.deadline: float | None = None
        self.timeout_s: float | None = None
        self.rollout: int | None = None
        self.step: int | None = None
        self.fired: records.Diagnosis | None = None
        self.failed_in: tuple[str, int | None, int | None] | None = None  # (phase, rollout, step) a failure left
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.board: Callable[[], dict[str, int]] | None = None  # the workers' beats per phase (beats.start_board)
        self._counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the driver's side
    def start(self, board: Callable[[], Callable[[], dict[str, int]]] | None = None) -> Watchdog:
        """Watch; ``board`` starts the workers' beat board (``beats.start_board``), only when it is on."""
        if self.setting is not None and self.setting <= 0:
            return self  # cluster.stall_timeout_s: 0 turns it off
        self.board = board() if board is not None else None
        beats.set_local(self.beat)  # this process's beats come straight here
        self._thread = threading.Thread(target=self._watch, name="slime-watchdog", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        beats.set_local(None)

    @contextlib.contextmanager
    def phase(self, name: str, *, rollout: int | None = None, step: int | None = None) -> Iterator[None]:
        """Time ``name``: no progress (no :meth:`beat`) for its timeout is a stall."""
        before = (self.name, self.deadline, self.timeout_s)
        if name == "train step" and name not in self._seen:
            self._seen.add(name)
            name = "first train step"  # the slowest: allocators warm up, kernels compile
        with self._lock:
            self.name, self.rollout, self.step = name, rollout, step
            self.timeout_s = phase_timeout_s(self.setting, name)
            self.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            yield
        except BaseException:
            if self.failed_in is None:  # the innermost phase the failure left
                self.failed_in = (name, rollout, step)
            raise
        finally:
            with self._lock:
                self.name, self.deadline, self.timeout_s = before

    def beat(self, phase: str | None = None) -> None:
        """Progress in the current phase (or in ``phase``, ignored unless it is the current one): its deadline
        starts again."""
        with self._lock:
            if self.timeout_s is not None and (phase is None or phase == beat_key(self.name)):
                self.deadline = time.monotonic() + self.timeout_s

    # ------------------------------------------------------------------ the watchdog thread
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._read_board()
            with self._lock:
                late = self.deadline is not None and time.monotonic() > self.deadline
                phase, timeout = self.name, self.timeout_s
            if late and phase is not None:
                self._fire(phase, timeout or 0.0)
                return

    def _read_board(self) -> None:
        """A beat of the current phase where the workers' count of it moved since the last poll."""
        if self.board is None or self.name is None:
            return
        try:
            counts = self.board()
        except Exception:  # noqa: BLE001 - an unreadable board is no progress; the deadline decides
            return
        moved = [k for k, n in counts.items() if self._counts.get(k) != n]
        self._counts = counts
        for key in moved:
            self.beat(key)

    def _fire(self, phase: str, timeout_s: float) -> None:
        self.firing.set()
        self.say(f"stall: no progress in the {phase} for {timeout_s:g}s (cluster.stall_timeout_s): dumping stacks")
        try:
            self.fired = self.diagnose(phase, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis must not keep a stuck job alive
            self.fired = records.Diagnosis(
                cause="stall",
                title=f"no progress in the {phase} for {timeout_s:g}s",
                fix=f"the stacks could not be dumped ({exc}); raise cluster.stall_timeout_s if the phase is slow",
                exit_code=ExitCode.STALL,
                phase=phase,
            )
            records.append(self.tp, self.fired)
        timer = threading.Timer(GRACE_S, self.hard_exit)  # if the teardown itself hangs
        timer.daemon = True
        timer.start()
        self.on_stall(self.fired)
        self.hard_exit()

    def diagnose(self, phase: str, timeout_s: float) -> records.Diagnosis:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = self.tp.stacks / f"stall-{stamp}"
        out.mkdir(parents=True, exist_ok=True)
        procs = dump_all(self.processes())
        for p in procs:
            name = f"{p.label.replace(' ', '-')}-pid{p.pid}.txt"
            (out / name).write_text(p.text or f"{p.label}: pid {p.pid} on {p.node}: {p.error}\n")
        blame = behind(procs, phase)
        late, frame = blame.proc, blame.frame
        title = f"no progress in the {phase} for {timeout_s:g}s" + (
            f": {late.label} {blame.why}" if late else f" ({blame.why})"
        )
        fix = _stall_fix(blame, phase)
        first = [p for p in procs if p is late] + [p for p in procs if p is not late and p.label != "driver"]
        evidence = [f"{p.label} (pid {p.pid}, {p.node}): {(p.error or _top(p)).splitlines()[0]}" for p in first[:5]]
        diagnosis = records.Diagnosis(
            cause="stall",
            title=title,
            fix=fix,
            exit_code=ExitCode.STALL,
            phase=phase,
            who=f"{late.label} (pid {late.pid})" if late else None,
            node=late.node if late else None,
            pid=late.pid if late else None,
            frame=frame,
            rollout=self.rollout,
            step=self.step,
            evidence=tuple(evidence),
            stacks=records.relative(out, self.tp.root),
            message=title,
        )
        return records.append(self.tp, diagnosis)


def _top(p: ProcStacks) -> str:
    from slime.diagnosis.stacks import job_frame, short

    f = job_frame(p)
    return ("stopped; " if p.stopped else "") + (short(f) if f else "see its stacks")


def _stall_fix(blame: Any, phase: str) -> str:
    slow = "if it is only slow, raise cluster.stall_timeout_s"
    p = blame.proc
    if blame.kind == "user_code":
        return (
            f"your function never returns ({blame.frame}): make it return, with a timeout on what it waits on; {slow}"
        )
    if blame.kind == "stopped":
        return (
            f"{p.label} (pid {p.pid} on {p.node}) was stopped (SIGSTOP, a debugger, a frozen node): resume it "
            f"(kill -CONT {p.pid}) or let the restart policy rerun the job (cluster.slurm.max_stalls)"
        )
    if blame.kind == "collective":
        return (
            f"{p.label} did not reach the collective (it waits in {blame.frame}): see its stack and log; a rank that "
            f"died or diverged first is the cause; {slow}"
        )
    return f"see the stack of what the {phase} waits on ({p.label if p else 'every process'}); {slow}"


def _hard_exit() -> None:
    try:
        import ray

        ray.shutdown()
    finally:
        os._exit(ExitCode.STALL)


def dump_all(processes: list[tuple[str, int, str | None]]) -> list[ProcStacks]:
    """Stacks of ``(label, pid, Ray node id or None for this node)``: this node's here, others by a Ray task."""
    here = _node_id()
    mine = [(label, pid) for label, pid, node in processes if node in (None, here)]
    out = dump_here(mine)
    others: dict[str, list[tuple[str, int]]] = {}
    for label, pid, node in processes:
        if node not in (None, here):
            others.setdefault(node, []).append((label, pid))
    if others:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0)(dump_here)
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(items)
            for node, items in others.items()
        ]
        for (node, items), ref in zip(others.items(), refs):
            try:
                out += ray.get(ref, timeout=120)
            except Exception as exc:  # noqa: BLE001 - that node's Ray may be the problem
                out += [ProcStacks(label, pid, node, error=f"not dumped: {exc}") for label, pid in items]
    return out


def dump_here(items: list[tuple[str, int]]) -> list[ProcStacks]:
    """Stacks of ``(label, pid)`` on this node, and of the Python processes each started (an SGLang engine's
    schedulers); not the driver's: a standalone driver's children are Ray's own daemons."""
    node = socket.gethostname().split(".")[0]
    out, seen = [], {pid for _, pid in items}
    for label, pid in items:
        out.append(dump(label, pid, node))
        kids = [] if label == "driver" else [k for k in descendants(pid) if k not in seen and _is_python(k)]
        seen.update(kids)
        out += [dump(f"{label} child", k, node) for k in kids]
    return out


def _is_python(pid: int) -> bool:
    try:
        return "python" in os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def job_processes(job: Any) -> list[tuple[str, int, str | None]]:
    """(label, pid, Ray node id) of the driver and every actor of ``job`` (trainer ranks, engines, manager).

    Read from Ray's actor table (``ray._private.state``: the public state API needs the dashboard,
    which jobs run without); an actor that is stuck cannot be asked for its pid."""
    import ray

    labels: dict[str, str] = {}
    for g in job.trainers:
        for i, r in enumerate(g.ranks):
            labels[r._actor_id.hex()] = f"{g.role} rank {i}"
    for i, a in enumerate(getattr(job.engines, "actors", None) or []):
        labels[a._actor_id.hex()] = f"engine {i}"
    if job.manager is not None:
        labels[job.manager._actor_id.hex()] = "rollout manager"
    out: list[tuple[str, int, str | None]] = [("driver", os.getpid(), None)]
    for aid, a in ray._private.state.actors().items():
        if aid in labels and a.get("State") == "ALIVE" and a.get("Pid"):
            out.append((labels[aid], int(a["Pid"]), (a.get("Address") or {}).get("NodeID")))
    return sorted(out, key=lambda x: (x[0] != "driver", x[0]))


def start_board() -> Callable[[], dict[str, int]]:
    """Start the job's beat board (``slime.diagnosis.beats``) on this node, after ``ray.init``; returns its
    reader (for :meth:`Watchdog.start`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    board = (
        ray.remote(beats.BeatBoard)
        .options(name=beats.BOARD, num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        .remote()
    )
    return lambda: ray.get(board.read.remote(), timeout=BOARD_READ_S)
