"""The benchmarks' quiet-machine check: a loaded machine is refused unless waived, and the
record says which."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import host_probe  # noqa: E402


def test_loaded_machine_is_refused_unless_waived(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 2.0, 1.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(SystemExit, match=r"load average is 3.00 on 2 cores \(limit 1.00\)"):
        host_probe.require_quiet()
    record = host_probe.require_quiet(allow_load=True)
    assert record == {"load_average_1_5_15_min": [3.0, 2.0, 1.0], "cores": 2,
                      "quiet_threshold": 1.0, "load_check_waived": True}


def test_quiet_machine_passes(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.5, 0.6))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert host_probe.require_quiet()["load_check_waived"] is False
