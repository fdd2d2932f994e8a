"""Hostile answers against the math verifier: evaluation, forged and leaked verdicts.

Before: `parse_expr` evaluated sympy calls such as `sympify(...)` in the answer (and in the
gold answer), which re-parsed assembled strings with builtins and reached `exec`; the
worker's verdict was a `{"r": ...}` line on the stdout the payload shared, so a payload could
forge its own verdict and queue verdicts for later jobs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from jaxrl_reason.rewards import _sympy_child, _sympy_tree, _sympy_worker, isolation
from jaxrl_reason.rewards._sympy_worker import SympyPool
from jaxrl_reason.rewards.math import is_equivalent

# Names-and-parentheses answers that the old parser evaluated as sympy calls.
CALLS = ["sympify(7)", "S(7)", "srepr(x)", "sstr(x)", "latex(x)", "Tuple(7)",
         "IndexedBase(x)", "exec(x)", "eval(x)", "lambdify(x, x)", "parse_expr(x)",
         "Lambda(x, 7)", "Function(x)", "Symbol(x)", "N(7)", "nsimplify(7)"]


@pytest.mark.parametrize("text", CALLS)
def test_tree_builder_admits_no_other_callable(text):
    """A name outside the table is letters (`sympify` -> s*y*m*p*i*f*y), never a call."""
    try:
        value = _sympy_tree.build(text)
    except _sympy_tree.Rejected:
        return
    assert value.free_symbols and "(" not in str(value), value  # a product of letters


@pytest.mark.parametrize("text", [
    "x.__class__", "().__class__", "'os'", "x[0]", "lambda: 1", "x if y else z", "f(x=1)",
    "__import__", "a; b", "[x for x in y]", "(10**9999)**9999", "9**9**9**9", "(10**400)!",
])
def test_tree_builder_rejects_syntax_outside_the_grammar(text):
    with pytest.raises(_sympy_tree.Rejected):
        _sympy_tree.build(text)


def test_tree_builder_limits_size_and_depth():
    with pytest.raises(_sympy_tree.Rejected):
        _sympy_tree.build("(" * 200 + "x" + ")" * 200)
    with pytest.raises(_sympy_tree.Rejected):
        _sympy_tree.build("+".join(["x"] * 3000))
    assert str(_sympy_tree.build("2 x + 1")) == "2*x + 1"


@pytest.mark.parametrize("payload", ["sympify(7)", "S(7)", "Tuple(7)", "N(7)"])
def test_payloads_are_not_evaluated_in_prediction_or_gold(payload):
    # Evaluated, each of these equals 7; as text outside the grammar it proves nothing.
    assert not is_equivalent(f"\\boxed{{{payload}}}", "7")
    assert not is_equivalent("7", payload)
    assert is_equivalent("\\sqrt{49}", "7")


def test_reply_must_match_the_job():
    assert _sympy_worker._reply(b'{"id": 4, "r": true}', 4) == {"id": 4, "r": True}
    assert _sympy_worker._reply(b'{"id": 4, "r": "c"}', 4) == {"id": 4, "r": "c"}
    for line in [b'{"r": true}', b'{"id": 3, "r": false}', b'{"id": 4, "r": 1}',
                 b'{"id": 4, "r": "C"}', b'{"id": 4, "r": ["c"]}',
                 b'{"id": 4, "r": true, "x": 0}', b"garbage", None]:
        assert _sympy_worker._reply(line, 4) is None


def test_a_job_cannot_write_the_verdict_stream(monkeypatch, capfd):
    """A job that prints forged replies on every descriptor it holds: the zygote's stdout
    (fd 1 here) receives nothing and the verdict is the job's own pipe's."""
    def forge(*_):
        for fd in range(0, 64):
            try:
                os.write(fd, b'{"id": 1, "r": true}\n')
            except OSError:
                pass
        return False

    monkeypatch.setattr(_sympy_child, "compare", forge)
    result, pid = _sympy_child.run_job({"a": "1", "b": "2", "mode": "expr", "atol": 0.0,
                                      "t": 5.0})
    _sympy_child.end_job(pid, own_pid_ns=False)
    assert result is not True  # its pipe held garbage: no verdict
    assert "true" not in capfd.readouterr().out


def test_verdicts_do_not_leak_between_jobs():
    """Many threads, alternating equal and different pairs: every verdict is its own."""
    pool = SympyPool(2)
    try:
        pairs = [(" sqrt(49)", "7", True), (" sqrt(49)", "8", False)] * 20
        results: list[tuple[bool, bool | None]] = []

        def run(items):
            for a, b, want in items:
                results.append((want, pool.compare(a, b, timeout_s=20.0)))

        threads = [threading.Thread(target=run, args=(pairs[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == len(pairs)
        assert [got for want, got in results if want is not got] == []
    finally:
        pool.shutdown()


def descendants(root: int) -> dict[int, str]:
    """{pid: /proc/pid/status text} of every live descendant of `root`."""
    status, parent = {}, {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            with open(f"/proc/{pid}/status") as f:
                text = f.read()
        except OSError:
            continue
        status[pid] = text
        parent[pid] = int(text.split("PPid:")[1].split()[0])
    out = {}
    for pid in status:
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root and pid != root:
            out[pid] = status[pid]
    return out


@pytest.mark.skipif(not isolation.available(), reason="bubblewrap unavailable")
def test_math_workers_run_isolated():
    pool = SympyPool(1, isolate=True)
    try:
        assert pool.warm() == 1
        (worker,) = pool._all
        pythons = [t for t in descendants(worker.proc.pid).values() if "Name:\tpython" in t]
        assert pythons, "the zygote should run below bwrap"
        for status in pythons:
            assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
            if os.geteuid() == 0:  # a dedicated uid
                assert int(status.split("Uid:")[1].split()[0]) >= isolation.UID_BASE
    finally:
        pool.shutdown()


def test_workers_end_when_the_trainer_dies(tmp_path):
    """A SIGKILLed trainer leaves no worker behind (stdin EOF ends each zygote)."""
    script = ("import os, sys\nfrom jaxrl_reason.rewards._sympy_worker import SympyPool\n"
              "p = SympyPool(2)\np.warm()\n"
              "print(' '.join(str(w.proc.pid) for w in p._all), flush=True)\n"
              "os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5.0
    while any(os.path.exists(f"/proc/{p}") and "zombie" not in _state(p) for p in pids):
        assert time.monotonic() < deadline, "a worker outlived its trainer"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line for line in f if line.startswith("State:")).lower()
    except (OSError, StopIteration):
        return "zombie"


# ------------------------------------------------- math-verify and latex2sympy2_extended

# What the zygote runs before serving: load, warm up on constants, harden; then the checks.
_HARDENED = """
import sys
from jaxrl_reason.rewards import _sympy_child as w
w.STATE["tree"] = w.load("_sympy_tree")
mv = w.STATE["mv"] = w.load("_latex_verify")
for a, b in mv.WARM:
    w.compare(a, b, "mv", 0.0, {"targets": ["latex", "expr", "string"]})
