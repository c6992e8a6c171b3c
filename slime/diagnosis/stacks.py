"""Python stacks of running processes, read from outside with py-spy, and the frame each waits in.

py-spy (a dependency of the runtime extra) reads a process's stacks without its cooperation, also one
that is stuck in C or stopped (SIGSTOP). The calling process's own threads are read in-process
(``sys._current_frames``: py-spy cannot attach to its caller). Without py-spy, or where it fails, a
worker's own faulthandler dump is asked for (``fault_dump``); else it is listed as not dumped, with the
reasons. Not guaranteed: native frames (py-spy's ``--native`` is slow and needs debug symbols).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Blame", "ProcStacks", "behind", "dump", "own_threads", "pyspy", "user_frame"]

# Frames in these trees are libraries, not where a user or the job logic waits.
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen", "<string>")
_COLLECTIVE = ("all_reduce", "all_gather", "broadcast", "barrier", "reduce_scatter", "recv", "send", "wait")


@dataclass(slots=True)
class ProcStacks:
    label: str  # "actor rank 1", "engine 0", "driver", …
    pid: int
    node: str
    threads: list[dict] = field(default_factory=list)  # py-spy's JSON: frames innermost first
    text: str = ""
    error: str | None = None
    stopped: bool = False  # the process is stopped (SIGSTOP or a debugger)
    via: str = "py-spy"  # what read the stacks: py-spy, faulthandler (the process's own dump), in-process

    def frames(self) -> list[dict]:
        """Every frame, main thread first, innermost first within a thread."""
        threads = sorted(self.threads, key=lambda t: t.get("thread_name") != "MainThread")
        return [f for t in threads for f in t.get("frames", [])]


def pyspy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


def _pyspy(tool: str, pid: int, nonblocking: bool, timeout_s: float) -> subprocess.CompletedProcess | str:
    try:
        return subprocess.run(
            # a stopped process cannot be attached to and paused: read its memory as it is
            [tool, "dump", "--pid", str(pid), "--json", *(["--nonblocking"] if nonblocking else [])],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"


def dump(label: str, pid: int, node: str, *, timeout_s: float = 30.0) -> ProcStacks:
    """The stacks of process ``pid`` on this node (py-spy; this process's own by faulthandler)."""
    out = ProcStacks(label, pid, node, stopped=_stopped(pid))
    tool = pyspy()
    if pid == os.getpid():  # py-spy cannot attach to its caller: read our own threads
        out.threads, out.via = own_threads(), "in-process"
        out.text = render(out)
        return out
    if tool is None:
        return _fallback(out, "py-spy is not installed (pip install py-spy)")
    run = _pyspy(tool, pid, out.stopped, timeout_s)
    if isinstance(run, subprocess.CompletedProcess) and run.returncode != 0 and not out.stopped:
        out.stopped = _stopped(pid)  # stopped between our look and py-spy's attach: read it as it is
        run = _pyspy(tool, pid, True, timeout_s) if out.stopped else run
    if isinstance(run, str):
        return _fallback(out, run)
    if run.returncode != 0:
        return _fallback(out, f"py-spy failed: {(run.stderr or run.stdout).strip()[-500:]}")
    try:
        out.threads = json.loads(run.stdout)
    except json.JSONDecodeError:
        return _fallback(out, "py-spy printed no JSON")
    out.text = render(out)
    return out


def _fallback(out: ProcStacks, why: str) -> ProcStacks:
    """The process's own faulthandler dump where py-spy could not read it (``why``)."""
    from slime.diagnosis.fault_dump import request

    threads = "it is stopped: it cannot dump itself" if out.stopped else request(out.pid)
    if isinstance(threads, str):
        out.error = f"{why}; faulthandler: {threads}"
        return out
    out.threads, out.via = threads, "faulthandler"
    out.text = render(out)
    return out


def own_threads() -> list[dict]:
    """This process's threads in py-spy's JSON shape (innermost frame first), but the watchdog's own."""
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "slime-watchdog":
            continue
        frames = []
        while frame is not None:
            code = frame.f_code
            frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno})
            frame = frame.f_back
        out.append({"thread_id": ident, "thread_name": names.get(ident, "?"), "frames": frames})
    return out


