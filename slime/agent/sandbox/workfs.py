"""A size-capped tmpfs for a sandbox's persistent ``/work``, mounted on the host.

``/work`` outlives each ``exec``, so it cannot be a per-call bubblewrap tmpfs; the host directory
behind it is a tmpfs with ``size=`` instead: past the cap writes fail with ``ENOSPC``, the host
disk is never touched, and its pages count against the sandbox's memory cgroup. Needs root
(``CAP_SYS_ADMIN``); without it the caller keeps ``/work`` on disk, capped per file, and says so.
Why ctypes: ``mount``/``umount2`` are two libc calls, cheaper than a ``mount`` process per start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

__all__ = ["mount_tmpfs", "unmount"]

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mount_tmpfs(target: Path, size_bytes: int, uid: int, gid: int) -> None:
    """Mount a tmpfs of ``size_bytes`` at ``target``, root directory ``uid:gid`` mode 0700."""
    opts = f"size={size_bytes},mode=0700,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Lazily unmount ``target`` (a no-op if nothing is mounted there)."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point / gone
            raise OSError(err, f"unmount {target}: {os.strerror(err)}")
