"""Host resources a sandboxed answer can take, and what the reward processes get without
the sandbox.

Before: `/tmp` in the code sandbox was a tmpfs of no size (a solution wrote 2,000 MB of
files against a 512 MB memory limit, host Shmem +2 GB), SysV shared memory was unlimited
(3 x 512 MB segments), a deeply nested JSON on the status pipe made `run_sandboxed` raise
RecursionError, the math workers without bwrap got no rlimits and the trainer's whole
environment, and a `bwrap` found outside a fixed PATH was reported unavailable.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time

import pytest

from jaxrl_reason.rewards import _sympy_worker, isolation
from jaxrl_reason.rewards.code import SandboxLimits, code_reward, run_sandboxed

needs_sandbox = pytest.mark.skipif(not isolation.available(), reason="bubblewrap unavailable")

LIMIT = 128 * 2**20  # the run's memory limit: its /tmp may hold no more
SMALL = SandboxLimits(wall_s=15.0, cpu_s=10.0, memory_bytes=LIMIT, output_bytes=8192,
                      max_processes=64)


def host_shmem() -> int:
    """The host's shared memory in bytes (tmpfs pages count here), from /proc/meminfo."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


class PeakShmem:
    """Samples `host_shmem()` every 10 ms in a thread while the `with` block runs."""

    def __enter__(self):
        self.before = self.peak = host_shmem()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, host_shmem())
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.growth = self.peak - self.before


# ------------------------------------------------------------------------ item 4: memory

FILL_TMP = """
import os
chunk = b"x" * (1 << 20)
written = 0
try:
    for i in range(2000):  # 2,000 MB in files of 15 MB (each under the file-size limit)
        with open(f"/tmp/fill{i // 15}", "ab") as f:
            f.write(chunk)
        written += len(chunk)
except OSError as e:
    print("stopped", written, e.errno)
else:
    print("wrote", written)
st = os.statvfs("/tmp")
print("size", st.f_blocks * st.f_frsize)
"""


@needs_sandbox
def test_writing_2000_mb_to_tmp_stops_at_the_memory_limit():
    """The write fails with ENOSPC once /tmp holds the run's memory limit, and the host's
    shared memory grows by no more than that limit (with slack for other tests' runs)."""
    with PeakShmem() as shm:
        res = run_sandboxed(FILL_TMP, "", SMALL)
    assert res.status == "ok", res
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    written, errno = map(int, lines["stopped"].split())
    assert errno == 28  # ENOSPC
    assert written <= LIMIT and int(lines["size"]) == LIMIT
    assert shm.growth < 2 * LIMIT, f"host Shmem grew by {shm.growth / 2**20:.0f} MB"


@needs_sandbox
@pytest.mark.parametrize("where", ["/", "/dev", "/dev/shm"])
def test_tmp_is_the_only_writable_place(where):
    """The root and /dev tmpfs (of no size) are read-only: /tmp is all a run can fill, and
    POSIX shared memory (/dev/shm) cannot be created."""
    res = run_sandboxed(f"open({os.path.join(where, 'x')!r}, 'w').write('x' * 4096)", "",
                        SMALL)
    assert res.status == "error" and (
        "Read-only file system" in res.stderr_tail or "Permission denied" in res.stderr_tail
    ), res


SYSV_SEGMENTS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
made = []
for _ in range(3):
    ctypes.set_errno(0)
    made.append((libc.shmget(IPC_PRIVATE, 512 << 20, IPC_CREAT | 0o600), ctypes.get_errno()))
print(made)
ctypes.set_errno(0)
print(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600), ctypes.get_errno())
ctypes.set_errno(0)
print(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600), ctypes.get_errno())
from multiprocessing import shared_memory
try:
    shared_memory.SharedMemory(create=True, size=512 << 20)
    print("posix shm created")
except OSError as e:
    print("posix shm refused")
