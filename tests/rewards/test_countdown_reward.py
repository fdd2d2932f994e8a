"""The safe arithmetic evaluator and the `countdown` reward."""
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrl_reason.rewards.countdown as cr
from jaxrl_reason.rewards import arith_eval as ae
from jaxrl_reason.rewards import get_reward
from cpu_bounds import Bound

EX = {"prompt": "Using the numbers [3, 7, 25, 50], make 21.", "answer": "50-25-7+3",
      "numbers": [3, 7, 25, 50], "target": 21}


# ----------------------------------------------------------------------------- evaluator


@pytest.mark.parametrize("text, value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("10-4-3", 3), ("100/10/5", 2), ("7/2*2", 7),
    ("1/3+1/3+1/3", 1), ("-3+5", 2), ("--3", 3), ("2*-3", -6), ("-(2+3)", -5),
    (" ( 50 - 25 ) × 3 ", 75), ("8 ÷ 2", 4), ("7−2", 5), ("0", 0), ("007", 7),
    ("1/2", Fraction(1, 2)),
])
def test_evaluate(text, value):
    assert ae.evaluate(text) == value


@pytest.mark.parametrize("text", [
    "", "   ", "1+", "+1", "(1", "1)", "()", "1 2", "2**3", "2^3", "2**999999", "1.5",
    "abc", "x*2", "3(4)", "(1)(2)", "1e3", "1,000", "=3", "1/", "*", "9" * 13,
    "(" * 40 + "1" + ")" * 40, "-" * 40 + "1",
])
def test_malformed_raises_expression_error(text):
    with pytest.raises(ae.ExpressionError):
        ae.parse(text)


def test_limits_and_division_by_zero():
    with pytest.raises(ae.ExpressionTooLong):
        ae.parse("1+" * 100 + "1")
    assert issubclass(ae.ExpressionTooLong, ae.ExpressionError)
    assert issubclass(ae.ExpressionError, ValueError)
    assert ae.parse("(" * ae.MAX_DEPTH + "1" + ")" * ae.MAX_DEPTH).value == 1
    assert ae.parse("9" * ae.MAX_DIGITS).value == int("9" * ae.MAX_DIGITS)
    with pytest.raises(ae.ExpressionTooLong):
        ae.parse("(" * 10_000 + "1" + ")" * 10_000)
    with pytest.raises(ae.ExpressionError):
        ae.parse(12)
    parsed = ae.parse("5/(3-3)+7")
    assert parsed.value is None and parsed.numbers == (5, 3, 3, 7)
    with pytest.raises(ae.DivisionByZero):
        ae.evaluate("5/(3-3)")
    with pytest.raises(ae.ExpressionError):  # a syntax error wins over division by zero
        ae.parse("1/0+")


def _tree_text(draw_tree):
    """Render a random tree (int | (op, l, r)) fully parenthesized, with its exact value."""
    if isinstance(draw_tree, int):
        return str(draw_tree), Fraction(draw_tree)
    op, left, right = draw_tree
    (lt, lv), (rt, rv) = _tree_text(left), _tree_text(right)
    if op == "/" and rv == 0:
        return f"({lt}+{rt})", lv + rv
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
    return f"({lt}{op}{rt})", value


_TREES = st.recursive(st.integers(0, 999),
                      lambda sub: st.tuples(st.sampled_from("+-*/"), sub, sub), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_TREES)
def test_evaluate_matches_exact_fractions(tree):
    text, value = _tree_text(tree)
    if len(text) <= ae.MAX_CHARS:
        assert ae.evaluate(text) == value
        assert ae.evaluate(text.replace("(", "( ").replace(")", " )")) == value


# -------------------------------------------------------------------------------- reward


def _answer(expr):
    return f"<think>50-25=25. 25-7=18. 18+3=21.</think><answer>{expr}</answer>"


N4 = [3, 7, 25, 50]


@pytest.mark.parametrize("completion, numbers, target", [
    (_answer("50-25-7+3"), N4, 21),
    (_answer(" (50 - 25) - 7 + 3 "), N4, 21),
    (_answer("3+50-7-25"), N4, 21),
    (_answer("50-25-7+3 = 21"), N4, 21),
    (_answer("50-25-7+3=21."), N4, 21),
    ("<answer>x</answer> then <answer>3 + 50 - 25 - 7</answer>", N4, 21),
    ("The answer is \\boxed{50-25-7+3}", N4, 21),
    ("\\boxed{(50-25) - 7 + 3}", N4, 21),
    ("<answer>$50 - 25 - 7 + 3$</answer>", N4, 21),
    ("<answer>-(7-3) + 50 - 25</answer>", N4, 21),
    ("<answer>(50-25)*3 = 75</answer>", [3, 25, 50], 75),
    ("<answer>(3 \\times 7) + 50 \\div 25</answer>", N4, 23),
    ("<answer>3 \\cdot 7 \\cdot 50 / 25</answer>", N4, 42),
    ("<answer>7*3 + (50-25)*0</answer>", [0, 3, 7, 25, 50], 21),
    ("<answer>7*3*(50/25)/2</answer>", [2, 3, 7, 25, 50], 21),
    ("<answer>(1/2+3/2)*5</answer>", [1, 2, 2, 3, 5], 10),  # fractional intermediates
    ("<answer>5+5*2</answer>", [5, 2, 5], 15),  # repeated numbers are a multiset
])
def test_correct_answers(completion, numbers, target):
    ex = {**EX, "numbers": numbers, "target": target}
    assert cr.countdown(completion, ex) == cr.RewardResult(1.0), completion


