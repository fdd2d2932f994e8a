"""Sympy comparisons in worker processes, so a hang can be ended by killing the process.

Sympy can spin for minutes inside one C-level big-integer operation while holding the GIL
(`9**9**9**9`), and a thread cannot be interrupted, so every sympy call of the reward code
runs in a small pool of persistent child processes. A job that overruns its deadline is
killed by its worker; a worker that does not answer within a short grace after the deadline
is killed itself, and a replacement starts at once in the background. The client is safe to
use from many threads.

Each worker is a zygote: it imports sympy, warms it up and announces `{"ready": true}`, then
serves one request per line, `{"id": int, "a": str, "b": str, "mode": str, "atol": float,
"t": float, "o": dict | null}`. It forks a job per request; the job parses both sides into
sympy objects (mode "mv": math-verify's LaTeX grammar, hardened by `_latex_verify.harden`
in the zygote, or `_sympy_tree`; other modes: `_sympy_tree` only; nothing is evaluated as
code), compares them and writes one byte into a pipe made for that job only; the zygote
answers `{"id": id, "r": true | false | "c" | null}` ("c": mode "mv", only math-verify's
own extraction from the completion matched; null: the job overran `t` and was killed),
then kills and reaps the job before it reads the next request. The parent accepts exactly one line with the
request's id; anything else (silence past the deadline, garbage, an extra line) kills and
replaces the worker, so one job's output can never reach another job's verdict. With
isolation (the default where `isolation.available()`), the zygote runs under bubblewrap as
an unprivileged uid with no capabilities, no network, its own pid namespace and a
read-only view of the Python installation and these three files only.

Modes: "mv" (`a` is a prediction, `b` a gold answer, both answer text; the verdict is
`_latex_verify.verdict` with the options `o`), "expr" (equal values; a matrix equals a
matrix of the same shape entrywise), "eq"
(`a` and `b` are `lhs - (rhs)` of two equations: equal up to a nonzero constant factor),
"rel" (same for two inequalities, the factor must be positive). `atol` is an extra absolute
tolerance for constant expressions (the half-unit of a decimal literal). This file is also
the zygote's program (`python -c <bootstrap> <this file>`); it imports nothing from the
package.

How the child decides: parse both sides; constants compare exactly when their difference is
a rational number, else numerically at 30 digits (relative 1e-12, plus `atol`); expressions
with free symbols are evaluated at a few random positive rational points (agreement at all
valid points means equal, so `sqrt(x^2)` counts as `x`), and `simplify` is only the fallback
when no point gives finite values.
"""
from __future__ import annotations

import atexit
import cmath
import collections
import gc
import json
import os
import select
import subprocess
import sys
import threading
import time
import warnings

# A fresh worker imports sympy (~0.3-2 s). The pool's very first start-up has this
# allowance beyond the caller's deadline; later (replacement) start-ups do not.
_STARTUP_TIMEOUT_S = 30.0
# Idle workers cost memory, not CPU: two more than the cores (at most 4), so that a call
# stuck until its deadline on a small host does not make the other threads wait for a slot.
_MAX_WORKERS = min(4, (os.cpu_count() or 1) + 2)
_MEMORY_BYTES = 4 * 2**30  # address space of a worker and of each of its jobs
_CACHE_SIZE = 1 << 16  # verdicts remembered by the parent (see `SympyPool.compare`)
_REPLY_GRACE_S = 0.5  # the zygote ends a job at its deadline; past this grace it is killed
# Run this file by path without putting its directory (which holds `math.py`) on sys.path.
_BOOTSTRAP = (
    "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_path(sys.argv[1], run_name='__jaxrl_sympy_worker__')"
)


# ----------------------------------------------------------------------------- child side

_REL_TOL = 1e-12
_CHILD: dict = {}


def _child_parse(text: str):
    """The sympy object of one expression string, built from a syntax tree by `_sympy_tree`
    (loaded by path next to this file); no string is ever evaluated."""
    return _CHILD["tree"].build(text)