"""


@needs_sandbox
def test_three_512_mb_sysv_segments_cannot_be_created():
    """shmget (and semget, msgget) answer EPERM (the seccomp filter); POSIX shared memory
    fails too (read-only /dev/shm): no segment pins host memory outside every rlimit."""
    with PeakShmem() as shm:
        res = run_sandboxed(SYSV_SEGMENTS, "", SMALL)
    assert res.status == "ok", res
    segments, sem, msg, posix = res.stdout.splitlines()
    assert segments == str([(-1, 1)] * 3)
    assert sem == "-1 1" and msg == "-1 1"
    assert posix == "posix shm refused"
    assert shm.growth < LIMIT


def test_tmp_size_follows_the_memory_limit(monkeypatch):
    """The code sandbox's /tmp is as large as the run's `memory_bytes` (bwrap `--size`)."""
    from jaxrl_reason.rewards import code as code_mod

    cmd = code_mod._command("/tmp/x", {}, SandboxLimits(memory_bytes=300 * 2**20), True, 3,
                            None)
    i = cmd.index("--tmpfs")
    assert cmd[i - 2:i + 2] == ["--size", str(300 * 2**20), "--tmpfs", "/tmp"]
    assert cmd.index("--remount-ro") > i
    with pytest.raises(ValueError, match="tmp_bytes"):
        isolation.sandbox_command(["true"], tmp_bytes=0)


# ----------------------------------------------------------------- item 5: the status pipe


def forged_status(payload: str) -> str:
    """A solution that writes `payload` as a `result` line on every inherited pipe it can
    write, then exits before the harness can write the honest one."""
    return f"""
