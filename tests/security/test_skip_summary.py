"""The closing line of a test run that counts the sandbox tests skipped (tests/sandbox_skips.py,
hooked in by tests/conftest.py): on a tiny fake test directory run under pytest-xdist, whose
workers report their skips to the controller."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import sandbox_skips

TESTS = Path(__file__).resolve().parents[1]


def _skip(nodeid: str, reason: str, as_list: bool = False):
    longrepr = (nodeid.split("::")[0], 3, f"Skipped: {reason}")
    return SimpleNamespace(nodeid=nodeid, longrepr=list(longrepr) if as_list else longrepr)


def test_only_skips_naming_the_sandbox_count(monkeypatch):
    monkeypatch.setattr(sandbox_skips, "why_unavailable", lambda: "`bwrap` not found")
    reports = [_skip("a.py::t1", "bubblewrap unavailable"),
               _skip("a.py::t2", "bubblewrap unavailable", as_list=True),  # via xdist
               _skip("b.py::t", "needs a sandbox"),
               _skip("c.py::t", "no TPU here"), SimpleNamespace(nodeid="d.py::t", longrepr=None)]
    assert sandbox_skips.count_sandbox_skips(reports) == 3
    assert sandbox_skips.sandbox_skips(reports) == {"bubblewrap unavailable": ["a.py"],
                                                    "needs a sandbox": ["b.py"]}
    assert sandbox_skips.summary_line(reports) == (
        "3 sandbox tests skipped: `bwrap` not found; not run: a.py, b.py")
    assert sandbox_skips.summary_line(reports[3:]) is None
    assert sandbox_skips.summary_line([]) is None


def test_the_line_closes_an_xdist_run(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from sandbox_skips import pytest_terminal_summary  # noqa\n")
    (tmp_path / "test_fake.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='bubblewrap unavailable')\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_escape(i):\n    pass\n\n"
        "@pytest.mark.skip(reason='no TPU here')\n"
        "def test_other():\n    pass\n\n"
        "def test_runs():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    ours = [line for line in lines if "sandbox tests skipped" in line]
    assert len(ours) == 1 and ours[0].startswith("3 sandbox tests skipped: "), proc.stdout
    assert ours[0].endswith("; not run: test_fake.py")
    assert "1 passed, 4 skipped" in lines[-1]
