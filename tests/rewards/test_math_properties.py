"""Property tests for `is_equivalent`, `extract_answer` and the `correctness` reward.

Two kinds: (1) totality and time bounds on random and hostile strings (LaTeX tokens, braces,
digits, operators, unicode look-alikes, control characters): never raise, return bool /
str-or-None, finish within the timeout plus a small slack; (2) metamorphic properties on
generated answers (formatting variants are equal, perturbations are not). The sympy worker
pool is warmed first, so start-up is not counted.
"""
import datetime
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpu_bounds import Bound
from jaxrl_reason.rewards import extract_answer, get_reward, is_equivalent
from jaxrl_reason.rewards._sympy_worker import _REPLY_GRACE_S, get_pool, wall_backstop
from jaxrl_reason.rewards.math import CORRECTNESS_TIMEOUT_S

TIMEOUT_S = 0.5  # is_equivalent timeout in the hostile tests (CPU seconds of the worker job)
# CPU time of the calling thread allowed to the parent-side work of one call (normalizing,
# guards, IPC). Thread CPU, not wall time: a loaded machine stretches wall time, and the
# worker's timeout is itself counted in CPU time (see `_sympy_worker`).
SLACK_S = 0.4
EXTRACT_BOUND_S = 2.0  # thread CPU of extract_answer: catches super-linear blow-ups on 1e5 chars
# Wall time is bounded only by the documented backstop: a comparison that gets no CPU is
# unscored at `wall_backstop`, and a silent worker is killed a grace period later.
WALL_BOUND_S = wall_backstop(TIMEOUT_S) + _REPLY_GRACE_S + 1.0


def _Bound(cpu_s: float, wall_s: float = WALL_BOUND_S, label=None) -> Bound:
    """`cpu_bounds.Bound` with this file's wall backstop by default."""
    return Bound(cpu_s, wall_s, label)


def _settings(max_examples: int, bound_s: float | None = None) -> settings:
    deadline = None if bound_s is None else datetime.timedelta(seconds=bound_s)
    return settings(max_examples=max_examples, deadline=deadline, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def warm_sympy_workers():
    """Ready sympy workers before each test (a previous test may have killed some)."""
    get_pool().warm()


# ------------------------------------------------------------------------ hostile strings

TOKENS = [
    "\\frac", "\\dfrac", "\\sqrt", "\\sqrt[3]", "{", "}", "{", "}", "^", "_", "\\boxed{",
    "\\text{", "\\left(", "\\right)", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\\\", "\\pi",
    "\\infty", "\\pm", "\\cup", "\\in", "\\le", "\\{", "\\}", "\\cdot", "\\times", "!", "%", "\\%",
    "$", "=", "<", ">", ",", "(", ")", "[", "]", "|", "+", "-", "*", "/", ".", " ", "x", "y", "e",
    "i", "n", "0", "1", "2", "3", "9", "10", "999", "\\sin", "\\log_", "\\overline{", "<answer>",
    "</answer>", "<think>", "</think>", "####", "The answer is ", "\u2212", "\uff11", "\u00a0",
    "\x00", "\x1b", "\u200b", "\u00b2", "\u00bd", "\u221a", "\u00b0", "^\\circ", "\\mathbb{R}",
    "\\emptyset", "e5", "e999", "\\binom", "\\begin{array}{cc}", "\\end{array}", "\\approx",
]
latexish = st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)
anything = st.one_of(latexish, st.text(max_size=60))


@_settings(max_examples=120, bound_s=WALL_BOUND_S)
@given(pred=anything, gold=anything)
def test_is_equivalent_is_total_and_bounded(pred, gold):
    with _Bound(SLACK_S):
        result = is_equivalent(pred, gold, timeout_s=TIMEOUT_S)
    assert isinstance(result, bool)


@_settings(max_examples=150, bound_s=WALL_BOUND_S)
@given(text=st.one_of(anything, st.lists(latexish, max_size=30).map("\n".join)))
def test_extract_answer_is_total_and_fast(text):
    with _Bound(EXTRACT_BOUND_S):
        answer = extract_answer(text)
    assert answer is None or (isinstance(answer, str) and answer)