import os
line = ("result " + {payload} + "\\n").encode()
for fd in range(3, 64):
    try:
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)
"""


@needs_sandbox
@pytest.mark.parametrize("payload, why", [
    ("'[' * 30000 + ']' * 30000", "deeper than"),  # fits the pipe's cap, too deep
    ("'[' * 200000 + ']' * 200000", "more than"),  # more than the cap
    ("'[1, 2' ", "not JSON"),
    ("'{\"a\": 1}'", "not a list"),
])
def test_a_hostile_status_line_is_a_failed_run_not_an_exception(payload, why):
    res = run_sandboxed(forged_status(payload), "", SMALL, calls=["1"])
    assert res.status == "error" and res.results is None, res
    assert "status pipe rejected" in res.stderr_tail and why in res.stderr_tail


@needs_sandbox
def test_the_code_reward_scores_a_hostile_status_line_zero():
    out = code_reward(f"```python\n{forged_status(chr(39) + '[' * 30000 + chr(39))}\n```",
                      {"tests": ["assert f(1) == 1"]}, limits=SMALL)
    assert (out.score, out.reason) == (0.0, "error")


@needs_sandbox
def test_honest_results_still_cross_the_status_pipe():
    res = run_sandboxed("def f(x):\n    return [[[[x]]]]", "", SMALL, calls=["f(3)"])
    assert res.status == "ok" and res.results is not None, res
    assert code_reward("```python\ndef f(x):\n    return [[[[x]]]]\n```",
                       {"tests": ["assert f(3) == [[[[3]]]]"]}, limits=SMALL).score == 1.0


# ------------------------------------------------------- item 10: without bwrap, and bwrap


@pytest.fixture
def no_sandbox(monkeypatch):
    """The availability check answering 'no bwrap', and the once-per-process log reset."""
    monkeypatch.setattr(isolation, "available", lambda: False)
    monkeypatch.setattr(isolation, "unavailable_reason",
                        lambda: "`bwrap` not found: install it")
    monkeypatch.setattr(isolation, "_LOGGED", [])


def _proc_file(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read().decode("utf-8", "replace")


def _limit(limits: str, name: str) -> tuple[str, str]:
    """(soft, hard) of the `name` row of /proc/<pid>/limits."""
    row = next(line for line in limits.splitlines() if line.startswith(name))
    soft, hard = row[len(name):].split()[:2]
    return soft, hard


def test_unsandboxed_math_workers_get_rlimits_an_empty_env_and_no_fds(no_sandbox, monkeypatch):
    """Without bwrap a worker holds the sandbox's rlimits (address space, CPU, file size,
    open files, core), only PATH and LANG in its environment, no descriptor beyond
    stdin/stdout/stderr, and runs in /; the pool says why it has no sandbox."""
    monkeypatch.setenv("JAXRL_SECRET_TOKEN", "s3cr3t")
    keep_r, keep_w = os.pipe()  # a descriptor of the trainer's that must not leak
    os.set_inheritable(keep_r, True)
    try:
        with pytest.warns(RuntimeWarning, match="WITHOUT OS isolation: `bwrap` not found"):
            pool = _sympy_worker.SympyPool(1)
        try:
            assert pool.isolate is False
            assert pool.warm() == 1
            (worker,) = pool._idle
            pid = worker.proc.pid
            env = dict(item.split("=", 1) for item in
                       _proc_file(pid, "environ").split("\0") if item)
            limits = _proc_file(pid, "limits")
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
            cwd = os.readlink(f"/proc/{pid}/cwd")
            assert pool.compare("1/2", "0.5") is True  # the worker still works
        finally:
            pool.shutdown()
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert set(env) <= {"PATH", "LANG"} and "JAXRL_SECRET_TOKEN" not in env, env
    assert _limit(limits, "Max address space") == (str(_sympy_worker._MEMORY_BYTES),) * 2
    assert _limit(limits, "Max cpu time") == (str(_sympy_worker._CPU_S),) * 2
    assert _limit(limits, "Max file size") == (str(_sympy_worker._FILE_BYTES),) * 2
    assert _limit(limits, "Max open files") == (str(_sympy_worker._OPEN_FILES),) * 2
    assert _limit(limits, "Max core file size") == ("0", "0")
    assert fds == [0, 1, 2], fds
    assert cwd == "/"


def test_the_run_says_once_what_isolation_it_has(no_sandbox, caplog):
    from jaxrl_reason.rewards import RewardPool

    with caplog.at_level(logging.INFO, logger="jaxrl_reason"):
        RewardPool({"format_strict": 1.0}, num_workers=1).close()
        RewardPool({"format_strict": 1.0}, num_workers=1).close()
    lines = [r for r in caplog.records if "reward isolation" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "NO sandbox" in lines[0].getMessage() and "bwrap" in lines[0].getMessage()
    assert "rlimits" in lines[0].getMessage()


@pytest.fixture
def fresh_check():
    """The cached availability check cleared before and after."""
    isolation._unavailable.cache_clear()
    yield
    isolation._unavailable.cache_clear()


@needs_sandbox
def test_bwrap_is_run_from_where_which_found_it(tmp_path, monkeypatch, fresh_check):
    """A bwrap found outside the sandbox's fixed PATH is checked and run by that path."""
    real = shutil.which("bwrap")
    log = tmp_path / "calls"
    wrapper = tmp_path / "opt" / "bin" / "bwrap"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\necho run >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda name, *a, **k: str(wrapper) if name == "bwrap"
                        else which(name, *a, **k))
    assert isolation.available(), isolation.unavailable_reason()
    assert isolation.sandbox_command(["true"])[0] == str(wrapper)
    res = run_sandboxed("print(6 * 7)", "", SMALL)
    assert (res.status, res.stdout) == ("ok", "42\n"), res
    assert log.read_text().count("run") >= 2  # the check and the run


def test_a_tool_run_inside_must_lie_in_the_sandboxs_view(monkeypatch, fresh_check):
    which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda name, *a, **k: "/opt/tools/prlimit" if name == "prlimit"
                        else which(name, *a, **k))
    if which("bwrap") is None:
        pytest.skip("bubblewrap unavailable (the bwrap check comes first)")
    assert not isolation.available()
    assert "/opt/tools/prlimit" in isolation.unavailable_reason()
    assert "outside the sandbox's view" in isolation.unavailable_reason()
