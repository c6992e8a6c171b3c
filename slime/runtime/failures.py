"""Map a failure of the run to an exit code and a one-line message.

0 ok, 1 bug (traceback), 2 bad input, 3 infrastructure, 75 stopped after a checkpoint.
:func:`root_cause` unwraps errors that Ray actors raised. :func:`lost_node_error` turns what a lost
node looks like from the surviving side (a dead actor, a collective error) into an ``InfraError``
naming the host from Ray's node table (exit 3: ``cluster.slurm.max_failures`` applies);
:func:`checkpoint_save_error` turns an ``OSError`` while saving into a ``CheckpointError``.
Not guaranteed: a hostname when the node table cannot be read (the IP then), or telling a crashed
process from a dead node when Ray has not marked it dead in time. See docs/design-notes.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from slime.core.errors import ExitCode

__all__ = [
    "checkpoint_save_error",
    "classify",
    "looks_like_peer_loss",
    "lost_node_error",
    "name_lost_nodes",
    "root_cause",
]

_IP = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
# What a surviving rank's collective says when its peer's process or node is gone (gloo, NCCL, sockets).
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|ncclRemoteError|Connection refused|cannot connect",
    re.I,
)
# What torch.save in a trainer rank raises when the disk fills up (a RuntimeError, not an OSError).
# (a full tmpfs shows as iostream errors or a short write: "unexpected pos N vs M").
_TORCH_WRITE = re.compile(
    r"PytorchStreamWriter failed writing|file write failed|basic_ios::clear|iostream error|unexpected pos \d+ vs \d+"
)
_ACTOR_IP = re.compile(r"^\s*ip: \S+\s*$")  # ActorDiedError's line naming the dead actor's node


def classify(exc: BaseException) -> int:
    from slime.core.errors import InfraError
    from slime.core.registry import UnknownPlugin

    try:
        from slime.placement import PlacementError
    except ImportError:  # pragma: no cover
        PlacementError = InfraError  # type: ignore[assignment,misc]
    if isinstance(exc, (InfraError, PlacementError, TimeoutError, ConnectionError)):
        return ExitCode.INFRA
    if isinstance(exc, (ValueError, UnknownPlugin, FileNotFoundError)):
        return ExitCode.SPEC
    try:
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError):
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            return classify(cause) if cause is not None else ExitCode.BUG
        if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)):
            return ExitCode.INFRA
    except ImportError:  # pragma: no cover
        pass
    return ExitCode.BUG


def root_cause(exc: BaseException) -> BaseException:
    """The user's exception inside a Ray task error (whose text is a whole remote traceback)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def checkpoint_save_error(exc: BaseException, root: Any, rollout_id: int) -> BaseException | None:
    """A ``CheckpointError`` (exit 2) for an ``OSError`` (or torch's failed write) raised while saving
    into ``root`` (here or, wrapped, in a trainer rank), else None. Connection and timeout errors are
    OSErrors too but infrastructure, left to :func:`classify`."""
    from slime.core.errors import CheckpointError

    root_exc = root_cause(exc)
    disk = isinstance(root_exc, OSError) or (
        isinstance(root_exc, RuntimeError) and bool(_TORCH_WRITE.search(str(root_exc)))
    )
    if not disk or isinstance(root_exc, (ConnectionError, TimeoutError)):
        return None
    return CheckpointError(
        f"cannot save the checkpoint of rollout {rollout_id} in {root} (train.checkpoint.dir): "
        f"{root_exc}{_space(root)}. Fix: free disk space there (or lower train.checkpoint.keep, or point "
        "train.checkpoint.dir at a larger file system) or make it writable again, then rerun the task "
        "(it resumes from the newest complete checkpoint there, if any)"
    )