@_settings(max_examples=60, bound_s=wall_backstop(CORRECTNESS_TIMEOUT_S) + _REPLY_GRACE_S + 1.0)
@given(completion=anything, gold=latexish.filter(str.strip))
def test_correctness_reward_is_total_and_bounded(completion, gold):
    with _Bound(CORRECTNESS_TIMEOUT_S + SLACK_S,
                wall_backstop(CORRECTNESS_TIMEOUT_S) + _REPLY_GRACE_S + 1.0):
        out = get_reward("correctness")(completion, {"prompt": "", "answer": gold})
    assert out.score in (0.0, 1.0)
    assert out.reason in (None, "no_answer", "wrong", "timeout")


@_settings(max_examples=100)
@given(text=anything.filter(str.strip))
def test_an_answer_equals_itself(text):
    assert is_equivalent(text, text)


HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}",
    "9^{9^{9^{9}}}",
    "10^{10^{10}}",
    "1e100000000",
    "1000000!",
    "\\boxed{1000000!}",
    "(12!)!",
    "\\binom{1000000}{500000}",
    "(10^{9999})^{9999}",  # passes the guards: the worker is killed at the deadline
    "\\frac{1}{0}",
    "0/0",
    "x" * 10**6,
    "\\boxed{" + "1" * 10**6 + "}",
    "a" * 10**6 + "\\boxed{5}",
    "{" * 10**4 + "1" + "}" * 10**4,
    "\\boxed{" + "{" * 10**4 + "1" + "}" * 10**4 + "}",
    "\\boxed{" * 10**5,
    "\\boxed{\\boxed{" * 20_000 + "}}" * 20_000,
    "<answer>" * 50_000 + "</answer>",
    "the answer is " * 50_000,
    "$" * 10**5,
    "\\(" * 10**5,
    "\\frac{" * 5000,
    "\\left(" * 5000,
    "(" * 3000 + "1" + ")" * 3000,
    "(" * 300 + "1" + ")" * 300,
    "2^" * 3000 + "2",
    "|" * 1000,
    "\\sqrt[" * 1000,
    "\\text{" * 5000,
    "\\overline{" * 3000,
    "\\begin{pmatrix}" * 500,
    "\\begin{pmatrix}" + "1&" * 3000 + "\\end{pmatrix}",
    "\\begin{pmatrix}" + "1\\\\" * 3000 + "\\end{pmatrix}",
    "1," * 5000,
    "\\{" + "1," * 5000 + "\\}",
    "x=" * 3000,
    "<" * 3000,
    "\\pm" * 3000,
    "\\cup" * 3000,
    "1" * 20000 + "x",
    "0." + "1" * 5000,
    "1" * 5000 + "/" + "3" * 5000,
    "5 " + "ab " * 3000 + "!",
    "\\sin(10^{999})",
    "\\sin" * 30 + " x",
    "\\\\" * 5000,
    "\uff11\uff12\uff13",
    "\u22123",
    "\u00a0\u00a0",
    "\x00\x01\x02\x7f",
    "\\boxed{\x00}",
    "\ud800",  # lone surrogate
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs_are_total_and_bounded(text):
    reward = get_reward("correctness")
    for gold in ("5", text[:500], "(1,2)"):
        for pred, ref in ((text, gold), (gold, text)):
            with _Bound(SLACK_S, label=(pred[:80], ref[:80])):
                assert isinstance(is_equivalent(pred, ref, timeout_s=TIMEOUT_S), bool)
    with _Bound(EXTRACT_BOUND_S):
        answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    # The whole reward (extraction, both readings, the guard, IPC) within its own limit.
    with _Bound(CORRECTNESS_TIMEOUT_S + SLACK_S,
                wall_backstop(CORRECTNESS_TIMEOUT_S) + _REPLY_GRACE_S + 1.0):
        assert reward(text, {"prompt": "", "answer": "5"}).score in (0.0, 1.0)


# --------------------------------------------------------------------- metamorphic checks

GENEROUS_S = 20.0  # the metamorphic tests check verdicts, not speed


@_settings(max_examples=60)
@given(n=st.integers(-10**15, 10**15))
def test_integer_spellings_are_equal(n):
    spellings = [f"{n:,}", f"\\boxed{{{n}}}", f"${n}$", f"{n}.0", f"{n:,}".replace(",", "{,}")]
    for spelling in spellings:
        assert is_equivalent(spelling, str(n)) and is_equivalent(str(n), spelling), spelling
    assert not is_equivalent(f"{n + 1:,}", str(n))


