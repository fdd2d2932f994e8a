"""Tests for answer extraction, equivalence and the `correctness` reward."""
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_reason.rewards import RewardResult, extract_answer, get_reward, is_equivalent
from jaxrl_reason.rewards.math import _verdict

EQUAL = [
    # plain numbers, signs, separators
    ("42", "42"),
    ("-7", "-7"),
    ("+5", "5"),
    ("007", "7"),
    ("1,000", "1000"),
    ("1{,}234{,}567", "1234567"),
    ("1\\,000", "1000"),
    ("3.0", "3"),
    (".5", "0.5"),
    ("0.50", "\\frac{1}{2}"),
    # fractions
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\tfrac{3}{4}", "\\frac34"),
    ("\\frac12", "1/2"),
    ("-\\frac{1}{3}", "\\frac{-1}{3}"),
    ("2/4", "\\frac{1}{2}"),
    ("3\\frac{1}{2}", "7/2"),
    ("3\\frac12", "3.5"),
    # scientific notation
    ("1e3", "1000"),
    ("1.5\\times10^{3}", "1500"),
    ("2.5e-2", "0.025"),
    # wrappers
    ("$\\frac{1}{2}$", "\\frac{1}{2}"),
    ("\\(5\\)", "5"),
    ("\\[5\\]", "5"),
    ("\\boxed{12}", "12"),
    ("\\boxed{\\boxed{12}}", "$12$"),
    ("\\text{5}", "5"),
    ("\\mathrm{5}", "5"),
    ("\\$5", "5"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    # units and degrees
    ("10 cm", "10"),
    ("10\\text{ cm}", "10"),
    ("12 apples", "12"),
    ("5 \\text{ dollars}", "\\$5"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("45°", "45"),
    # equations with a single variable side
    ("x = 3", "3"),
    ("x=\\frac{1}{2}", "0.5"),
    ("y = 2x + 3", "2x+3"),
    ("y=2x+3", "2x+3=y"),
    ("f(x) = x^2", "x^2"),
    # percentages
    ("50\\%", "50"),
    ("50%", "0.5"),
    ("12.5\\%", "\\frac{1}{8}"),
    # symbolic (sympy)
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("3 \\times 4", "12"),
    ("2^{10}", "1024"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{x}{2}", "0.5x"),
    ("\\sqrt[3]{27}", "3"),
    ("5!", "120"),
    ("3+4i", "4i+3"),
    ("\\infty", "\\infty"),
    ("x^2+y^2=1", "2x^2+2y^2=2"),
    # structures
    ("(1,2)", "(1, 2)"),
    ("(\\frac{1}{2}, 3)", "(0.5, 3)"),
    ("\\{1,2,3\\}", "\\{3,1,2\\}"),
    ("1, 2", "2, 1"),
    ("x = 1, 2", "2,1"),
    ("[1,2)", "[1, 2)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("(-\\infty,1)\\cup(2,\\infty)", "(2,\\infty)\\cup(-\\infty,1)"),
    ("1\\pm\\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}"),
    # text answers
    ("\\text{(A)}", "A"),
    ("Monday", "\\text{monday}"),
]

DIFFERENT = [
    ("42", "43"),
    ("-7", "7"),
    ("1,000", "100"),
    ("\\frac{1}{2}", "0.51"),
    ("\\frac{1}{3}", "0.333"),
    ("3\\frac{1}{2}", "3"),
    ("1e3", "100"),
    ("10 cm", "100"),
    ("x = 3", "4"),
    ("50\\%", "5"),
    ("5x", "5"),
    ("\\sqrt{8}", "3"),
    ("\\frac{\\pi}{2}", "\\pi"),
    ("x^2+2x+1", "(x-1)^2"),
    ("x^2+y^2=1", "x^2+y^2=2"),
    ("2^{10}", "1000"),
    ("(1,2)", "(2,1)"),
    ("(1,2)", "(1,2,3)"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("[1,2)", "[1,2]"),
    ("[1,2]", "(1,2)"),
    ("(-\\infty,3]", "(-\\infty,3)"),
    ("(1,2)", "1"),
    ("A", "B"),
    ("Monday", "Tuesday"),
    ("x = 3", "x = 3, y = 4"),
    ("9^{9^{9^{9}}}", "1"),
    ("", "5"),
    ("5", ""),
    ("I do not know", "5"),
]


@pytest.mark.parametrize("pred,gold", EQUAL)
def test_equal_both_directions(pred, gold):
    assert is_equivalent(pred, gold), (pred, gold)
    assert is_equivalent(gold, pred), (gold, pred)


@pytest.mark.parametrize("pred,gold", DIFFERENT)
def test_different_both_directions(pred, gold):
    assert not is_equivalent(pred, gold), (pred, gold)
    assert not is_equivalent(gold, pred), (gold, pred)


@pytest.mark.parametrize("bad", [None, 3, 3.0, b"3", ["3"], {"a": 1}])
def test_non_str_inputs_are_not_equivalent(bad):
    assert is_equivalent(bad, "3") is False
    assert is_equivalent("3", bad) is False


def test_huge_power_tower_is_fast():
    start = time.monotonic()
    assert is_equivalent("\\boxed{9^{9^{9^{9}}}}", "9^{9^{9^{9}}}")
    assert not is_equivalent("\\boxed{9^{9^{9^{9}}}}", "9")
    assert not is_equivalent("10^{100000000}", "1")
    assert not is_equivalent("1e100000000", "1")
    assert time.monotonic() - start < 1.0


def test_slow_sympy_is_cut_at_the_timeout():
    # (12!)! has ~10^8 digits: sympy spins holding the GIL; the worker process is killed.
    start = time.monotonic()
    assert _verdict("(12!)!", "1", 0.5) == "timeout"
    assert not is_equivalent("(12!)!", "1", timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    assert is_equivalent("\\sqrt{4}", "2")  # a fresh worker serves the next call


def test_timeouts_hold_across_threads():
    results, start = [], time.monotonic()

    def run():
        results.append(_verdict("(12!)!", "2", 0.5))
        results.append(_verdict("\\sqrt{9}", "3", 5.0))

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["equal"] * 6 + ["timeout"] * 6
    assert time.monotonic() - start < 12.0


def test_integer_fast_path_is_fast():
    start = time.perf_counter()
    for i in range(5000):
        assert is_equivalent(str(i), str(i)) and not is_equivalent(str(i), str(i + 1))
    assert time.perf_counter() - start < 0.5


EXTRACT = [
    ("so \\boxed{5}", "5"),
    ("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
    ("\\boxed{3} and an unfinished \\boxed{4", "3"),
    ("\\boxed 7", "7"),
    ("\\fbox{8}", "8"),
    ("<think>2+2</think><answer> 4 </answer>", "4"),
    ("<answer>1</answer> <answer>2</answer>", "2"),
    ("<answer>\\boxed{9}</answer>", "9"),
    ("work\n#### 1,234\n", "1,234"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
    ("Thus the answer is 17.", "17"),
    ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "$\\frac{1}{2}$"),
    ("Answer: 3.5", "3.5"),
    ("Q: what?\nA: blue", "blue"),
    ("we get $x = 5$", "x = 5"),
    ("we get \\(x^2\\) and finally 12 apples", "12"),
    ("it is -3.25 or so", "-3.25"),
    ("roughly 3/4 of them", "3/4"),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text", ["", "   ", "no numbers here", "<answer></answer>", "\\boxed{}", None, 5, b"\\boxed{1}"]
)
def test_extract_answer_none(text):
    assert extract_answer(text) is None


def test_correctness_reward():
    reward = get_reward("correctness")
    example = {"prompt": "What is 6*7?", "answer": "42"}
    assert reward("<think>6*7</think><answer>42</answer>", example) == RewardResult(1.0)
    assert reward("<think>6*7</think><answer>41</answer>", example) == RewardResult(0.0, "wrong")
    assert reward("I have no idea.", example) == RewardResult(0.0, "no_answer")
    assert reward("\\boxed{\\dfrac{84}{2}}", example) == RewardResult(1.0)
    assert reward("\\boxed{42}", {"prompt": "p", "answer": 42}) == RewardResult(1.0)
    with pytest.raises(ValueError, match="no 'answer' key"):
        reward("\\boxed{1}", {"prompt": "p"})


_MATHY = list("0123456789+-*/^_{}()[]\\$=,.%! xyeipabcdfrqst<>#:")
texts = st.text(alphabet=st.sampled_from(_MATHY), max_size=60)


@settings(max_examples=150, deadline=None)
@given(pred=st.one_of(texts, st.text(max_size=40)), gold=st.one_of(texts, st.text(max_size=40)))
def test_random_text_never_raises(pred, gold):
    assert isinstance(is_equivalent(pred, gold, timeout_s=1.0), bool)
    answer = extract_answer(pred)
    assert answer is None or isinstance(answer, str)
    out = get_reward("correctness")(pred, {"prompt": "", "answer": gold})
    assert out.score in (0.0, 1.0)


PATHOLOGICAL = [
    "\\boxed{" * 5000,
    "<answer>" * 5000,
    "\\(" * 5000,
    "$$" * 5000,
    "{" * 10000,
    "the answer is " * 2000,
    "1" * 20000 + "x",
    "5 " + "ab " * 3000 + "!",
    "(" * 3000 + "1" + ")" * 3000,
    "2^" * 3000 + "2",
    "\\frac{" * 3000 + "1",
    "a " * 10000,
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=range(len(PATHOLOGICAL)))
def test_pathological_inputs_are_fast(text):
    start = time.monotonic()
    extract_answer(text)
    is_equivalent(text, "5", timeout_s=2.0)
    is_equivalent(text[:900], "5", timeout_s=2.0)
    get_reward("correctness")(text, {"prompt": "", "answer": "5"})
    assert time.monotonic() - start < 1.0