def _child_compare(a: str, b: str, mode: str = "expr", atol: float = 0.0,
                   options: dict | None = None) -> bool | str:
    """The verdict of one request (see the module docstring); mode "mv" gives
    `_latex_verify.verdict`'s "pred" / "completion" / ""."""
    from sympy.matrices import MatrixBase

    if mode == "mv":
        return _CHILD["mv"].verdict(a, b, dict(options or {}), _CHILD["tree"])

    ea, eb = _child_parse(a), _child_parse(b)
    ma, mb = isinstance(ea, MatrixBase), isinstance(eb, MatrixBase)
    if ma or mb:
        if mode != "expr" or not (ma and mb) or ea.shape != eb.shape:
            return False
        return all(_scalar_equal(x, y, 0.0) for x, y in zip(ea, eb))
    if mode == "expr":
        return _scalar_equal(ea, eb, atol)
    return _proportional(ea, eb, positive=mode == "rel")


def _points(symbols: list, count: int = 6):
    """Random positive rational assignments of `symbols` (fixed seed)."""
    import random

    import sympy

    rng = random.Random(0)
    for _ in range(count):
        yield {s: sympy.Rational(rng.randint(1, 97), rng.randint(1, 13)) for s in symbols}


def _value(expr, point) -> complex | None:
    """`expr` at `point` as a finite complex number, else None."""
    try:
        value = complex(expr.evalf(30, subs=point) if point else expr.evalf(30))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError):
        return None
    return value if cmath.isfinite(value) else None


def _scalar_equal(ea, eb, atol: float) -> bool:
    import sympy

    if not isinstance(ea, sympy.Expr) or not isinstance(eb, sympy.Expr):
        return bool(ea == eb)
    if ea == eb:
        return True
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    if not symbols:
        if any(e.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) for e in (ea, eb)):
            return False
        diff = ea - eb
        if diff == 0:
            return True
        if diff.is_Rational and not atol:
            return False
        va, vb = _value(ea, None), _value(eb, None)
        return va is not None and vb is not None and _close(va, vb, atol)
    valid = 0
    for point in _points(symbols):
        va, vb = _value(ea, point), _value(eb, point)
        if va is None or vb is None:
            continue
        if not _close(va, vb, 0.0):
            return False
        valid += 1
    return valid >= 2 or bool(sympy.simplify(ea - eb) == 0)


def _proportional(ea, eb, positive: bool) -> bool:
    """Whether `ea = c * eb` for a constant c != 0 (c > 0 with `positive`)."""
    import sympy

    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    ratios = []
    for point in _points(symbols) if symbols else [None]:
        va, vb = _value(ea, point), _value(eb, point)
        if va is None or vb is None:
            continue
        if abs(vb) < 1e-25 or abs(va) < 1e-25:
            if abs(vb) < 1e-25 and abs(va) < 1e-25:
                continue
            return False
        ratios.append(va / vb)
    if not ratios:
        both_zero = sympy.simplify(ea) == 0 and sympy.simplify(eb) == 0
        return bool(both_zero and not positive)
    r0 = ratios[0]
    if positive and not (abs(r0.imag) <= 1e-12 * abs(r0) and r0.real > 0):
        return False
    return all(_close(r, r0, 0.0) for r in ratios)


def _close(va: complex, vb: complex, atol: float) -> bool:
    """Finite and equal to about twelve significant digits, or within `atol`."""
    if not (cmath.isfinite(va) and cmath.isfinite(vb)):
        return False
    return abs(va - vb) <= atol + _REL_TOL * max(abs(va), abs(vb)) + 1e-20


# Comparisons run once in the zygote before it announces readiness, so that the lazy imports
# and caches they fill are paid once rather than in every forked job.
_WARM = ["2 x + 1", "sqrt(2)/2", "sin(pi/3) + cos(x)", "Matrix([[1, 2], [3, 4]])",
         "log(8)/log(2)", "(n + 1)!", "binomial(5, 2)", "floor(x) + Abs(y)", "1.5", "x_1 y",
         "E**(I pi)", "atan(1) + exp(2)"]