def _space(root: Any) -> str:
    """'; 1.2 MB free, the last checkpoint took 9.8 MB' for the file system of ``root`` (what can be read)."""
    import shutil
    from pathlib import Path

    root = Path(root)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    done = [d for d in root.iterdir() if d.is_dir() and d.name.isdigit()] if root.is_dir() else []
    last = max(done, key=lambda d: int(d.name), default=None)
    need = sum(f.stat().st_size for f in last.rglob("*") if f.is_file()) if last is not None else None
    took = f", the last checkpoint ({last}) took {_mb(need)}" if need is not None else ""
    return f"; {_mb(free)} free there{took}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _ray_death(exc: BaseException) -> bool:
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover
        return False
    return isinstance(
        exc, (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.ObjectLostError, rex.OwnerDiedError)
    )


def _loss_lines(text: str) -> str:
    """The lines of an error that describe a lost peer (a remote traceback also names the reporter's IP)."""
    return "\n".join(ln for ln in text.splitlines() if _PEER_LOSS.search(ln) or _ACTOR_IP.match(ln))


def looks_like_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is what a lost actor, worker or node looks like from the driver."""
    return _ray_death(exc) or bool(_loss_lines(str(root_cause(exc))))


def name_lost_nodes(text: str, nodes: Iterable[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(dead, named): Ray nodes marked dead, and Ray nodes whose IP the loss lines of ``text`` mention,
    each as ``host (ip)``; IPs that are no node of the cluster (a remote reward server) are not named."""

    def label(n: dict[str, Any]) -> str:
        return f"{n.get('NodeManagerHostname') or '?'} ({n.get('NodeManagerAddress') or '?'})"

    nodes = list(nodes)
    by_ip = {n.get("NodeManagerAddress"): n for n in nodes}
    dead = sorted({label(n) for n in nodes if not n.get("Alive", True)})
    named = sorted({label(by_ip[ip]) for ip in _IP.findall(_loss_lines(text)) if ip in by_ip})
    return dead, [h for h in named if h not in dead]


def lost_node_error(
    exc: BaseException,
    *,
    wait_s: float = 8.0,
    named_wait_s: float = 3.0,
    nodes: Callable[[], list[dict[str, Any]]] | None = None,
) -> BaseException | None:
    """An ``InfraError`` naming the lost node(s) when ``exc`` looks like one was lost, else None.

    Waits at most ``wait_s`` (``named_wait_s`` when the error already names a node) for Ray to mark a
    node dead: the launcher stops the driver soon after a node is lost, so the wait is short."""
    if not looks_like_peer_loss(exc):
        return None
    from slime.core.errors import InfraError

    if nodes is None:
        try:
            import ray

            if not ray.is_initialized():
                return None
            nodes = ray.nodes
        except ImportError:  # pragma: no cover
            return None
    root = root_cause(exc)
    text = str(root)
    named_ips = bool(_IP.search(_loss_lines(text)))
    deadline = time.monotonic() + (named_wait_s if named_ips else wait_s)
    while True:
        try:
            dead, named = name_lost_nodes(text, nodes())
        except Exception:  # noqa: BLE001 - the GCS itself may be gone: name what the error says
            dead, named = [], sorted(set(_IP.findall(_loss_lines(text))))
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    lost = dead + named
    if not lost and not _ray_death(exc):
        return None  # a connection error that names no node of this job: not a node loss
    # the last loss line: a remote traceback's message comes after its source lines
    symptom = (_loss_lines(text) or text.strip() or type(root).__name__).splitlines()[-1].strip()[:300]
    hosts = ", ".join(h.split(" (")[0] for h in lost)
    how = (
        "Ray marks the node dead: its Ray died, or the machine or its network failed"
        if dead
        else "a trainer or engine process there died or dropped its connection: the node's Ray died, the machine "
        "or its network failed, or the process was killed (out of memory?)"
    )
    fix = (
        f"if it keeps failing, exclude it (cluster.slurm.exclude: [{hosts}]) or see its Ray logs (worker-*.err)"
        if lost
        else "see the nodes' Ray logs (worker-*.err) for which process died and why"
    )
    return InfraError(
        f"lost {', '.join(lost) or 'a trainer or engine process'} during training ({how}); the "
        f"driver saw: {symptom}. Fix: nothing in the spec; the launcher requeues the job within "
        f"cluster.slurm.max_failures and it resumes from the newest checkpoint; {fix}"
    )


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 8:
        out.append(exc)
        exc = root_cause(exc) if root_cause(exc) is not exc else (exc.__cause__ or exc.__context__)
    return out