@_settings(max_examples=60)
@given(p=st.integers(-999, 999), q=st.integers(1, 999))
def test_fraction_spellings_are_equal(p, q):
    value = Fraction(p, q)
    frac = f"-\\frac{{{-p}}}{{{q}}}" if p < 0 else f"\\frac{{{p}}}{{{q}}}"
    reduced = f"{value.numerator}/{value.denominator}"
    for spelling in (f"{p}/{q}", frac.replace("frac", "dfrac"), reduced):
        assert is_equivalent(spelling, frac, GENEROUS_S), spelling
    assert not is_equivalent(frac, f"\\frac{{{p + q}}}{{{q}}}", GENEROUS_S)
    if all(f in (2, 5) for f in _factors(value.denominator)):
        assert is_equivalent(frac, str(float(value)) if value.denominator > 1 else str(p // q))


def _factors(n: int) -> list[int]:
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out


@_settings(max_examples=40)
@given(items=st.lists(st.integers(-50, 50), min_size=2, max_size=6, unique=True), data=st.data())
def test_sets_ignore_order_and_tuples_do_not(items, data):
    perm = data.draw(st.permutations(items))
    as_set = lambda xs: "\\{" + ", ".join(map(str, xs)) + "\\}"  # noqa: E731
    as_tuple = lambda xs: "(" + ", ".join(map(str, xs)) + ")"  # noqa: E731
    assert is_equivalent(as_set(items), as_set(perm))
    assert is_equivalent(as_set(items), ", ".join(map(str, perm)))
    assert is_equivalent(as_tuple(items), as_tuple(perm)) == (list(perm) == list(items))
    assert not is_equivalent(as_set(items), as_set(items[:-1]))


@_settings(max_examples=40)
@given(a=st.integers(-100, 100), width=st.integers(1, 100),
       ends=st.sampled_from(["()", "[]", "[)", "(]"]))
def test_interval_ends_matter(a, width, ends):
    b = a + width
    interval = f"{ends[0]}{a}, {b}{ends[1]}"
    assert is_equivalent(interval, f"\\left{ends[0]} {a},{b} \\right{ends[1]}")
    flipped = ("[" if ends[0] == "(" else "(") + f"{a},{b}" + ends[1]
    assert not is_equivalent(interval, flipped)
    assert not is_equivalent(interval, f"{ends[0]}{a},{b + 1}{ends[1]}")


@_settings(max_examples=30)
@given(rows=st.integers(1, 3), cols=st.integers(1, 3), data=st.data())
def test_matrices_compare_entrywise(rows, cols, data):
    m = [[data.draw(st.integers(-9, 9)) for _ in range(cols)] for _ in range(rows)]
    body = lambda mat: " \\\\ ".join(" & ".join(map(str, r)) for r in mat)  # noqa: E731
    pmatrix = f"\\begin{{pmatrix}} {body(m)} \\end{{pmatrix}}"
    assert is_equivalent(pmatrix, f"\\begin{{bmatrix}}{body(m)}\\end{{bmatrix}}")
    changed = [row[:] for row in m]
    changed[-1][-1] += 1
    assert not is_equivalent(pmatrix, f"\\begin{{pmatrix}}{body(changed)}\\end{{pmatrix}}")
    transposed = [list(col) for col in zip(*m)]
    if transposed != m:
        assert not is_equivalent(pmatrix, f"\\begin{{pmatrix}}{body(transposed)}\\end{{pmatrix}}")


@_settings(max_examples=15)
@given(a=st.integers(-9, 9), b=st.integers(-9, 9))
def test_expanded_polynomials_are_equal(a, b):
    factored = f"(x{a:+d})(x{b:+d})"
    expanded = f"x^2{a + b:+d}x{a * b:+d}"
    assert is_equivalent(factored, expanded, GENEROUS_S)
    assert is_equivalent(expanded, factored, GENEROUS_S)
    assert not is_equivalent(factored, f"x^2{a + b:+d}x{a * b + 1:+d}", GENEROUS_S)