def _load(name: str):
    """Module `name` (`_sympy_tree`, `_latex_verify`) loaded by path from this file's
    directory (no package import)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location("_jaxrl" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _undumpable() -> None:
    """PR_SET_DUMPABLE 0: the forked jobs (same uid) cannot ptrace this process or open its
    file descriptors through /proc, so they cannot write to the verdict stream."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _job(req: dict) -> tuple[bool | None, int]:
    """Run one comparison in a forked process and read its verdict from a fresh pipe.

    The job process holds only the write end of its own pipe (stdin/stdout/stderr are
    /dev/null, every other descriptor closed), so it cannot reach the verdict stream or any
    other job. Returns (True/False, "c" when only the completion matched (mode "mv"), or
    None at the request's time limit `t`; the job's pid).
    The job may still be running or exiting: the caller ends it with `_end_job` before the
    next request (after sending the reply, so the reply does not wait for the teardown).
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job: parse and compare untrusted text, answer one byte, exit
        verdict = b"F"
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, w)
            os.closerange(w + 1, 4096)
            os.setpgid(0, 0)
            gc.disable()  # the job is short-lived: no collection touching inherited pages
            found = _child_compare(str(req["a"]), str(req["b"]), str(req["mode"]),
                                   float(req["atol"]), req.get("o"))
            verdict = b"C" if found == "completion" else b"T" if found else b"F"
        except BaseException:  # any parse/simplify failure means "not shown equal"
            pass
        try:
            os.write(w, verdict)
            os.close(w)  # end of file now, not after the address space is torn down
        finally:
            os._exit(0)
    os.close(w)
    deadline, data = time.monotonic() + max(0.0, float(req["t"])), b""
    try:
        while len(data) < 2:
            readable, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(r, 2) if readable else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    return {b"T": True, b"F": False, b"C": "c"}.get(data), pid


def _end_job(pid: int, own_pid_ns: bool) -> None:
    """Kill and reap job `pid` and, in its own pid namespace, every other process but this
    one (strays a job may have left; pid 1, bwrap's init, is exempt)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, 9)
        except OSError:
            pass
    os.waitpid(pid, 0)
    if own_pid_ns:
        try:
            os.kill(-1, 9)
        except OSError:
            pass
        _reap()


def _reap() -> None:
    """Collect exited children without blocking."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _child_main() -> None:
    """The zygote: serve requests `{"id", "a", "b", "mode", "atol", "t"}` from stdin until
    EOF, each in a forked job, answering `{"id": id, "r": true | false | "c" | null}`."""
    _CHILD["tree"] = _load("_sympy_tree")
    _CHILD["mv"] = _load("_latex_verify")
    _CHILD["mv"].two_stage_parsing()
    for text in _WARM:
        for mode in ("expr", "eq"):
            try:
                _child_compare(text, text, mode, 0.0)
            except Exception:
                pass
    warm_options = {"targets": ["latex", "expr", "string"]}
    for i, (a, b) in enumerate(_CHILD["mv"].WARM):
        completion = f"The answer is ${a}$." if i < 4 else None
        try:
            _child_compare(a, b, "mv", 0.0, {**warm_options, "completion": completion})
        except Exception:
            pass
    _CHILD["mv"].harden()  # after the constant warm-up, before any untrusted text
    own_pid_ns = "--own-pid-ns" in sys.argv[1:]
    _undumpable()
    gc.collect()
    gc.freeze()  # forked jobs neither scan nor copy the warmed-up heap
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        result, pid = _job(req)
        try:
            out.write(json.dumps({"id": int(req["id"]), "r": result}) + "\n")
            out.flush()
        finally:
            _end_job(pid, own_pid_ns)  # before the next request is read


if __name__ == "__jaxrl_sympy_worker__":
    _child_main()


# ---------------------------------------------------------------------------- parent side


def _reply(line: bytes | None, job: int) -> dict | None:
    """The zygote's reply to request `job` if `line` is exactly that, else None."""
    try:
        reply = json.loads(line) if line is not None else None
    except ValueError:
        return None
    if not isinstance(reply, dict) or set(reply) != {"id", "r"} or reply["id"] != job or \
            not (any(reply["r"] is v for v in (True, False, None)) or reply["r"] == "c"):
        return None
    return reply


class _Worker:
    """One child process and its line buffer; `ready` once it has announced itself."""

    def __init__(self, isolate: bool) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        files = [os.path.join(here, name)
                 for name in ("_sympy_worker.py", "_sympy_tree.py", "_latex_verify.py")]
        argv = [sys.executable, "-I", "-c", _BOOTSTRAP, files[0]]
        env, seccomp = None, None
        if isolate:
            from jaxrl_reason.rewards import isolation  # parent side only

            seccomp = isolation.seccomp_fd()

            limits = isolation.rlimit_args(_MEMORY_BYTES, 3600, 2**20, 64, 512)
            # Not --die-with-parent: a worker outlives the pool thread that started it; it
            # ends on stdin EOF, and its pid namespace with it.
            argv = isolation.sandbox_command(argv + ["--own-pid-ns"], files=files,
                                             rlimits=limits, die_with_parent=False,
                                             seccomp=seccomp)
            env = isolation.sandbox_env()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env,
                                         pass_fds=() if seccomp is None else (seccomp,))
        finally:
            if seccomp is not None:
                os.close(seccomp)
        self.jobs = 0
        self._buf = b""
        self.ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, deadline: float) -> bool:
        """Whether the child is (or becomes, before `deadline`) ready to serve."""
        if not self.ready:
            line = self.read_line(deadline)
            try:
                self.ready = line is not None and bool(json.loads(line).get("ready"))
            except ValueError:
                self.ready = False
        return self.ready

    def read_line(self, deadline: float) -> bytes | None:
        """The next line from the child, or None at the deadline or on EOF (a past deadline
        still reads what has already arrived)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def pending(self) -> bool:
        """Whether anything beyond the last reply has arrived (a sign of a broken worker)."""
        if self._buf:
            return True
        readable, _, _ = select.select([self.proc.stdout.fileno()], [], [], 0)
        return bool(readable)

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
    """A bounded set of sympy worker processes shared by all threads.

    At most `max_workers` children exist at a time. A child killed at a deadline is replaced
    at once by a fresh one that starts up in the background; callers prefer ready children
    and wait for a starting one only within their own deadline (only the pool's very first
    start-up is allowed `_STARTUP_TIMEOUT_S` beyond it).
    """

    def __init__(self, max_workers: int = _MAX_WORKERS, isolate: bool | None = None) -> None:
        if isolate is None:
            from jaxrl_reason.rewards import isolation

            isolate = isolation.available()
            if not isolate:
                warnings.warn("sympy workers run WITHOUT OS isolation (bubblewrap or user "
                              "namespaces unavailable); install bubblewrap", RuntimeWarning)
        self.isolate = bool(isolate)
        self.max_workers = max_workers
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._all: set[_Worker] = set()
        self._closed = False
        self._served = False  # whether any worker has been ready yet
        self._verdicts: collections.OrderedDict = collections.OrderedDict()

    def compare(
        self, a: str, b: str, mode: str = "expr", atol: float = 0.0, timeout_s: float = 5.0,
        options: dict | None = None,
    ) -> bool | None:
        """Compare two expression strings in a worker (modes: see the module docstring).

        Returns True/False, or None when the deadline (`timeout_s` of wall time) passed
        first; a worker still computing is then killed and replaced. A verdict is a pure
        function of the request, so True/False verdicts are kept in an LRU cache of
        `_CACHE_SIZE` requests (the jobs' own sympy caches die with them). A mode "mv"
        request with a completion also records the verdict on the answer alone (the job
        tells which of the two matched): an answer known equal needs no job, one known
        different is not parsed again (`pred_different`).
        """
        key = self._key(a, b, mode, atol, options)
        pair = None
        if mode == "mv" and options and options.get("completion") is not None:
            pair = self._key(a, b, mode, atol, {**options, "completion": None})
        with self._lock:
            for k in (key, pair):
                if k in self._verdicts:
                    self._verdicts.move_to_end(k)
                    if k == key or self._verdicts[k]:
                        return self._verdicts[k]
            known_different = pair in self._verdicts
        if known_different:
            options = {**options, "pred_different": True}
        verdict = self._compare(a, b, mode, atol, timeout_s, options)
        if verdict is None:
            return None
        with self._lock:
            self._verdicts[key] = bool(verdict)
            if pair is not None and not known_different:
                self._verdicts[pair] = verdict is True
            while len(self._verdicts) > _CACHE_SIZE:
                self._verdicts.popitem(last=False)
        return bool(verdict)

    @staticmethod
    def _key(a: str, b: str, mode: str, atol: float, options: dict | None) -> tuple:
        """The cache key of a request."""
        return (a, b, mode, float(atol), json.dumps(options, sort_keys=True))

    def _compare(self, a: str, b: str, mode: str, atol: float, timeout_s: float,
                 options: dict | None = None) -> bool | None:
        """One request to a worker (no cache)."""
        deadline = time.monotonic() + timeout_s
        if not self._slots.acquire(timeout=max(0.0, timeout_s)):
            return None
        worker, first_start, started = None, not self._served, time.monotonic()
        try:
            worker = self._checkout(deadline)
            if worker is None:
                return None
            if first_start:  # the pool's first start-up is not counted against the call
                deadline += time.monotonic() - started
            worker.jobs += 1
            job = worker.jobs
            request = {"id": job, "a": a, "b": b, "mode": mode, "atol": float(atol),
                       "t": max(0.0, deadline - time.monotonic()), "o": options}
            worker.proc.stdin.write((json.dumps(request) + "\n").encode())
            worker.proc.stdin.flush()
            line = worker.read_line(deadline + _REPLY_GRACE_S)
            reply = _reply(line, job)
            if reply is None or worker.pending():  # silent, garbled, or more than one line
                self._discard(worker, replace=True)
                worker = None
                return None
            self._checkin(worker)
            worker = None
            return reply["r"]
        except Exception:
            if worker is not None:
                self._discard(worker, replace=True)
            return None
        finally:
            self._slots.release()

    def warm(self, timeout_s: float = _STARTUP_TIMEOUT_S) -> int:
        """Start `max_workers` children and wait until they are ready (or `timeout_s`).
        Returns the number of ready workers."""
        with self._lock:
            missing = self.max_workers - len(self._all)
        for _ in range(max(0, missing)):
            self._spawn()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            workers = list(self._idle)
        ready = sum(w.wait_ready(deadline) for w in workers)
        with self._lock:
            self._served |= ready > 0
        return ready

    def _spawn(self) -> None:
        worker = _Worker(self.isolate)
        with self._lock:
            if not self._closed:
                self._all.add(worker)
                self._idle.append(worker)
                return
        worker.kill()

    def _checkin(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def _checkout(self, deadline: float) -> _Worker | None:
        """A ready idle worker, else a starting one (waited for until the deadline), else a
        new one."""
        with self._lock:
            dead = [w for w in self._idle if not w.alive()]
            self._idle = [w for w in self._idle if w.alive()]
            for w in self._idle:  # children that announced themselves since the last look
                w.ready or w.wait_ready(0.0)
            ready = [w for w in self._idle if w.ready]
            worker = (ready or self._idle or [None])[-1]
            if worker is not None:
                self._idle.remove(worker)
            free_start = not self._served
        for w in dead:
            self._discard(w)
        if worker is None:
            worker = _Worker(self.isolate)
            with self._lock:
                self._all.add(worker)
        startup = max(deadline, time.monotonic() + _STARTUP_TIMEOUT_S) if free_start else deadline
        if not worker.wait_ready(startup):
            if worker.alive():
                self._checkin(worker)  # still starting: the next caller may use it
            else:
                self._discard(worker)
            return None
        with self._lock:
            self._served = True
        return worker

    def _discard(self, worker: _Worker, replace: bool = False) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
        if replace:
            self._spawn()

    def shutdown(self) -> None:
        """Kill every worker (idle, starting or busy)."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
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