@pytest.mark.parametrize("completion, reason", [
    (_answer("50-25-7+4"), "wrong_numbers"),  # a number not given
    (_answer("50-25-7"), "wrong_numbers"),  # a missing number
    (_answer("50-25-7+3+3-3"), "wrong_numbers"),  # a reused number
    (_answer("50-25-7+3+1-1"), "wrong_numbers"),  # extra numbers
    (_answer("50-25+7+3"), "wrong_value"),
    (_answer("50-25-7+3 = 22"), "wrong_value"),
    (_answer("50+25-7+3 = 21"), "wrong_value"),
    (_answer("50-25-7+3 = twenty"), "parse_error"),
    (_answer("21"), "wrong_numbers"),
    (_answer("50-25-7+3 = 18 + 3"), "parse_error"),
    (_answer("3*7/(50-50)"), "wrong_numbers"),
    (_answer("50/(25-25)+3+7"), "wrong_numbers"),
    (_answer("(50-25-7+3"), "parse_error"),
    (_answer("50 - 25 - 7 + 3 + "), "parse_error"),
    (_answer("2**999999"), "parse_error"),
    (_answer("50^1-25-7+3"), "parse_error"),
    (_answer("fifty minus 25"), "parse_error"),
    (_answer("1" * 250), "too_long"),
    (_answer("(" * 10_000 + "3" + ")" * 10_000), "too_long"),
    (_answer(""), "no_answer"),
    ("<think>50-25-7+3</think>", "no_answer"),
    ("", "no_answer"),
    ("\\boxed{}", "no_answer"),
    ("<answer>50-25-7+3", "no_answer"),
])
def test_wrong_answers(completion, reason):
    assert cr.countdown(completion, EX) == cr.RewardResult(0.0, reason), completion


def test_division_by_zero_and_exact_division():
    ex = {**EX, "numbers": [7, 3, 3, 2], "target": 5}
    assert cr.countdown("<answer>7/(3-3)+2</answer>", ex).reason == "division_by_zero"
    assert cr.countdown("<answer>(7*3-3*2)/3</answer>", ex).reason == "wrong_numbers"
    assert cr.countdown("<answer>7-(3-3)-2</answer>", ex).score == 1.0
    assert cr.countdown("<answer>7/(3-3)+2+</answer>", ex).reason == "parse_error"


def test_not_text_bad_examples_and_registry():
    assert cr.countdown(None, EX) == cr.RewardResult(0.0, "not_text")
    assert cr.countdown(b"<answer>1</answer>", EX).reason == "not_text"
    with pytest.raises(ValueError):
        cr.countdown("<answer>1</answer>", {"prompt": "p", "answer": "1"})
    assert get_reward("countdown") is cr.countdown
    assert cr.countdown("<answer>50-25-7+3</answer>", {**EX, "numbers": (50, 3, 25, 7)}).score == 1


def test_huge_inputs_are_fast():
    huge = [
        "<answer>" + "1+" * 500_000 + "1</answer>",
        "x" * 1_000_000,
        "\\boxed{" * 200_000,
        "<answer>" * 100_000 + "</answer>" * 10,
        "<answer>" + "(" * 500_000 + "</answer>",
        "<think>" + "9" * 1_000_000 + "</think><answer>3+7+25+50</answer>",
    ]
    with Bound(cpu_s=2.0, wall_s=60.0):  # thread CPU: load cannot make it fail
        results = [cr.countdown(c, EX) for c in huge]
    assert all(r.score == 0.0 for r in results)
    assert results[0].reason == "too_long"


_ALPHABET = "0123456789+-*/() =x<>answer\\boxed{}.×÷−"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(alphabet=_ALPHABET, max_size=300)))
def test_random_text_never_raises(text):
    for completion in (text, f"<answer>{text}</answer>", f"\\boxed{{{text}}}"):
        result = cr.countdown(completion, EX)
        assert result.score in (0.0, 1.0)
        assert (result.score == 1.0) == (result.reason is None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", max_size=60))
def test_random_expressions_agree_with_the_evaluator(expr):
    result = cr.countdown(f"<answer>{expr}</answer>", EX)
    if result.score == 1.0:
        parsed = ae.parse(expr)
        assert parsed.value == 21 and sorted(parsed.numbers) == [3, 7, 25, 50]
