"""Escape tests for LocalSandbox's hardening: the seccomp filter, the total memory cap, the /work cap.

Each attempt runs as a small program inside a real bubblewrap sandbox and is checked
twice: against the restriction (it must fail with the exact errno, or be stopped) and
without it (``seccomp=False``, a larger cap) where the same program gets through, so a
test fails if the restriction silently stops applying. Each also asserts the host is
untouched. Needs bubblewrap (as in test_sandbox_local.py); the seccomp tests need
x86_64, the memory tests a memory cgroup and the /work tests root (a host tmpfs
mount): elsewhere they skip, saying why.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import pytest

from slime.agent.sandbox import IsolationUnavailable
from slime.agent.sandbox.local import LocalSandbox
from slime.agent.sandbox.seccomp import DENIED_ENOSYS, DENIED_EPERM

PROBE = (Path(__file__).parent / "sandbox_syscall_probe.py").read_text()
# A host uid no other test uses, so host-side scans find only this test's sandbox processes.
PROBE_UID = 61234
# These fail with EPERM without the filter too: the kernel checks CAP_SYS_ADMIN in the
# sandbox's user namespace (which has none) before it looks at any argument.
EPERM_ANYWAY = {"move_mount", "fsopen", "fsmount", "fspick", "pivot_root"}
# The sandbox runs on the host's kernel; these anonymous inodes are what the calls
# would create there.
ANON_INODES = ("anon_inode:[io_uring]", "anon_inode:[userfaultfd]", "anon_inode:[perf_event]")


def run(coro):
    return asyncio.run(coro)


_availability: list[str | None] = []


def _unavailable() -> str | None:
    if not _availability:

        async def probe() -> str | None:
            try:
                async with LocalSandbox():
                    return None
            except IsolationUnavailable as exc:
                return str(exc)

        _availability.append(run(probe()))
    return _availability[0]


@pytest.fixture
def isolated():
    if platform.machine() != "x86_64":
        pytest.skip(f"the seccomp filter and these probes are x86_64-only; this is {platform.machine()}")
    reason = _unavailable()
    if reason:
        pytest.skip(f"bubblewrap isolation unavailable here: {reason}")


pytestmark = pytest.mark.usefixtures("isolated")


async def _probe(*names: str, seccomp: bool = True, hold: float = 0.0, **kw):
    """Run the syscall probe; with ``hold``, also list host processes holding its descriptors."""
    async with LocalSandbox(seccomp=seccomp, **kw) as sb:
        await sb.write_file("probe.py", PROBE)
        task = asyncio.ensure_future(
            sb.exec(["python3", "probe.py", *names], timeout=30, env={"HOLD": str(hold)} if hold else None)
        )
        held: list[str] = []
        if hold:
            while not (sb.host_workdir / "holding").exists() and not task.done():
                await asyncio.sleep(0.02)
            held = _host_anon_inodes(PROBE_UID)
        res = await task
    assert res.ok, res
    return json.loads(res.stdout), held


def _host_anon_inodes(uid: int) -> list[str]:
    """The io_uring/userfaultfd/perf descriptors held by host processes running as ``uid``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target in ANON_INODES:
                    found.append(target)
        except OSError:
            continue  # the process exited meanwhile
    return sorted(found)


def test_every_denied_syscall_fails_with_the_filters_errno_and_only_because_of_it():
    filtered, _ = run(_probe())
    unfiltered, _ = run(_probe(seccomp=False))
    assert set(filtered) >= set(DENIED_EPERM + DENIED_ENOSYS) - {"umount"}  # umount: i386 only
    expected = dict.fromkeys(filtered, errno.EPERM) | dict.fromkeys(DENIED_ENOSYS, errno.ENOSYS)
    assert filtered == expected
    # Without the filter the same calls get through or fail differently: the filter made the difference.
    differs = {name for name, err in unfiltered.items() if err != expected[name]}
    assert differs == set(filtered) - EPERM_ANYWAY, unfiltered
    assert all(unfiltered[name] == errno.EPERM for name in EPERM_ANYWAY)