def render(p: ProcStacks) -> str:
    via = " (its own faulthandler dump)" if p.via == "faulthandler" else ""
    lines = [f"{p.label}: pid {p.pid} on {p.node}" + (" (stopped)" if p.stopped else "") + via]
    for t in p.threads:
        lines.append(f"\nThread {t.get('os_thread_id') or t.get('thread_id')} ({t.get('thread_name') or '?'})")
        lines += [f"    {fr.get('name')} ({fr.get('filename')}:{fr.get('line')})" for fr in t.get("frames", [])]
    return "\n".join(lines) + "\n"


def where(frame: dict) -> str:
    return f"{frame.get('name')} ({frame.get('filename')}:{frame.get('line')})"


def short(frame: dict) -> str:
    return f"{frame.get('name')} ({Path(str(frame.get('filename'))).name}:{frame.get('line')})"


_OURS = tuple(str(Path(__file__).resolve().parents[2] / d) for d in ("slime", "launchers"))


def user_frame(p: ProcStacks) -> dict | None:
    """The innermost frame of user code (outside the libraries and slime-submit's own), else None."""
    for fr in p.frames():
        name = str(fr.get("filename") or "")
        if name and not any(m in name for m in _LIBRARY) and not name.startswith(_OURS):
            return fr
    return None


def job_frame(p: ProcStacks) -> dict | None:
    """The innermost frame in slime's own code (what the job logic waits in), else the innermost one."""
    slime_root = str(Path(__file__).resolve().parents[1])
    frames = p.frames()
    return next(
        (f for f in frames if str(f.get("filename") or "").startswith(slime_root)), frames[0] if frames else None
    )


def in_collective(p: ProcStacks) -> bool:
    """Whether the process waits in a collective (torch.distributed) in any thread."""
    return any(
        "distributed" in str(f.get("filename")) and any(c in str(f.get("name")) for c in _COLLECTIVE)
        for f in p.frames()
    )


# Which processes each phase waits on, first the likeliest to be behind (by label prefix).
_WAITS_ON = {
    "engine start": ("engine",),
    "rollout": ("engine", "rollout manager"),
    "eval": ("engine", "rollout manager"),
    "first train step": ("actor rank", "critic rank"),
    "train step": ("actor rank", "critic rank"),
    "weight sync": ("actor rank", "engine"),
    "checkpoint save": ("actor rank", "critic rank", "rollout manager"),
}


@dataclass(frozen=True, slots=True)
class Blame:
    proc: ProcStacks | None
    frame: str | None  # the frame it waits in
    why: str  # a phrase after the process's label
    kind: str  # stopped | user_code | collective | phase | unknown


def behind(procs: list[ProcStacks], phase: str) -> Blame:
    """The process that is behind after a stall in ``phase``, and the frame it waits in."""
    for p in procs:
        if p.stopped:
            f = job_frame(p)
            return Blame(p, where(f) if f else None, "is stopped (SIGSTOP or a debugger)", "stopped")
    for p in procs:
        f = user_frame(p)
        if f is not None:
            return Blame(p, where(f), "waits in your code", "user_code")
    ranks = [p for p in procs if " rank " in p.label and p.threads]
    waiting = [p for p in ranks if in_collective(p)]
    if waiting and len(waiting) < len(ranks):
        p = next(r for r in ranks if r not in waiting)
        f = job_frame(p)
        return Blame(
            p, where(f) if f else None, f"never joined the collective {waiting[0].label} waits in", "collective"
        )
    for prefix in _WAITS_ON.get(phase, ()):
        for p in procs:
            if p.label.startswith(prefix) and p.threads:
                f = job_frame(p)
                return Blame(p, where(f) if f else None, f"is what the {phase} waits on", "phase")
    driver = next((p for p in procs if p.label == "driver" and p.threads), None)
    f = job_frame(driver) if driver is not None else None
    if f is not None:  # nothing started yet to wait on (placement, a load): where the driver waits
        return Blame(driver, where(f), f"waits in {f.get('name')}", "driver")
    return Blame(None, None, "no process stands out: see every stack", "unknown")


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, recursively (read from /proc: Linux)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[-1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out
