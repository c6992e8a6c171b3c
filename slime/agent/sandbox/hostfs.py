"""Files in a sandbox's working directory, reached from the host without following links.

The sandboxed command owns its working directory and may plant symlinks,
FIFOs or directories where the caller expects files. Every path component is
therefore opened with ``O_NOFOLLOW`` relative to its parent's descriptor, the
final file must be a regular file, and FIFOs are opened non-blocking so they
cannot hang the caller. ``..`` is refused and absolute paths must lie under the
working directory.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from pathlib import Path

from slime.agent.sandbox.base import SandboxError

__all__ = ["fs_error", "read_nofollow", "relative_parts", "remove_tree", "write_nofollow"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def relative_parts(path: str, root: str) -> list[str]:
    """``path`` (relative, or absolute under ``root``) as components below ``root``."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SandboxError(f"invalid sandbox path {path!r}")
    rel = path
    if path.startswith("/"):
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            raise SandboxError(
                f"{path!r} is outside the sandbox working directory {root}; only files under "
                f"{root} persist between commands (give a path under it or a relative one)"
            )
        rel = path[len(root) :]
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise SandboxError(f"invalid sandbox file path {path!r} (no '..', must name a file)")
    return parts


def _open_parent(top: Path, parts: list[str], owner: tuple[int, int] | None, create: bool) -> int:
    fd = os.open(top, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_nofollow(top: Path, parts: list[str], data: bytes, owner: tuple[int, int] | None) -> None:
    """Create or overwrite ``top/parts`` (parents created, chowned to ``owner`` if given)."""
    dfd = _open_parent(top, parts, owner, create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(parts[-1], flags, 0o644, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxError(f"{'/'.join(parts)} exists and is not a regular file")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def read_nofollow(top: Path, parts: list[str], cap: int) -> bytes:
    """The content of the regular file ``top/parts``, refusing files over ``cap`` bytes."""
    dfd = _open_parent(top, parts, None, create=False)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SandboxError(f"{'/'.join(parts)} is not a regular file")
        if st.st_size > cap:
            raise SandboxError(f"{'/'.join(parts)} is {st.st_size} bytes, over the {cap}-byte cap")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def fs_error(op: str, path: str, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return f"cannot {op} {path!r}: a path component is a symlink or not a directory"
    if exc.errno == errno.ENOENT:
        return f"cannot {op} {path!r}: no such file"
    return f"cannot {op} {path!r}: {exc.strerror}"


def remove_tree(path: Path) -> None:
    """``rm -rf`` that also removes directories the sandbox made unwritable."""

    def make_writable(func, failed, *_):
        os.chmod(os.path.dirname(failed), 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        func(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)