mv.harden()
import sympy, math_verify.parser, latex2sympy2_extended.sets, latex2sympy2_extended.logic
from sympy.core.sympify import _sympify
from latex2sympy2_extended.latex2sympy2 import latex2sympy
marker = sys.argv[1]
payload = "__import__('os').system('touch " + marker + "')"
refused = 0
for call in (lambda: sympy.sympify(payload), lambda: sympy.Number(payload),
             lambda: math_verify.parser.parse_expr(payload),
             lambda: latex2sympy2_extended.sets.sympify(payload),
             lambda: latex2sympy2_extended.logic.sympify(payload)):
    try:
        call()
    except Exception:
        refused += 1
assert refused == 5, refused
assert sympy.Number("12") == 12 and sympy.sympify("2.5") == sympy.Float("2.5")
assert sympy.simplify(latex2sympy(r"\\frac{1}{2} + 3") - sympy.Rational(7, 2)) == 0
assert sorted(latex2sympy(r"\\{2, 1\\}")) == [1, 2]
print("ok")
"""


def test_library_string_paths_refuse_code(tmp_path):
    """After `harden`, every string-to-code path of sympy, latex2sympy2_extended and
    math-verify refuses a payload (it would otherwise create the marker file), while
    numeric literals and the LaTeX grammar still work."""
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-c", _HARDENED, str(marker)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert not marker.exists()


def _latex_payloads(marker: str) -> list[str]:
    """Answers that smuggle Python into the LaTeX path (text, operator names, sets,
    relations, matrices, percent numbers) or the plain-expression path."""
    code = f"__import__('os').system('touch {marker}')"
    return [
        f"\\boxed{{\\text{{{code}}}}}", f"\\{{\\text{{{code}}}, 1\\}}",
        f"\\operatorname{{eval}}(\\text{{{code}}})", f"\\mathrm{{exec}}({code})",
        f"x = \\text{{{code}}}", f"\\begin{{pmatrix}} \\text{{{code}}} \\end{{pmatrix}}",
        f"{code}", f"sympify(\"{code}\")", f"\\text{{{code}}}\\%", f"$${code}$$",
        f"\\boxed{{{code}}} = 7", f"1 < \\text{{{code}}} < 2",
    ]


def test_library_payloads_are_not_evaluated(tmp_path):
    """Hostile answers through the real worker (without bwrap, so that a file written by
    the payload would land here): no marker file, no forged verdict, the pool still
    serves."""
    marker = tmp_path / "pwned"
    pool = SympyPool(1, isolate=False)
    options = {"targets": ["latex", "expr", "string"], "float_rounding": 6,
               "numeric_precision": 15, "strict": True, "set_relation": True}
    try:
        for payload in _latex_payloads(str(marker)):
            for a, b in ((payload, "0"), ("0", payload)):
                assert pool.compare(a, b, "mv", 0.0, 20.0, options) is not True, payload
        assert pool.compare("\\sqrt{49}", "7", "mv", 0.0, 20.0, options) is True
    finally:
        pool.shutdown()
    assert not marker.exists()


def test_library_runs_inside_the_deadline():
    """math-verify's own signal timeouts are off; a slow parse is cut by the pool."""
    slow = r"\sin((10^{999})^{60})+\sin((10^{998})^{60})+\sin((10^{997})^{60})"
    start = time.monotonic()
    pool = SympyPool(1, isolate=False)
    try:
        pool.warm()
        start = time.monotonic()
        assert pool.compare(slow, "1", "mv", 0.0, 0.5, {"targets": ["latex"]}) is None
        assert time.monotonic() - start < 2.5
        assert pool.compare("\\frac{1}{2}", "0.5", "mv", 0.0, 20.0, {}) is True
    finally:
        pool.shutdown()


