"""Test setup: 8 fake CPU devices so sharding code runs as on a real mesh."""
import collections
import contextlib
import os
import shutil
import sys
import tempfile

# Shared helpers (cli_runs, numerics) import by name from every test directory.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The closing line that counts the sandbox tests skipped (no bwrap) and says why.
from sandbox_skips import pytest_terminal_summary  # noqa: E402,F401
import busy_cpu  # noqa: E402

import pytest  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process (SIGABRT, no Python error) when the fake devices of a collective
# do not all reach it within 40 s, its default. Two workers plus the multi-process tests'
# children on 2 cores can delay a device thread that long; 300 s still turns a real hang
# into an abort (the worker is replaced, the test fails) well before the tests' timeouts.
if "xla_cpu_collective_call_terminate_timeout_seconds" not in _flags:
    _flags += (" --xla_cpu_collective_call_terminate_timeout_seconds=300"
               " --xla_cpu_collective_call_warn_stuck_timeout_seconds=60")
os.environ["XLA_FLAGS"] = _flags.strip()

# One persistent XLA compilation cache for the whole run, shared by both xdist workers (they
# inherit the controller's environment) and by every `jaxrl-reason` subprocess the CLI and
# end-to-end tests start: those compile the same trainer programs again and again (a smoke
# train went from 172 s to 48 s on a cache hit). The cache only stores compiled executables
# keyed by their HLO and options, so results are unchanged. A directory the caller set wins;
# the one made here is removed when the run ends.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxrl_reason_tests_xla_")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# The lock that keeps the busy-loop tests (tests/busy_cpu.py) from running beside others.
_OWN_LOCK = busy_cpu.LOCK_ENV not in os.environ
if _OWN_LOCK:
    os.environ[busy_cpu.LOCK_ENV] = busy_cpu.new_lock_file()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test (its setup, with any module fixtures it builds, call and teardown) runs
    holding the run's CPU lock shared; `busy_cpu.saturated` takes it exclusively."""
    busy_cpu.share_cpu()
    busy_cpu.MARKED = item.get_closest_marker("saturates_cpu") is not None
    try:
        yield
    finally:
        busy_cpu.MARKED = False
        busy_cpu.release_cpu()


def pytest_unconfigure(config):
    """Remove the compilation cache and lock file this process made (workers inherit them
    and do not own them)."""
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if _OWN_LOCK:
        with contextlib.suppress(OSError):
            os.unlink(os.environ[busy_cpu.LOCK_ENV])


def pytest_collection_modifyitems(config, items):
    """Files with a test that saturates the CPU (`saturates_cpu`, which waits for the other
    worker to finish its current test, then keeps it waiting) run first, while the other
    worker's current test is short; then files holding end-to-end (`slow`) tests: with
    `-n 2` each worker takes whole files, so a minutes-long file picked up last would leave
    the other worker idle. Those with more end-to-end tests go earlier (pyproject's
    `--no-loadscope-reorder` keeps xdist from re-sorting files by their test count, which
    put these last)."""
    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    busy = {item.path for item in items if item.get_closest_marker("saturates_cpu")}
    # stable: file order kept otherwise
    items.sort(key=lambda item: (item.path not in busy, -slow[item.path]))
