r"""The sympy worker's own program: the zygote and the jobs it forks (child side).

`_sympy_worker.SympyPool` (the parent side) starts this file by path inside the sandbox
(`python -I -c <bootstrap> _sympy_child.py`); it imports nothing from the package and loads
its two siblings, `_sympy_tree` and `_latex_verify`, by path (`load`).

The zygote imports sympy and math-verify, warms them up on constants, hardens them
(`_latex_verify.harden`), announces `{"ready": true}`, then serves one request per line:

- `{"id": int, "a": str, "b": str, "mode": str, "atol": float, "t": float, "w": float,
  "o": dict | null}`: one comparison in a job forked for it (`run_job`), answered
  `{"id": id, "r": true | false | "c" | null | "w"}` ("c": mode "mv", only math-verify's
  own extraction from the completion matched; null: the comparison used up `t` seconds of
  its own CPU time and was killed; "w": not decided within `w` seconds of wall time, the
  backstop against a job that makes no progress, e.g. on a machine too busy to run it);
- `{"id": int, "batch": [{"a", "b", "mode", "atol", "o"}, ...], "t": float, "w": float}`:
  several comparisons, one after another, in one forked job (`run_batch_job`), each allowed
  `t` seconds of CPU time of its own (and `w` of wall time from the end of the one before);
  answered `{"id": id, "r": [verdict, ...]}`, one entry per comparison, where a verdict is
  as above or "u" (not decided: the job stopped before it, at a limit of an earlier
  comparison, a resource error such as MemoryError or RecursionError, a crash or garbage on
  its pipe; the parent runs those again singly). A comparison that reaches its wall backstop
  is "u" too (run again singly, where that gives "w").

CPU time, not wall time, decides a timeout: the job arms `ITIMER_PROF` (the process's own
user + system time) with `t` before each comparison, and the kernel kills it with SIGPROF
when that comparison has used `t` seconds; a verdict therefore does not depend on what
else the machine runs. Wall time only bounds a job that does not progress (`w`).

After replying, the zygote kills and reaps the job (and, in its own pid namespace, every
other process but itself) before it reads the next request. A job holds only the write end
of a pipe made for it (stdin/stdout/stderr are /dev/null, every other descriptor closed) and
the zygote is non-dumpable, so a job cannot reach the verdict stream or another job.

How a job decides (mode "mv": `_latex_verify.verdict`, math-verify on hardened parsers;
other modes: `_sympy_tree` only; nothing is evaluated as code): modes "expr" (equal values;
a matrix equals a matrix of the same shape entrywise), "eq" (`a` and `b` are `lhs - (rhs)`
of two equations: equal up to a nonzero constant factor), "rel" (same for two inequalities,
the factor must be positive); `atol` is an extra absolute tolerance for constant expressions
(the half-unit of a decimal literal). Constants compare exactly when their difference is a
rational number, else numerically at 30 digits (relative 1e-12, plus `atol`); expressions
with free symbols are evaluated at a few random positive rational points (agreement at all
valid points means equal, so `sqrt(x^2)` counts as `x`), and `simplify` is only the fallback
when no point gives finite values.
"""
from __future__ import annotations

import cmath
import gc
import json
import os
import select
import signal
import sys
import time

_REL_TOL = 1e-12
STATE: dict = {}


def _parse(text: str):
    """The sympy object of one expression string, built from a syntax tree by `_sympy_tree`
    (loaded by path next to this file); no string is ever evaluated."""
    return STATE["tree"].build(text)


def compare(a: str, b: str, mode: str = "expr", atol: float = 0.0,
                   options: dict | None = None) -> bool | str:
    """The verdict of one request (see the module docstring); mode "mv" gives
    `_latex_verify.verdict`'s "pred" / "completion" / ""."""
    from sympy.matrices import MatrixBase

    if mode == "mv":
        return STATE["mv"].verdict(a, b, dict(options or {}), STATE["tree"])

    ea, eb = _parse(a), _parse(b)
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


