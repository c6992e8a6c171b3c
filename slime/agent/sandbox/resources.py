"""Whole-sandbox caps of a :class:`~slime.agent.sandbox.local.LocalSandbox`: total memory and ``/work`` size.

:class:`Resources` sets up, for one sandbox, the memory cgroup (``cgroup.py``)
and the tmpfs behind ``/work`` (``workfs.py``) where this host allows them,
records in :attr:`Resources.enforcement` what is enforced and how, warns once
per process for each cap that falls back, and undoes it all on ``release``.
It also sweeps what a killed process left behind (state directories with
their tmpfs, empty cgroups) the first time a sandbox starts under a root.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from slime.agent.sandbox import cgroup, hostfs, workfs

__all__ = ["Resources", "sweep_state_root"]

log = logging.getLogger(__name__)
MIB = 1024 * 1024
OWNER_FILE = "owner"
_warned: set[str] = set()
_swept: set[str] = set()
_parent: list[cgroup.Parent | str] = []  # find_parent() once per process


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def cgroup_parent() -> cgroup.Parent | str:
    if not _parent:
        _parent.append(cgroup.find_parent())
    return _parent[0]


class Resources:
    """The caps of one sandbox (see the module docstring)."""

    def __init__(self, state: Path, name: str, *, work_mb: int, total_memory_mb: int, uid: int, gid: int) -> None:
        self.state = state
        self.work_mounted = False
        self.cgroup: cgroup.MemoryCgroup | None = None
        self.enforcement: dict[str, str] = {}
        try:
            self._mount_work(work_mb, uid, gid)
            self._make_cgroup(name, total_memory_mb)
        except BaseException:
            self.release()
            raise

    @property
    def work(self) -> Path:
        return self.state / "work"

    def _mount_work(self, work_mb: int, uid: int, gid: int) -> None:
        if os.geteuid() != 0:
            why = "mounting a tmpfs on the host needs root"
        else:
            try:
                workfs.mount_tmpfs(self.work, work_mb * MIB, uid, gid)
            except OSError as exc:
                why = str(exc)
            else:
                self.work_mounted = True
                self.enforcement["work_size"] = f"tmpfs of {work_mb} MiB"
                return
        self.enforcement["work_size"] = f"NOT capped: /work is on the host disk, per-file cap only ({why})"
        _warn_once("work", f"sandbox /work is not size-capped on this host ({why}); only each file is capped")

    def _make_cgroup(self, name: str, total_memory_mb: int) -> None:
        parent = cgroup_parent()
        if isinstance(parent, cgroup.Parent):
            if parent.path.as_posix() not in _swept:
                _swept.add(parent.path.as_posix())
                cgroup.sweep(parent)
            try:
                self.cgroup = cgroup.MemoryCgroup(parent, name, total_memory_mb * MIB)
            except OSError as exc:
                why = f"cannot create a memory cgroup under {parent.path}: {exc.strerror}"
            else:
                self.enforcement["total_memory"] = f"cgroup v{parent.version}, {total_memory_mb} MiB"
                return
        else:
            why = parent
        self.enforcement["total_memory"] = f"NOT capped: per-process rlimits only ({why})"
        _warn_once(
            "memory",
            f"sandbox memory is capped per process only, not in total ({why}); the worst case is max_procs x memory_mb",
        )

    def release(self) -> None:
        """Kill what is left in the cgroup, remove it, unmount ``/work`` (best effort)."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.work_mounted:
            try:
                workfs.unmount(self.work)
            except OSError as exc:
                log.warning("sandbox state %s: %s", self.state, exc)
            self.work_mounted = False


def write_owner(state: Path) -> None:
    (state / OWNER_FILE).write_text(cgroup.owner_tag())


def sweep_state_root(root: Path) -> None:
    """Remove state directories (and their tmpfs) left by processes that are gone; once per root."""
    if root.as_posix() in _swept:
        return
    _swept.add(root.as_posix())
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            tag = (Path(entry.path) / OWNER_FILE).read_text()
        except OSError:
            continue  # not ours, or made by an older version: leave it
        if not cgroup.owner_alive(tag):
            try:
                workfs.unmount(Path(entry.path) / "work")
                hostfs.remove_tree(Path(entry.path))
            except OSError as exc:
                log.warning("cannot remove the stale sandbox state %s: %s", entry.path, exc)
