"""The bubblewrap command line of one :class:`~slime.agent.sandbox.local.LocalSandbox` call.

Kept apart from the sandbox's lifecycle so the mount layout (what the command can see) reads in
one place; ``local.py`` says what is and is not isolated. :class:`CallFds` are the descriptors a
call hands bubblewrap: the seccomp program and the cgroup handshake (``--info-fd`` gives the
sandbox pid, ``--block-fd`` holds it until the caller has moved it into the cgroup), so the
command runs inside the cgroup from its first instruction.
"""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from slime.agent.sandbox.cgroup import MemoryCgroup
from slime.agent.sandbox.processes import read_small
from slime.agent.sandbox.seccomp import pipe_with

__all__ = [
    "AGENT_UID",
    "INIT_ARGV",
    "SANDBOX_WORKDIR",
    "CallFds",
    "Limits",
    "bwrap_prefix",
    "features",
    "identity_files",
    "may_traverse",
]

SANDBOX_WORKDIR = "/work"
AGENT_UID = 1000
MIB = 1024 * 1024
# Read-only /etc entries: dynamic loader, certificates, alternatives links,
# time zone, service/protocol names, shell profile; nothing with secrets.
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
    "nsswitch.conf", "ssl", "ca-certificates", "mime.types", "protocols", "services",
    "hosts", "host.conf", "gai.conf", "bash.bashrc", "profile", "inputrc", "os-release",
    "debian_version",
)  # fmt: skip
ETC_NETWORK_FILES = ("resolv.conf",)
# A shell that does not exec its last command is PID 1 (the namespace's init,
# immune to its own signals), so the command keeps normal signal semantics.
# bwrap's own init is not used (``--as-pid-1``): bwrap exits without reaping
# it, which leaves one zombie per call for the host's init to collect.
INIT_ARGV = ("/bin/sh", "-c", '"$@"; exit $?', "sandbox-init")

_features: dict[str, frozenset[str]] = {}


@dataclass(frozen=True)
class Limits:
    """rlimits applied inside the sandbox with util-linux ``prlimit``."""

    cpu_time_s: int
    memory_mb: int
    max_procs: int
    max_file_mb: int
    max_open_files: int

    def prlimit_argv(self, prlimit: str) -> list[str]:
        pairs = (
            ("cpu", self.cpu_time_s),
            ("as", self.memory_mb * MIB),
            ("nproc", self.max_procs),
            ("fsize", self.max_file_mb * MIB),
            ("nofile", self.max_open_files),
            ("core", 0),  # a core_pattern helper would run on the host
        )
        return [prlimit, *(f"--{name}={value}:{value}" for name, value in pairs), "--"]


def features(bwrap: str) -> frozenset[str]:
    """Optional bwrap options this binary knows (asked once per binary)."""
    if bwrap not in _features:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
        text = out.stdout + out.stderr
        _features[bwrap] = frozenset(o for o in ("--disable-userns", "--size") if o in text)
    return _features[bwrap]


def bwrap_prefix(
    bwrap: str,
    *,
    network: bool,
    state_dir: Path,
    ro_binds: list[tuple[str, str]],
    tmp_mb: int,
) -> list[str]:
    """Everything before ``--chdir DIR -- COMMAND``; the same for every call of a sandbox."""
    opts = features(bwrap)
    out = [bwrap, "--unshare-all", "--unshare-user"]
    if network:
        out.append("--share-net")
    if "--disable-userns" in opts:
        out.append("--disable-userns")
    out += ["--uid", str(AGENT_UID), "--gid", str(AGENT_UID), "--die-with-parent"]
    out += ["--new-session", "--hostname", "sandbox", "--as-pid-1", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            out += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            out += ["--ro-bind", host, host]
    etc = [*ETC_FILES, *(ETC_NETWORK_FILES if network else ())]
    etc += [os.path.basename(p) for p in glob.glob("/etc/python3*")]
    for name in etc:
        out += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    out += ["--ro-bind", str(state_dir / "passwd"), "/etc/passwd"]
    out += ["--ro-bind", str(state_dir / "group"), "/etc/group"]
    for src, dest in ro_binds:
        out += ["--ro-bind", src, dest]
    size = ["--size", str(tmp_mb * MIB)] if "--size" in opts else []
    out += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm"]
    out += ["--remount-ro", "/dev", *size, "--tmpfs", "/tmp"]
    out += ["--bind", str(state_dir / "work"), SANDBOX_WORKDIR, "--remount-ro", "/"]
    return out


def identity_files() -> dict[str, str]:
    """``/etc/passwd`` and ``/etc/group`` as the sandboxed command sees them."""
    return {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agent:x:{AGENT_UID}:{AGENT_UID}:agent:{SANDBOX_WORKDIR}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nagent:x:{AGENT_UID}:\nnogroup:x:65534:\n",
    }


def may_traverse(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no supplementary groups) may enter a directory."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


class CallFds:
    """bwrap options and descriptors of one call (see the module docstring)."""

    def __init__(self, program: bytes | None, join_cgroup: bool) -> None:
        self.argv: list[str] = []
        self.child_fds: list[int] = []  # bwrap's ends, closed here once it started
        self.info_r = self.block_w = -1
        try:
            if program is not None:
                fd = pipe_with(program)
                self.child_fds.append(fd)
                self.argv += ["--seccomp", str(fd)]
            if join_cgroup:
                self.info_r, info_w = os.pipe()
                self.child_fds.append(info_w)
                block_r, self.block_w = os.pipe()
                self.child_fds.append(block_r)
                self.argv += ["--info-fd", str(info_w), "--block-fd", str(block_r)]
        except BaseException:
            self.close()
            raise

    def started(self) -> None:
        """bwrap holds its copies now: drop ours, or EOF would never come."""
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = []

    async def join(self, cgroup: MemoryCgroup) -> None:
        """Move bwrap's sandbox process into ``cgroup``, then let it go on.

        Raises OSError if the move fails: the caller must then kill the call,
        whose process is still waiting and has run nothing of the command.
        """
        fd, self.info_r = self.info_r, -1
        info = await read_small(fd)
        if info.strip():  # empty: bwrap failed before creating the process
            cgroup.add(int(json.loads(info)["child-pid"]))
        try:
            os.write(self.block_w, b"1")
        except BrokenPipeError:  # bwrap already exited; its status says why
            pass

    def close(self) -> None:
        for fd in [*self.child_fds, self.info_r, self.block_w]:
            if fd >= 0:
                os.close(fd)
        self.child_fds, self.info_r, self.block_w = [], -1, -1