@pytest.mark.skipif(os.geteuid() != 0, reason="scanning other uids' descriptors in /proc needs root")
def test_io_uring_userfaultfd_and_perf_leave_nothing_in_the_host_kernel():
    names = ("io_uring_setup", "userfaultfd", "perf_event_open")
    filtered, held = run(_probe(*names, hold=5.0, host_uid=PROBE_UID, host_gid=PROBE_UID))
    assert filtered == dict.fromkeys(names, errno.EPERM)
    assert held == []
    # The same program without the filter does create them, and the scan sees them.
    unfiltered, held = run(_probe(*names, seccomp=False, hold=5.0, host_uid=PROBE_UID, host_gid=PROBE_UID))
    assert unfiltered == dict.fromkeys(names, 0)
    assert held == sorted(ANON_INODES)


def test_ptrace_attach_to_a_sibling_process_is_refused():
    filtered, _ = run(_probe("ptrace", "process_vm_readv"))
    unfiltered, _ = run(_probe("ptrace", "process_vm_readv", seccomp=False))
    assert filtered == {"ptrace": errno.EPERM, "process_vm_readv": errno.EPERM}
    assert unfiltered == {"ptrace": 0, "process_vm_readv": 0}  # attached: the tracee stopped


def _host_mounts() -> set[str]:
    """The host's mount table without sandbox ``/work`` mounts: other tests (on the other pytest-xdist worker)
    start and stop sandboxes meanwhile, each mounting its own size-capped ``/work`` on the host."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return {line for line in lines if "/slime-sandboxes/" not in line.split()[4]}


def _mounts_under(path: Path) -> list[str]:
    return sorted(
        m
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if (m := line.split()[4]).startswith(str(path))
    )


def test_mount_is_refused_and_the_host_mount_table_is_unchanged():
    before = _host_mounts()

    async def go(seccomp: bool):
        async with LocalSandbox(seccomp=seccomp) as sb:
            own = sb.host_workdir.parent
            mounts = _mounts_under(own)
            res = await sb.exec(
                ["python3", "-c", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                 "os.makedirs('/work/mnt', exist_ok=True); "
                 "print(libc.mount(b'none', b'/work/mnt', b'tmpfs', 0, None), ctypes.get_errno())"],
                timeout=20,
            )  # fmt: skip
            return res, mounts, _mounts_under(own)

    res, during_before, during_after = run(go(seccomp=True))
    assert res.stdout.split() == ["-1", str(errno.EPERM)]
    assert during_after == during_before and not any(m.endswith("/mnt") for m in during_after)
    # the host got no tmpfs from "none" (the refused mount): other workers' tests (SLURM node namespaces,
    # other sandboxes) may mount elsewhere meanwhile, so only what this mount would have added is checked
    added = _host_mounts() - before
    assert not [m for m in added if m.split(" - ")[-1].split()[:2] == ["tmpfs", "none"]], added


def test_unshare_and_setns_are_refused():
    names = ("unshare", "unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)", "setns")
    filtered, _ = run(_probe(*names))
    unfiltered, _ = run(_probe(*names, seccomp=False))
    assert filtered == dict.fromkeys(names, errno.EPERM)
    # bubblewrap's --disable-userns already stops new user namespaces (ENOSPC); unshare(0) is a no-op.
    assert unfiltered == {
        "unshare": 0,
        "unshare(CLONE_NEWUSER)": errno.ENOSPC,
        "clone(CLONE_NEWUSER)": errno.ENOSPC,
        "setns": errno.EBADF,
    }


def test_threads_and_fork_still_work_under_the_filter():
    # clone3 fails with ENOSYS, so glibc falls back to clone for threads and posix_spawn.
    code = (
        "import threading, subprocess; out = []\n"
        "t = threading.Thread(target=lambda: out.append('thread')); t.start(); t.join()\n"
        "print(out[0], subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\n"
    )

    async def go():
        async with LocalSandbox() as sb:
            return await sb.exec(["python3", "-c", code], timeout=20)

    res = run(go())
    assert res.ok and res.stdout == "thread child\n", res


def test_enforcement_reports_each_cap():
    async def go():
        async with LocalSandbox(total_memory_mb=300, work_mb=32) as sb:
            return sb.enforcement, await sb.exec("grep Seccomp /proc/self/status", timeout=10)

    enforcement, status = run(go())
    assert set(enforcement) == {"isolation", "seccomp", "total_memory", "work_size"}
    assert enforcement["isolation"] == "bubblewrap"
    assert "ptrace" in enforcement["seccomp"] and "io_uring_setup" in enforcement["seccomp"]
    assert "Seccomp:\t2" in status.stdout  # 2 = filter mode
    if os.geteuid() == 0:
        assert enforcement["work_size"] == "tmpfs of 32 MiB"
    else:
        assert enforcement["work_size"].startswith("NOT capped")
    assert enforcement["total_memory"].endswith("300 MiB") or enforcement["total_memory"].startswith("NOT capped")


# -- /work size cap -------------------------------------------------------------------------------


@pytest.fixture
def work_root():
    """A sandbox root the sandbox's host uid can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="slime-sandbox-test-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the /work tmpfs is a host mount: root only (else per-file cap)")
