"""Sympy comparisons in worker processes, so a hang can be ended by killing the process.

Sympy can spin for minutes inside one C-level big-integer operation while holding the GIL
(`9**9**9**9`), and a thread cannot be interrupted, so every sympy call of the reward code
runs in a small pool of persistent child processes. A call that overruns its deadline kills
its worker; the next call starts a fresh one. The client is safe to use from many threads.

Protocol (one JSON object per line): request `{"a": str, "b": str, "eq": bool}` where `a`
and `b` are sympy-parsable expression strings (with `eq`, each is `lhs - (rhs)` of an
equation); reply `{"r": true | false}`. The child prints `{"ready": true}` once sympy is
imported. This file is also the child's program (`python -c <bootstrap> <this file>`); the
child imports nothing from the package.
"""
from __future__ import annotations

import atexit
import cmath
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time

# A fresh worker imports sympy (~0.3-1 s); that wait has its own allowance so that the
# first call of a process is not charged for it.
_STARTUP_TIMEOUT_S = 30.0
_MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
# Run this file by path without putting its directory (which holds `math.py`) on sys.path.
_BOOTSTRAP = (
    "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_path(sys.argv[1], run_name='__jaxrl_sympy_worker__')"
)


# ----------------------------------------------------------------------------- child side


def _child_compare(a: str, b: str, eq: bool) -> bool:
    """True iff the expressions `a` and `b` are equal (with `eq`: proportional, nonzero)."""
    import random

    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transforms = standard_transformations + (implicit_multiplication_application, convert_xor)
    local = {"E": sympy.E, "I": sympy.I, "pi": sympy.pi, "oo": sympy.oo}
    ea = parse_expr(a, local_dict=local, transformations=transforms)
    eb = parse_expr(b, local_dict=local, transformations=transforms)
    if eq:
        if ea == 0 or eb == 0:
            return bool(sympy.simplify(ea) == 0 and sympy.simplify(eb) == 0)
        ratio = sympy.simplify(ea / eb)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    if ea == eb:
        return True
    diff = ea - eb
    if diff == 0:
        return True
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    if not symbols:
        if ea.has(sympy.oo, -sympy.oo, sympy.zoo) or eb.has(sympy.oo, -sympy.oo, sympy.zoo):
            return bool(sympy.simplify(diff) == 0)
        return _close(complex(sympy.N(ea, 30)), complex(sympy.N(eb, 30)))
    if sympy.simplify(diff) == 0:
        return True
    rng = random.Random(0)
    for _ in range(3):
        point = {s: sympy.Rational(rng.randint(1, 97), rng.randint(1, 13)) for s in symbols}
        va, vb = complex(sympy.N(ea.subs(point), 30)), complex(sympy.N(eb.subs(point), 30))
        if not _close(va, vb):
            return False
    return True


def _close(va: complex, vb: complex) -> bool:
    """Finite and equal to about nine significant digits."""
    if not (cmath.isfinite(va) and cmath.isfinite(vb)):
        return False
    return abs(va - vb) <= 1e-9 * max(1.0, abs(va), abs(vb))


def _child_main() -> None:
    """Serve requests from stdin until EOF; a failed comparison answers false."""
    import sympy  # noqa: F401  (import before announcing readiness)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            result = _child_compare(str(req["a"]), str(req["b"]), bool(req.get("eq")))
        except Exception:  # any parse/simplify failure means "not shown equal"
            result = False
        out.write(json.dumps({"r": bool(result)}) + "\n")
        out.flush()


if __name__ == "__jaxrl_sympy_worker__":
    _child_main()


# ---------------------------------------------------------------------------- parent side


class _Worker:
    """One child process and its line buffer."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._buf = b""
        self.ready = False

    def read_line(self, deadline: float) -> bytes | None:
        """The next line from the child, or None at the deadline or on EOF."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def kill(self) -> None:
        """End the child at once."""
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


class SympyPool:
    """A bounded set of sympy worker processes shared by all threads."""

    def __init__(self, max_workers: int = _MAX_WORKERS) -> None:
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._all: set[_Worker] = set()

    def compare(self, a: str, b: str, eq: bool, timeout_s: float) -> bool | None:
        """Compare two expression strings in a worker.

        Returns True/False, or None when the deadline (`timeout_s` of wall time, plus a
        one-time allowance for starting a worker) passed first; the worker is then killed.
        """
        deadline = time.monotonic() + timeout_s
        if not self._slots.acquire(timeout=max(0.0, timeout_s)):
            return None
        worker = None
        try:
            worker = self._checkout(deadline)
            if worker is None:
                return None
            worker.proc.stdin.write((json.dumps({"a": a, "b": b, "eq": eq}) + "\n").encode())
            worker.proc.stdin.flush()
            line = worker.read_line(deadline)
            if line is None:
                self._discard(worker)
                worker = None
                return None
            self._idle.put(worker)
            worker = None
            return bool(json.loads(line)["r"])
        except Exception:
            if worker is not None:
                self._discard(worker)
            return None
        finally:
            self._slots.release()

    def _checkout(self, deadline: float) -> _Worker | None:
        """An idle live worker, or a newly started one once it reports ready."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                break
            if worker.proc.poll() is None:
                return worker
            self._discard(worker)
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        line = worker.read_line(max(deadline, time.monotonic() + _STARTUP_TIMEOUT_S))
        if line is None or not json.loads(line).get("ready"):
            self._discard(worker)
            return None
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def shutdown(self) -> None:
        """Kill every worker (idle or busy)."""
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.kill()


_POOL: SympyPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> SympyPool:
    """The process-wide sympy worker pool (created on first use, killed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = SympyPool()
            atexit.register(_POOL.shutdown)
        return _POOL