def load(name: str):
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


_BYTES = {b"T": True, b"F": False, b"C": "c"}
_UNDECIDED = "u"  # batch verdict: not decided in this job (the parent runs it again singly)
_WALL = "w"  # not decided within the wall-clock backstop (unscored, not a timeout)


def _verdict_byte(item: dict) -> bytes:
    """One comparison of a job as its verdict byte: T/F, C (mode "mv", only the completion
    matched), R (a resource error: MemoryError or RecursionError, after which the job stops
    so that later comparisons are not judged in a starved process)."""
    try:
        found = compare(str(item["a"]), str(item["b"]), str(item["mode"]),
                        float(item["atol"]), item.get("o"))
    except (MemoryError, RecursionError):
        return b"R"
    except BaseException:  # any parse/simplify failure means "not shown equal"
        return b"F"
    return b"C" if found == "completion" else b"T" if found else b"F"


def _fork_job(items: list[dict], cpu_s: float) -> tuple[int, int]:
    """Fork a job that judges `items` in order, writing one verdict byte each (stopping
    after an R) into a pipe made for it; each comparison may use `cpu_s` seconds of the
    job's CPU time (`ITIMER_PROF`, rearmed before each: the kernel kills the job with SIGPROF
    when one overruns). Returns (read end of that pipe, the job's pid).

    The job holds only the write end of its own pipe (stdin/stdout/stderr are /dev/null,
    every other descriptor closed), so it cannot reach the verdict stream or any other job.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job: parse and compare untrusted text, answer bytes, exit
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, w)
            os.closerange(w + 1, 4096)
            os.setpgid(0, 0)
            gc.disable()  # the job is short-lived: no collection touching inherited pages
            signal.signal(signal.SIGPROF, signal.SIG_DFL)  # overrun: the kernel kills the job
            for item in items:
                signal.setitimer(signal.ITIMER_PROF, max(1e-3, cpu_s))
                byte = _verdict_byte(item)
                signal.setitimer(signal.ITIMER_PROF, 0)
                os.write(w, byte)
                if byte == b"R":
                    break
            os.close(w)  # end of file now, not after the address space is torn down
        finally:
            os._exit(0)
    os.close(w)
    return r, pid


_REAPED: set = set()  # jobs `_cpu_killed` reaped: `end_job` must not signal their pid again


def _cpu_killed(pid: int) -> bool:
    """Whether job `pid`, whose pipe reached end of file, was killed by SIGPROF (a comparison
    used up its CPU time); reaps it when it has exited (waiting up to a second: a job closes
    its pipe only as it exits). False for any other end."""
    for _ in range(100):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if done:
            _REAPED.add(pid)
            return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGPROF
        time.sleep(0.01)
    return False


def _read_verdicts(r: int, count: int, wall_s: float, pid: int) -> list:
    """Up to `count` verdicts read from the pipe `r` (closed here) of job `pid`, each within
    `wall_s` seconds of the one before (the backstop): True/False/"c" per byte, None for the
    comparison the kernel stopped at its CPU limit, "w" for one still running at the
    backstop, "u" for every one not decided (after a limit, a resource error, EOF or an
    unknown byte; any byte beyond `count` makes every verdict "u")."""
    verdicts: list = []
    deadline = time.monotonic() + wall_s
    try:
        while len(verdicts) < count:
            readable, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                verdicts.append(_WALL)
                break
            chunk = os.read(r, count + 1)
            known = [_BYTES.get(bytes([c])) for c in chunk]
            if None in known:  # an R (resource error) or garbage: the rest is undecided
                verdicts += known[:known.index(None)]
                break
            verdicts += known
            if not chunk:  # EOF: the job ended, died early or overran its CPU time
                if _cpu_killed(pid):
                    verdicts.append(None)
                break
            deadline = time.monotonic() + wall_s
        if len(verdicts) > count:
            return [_UNDECIDED] * count
        readable, _, _ = select.select([r], [], [], 0)
        if readable and os.read(r, 1):  # more bytes than comparisons: a broken job
            return [_UNDECIDED] * count
    finally:
        os.close(r)
    return verdicts + [_UNDECIDED] * (count - len(verdicts))


def _limits(req: dict) -> tuple[float, float]:
    """(CPU seconds per comparison, wall seconds of the backstop) of a request; a request
    without "w" gets ten times its CPU time."""
    cpu_s = max(0.0, float(req["t"]))
    return cpu_s, max(0.0, float(req.get("w", 10.0 * cpu_s)))


def run_job(req: dict) -> tuple[bool | str | None, int]:
    """Run one comparison (`req`: "a", "b", "mode", "atol", "o", CPU limit "t", wall
    backstop "w") in a forked job and read its verdict. Returns (True/False, "c" when only
    the completion matched (mode "mv"), None when it used up its CPU time or on anything but
    one verdict byte, "w" at the wall backstop; the job's pid). The job may still be running
    or exiting: the caller ends it with `end_job` before the next request (after sending the
    reply, so the reply does not wait for the teardown).
    """
    cpu_s, wall_s = _limits(req)
    r, pid = _fork_job([req], cpu_s)
    (verdict,) = _read_verdicts(r, 1, wall_s, pid)
    return (None if verdict == _UNDECIDED else verdict), pid


def run_batch_job(req: dict) -> tuple[list, int]:
    """Run the comparisons of `req["batch"]` one after another in one forked job, each
    allowed `req["t"]` seconds of CPU time of its own and `req["w"]` of wall time from the
    end of the one before (the process, its imports' caches and the gold answer's parse are
    shared, so a comparison costs about half a fork of its own). Returns (one verdict per
    comparison, as `_read_verdicts` but "u" for one at its wall backstop, which the parent
    runs again singly; the job's pid), the job possibly still running: end it with
    `end_job`."""
    items = [dict(item) for item in req["batch"]]
    cpu_s, wall_s = _limits(req)
    r, pid = _fork_job(items, cpu_s)
    verdicts = _read_verdicts(r, len(items), wall_s, pid)
    return [_UNDECIDED if v == _WALL else v for v in verdicts], pid


def end_job(pid: int, own_pid_ns: bool) -> None:
    """Kill and reap job `pid` and, in its own pid namespace, every other process but this
    one (strays a job may have left; pid 1, bwrap's init, is exempt)."""
    if pid in _REAPED:  # reaped already (`_cpu_killed`): its pid may be another's now
        _REAPED.discard(pid)
    else:
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


def main() -> None:
    """The zygote: serve requests (one comparison, or a batch of them; see the module
    docstring) from stdin until EOF, each in a forked job, answering one line per request."""
    STATE["tree"] = load("_sympy_tree")
    STATE["mv"] = load("_latex_verify")
    STATE["mv"].two_stage_parsing()
    for text in _WARM:
        for mode in ("expr", "eq"):
            try:
                compare(text, text, mode, 0.0)
            except Exception:
                pass
    warm_options = {"targets": ["latex", "expr", "string"]}
    for i, (a, b) in enumerate(STATE["mv"].WARM):
        completion = f"The answer is ${a}$." if i < 4 else None
        try:
            compare(a, b, "mv", 0.0, {**warm_options, "completion": completion})
        except Exception:
            pass
    STATE["mv"].harden()  # after the constant warm-up, before any untrusted text
    own_pid_ns = "--own-pid-ns" in sys.argv[1:]
    _undumpable()
    gc.collect()
    gc.freeze()  # forked jobs neither scan nor copy the warmed-up heap
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        result, pid = run_batch_job(req) if "batch" in req else run_job(req)
        try:
            out.write(json.dumps({"id": int(req["id"]), "r": result}) + "\n")
            out.flush()
        finally:
            end_job(pid, own_pid_ns)  # before the next request is read


if __name__ == "__jaxrl_sympy_worker__":
    main()
