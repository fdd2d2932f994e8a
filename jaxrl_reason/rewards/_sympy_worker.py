"""Sympy comparisons in worker processes, so a hang can be ended by killing the process
(the parent side; the workers' own program is `_sympy_child`).

Sympy can spin for minutes inside one C-level big-integer operation while holding the GIL
(`9**9**9**9`), and a thread cannot be interrupted, so every sympy call of the reward code
runs in a small pool of persistent child processes. Each comparison may use `timeout_s`
seconds of its own CPU time (the job's `ITIMER_PROF`; the kernel kills a job that overruns):
a verdict, and a timeout, do not depend on how busy the machine is or on what the other
comparisons of a batch cost. Wall time is only a backstop (`wall_s`, by default
`WALL_FACTOR` times the CPU limit and at least `MIN_WALL_S`) against a job, a worker or a
start-up that makes no progress: a comparison not decided by then is *unscored* ("w" with
`detail`), never a timeout. A worker that does not answer within a short grace after the
backstop is killed, and a replacement starts at once in the background. The client is safe
to use from many threads.

Each worker is a zygote (`_sympy_child.main`): it imports sympy and math-verify, warms them
up, hardens them and announces `{"ready": true}`, then serves one request per line, forking
a job per request that writes its verdict into a pipe made for that job only (the protocol
and how a job decides: `_sympy_child`). A request is one comparison (`compare`) or a batch
of comparisons judged one after another in one job (`compare_many`, which fills the cache
for the calls that follow, e.g. a reward batch's answers before their `correctness` calls).
The parent accepts exactly one line with the request's id (and, for a batch, one verdict per
comparison); anything else (silence past the deadline, garbage, an extra line) kills and
replaces the worker, so one job's output can never reach another job's verdict. With
isolation (the default where `isolation.available()`), the zygote runs under bubblewrap as
an unprivileged uid with no capabilities, no network, its own pid namespace and a
read-only view of the Python installation and the three program files only. Without it
(no bwrap, or `isolate=False`) the zygote still sets the same rlimits on itself before it
does anything else (`isolation.unconfined_preamble`: address space, CPU, file size, open
files, no core dumps), starts with the sandbox's near-empty environment
(`isolation.unconfined_env`), in `/`, and inherits no descriptor but its stdin/stdout
(`close_fds`, nothing in `pass_fds`); the pool warns once that it has no sandbox.

Modes: "mv" (`a` is a prediction, `b` a gold answer, both answer text; the verdict is
`_latex_verify.verdict` with the options `o`), "expr", "eq", "rel" (`_sympy_tree` only;
see `_sympy_child`).
"""
from __future__ import annotations

import atexit
import collections
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
# The other rlimits of a worker (its jobs inherit them): CPU seconds of the zygote's own
# lifetime (each comparison is limited separately by its job's timer), largest file,
# open descriptors; a worker writes no file.
_CPU_S, _FILE_BYTES, _OPEN_FILES = 3600, 2**20, 64
_CACHE_SIZE = 1 << 16  # verdicts remembered by the parent (see `SympyPool.compare`)
_REPLY_GRACE_S = 0.5  # the zygote ends a job at its deadline; past this grace it is killed
# The wall-clock backstop of a comparison: this many times its CPU limit, at least
# MIN_WALL_S. Generous: a comparison hits it only when it gets almost no CPU at all.
WALL_FACTOR = 10.0
MIN_WALL_S = 10.0
UNSCORED = "w"  # `compare(detail=True)`: not decided within the wall-clock backstop


def wall_backstop(cpu_s: float) -> float:
    """The default wall-clock backstop of a comparison allowed `cpu_s` seconds of CPU."""
    return max(MIN_WALL_S, WALL_FACTOR * float(cpu_s))
