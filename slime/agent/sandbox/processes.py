"""Process helpers for :class:`~slime.agent.sandbox.local.LocalSandbox`."""

from __future__ import annotations

import asyncio
import os
import signal

__all__ = ["Capture", "children", "killpg", "read_small", "shell_returncode"]


class Capture:
    """Reads one pipe to EOF, keeping at most ``cap`` bytes (the rest is drained).

    Owns the read end from construction, so it is closed even if :meth:`drain`
    never runs.
    """

    def __init__(self, fd: int, cap: int) -> None:
        self.file = os.fdopen(fd, "rb", buffering=0)
        self.cap = cap
        self.data = bytearray()
        self.cut = False

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        try:
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self.file)
        except BaseException:
            self.file.close()
            raise
        try:
            while chunk := await reader.read(65536):
                room = self.cap - len(self.data)
                if room > 0:
                    self.data += chunk[:room]
                if len(chunk) > room:
                    self.cut = True
        finally:
            transport.close()

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", "replace")

    def close(self) -> None:
        self.file.close()


async def read_small(fd: int, cap: int = 65536) -> bytes:
    """Read a pipe to EOF (at most ``cap`` bytes) without blocking the event loop; closes ``fd``."""
    capture = Capture(fd, cap)
    try:
        await capture.drain()
    finally:
        capture.close()
    return bytes(capture.data)


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:  # kernel without CONFIG_PROC_CHILDREN: scan /proc
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid:
                    out.append(int(entry))
        return out


def shell_returncode(rc: int | None) -> int:
    """A signal death reported the way a shell does (128 + signal number)."""
    if rc is None:
        return -1
    return 128 - rc if rc < 0 else rc