def diagnose(
    exc: BaseException,
    code: int,
    *,
    phase: str | None,
    rollout: int | None,
    step: int | None,
    since: float,
    spec: Any = None,
) -> Any:
    """The ``slime.diagnosis`` record of a failed run: its cause, where it happened and what to change.
    ``since``: when the run started (epoch seconds): kernel OOM kills after it name a killed process."""
    import socket

    from slime.diagnosis.causes import CAUSES_BY_KEY, name_cause, remote_where
    from slime.diagnosis.record import Diagnosis

    chain = _chain(exc)
    root = root_cause(exc)  # what the user is told (a Ray task error's cause); the chain adds evidence
    text = "\n".join(str(e) for e in chain if str(e))
    named = name_cause([type(e).__name__ for e in chain], text, code)
    where = remote_where(text)
    who, pid, node = None, None, socket.gethostname().split(".")[0]
    if where is not None:
        who, pid, node = where[0], where[1], _host_of(where[2])
    message = str(root).strip() or type(root).__name__
    cause, title, fix, evidence = named.cause.key, named.cause.title, _fix(named.cause.fix, message), named.evidence
    if cause == "cuda_oom" and spec is not None:  # what the estimate says that role needs (cluster.gpu known)
        fix = f"{fix}; {fit_line(spec, who)}" if fit_line(spec, who) else fix
    oom = _oom_kill(since) if cause in ("process_killed", "node_lost") else None
    if oom is not None:  # the kernel says why the process died
        cause, who, pid = "host_oom", oom.name, oom.pid
        limit = "its memory cgroup's limit" if oom.cgroup else "the node's memory"
        title = f"{oom.name} (pid {oom.pid}) on {node} was killed by the kernel: it exceeded {limit}"
        fix = CAUSES_BY_KEY["host_oom"].fix
        evidence = (oom.line, *evidence[:4])
    return Diagnosis(
        cause=cause,
        title=title,
        fix=fix,
        exit_code=named.cause.exit_code or code,
        phase=phase,
        who=who,
        node=node,
        pid=pid,
        frame=named.frame,
        rollout=rollout,
        step=step,
        evidence=evidence,
        message=message[:4000],
    )


def _fix(generic: str, message: str) -> str:
    """The error's own "Fix: …" (or "; fix …") where it has one: it names the field and the value."""
    m = re.search(r"(?:Fix: |; (?=fix ))(.+)$", message, re.S)
    return m.group(1).strip().split("\n")[0][:600] if m else generic


def _host_of(ip: str) -> str:
    try:
        import ray

        for n in ray.nodes() if ray.is_initialized() else []:
            if n.get("NodeManagerAddress") == ip:
                return f"{n.get('NodeManagerHostname') or ip} ({ip})"
    except Exception:  # noqa: BLE001 - the GCS may be gone: the IP then
        pass
    return ip


def _oom_kill(since: float) -> Any:
    """The newest OOM kill of a Python/Ray process on this node since ``since``, if the kernel logged one."""
    from slime.diagnosis.kernel import oom_kills

    kills = [k for k in oom_kills(since) if k.name.startswith(("ray::", "python"))]
    return kills[-1] if kills else None


def fit_line(spec: Any, who: str | None) -> str | None:
    """The fit estimate of the role ``who`` names (an engine, the critic, else the actor), or None where the
    estimate cannot be made (no cluster.gpu, no readable config.json)."""
    try:
        from slime.fit import estimate
        from slime.fit.breakdown import gib

        report = estimate(spec)
    except Exception:  # noqa: BLE001 - the estimate only adds to the message
        return None
    if report is None:
        return None
    w = (who or "").lower()
    role = "engine" if "engine" in w else "critic" if "critic" in w else "actor"
    r = next((x for x in report.roles if x.role.startswith(role)), None) or report.worst()
    if r is None:
        return None
    return (
        f"the fit estimate for the {r.role}: {gib(r.memory.total)} of {gib(r.capacity)} per GPU "
        f"({r.verdict}; largest: {r.memory.describe()})"
    )
