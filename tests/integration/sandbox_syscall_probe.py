"""Runs INSIDE a LocalSandbox (python3 of the host's /usr): tries each syscall the seccomp
filter denies, with arguments chosen so that, without the filter, the kernel answers
differently (success, or an errno other than the filter's) wherever it can, and prints
one JSON object {name: errno, 0 for success}. x86_64 syscall numbers.

Nothing here can harm the host even unfiltered: the sandbox has no capabilities, and
each call targets a missing path, a bad descriptor or the program's own child.
"""

import ctypes
import json
import os
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pivot_root": 155,
    "chroot": 161, "kexec_load": 246, "kexec_file_load": 320, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272,
    "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "clone3": 435, "clone": 56,
}  # fmt: skip
MISSING = b"/nonexistent-probe-path"
AT_FDCWD = -100
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
held = []  # descriptors that calls returned: kept open until the end (see HOLD)


def call(name, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(NR[name]), *conv)
    if rc < 0:
        return ctypes.get_errno()
    if name == "clone" and rc == 0:
        os._exit(0)  # the (unexpected) child of a namespace clone
    if name in ("io_uring_setup", "userfaultfd", "perf_event_open", "fsopen", "open_tree"):
        held.append(rc)
    return 0


def attach_own_child():
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    try:
        err = call("ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
        if err == 0:
            os.waitpid(pid, 0)  # the tracee stopped: the attach really happened
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return err


def probes():
    buf = ctypes.create_string_buffer(256)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 16)
    uring_params = ctypes.create_string_buffer(120)
    perf_attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(perf_attr, 0).value = 1  # PERF_TYPE_SOFTWARE, config 0: cpu-clock
    ctypes.c_uint32.from_buffer(perf_attr, 4).value = 128  # attr size
    ctypes.c_uint64.from_buffer(perf_attr, 40).value = 1 << 5 | 1 << 6  # exclude_kernel, exclude_hv
    return {
        "ptrace": attach_own_child,
        "process_vm_readv": lambda: call("process_vm_readv", os.getpid(), iov, 1, iov, 1, 0),
        "process_vm_writev": lambda: call("process_vm_writev", os.getpid(), iov, 1, iov, 1, 0),
        "mount": lambda: call("mount", b"none", MISSING, b"tmpfs", 0, None),
        "umount2": lambda: call("umount2", MISSING, 0),
        "open_tree": lambda: call("open_tree", AT_FDCWD, b"/work", 0),
        "move_mount": lambda: call("move_mount", -1, MISSING, -1, MISSING, 0),
        "fsopen": lambda: call("fsopen", b"tmpfs", 0),
        "fsconfig": lambda: call("fsconfig", -1, 0, None, None, 0),
        "fsmount": lambda: call("fsmount", -1, 0, 0),
        "fspick": lambda: call("fspick", AT_FDCWD, MISSING, 0),
        "mount_setattr": lambda: call("mount_setattr", AT_FDCWD, MISSING, 0, None, 0),
        "pivot_root": lambda: call("pivot_root", MISSING, MISSING),
        "chroot": lambda: call("chroot", MISSING),
        "kexec_load": lambda: call("kexec_load", 0, 0, None, 0),
        "kexec_file_load": lambda: call("kexec_file_load", -1, -1, 0, None, 0),
        "bpf": lambda: call("bpf", 0x7FFFFFFF, None, 0),
        "perf_event_open": lambda: call("perf_event_open", perf_attr, 0, -1, -1, 0),
        "userfaultfd": lambda: call("userfaultfd", 1),  # UFFD_USER_MODE_ONLY
        "keyctl": lambda: call("keyctl", 0, -3, 0),  # KEYCTL_GET_KEYRING_ID, session keyring
        # An unknown keyring: unfiltered this fails (ENOKEY) rather than leave a key in the kernel.
        "add_key": lambda: call("add_key", b"user", b"probe", b"x", 1, 0x7FFFFFFF),
        "request_key": lambda: call("request_key", b"user", b"probe-missing", None, 0),
        "unshare": lambda: call("unshare", 0),
        "unshare(CLONE_NEWUSER)": lambda: call("unshare", CLONE_NEWUSER),
        "setns": lambda: call("setns", -1, 0),
        "clone(CLONE_NEWUSER)": lambda: call("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
        "clone3": lambda: call("clone3", None, 0),
        "io_uring_setup": lambda: call("io_uring_setup", 4, uring_params),
        "io_uring_enter": lambda: call("io_uring_enter", -1, 0, 0, 0, None, 0),
        "io_uring_register": lambda: call("io_uring_register", -1, 0, None, 0),
        "name_to_handle_at": lambda: call("name_to_handle_at", AT_FDCWD, MISSING, None, None, 0),
        "open_by_handle_at": lambda: call("open_by_handle_at", -1, None, 0),
    }


if __name__ == "__main__":
    names = sys.argv[1:] or list(probes())
    table = probes()
    out = {name: table[name]() for name in names}
    print(json.dumps(out))
    sys.stdout.flush()
    hold = float(os.environ.get("HOLD", "0"))  # keep returned descriptors open for the host to look
    if hold:
        open("/work/holding", "w").close()
        time.sleep(hold)