def test_filling_work_past_its_cap_is_enospc_inside_and_never_reaches_the_host_disk(work_root):
    fill = "head -c 48M /dev/zero > /work/fill; echo rc=$?; ls -l /work/fill | awk '{print $5}'"

    async def go(work_mb: int):
        async with LocalSandbox(work_mb=work_mb, max_file_mb=128, workdir_root=work_root) as sb:
            res = await sb.exec(fill, timeout=30)
            host = sb.host_workdir
            return res, os.stat(host).st_dev, os.statvfs(host), os.stat(host / "fill").st_size, sb.enforcement

    res, dev, vfs, size, enforcement = run(go(work_mb=16))
    assert "No space left on device" in res.stderr
    assert res.stdout.split() == ["rc=1", str(16 << 20)]
    # The bytes went to the sandbox's tmpfs, not to the filesystem that holds the host directory.
    assert dev != os.stat(work_root).st_dev
    assert vfs.f_blocks * vfs.f_frsize == 16 << 20 and size == 16 << 20
    assert enforcement["work_size"] == "tmpfs of 16 MiB"
    assert list(work_root.iterdir()) == []  # closed: unmounted and removed
    # Able to fail: with room, the same write completes.
    res, *_ = run(go(work_mb=64))
    assert res.stdout.split() == ["rc=0", str(48 << 20)] and res.stderr == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="the /work tmpfs is a host mount: root only")
def test_host_write_file_into_a_full_work_is_a_clear_error():
    from slime.agent.sandbox import SandboxError

    async def go():
        async with LocalSandbox(work_mb=4) as sb:
            await sb.exec("head -c 8M /dev/zero > /work/fill", timeout=20)
            with pytest.raises(SandboxError, match="cannot write 'more.txt': No space left on device"):
                await sb.write_file("more.txt", "x" * 8192)
            await sb.exec("rm /work/fill", timeout=20)
            await sb.write_file("more.txt", "fits again")
            return await sb.read_file("more.txt")

    assert run(go()) == b"fits again"


# -- total memory cap -----------------------------------------------------------------------------

# Eight processes of 40 MiB each (every page touched), each well under the per-process cap.
MANY_SMALL = """
import os, time
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        b = bytearray(40 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
done = 0
for pid in kids:
    _, status = os.waitpid(pid, 0)
    done += os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
print(done)
"""


def _needs_cgroup(sb: LocalSandbox) -> None:
    if sb.memory_usage() is None:
        pytest.skip(f"no memory cgroup here: {sb.enforcement['total_memory']}")