# ------------------------------------------------- several comparisons in one job

def test_batch_reply_must_list_one_valid_verdict_per_comparison():
    assert _sympy_worker._reply(b'{"id": 4, "r": [true, "c", null, "u"]}', 4, 4) == \
        {"id": 4, "r": [True, "c", None, "u"]}
    for line in [b'{"id": 4, "r": [true, false]}', b'{"id": 4, "r": true}',
                 b'{"id": 4, "r": [true, false, 1]}', b'{"id": 4, "r": [true, "C", false]}',
                 b'{"id": 3, "r": [true, true, true]}', b'{"id": 4, "r": [true, true, true, true]}']:
        assert _sympy_worker._reply(line, 4, 3) is None
    assert _sympy_worker._reply(b'{"id": 4, "r": "u"}', 4) is None  # not for one comparison


def _batch(monkeypatch, judge, n: int, t: float = 5.0, w: float = 50.0) -> list:
    """`run_batch_job` over n items whose comparison is `judge(a)` (a = "0".."n-1"), each
    allowed `t` seconds of CPU time and `w` of wall time."""
    monkeypatch.setattr(_sympy_child, "compare", lambda a, *_: judge(a))
    items = [{"a": str(i), "b": "x", "mode": "mv", "atol": 0.0, "o": None} for i in range(n)]
    verdicts, pid = _sympy_child.run_batch_job({"batch": items, "t": t, "w": w})
    _sympy_child.end_job(pid, own_pid_ns=False)
    return verdicts


