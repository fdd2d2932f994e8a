"""A machine under load for the duration of a test: `with saturated(n): ...` runs `n`
busy-loop processes (plain `python -c "while True: pass"`) and kills them, by their own
pids, on the way out. Tests that must give the same verdicts on a busy machine as on a
quiet one run their work inside it."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

__all__ = ["saturated"]


@contextlib.contextmanager
def saturated(processes: int = 4):
    """`processes` CPU-bound processes running while the block runs (each is also ended
    after 300 s by itself, should this process die first)."""
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
