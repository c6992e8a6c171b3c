"""The seccomp filter every :class:`~slime.agent.sandbox.local.LocalSandbox` command runs under.

bubblewrap loads it as its last step before exec, so it may mount and unshare and the command may
not; every process inherits it. A deny list (x86_64, i386 and x32 ABIs): ptrace, mounts, kexec, bpf,
perf, userfaultfd, keyrings, namespace creation and io_uring fail with EPERM; ``clone3`` with ENOSYS
(glibc falls back to ``clone``, whose flags are checked); other ABIs kill. Why libseccomp via
``pyseccomp``: it compiles rules by name for every ABI; hand-written BPF is error-prone.
Not guaranteed: other architectures (``SeccompUnavailable``), kernel bugs behind allowed calls.
"""

from __future__ import annotations

import errno
import os
import platform
import tempfile
from functools import cache

from slime.agent.sandbox.base import IsolationUnavailable

__all__ = ["CLONE_NS_FLAGS", "DENIED_ENOSYS", "DENIED_EPERM", "SeccompUnavailable", "filter_bpf"]

DENIED_EPERM = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount", "umount2", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "pivot_root", "chroot",
    "kexec_load", "kexec_file_load",
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    "unshare", "setns",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "name_to_handle_at", "open_by_handle_at",
)  # fmt: skip
DENIED_ENOSYS = ("clone3",)
# clone(2) flags that create namespaces (CLONE_NEWTIME only exists for unshare/clone3).
CLONE_NS_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# Machine (uname -m) -> the ABIs the filter is built for; the first is the native one.
_ABIS = {"x86_64": ("X86_64", "X86", "X32")}


class SeccompUnavailable(IsolationUnavailable):
    """The seccomp filter cannot be built here (library missing, unsupported architecture)."""


def filter_bpf(machine: str | None = None) -> bytes:
    """The compiled filter for ``machine`` (default: this one), built once per process."""
    return _build(machine or platform.machine())


@cache
def _build(machine: str) -> bytes:
    if machine not in _ABIS:
        raise SeccompUnavailable(
            f"the sandbox's seccomp filter is built and tested for {', '.join(_ABIS)} only; this machine "
            f"is {machine}. Run agent tools on an x86_64 host or use the e2b sandbox backend"
        )
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as exc:  # RuntimeError: libseccomp.so.2 not found
        raise SeccompUnavailable(
            f"cannot build the sandbox's seccomp filter ({exc}); install the Debian package libseccomp2 "
            "and the Python package pyseccomp (pip install 'slime-submit[agent]')"
        ) from None
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    native, *others = (getattr(sc.Arch, abi) for abi in _ABIS[machine])
    if sc.system_arch() != native:
        raise SeccompUnavailable(f"libseccomp reports native arch {sc.system_arch():#x}, expected {native:#x}")
    for arch in others:
        flt.add_arch(arch)
    for name in DENIED_EPERM:
        flt.add_rule(sc.ERRNO(errno.EPERM), _syscall(sc, name))
    for name in DENIED_ENOSYS:
        flt.add_rule(sc.ERRNO(errno.ENOSYS), _syscall(sc, name))
    clone = _syscall(sc, "clone")
    for flag in CLONE_NS_FLAGS.values():
        flt.add_rule(sc.ERRNO(errno.EPERM), clone, sc.Arg(0, sc.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        program = f.read()
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed filter ({len(program)} bytes)")
    return program


def _syscall(sc: object, name: str) -> int:
    """The syscall number (a negative pseudo-number for calls absent on the native ABI)."""
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)  # type: ignore[attr-defined]
    # libseccomp's pseudo-numbers for other ABIs' calls are <= -10000; -1 means unknown.
    if nr == -1:
        raise SeccompUnavailable(f"libseccomp does not know the syscall {name!r}; update libseccomp2")
    return nr


def pipe_with(program: bytes) -> int:
    """A pipe's read end holding ``program`` (bwrap reads ``--seccomp FD`` to EOF)."""
    r, w = os.pipe()
    try:
        os.write(w, program)  # a few KiB: well under the pipe buffer
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r
