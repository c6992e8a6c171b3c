"""A size-capped tmpfs for a sandbox's persistent ``/work``, mounted on the host.

``/work`` must outlive each ``exec`` (one bubblewrap process per call), so it
cannot be one of bubblewrap's per-call ``--tmpfs`` mounts. Instead the host
directory behind it is itself a tmpfs with ``size=``: writing past the cap
fails with ``ENOSPC`` inside the sandbox, and the host disk is never touched.
Its pages are memory, charged to the writer's memory cgroup (the sandbox's,
see ``cgroup.py``), and freed when the sandbox closes.

Mounting on the host needs ``CAP_SYS_ADMIN`` (root). Without it the caller
keeps ``/work`` on the host disk, capped per file only, and says so.

Why ctypes: ``mount(2)``/``umount2(2)`` are two libc calls; running the
``mount`` binary would cost a process per sandbox start and parse the same
options. A mount this process made and did not remove (it was killed) is
removed by the next sandbox's sweep (``local.py``).
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