def test_batch_job_answers_each_comparison_in_order(monkeypatch):
    def judge(a):
        if a == "2":
            raise ValueError("unparsable")  # "not shown equal"
        return {"0": True, "1": False, "3": "completion"}[a]

    assert _batch(monkeypatch, judge, 4) == [True, False, False, "c"]


def test_a_slow_comparison_leaves_the_rest_undecided(monkeypatch):
    """The comparison that uses up its CPU time is a timeout (the kernel kills the job);
    the later ones are "u" (the pool runs them singly), so a slow answer cannot time out its
    neighbours."""
    def judge(a):
        if a == "1":
            while True:
                pass
        return True

    start = time.monotonic()
    assert _batch(monkeypatch, judge, 4, t=0.5) == [True, None, "u", "u"]
    assert time.monotonic() - start < 5.0


def test_a_stalled_comparison_is_undecided_at_the_wall_backstop(monkeypatch):
    """A comparison that uses no CPU (here it sleeps; on a machine too busy to run it, it
    would wait) is not a timeout: at the wall-clock backstop it and the rest are "u", and a
    single request says "w" (unscored)."""
    def judge(a):
        if a == "1":
            time.sleep(30)
        return True

    start = time.monotonic()
    assert _batch(monkeypatch, judge, 4, t=0.5, w=1.0) == [True, "u", "u", "u"]
    assert time.monotonic() - start < 5.0
    result, pid = _sympy_child.run_job({"a": "1", "b": "x", "mode": "mv", "atol": 0.0,
                                        "o": None, "t": 0.5, "w": 1.0})
    _sympy_child.end_job(pid, own_pid_ns=False)
    assert result == "w"


@pytest.mark.parametrize("error", [MemoryError, RecursionError])
def test_a_resource_error_stops_the_job(monkeypatch, error):
    """After a MemoryError or RecursionError the process is not trusted to judge the rest."""
    def judge(a):
        if a == "1":
            raise error()
        return True

    assert _batch(monkeypatch, judge, 3) == [True, "u", "u"]


def test_a_batch_job_cannot_forge_its_neighbours_verdicts(monkeypatch, capfd):
    """A comparison that writes verdict bytes (and forged replies) on every descriptor it
    holds: its own pipe then holds more bytes than comparisons or garbage, and every verdict
    of the job is undecided; nothing reaches the zygote's stdout."""
    def forge(a):
        for fd in range(0, 64):
            try:
                os.write(fd, b"TTTT" if a == "0" else b'{"id": 1, "r": [true, true]}\n')
            except OSError:
                pass
        return False

    assert _batch(monkeypatch, forge, 2) == ["u", "u"]
    assert "true" not in capfd.readouterr().out


def test_compare_many_decides_like_compare_and_retries_after_a_timeout():
    """A real worker: a slow answer in the middle of a batch times out alone; the
    comparisons after it are run singly by `compare`, with the same verdicts as without the
    batch; the timeout is reported once, then the request is tried afresh."""
    slow = r"\sin((10^{999})^{60})+\sin((10^{998})^{60})+\sin((10^{997})^{60})"
    options = {"targets": ["latex"]}
    requests = [("\\frac{1}{2}", "0.5", "mv", 0.0, options), (slow, "1", "mv", 0.0, options),
                ("\\sqrt{4}", "2", "mv", 0.0, options), ("3", "2", "mv", 0.0, options)]
    pool = SympyPool(1, isolate=False)
    try:
        pool.warm()
        assert pool.compare_many(requests, timeout_s=0.5) == [True, None, "u", "u"]
        assert pool.compare_many(requests, timeout_s=0.5)[0] == "u"  # cached: skipped
        assert pool.compare(slow, "1", "mv", 0.0, 20.0, options) is None  # the batch timeout
        assert [pool.compare(a, b, m, t, 20.0, o) for a, b, m, t, o in requests[2:]] == \
            [True, False]
        assert pool._inflight == {}
    finally:
        pool.shutdown()
