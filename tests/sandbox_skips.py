"""A line at the end of a test run saying how many tests that need the OS sandbox
(bubblewrap: the sandbox-escape suite of tests/security, the code-reward sandbox) were
skipped, and why: without `bwrap` they skip, and `-ra`'s short summary alone is easy to miss.

tests/conftest.py imports `pytest_terminal_summary` from here. Under pytest-xdist the
workers' skip reports reach the controller, whose terminal reporter holds them all
(`terminalreporter.stats["skipped"]`), so the count covers every worker.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

# A skip reason naming the sandbox (its tool, its package, or the word).
SANDBOX_REASON = re.compile(r"bubblewrap|\bbwrap\b|sandbox", re.I)


def skip_reason(report) -> str:
    """The reason of a skipped test report ("Skipped: " dropped); "" when it has none. A skip
    report's longrepr is (path, line, reason), a list once it came through xdist."""
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return ""


def sandbox_skips(reports: Iterable) -> dict[str, list[str]]:
    """{skip reason: [test file, ...]} of the skipped reports whose reason names the
    sandbox; files in first-seen order, each once."""
    found: dict[str, list[str]] = {}
    for report in reports:
        reason = skip_reason(report)
        if SANDBOX_REASON.search(reason):
            path = report.nodeid.split("::")[0] or str(report.longrepr[0])
            files = found.setdefault(reason, [])
            if path not in files:
                files.append(path)
    return found


def count_sandbox_skips(reports: Iterable) -> int:
    """How many skipped reports name the sandbox (a module-level skip is one per test)."""
    return sum(bool(SANDBOX_REASON.search(skip_reason(r))) for r in reports)


def why_unavailable() -> str:
    """What the sandbox check finds missing here (jaxrl_reason.rewards.isolation), or a
    generic hint when it cannot tell."""
    try:
        from jaxrl_reason.rewards import isolation
        return isolation.unavailable_reason()
    except Exception as e:  # noqa: BLE001 (a summary line must not fail the run)
        return f"install Debian's bubblewrap (`apt-get install -y bubblewrap`) ({e})"


def summary_line(reports: Iterable) -> str | None:
    """The line, or None when no sandbox test was skipped."""
    reports = list(reports)
    n = count_sandbox_skips(reports)
    if not n:
        return None
    files = [f for fs in sandbox_skips(reports).values() for f in fs]
    return (f"{n} sandbox test{'s' if n != 1 else ''} skipped: {why_unavailable()}; "
            f"not run: {', '.join(dict.fromkeys(files))}")


@pytest.hookimpl(trylast=True)  # after --durations; -ra's short summary still follows
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    line = summary_line(terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_sep("=", "sandbox", yellow=True)
        terminalreporter.write_line(line, yellow=True, bold=True)
