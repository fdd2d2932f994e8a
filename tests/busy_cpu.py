"""A machine under load for the duration of a test: `with saturated(n): ...` runs `n`
busy-loop processes (plain `python -c "while True: pass"`) and kills them, by their own
pids, on the way out. Tests that must give the same verdicts on a busy machine as on a
quiet one run their work inside it.

The busy loops would also slow whatever the other xdist worker runs at the same time, and
tests there that hold wall-clock limits (the code sandbox, pool deadlines) would fail for
it. So every test runs holding a shared lock on one file of the run (`share_cpu`, from a
conftest hook around each test's setup, call and teardown), and `saturated` turns its
worker's lock exclusive first: the other worker finishes its current test and waits.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time

__all__ = ["saturated", "share_cpu", "release_cpu"]

LOCK_ENV = "JAXRL_REASON_TESTS_CPU_LOCK"
_lock_fd: int | None = None
# Set by conftest around each test: whether it carries `@pytest.mark.saturates_cpu`. Its file
# is then scheduled first (conftest), so the exclusive lock waits on a short test.
MARKED = False


def _fd() -> int | None:
    """This process's descriptor on the run's lock file (None when no conftest set one)."""
    global _lock_fd
    path = os.environ.get(LOCK_ENV)
    if _lock_fd is None and path:
        _lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return _lock_fd


def new_lock_file() -> str:
    """A fresh lock file for one test run (the controller makes it; workers inherit the path
    through `LOCK_ENV`)."""
    fd, path = tempfile.mkstemp(prefix="jaxrl_reason_tests_cpu_", suffix=".lock")
    os.close(fd)
    return path


def share_cpu() -> None:
    """Hold the run's lock shared: other tests may run beside this one."""
    if (fd := _fd()) is not None:
        fcntl.flock(fd, fcntl.LOCK_SH)


def release_cpu() -> None:
    """Release this process's hold on the run's lock."""
    if (fd := _fd()) is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _exclusive():
    """Hold the run's lock exclusively (no other worker is inside a test), then shared again."""
    fd = _fd()
    if fd is None:
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_SH)


@contextlib.contextmanager
def saturated(processes: int = 4):
    """`processes` CPU-bound processes running while the block runs (each is also ended
    after 300 s by itself, should this process die first). No other test of the run is
    running meanwhile (see the module docstring). Under the run's lock, only a test marked
    `saturates_cpu` may call it."""
    if _fd() is not None and not MARKED:
        raise RuntimeError("a test that calls busy_cpu.saturated must be marked "
                           "@pytest.mark.saturates_cpu (its file is then scheduled first)")
    with _exclusive(), _busy(processes) as procs:
        yield procs


@contextlib.contextmanager
def _busy(processes: int):
    """`processes` busy-loop processes for the duration of the block."""
    procs = [subprocess.Popen(
        [sys.executable, "-c",
         "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(processes)]
    try:
        time.sleep(0.2)  # let them start spinning
        for proc in procs:
            assert proc.poll() is None, "a busy-loop process did not start"
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
