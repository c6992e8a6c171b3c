"""The seccomp filter every :class:`~slime.agent.sandbox.local.LocalSandbox` command runs under.

bubblewrap loads it (``bwrap --seccomp FD``: a compiled classic-BPF program)
as the very last step before it execs the command, after its own mounts and
namespace setup, so bubblewrap itself may use ``mount``/``unshare`` and the
sandboxed program may not. Every process of the sandbox inherits the filter
and no process can remove it.

Why libseccomp through ``pyseccomp``: writing BPF by hand is error-prone
(syscall numbers per architecture, the x32 ABI's high bit, the i386 ABI that
``int 0x80`` reaches from a 64-bit process). libseccomp (Debian's
``libseccomp2``, also what Docker, systemd and Flatpak use) compiles rules
by syscall *name* for several ABIs into one program. ``pyseccomp`` is a thin
pure-Python ctypes binding to ``libseccomp.so.2`` with the API of libseccomp's
own Python bindings, which are not published on PyPI (Debian's
``python3-seccomp`` only serves the system interpreter, not a virtualenv).
The binding is ~500 lines with no compiled part; libseccomp does the work.

What the filter does (x86_64 only; it covers the x86_64, i386 and x32 ABIs):

- Fails with ``EPERM`` (a clean error, not a kill): ``ptrace`` and
  ``process_vm_readv/writev``; ``mount``, ``umount``/``umount2``, the new mount
  API (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``,
  ``fspick``, ``mount_setattr``), ``pivot_root``, ``chroot``; ``kexec_load``,
  ``kexec_file_load``; ``bpf``; ``perf_event_open``; ``userfaultfd``;
  ``keyctl``, ``add_key``, ``request_key``; ``unshare``, ``setns`` and
  ``clone`` with any ``CLONE_NEW*`` flag; ``io_uring_setup``,
  ``io_uring_enter``, ``io_uring_register``; ``name_to_handle_at``,
  ``open_by_handle_at``.
- ``clone3`` fails with ``ENOSYS``: its flags live in memory a filter cannot
  read, and ENOSYS is what makes glibc fall back to ``clone``, whose flags
  the filter checks. (EPERM would break thread creation.)
- A syscall made through another ABI than the three above kills the process.
- Everything else is allowed: this is a deny list that narrows the kernel's
  attack surface, not an allow list. Most of the denied calls already fail
  for lack of capabilities inside the sandbox; the filter keeps the kernel
  code behind them unreachable even if a capability check had a bug.

Not guaranteed: anything on other architectures (``filter_bpf`` raises
:class:`SeccompUnavailable` there rather than build an untested filter), and
kernel bugs reachable through allowed syscalls.
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