_PROGRAM = ("_sympy_child.py", "_sympy_tree.py", "_latex_verify.py")  # the worker's files
# Run the child program by path without putting its directory (which holds `math.py`) on
# sys.path.
_BOOTSTRAP = (
    "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_path(sys.argv[1], run_name='__jaxrl_sympy_worker__')"
)



def _valid(verdict, batch: bool) -> bool:
    """Whether `verdict` is one a job can give: True, False, None, "c", "w" (and "u" in a
    batch, a comparison the job did not decide)."""
    return any(verdict is v for v in (True, False, None)) or verdict in ("c", UNSCORED) or \
        (batch and verdict == "u")


def _reply(line: bytes | None, job: int, count: int | None = None) -> dict | None:
    """The zygote's reply to request `job` if `line` is exactly that, else None: one
    verdict, or with `count` (a batch request) a list of exactly `count` verdicts."""
    try:
        reply = json.loads(line) if line is not None else None
    except ValueError:
        return None
    if not isinstance(reply, dict) or set(reply) != {"id", "r"} or reply["id"] != job:
        return None
    r = reply["r"]
    if count is None:
        return reply if _valid(r, False) else None
    if not isinstance(r, list) or len(r) != count or not all(_valid(v, True) for v in r):
        return None
    return reply


class _Worker:
    """One child process and its line buffer; `ready` once it has announced itself."""

    def __init__(self, isolate: bool) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        files = [os.path.join(here, name) for name in _PROGRAM]
        from jaxrl_reason.rewards import isolation  # parent side only

        seccomp, cwd = None, "/"
        if isolate:
            seccomp = isolation.seccomp_fd()
            limits = isolation.rlimit_args(_MEMORY_BYTES, _CPU_S, _FILE_BYTES, _OPEN_FILES, 512)
            # Not --die-with-parent: a worker outlives the pool thread that started it; it
            # ends on stdin EOF, and its pid namespace with it.
            argv = isolation.sandbox_command(
                [sys.executable, "-I", "-c", _BOOTSTRAP, files[0], "--own-pid-ns"],
                files=files, rlimits=limits, die_with_parent=False, seccomp=seccomp)
            env = isolation.sandbox_env()
        else:  # no sandbox: the same rlimits, set by the child on itself before anything else
            preamble = isolation.unconfined_preamble(_MEMORY_BYTES, _CPU_S, _FILE_BYTES,
                                                     _OPEN_FILES)
            argv = [sys.executable, "-I", "-c", f"{preamble}; {_BOOTSTRAP}", files[0]]
            env = isolation.unconfined_env()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                                         close_fds=True,
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
                warnings.warn("sympy workers run WITHOUT OS isolation: "
                              + isolation.unavailable_reason() + " (rlimits, an empty "
                              "environment and no inherited descriptors only)",
                              RuntimeWarning)
        self.isolate = bool(isolate)
        self.max_workers = max_workers
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._all: set[_Worker] = set()
        self._closed = False
        self._served = False  # whether any worker has been ready yet
        self._verdicts: collections.OrderedDict = collections.OrderedDict()
        # Requests a batch job is deciding: key -> (event set when it ends, its deadline).
        self._inflight: dict[tuple, tuple[threading.Event, float]] = {}
        # Requests that overran their time in a batch job: the next call returns None once.
        self._timed_out: collections.OrderedDict = collections.OrderedDict()

    def compare(
        self, a: str, b: str, mode: str = "expr", atol: float = 0.0, timeout_s: float = 5.0,
        options: dict | None = None, *, wall_s: float | None = None, detail: bool = False,
    ) -> bool | str | None:
        """Compare two expression strings in a worker (modes: see the module docstring).

        `timeout_s` is the comparison's own CPU time; `wall_s` (default
        `wall_backstop(timeout_s)`) the wall-clock backstop of the whole call, waiting for a
        worker or a batch job included. Returns True/False, or None when not decided: the
        comparison used up its CPU time (a timeout: the answer's own cost) or, only with
        `detail=False`, the backstop passed first; with `detail=True` the latter is
        `UNSCORED` ("w", truthy: test `is True`). A worker still computing at the backstop
        is killed and replaced. A verdict is a pure function of the request, so True/False
        verdicts are kept in an LRU cache of `_CACHE_SIZE` requests (the jobs' own sympy
        caches die with them). A mode "mv" request with a completion and `later` false
        (the answer is the completion's one reading whenever it has a value: see
        `rewards/_reading.py`) also records a match of the answer alone (the job tells which
        reading matched), so another such completion with that answer and gold needs no
        job; nothing else is shared between completions, which may read differently. A
        request that a `compare_many` job is deciding is waited for
        (until that job's backstop) rather than run twice; one that overran its CPU time
        there returns None once.
        """
        wall_s = wall_backstop(timeout_s) if wall_s is None else float(wall_s)
        request = (a, b, mode, float(atol), options)
        state = self._lookup(request)
        if state["event"] is not None:
            state["event"].wait(max(0.0, min(state["until"] - time.monotonic(), wall_s)))
            state = self._lookup(request)
        if state["done"]:
            return state["verdict"]
        verdict = self._compare(a, b, mode, atol, timeout_s, wall_s, state["options"])
        self._remember(state, verdict)
        if verdict == UNSCORED:
            return UNSCORED if detail else None
        return None if verdict is None else bool(verdict)

    def compare_many(self, requests: list[tuple], timeout_s: float = 5.0,
                     wall_s: float | None = None) -> list:
        """Decide several requests `(a, b, mode, atol, options)` in one worker job, one after
        another, each allowed `timeout_s` seconds of its own CPU time and `wall_s` (default
        `wall_backstop(timeout_s)`) of wall time (a job per comparison costs a fork and cold
        caches; this is what a reward batch uses before its per-answer calls).

        Requests already cached or being decided elsewhere are skipped. The verdicts go to
        the cache `compare` reads (a request that overran its CPU time: a None for the next
        `compare` of it). Returns one entry per request: True/False, None (overran its CPU
        time), or "u": not decided here (skipped, or the job stopped before it: a limit of
        an earlier comparison, the backstop, a resource error, a crash, a broken reply);
        `compare` runs those singly, so a slow answer cannot time out the others of its job.
        """
        wall_s = wall_backstop(timeout_s) if wall_s is None else float(wall_s)
        states, todo, out = [], [], ["u"] * len(requests)
        until = time.monotonic() + len(requests) * wall_s + _REPLY_GRACE_S
        with self._lock:
            for i, request in enumerate(requests):
                state = self._lookup(request, locked=True, consume=False)
                if state["done"] or state["event"] is not None:
                    continue
                self._inflight[state["key"]] = (threading.Event(), until)
                states.append(state)
                todo.append(i)
        if not todo:
            return out
        verdicts = ["u"] * len(todo)
        try:
            items = [{"a": requests[i][0], "b": requests[i][1], "mode": requests[i][2],
                      "atol": float(requests[i][3]), "o": st["options"]}
                     for i, st in zip(todo, states)]
            verdicts = self._request({"batch": items}, timeout_s, wall_s, len(items))
            if not isinstance(verdicts, list):  # no valid reply: all undecided
                verdicts = ["u"] * len(todo)
        finally:
            for i, state, verdict in zip(todo, states, verdicts):
                if verdict == UNSCORED:
                    verdict = "u"
                out[i] = verdict if verdict == "u" else None if verdict is None \
                    else bool(verdict)
                if verdict is None:
                    with self._lock:
                        self._timed_out[state["key"]] = True
                        while len(self._timed_out) > _CACHE_SIZE:
                            self._timed_out.popitem(last=False)
                elif verdict != "u":
                    self._remember(state, verdict)
                with self._lock:
                    event, _ = self._inflight.pop(state["key"])
                event.set()
        return out

    def _lookup(self, request: tuple, locked: bool = False, consume: bool = True) -> dict:
        """What the pool knows of `request` (a, b, mode, atol, options): "key", "pair" (the
        key of the answer alone, mode "mv" with a completion and `later` false), "done" and
        "verdict" (a cached verdict, or a None left by a batch timeout, consumed here unless
        `consume` is False; a pair counts only as a match), "event" and "until" (a batch job
        deciding it), "options"."""
        if not locked:
            with self._lock:
                return self._lookup(request, locked=True, consume=consume)
        a, b, mode, atol, options = request
        key = self._key(a, b, mode, atol, options)
        pair = None
        if mode == "mv" and options and options.get("completion") is not None and \
                not options.get("later"):
            pair = self._key(a, b, mode, atol, {**options, "completion": None})
        state = {"key": key, "pair": pair, "done": False, "verdict": None, "event": None,
                 "until": 0.0, "options": options}
        for k in (key, pair):
            if k in self._verdicts:
                self._verdicts.move_to_end(k)
                if k == key or self._verdicts[k]:
                    state.update(done=True, verdict=self._verdicts[k])
                    return state
        if (self._timed_out.pop if consume else self._timed_out.get)(key, None):
            state["done"] = True
            return state
        if key in self._inflight:
            state["event"], state["until"] = self._inflight[key]
        return state

    def _remember(self, state: dict, verdict) -> None:
        """Cache a decided verdict (True/False/"c") of the request `_lookup` described."""
        if verdict is None or verdict == UNSCORED:
            return
        with self._lock:
            self._verdicts[state["key"]] = bool(verdict)
            if state["pair"] is not None and verdict is True:  # the answer alone matched
                self._verdicts[state["pair"]] = True
            while len(self._verdicts) > _CACHE_SIZE:
                self._verdicts.popitem(last=False)

    @staticmethod
    def _key(a: str, b: str, mode: str, atol: float, options: dict | None) -> tuple:
        """The cache key of a request."""
        return (a, b, mode, float(atol), json.dumps(options, sort_keys=True))

    def _compare(self, a: str, b: str, mode: str, atol: float, timeout_s: float,
                 wall_s: float, options: dict | None = None) -> bool | str | None:
        """One request to a worker (no cache)."""
        return self._request({"a": a, "b": b, "mode": mode, "atol": float(atol),
                              "o": options}, timeout_s, wall_s)

    def _request(self, body: dict, timeout_s: float, wall_s: float, count: int | None = None):
        """Send `body` (a comparison, or with `count` a batch of `count`, each allowed
        `timeout_s` seconds of CPU time and `wall_s` of wall time) to a worker and return the
        reply's verdict(s), or `UNSCORED` when no valid reply came within the wall backstop
        (waiting for a worker slot or a start-up included; the worker is then killed and
        replaced)."""
        total = wall_s * (count or 1)
        deadline = time.monotonic() + total
        if not self._slots.acquire(timeout=max(0.0, total)):
            return UNSCORED
        worker, first_start, started = None, not self._served, time.monotonic()
        try:
            worker = self._checkout(deadline)
            if worker is None:
                return UNSCORED
            if first_start:  # the pool's first start-up is not counted against the call
                deadline += time.monotonic() - started
            worker.jobs += 1
            job = worker.jobs
            left = max(0.0, deadline - time.monotonic())
            request = {"id": job, **body, "t": float(timeout_s),
                       "w": left if count is None else wall_s}
            worker.proc.stdin.write((json.dumps(request) + "\n").encode())
            worker.proc.stdin.flush()
            line = worker.read_line(deadline + _REPLY_GRACE_S)
            reply = _reply(line, job, count)
            if reply is None or worker.pending():  # silent, garbled, or more than one line
                self._discard(worker, replace=True)
                worker = None
                return UNSCORED
            self._checkin(worker)
            worker = None
            return reply["r"]
        except Exception:
            if worker is not None:
                self._discard(worker, replace=True)
            return UNSCORED
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