def test_many_small_processes_together_cannot_exceed_the_total_memory_cap():
    async def go(total_mb: int):
        async with LocalSandbox(memory_mb=256, total_memory_mb=total_mb) as sb, LocalSandbox() as neighbour:
            _needs_cgroup(sb)
            # A neighbour sandbox holds memory meanwhile: the OOM killer must not pick it.
            other = asyncio.ensure_future(
                neighbour.exec(["python3", "-c", "import time; b = bytearray(64 << 20); time.sleep(2); print('ok')"],
                               timeout=30)
            )  # fmt: skip
            res = await sb.exec(["python3", "-c", MANY_SMALL], timeout=60)
            return res, sb.memory_usage(), await other

    res, (peak, oom_kills), other = run(go(total_mb=128))
    assert res.ok, res
    assert int(res.stdout) < 8 and oom_kills >= 1  # some were killed: 8 x 40 MiB > 128 MiB
    assert peak is None or peak <= 128 << 20
    assert other.ok and other.stdout == "ok\n"  # the host side (another sandbox) is untouched
    # Able to fail: under a cap that fits them, all eight finish and nothing is killed.
    res, (peak, oom_kills), _ = run(go(total_mb=768))
    assert res.ok and res.stdout == "8\n" and oom_kills == 0
    assert peak is None or peak > 128 << 20


def test_memory_cgroup_is_removed_on_close():
    async def go():
        async with LocalSandbox() as sb:
            _needs_cgroup(sb)
            path = sb._res.cgroup.path
            await sb.exec("sleep 0.1", timeout=10)
            assert path.is_dir()
        return path

    assert not run(go()).exists()


# -- where a restriction cannot apply --------------------------------------------------------------


def test_an_architecture_without_a_filter_is_refused_clearly(monkeypatch):
    from slime.agent.sandbox import seccomp

    monkeypatch.setattr(seccomp.platform, "machine", lambda: "riscv64")
    with pytest.raises(IsolationUnavailable, match=r"built and tested for x86_64 only; this machine is riscv64"):
        run(LocalSandbox().start())
    with pytest.raises(seccomp.SeccompUnavailable, match="riscv64"):
        seccomp.filter_bpf()
    assert len(seccomp.filter_bpf("x86_64")) % 8 == 0  # the native one still builds


def test_without_a_memory_cgroup_the_fallback_is_stated_and_warned_once(monkeypatch, caplog):
    from slime.agent.sandbox import resources

    monkeypatch.setattr(resources, "_parent", ["cgroup v2 has no memory controller here (simulated)"])
    monkeypatch.setattr(resources, "_warned", set())

    async def go():
        out = []
        for _ in range(2):
            async with LocalSandbox(memory_mb=128, max_procs=8) as sb:
                out.append((sb.enforcement["total_memory"], sb.memory_usage()))
                assert (await sb.exec("true", timeout=10)).ok
        return out

    (first, usage), _ = run(go())
    assert first == "NOT capped: per-process rlimits only (cgroup v2 has no memory controller here (simulated))"
    assert usage is None
    warnings = [r.getMessage() for r in caplog.records if "capped per process only" in r.getMessage()]
    assert warnings == [
        "sandbox memory is capped per process only, not in total (cgroup v2 has no memory controller here "
        "(simulated)); the worst case is max_procs x memory_mb"
    ]


# -- leftovers of a killed process -----------------------------------------------------------------

_START_AND_DIE = """
import asyncio, json, os, sys
from slime.agent.sandbox.local import LocalSandbox

async def main():
    sb = LocalSandbox(workdir_root=sys.argv[1])
    await sb.start()
    await sb.exec("head -c 1M /dev/zero > /work/data", timeout=10)
    cg = sb._res.cgroup
    print(json.dumps([str(sb.host_workdir), str(cg.path) if cg else None]), flush=True)
    if sys.argv[2] == "die":
        os._exit(0)  # no close(): as if killed
    await sb.close()

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the tmpfs and the cgroup this sweeps need root")
def test_what_a_killed_process_left_is_swept_by_the_next_sandbox(work_root):
    import subprocess
    import sys

    def start(mode: str) -> tuple[Path, Path | None]:
        out = subprocess.run(
            [sys.executable, "-c", _START_AND_DIE, str(work_root), mode],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        work, cg = json.loads(out.stdout)
        return Path(work), Path(cg) if cg else None

    work, cg = start("die")
    assert os.path.ismount(work) and (work / "data").stat().st_size == 1 << 20
    assert cg is None or cg.is_dir()
    start("close")  # a later sandbox on the machine sweeps what the dead one left
    assert not work.parent.exists() and not os.path.ismount(work)
    assert cg is None or not cg.exists()
