"""Test setup: 8 fake CPU devices so sharding code runs as on a real mesh."""
import os
import sys

# Shared helpers (cli_runs, numerics) import by name from every test directory.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The closing line that counts the sandbox tests skipped (no bwrap) and says why.
from sandbox_skips import pytest_terminal_summary  # noqa: E402,F401

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()


def pytest_collection_modifyitems(config, items):
    """Files holding end-to-end (`slow`) tests run first: with `-n 2` each worker takes whole
    files, so a minutes-long file picked up last would leave the other worker idle."""
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: file order kept otherwise
