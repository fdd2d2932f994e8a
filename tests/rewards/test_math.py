"""Tests for the math verifier around its verdicts: bad inputs, timeouts and threads, the fast
paths, options and conventions, answer extraction and the `correctness` reward (the verdict
tables are in test_math_equivalence.py)."""
import threading
import time

import pytest

from jaxrl_reason.rewards import RewardResult, extract_answer, get_reward, is_equivalent
from jaxrl_reason.rewards._sympy_worker import get_pool
from jaxrl_reason.rewards.math import _verdict
from cpu_bounds import Bound


@pytest.mark.parametrize("bad", [None, 3, 3.0, b"3", ["3"], {"a": 1}])
def test_non_str_inputs_are_not_equivalent(bad):
    assert is_equivalent(bad, "3") is False
    assert is_equivalent("3", bad) is False


def test_huge_power_tower_is_fast():
    get_pool().warm()  # the pool's start-up is not what this measures
    with Bound(cpu_s=1.0, wall_s=30.0):  # parent thread CPU; the wall time a backstop
        assert is_equivalent("\\boxed{9^{9^{9^{9}}}}", "9^{9^{9^{9}}}")
        assert not is_equivalent("\\boxed{9^{9^{9^{9}}}}", "9")
        assert not is_equivalent("10^{100000000}", "1")
        assert not is_equivalent("1e100000000", "1")
        assert not is_equivalent("(12!)!", "1") and not is_equivalent("1000000!", "1")


# Admitted by every static guard (the tree builder refuses `(10^{9999})^{9999}` outright;
# a 199,000-bit power is just under the oversized-number guard's bound, a sum of several is
# over it) but over a second of big-number trigonometry.
SLOW = r"\sin(10^{59940})"


def test_slow_sympy_is_cut_at_the_timeout():
    # sympy spins holding the GIL; the job process is killed at the deadline.
    get_pool().warm()  # the pool's first start-up is not what this measures
    start = time.monotonic()
    assert _verdict(SLOW, "1", 0.5) == "timeout"
    assert not is_equivalent(SLOW, "1", timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    assert is_equivalent("\\sqrt{4}", "2")  # a fresh worker serves the next call


def test_timeouts_hold_across_threads():
    get_pool().warm()
    results, start = [], time.monotonic()

    def run():
        results.append(_verdict(SLOW, "2", 0.5))
        results.append(_verdict("\\sqrt{9}", "3", 5.0))

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["equal"] * 6 + ["timeout"] * 6
    assert time.monotonic() - start < 12.0


def test_integer_fast_path_is_fast():
    with Bound(cpu_s=0.5, wall_s=30.0):  # no worker round trip: all on this thread
        for i in range(5000):
            assert is_equivalent(str(i), str(i)) and not is_equivalent(str(i), str(i + 1))


def test_numeric_tolerance_policy():
    # Plain numbers: exact unless a decimal has >= 6 significant digits and is the value
    # rounded at its last digit; truncation does not count, integers are always exact.
    assert is_equivalent("0.333333", "1/3") and is_equivalent("0.666667", "2/3")
    assert not is_equivalent("0.666666", "2/3")  # truncated, not rounded
    assert not is_equivalent("0.3333", "1/3") and not is_equivalent("1.414", "\\sqrt{2}")
    assert not is_equivalent("123456", "123457") and not is_equivalent("2.9999999", "3")
    # Against an expression: math-verify's rounding to `float_rounding` decimal places.
    assert is_equivalent("1.414214", "\\sqrt{2}") and not is_equivalent("1.4142", "\\sqrt{2}")
    assert is_equivalent("1.41", "\\sqrt{2}", float_rounding=2)


def test_options_are_checked():
    for bad in ({"float_rounding": -1}, {"strict": "yes"}, {"targets": ["latex", "python"]},
                {"targets": []}, {"timeout": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            is_equivalent("1", "2", **bad)
    reward = get_reward("correctness")
    with pytest.raises(ValueError, match="float_rounding"):
        reward("\\boxed{1}", {"answer": "1"}, float_rounding=1.5)


def test_extraction_targets_are_options():
    # plain expressions come from our tree builder only when "expr" is on
    assert is_equivalent("2**10", "1024") and is_equivalent("atan(1)", "\\frac{\\pi}{4}")
    assert not is_equivalent("2**10", "1024", targets=["latex"])
    assert not is_equivalent("atan(1)", "\\frac{\\pi}{4}", targets=["latex"])
    # strict mode off: variables are matched by position
    assert not is_equivalent("y+1", "x+1") and is_equivalent("y+1", "x+1", strict=False)


def test_percent_policy():
    assert is_equivalent("10\\%", "10") and is_equivalent("10\\%", "0.1")
    assert is_equivalent("10\\%", "10 percent") and not is_equivalent("10\\%", "0.1\\%")
    assert not is_equivalent("10", "0.1")  # only an explicit percent sign scales


def test_degrees_are_not_radians():
    assert is_equivalent("90^\\circ", "90") and is_equivalent("90°", "90^{\\circ}")
    assert not is_equivalent("90^\\circ", "\\frac{\\pi}{2}")


def test_unicode_digits_and_minus_are_folded():
    assert is_equivalent("\u2212\uff13", "-3") and is_equivalent("\uff11\uff12\uff13", "123")
    assert is_equivalent("\u2212x\u00b2", "-x^2") and not is_equivalent("\u22123", "3")


EXTRACT = [
    ("so \\boxed{5}", "5"),
    ("The integers are \\boxed{-2} and \\boxed{1}.", "-2,1"),
    ("$\\boxed{1}\\boxed{2}$", "1,2"),
    ("\\[ \\boxed{3} \\quad \\text{and} \\quad \\boxed{3} \\]", "3"),
    ("first \\boxed{1}, then a long remark about it, finally \\boxed{2}", "2"),
    ("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
    ("\\boxed{3} and an unfinished \\boxed{4", "3"),
    ("\\boxed 7", "7"),
    ("\\fbox{8}", "8"),
    ("<think>2+2</think><answer> 4 </answer>", "4"),
    ("<answer>1</answer> <answer>2</answer>", "2"),
    ("<answer>\\boxed{9}</answer>", "9"),
    ("<answer>x = 5</answer>", "x = 5"),
    ("<answer>The answer is 7.</answer>", "7"),
    # a box in the reasoning does not count once something answers after </think>
    ("<think>so \\boxed{4}</think><answer>5</answer>", "5"),
    ("<think>\\boxed{4}</think> The answer is 5.", "5"),
    ("<think>\\boxed{4}</think>", "4"),
    ("<think> unfinished \\boxed{4}", "4"),
    ("<think>x</think>\n\n**Final Answer**\n\\[\\boxed{\\dfrac{3}{4}}\\]", "\\dfrac{3}{4}"),
    (r"so \boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}.", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
    ("The answer is: \\boxed{(-\\infty, 3]}", "(-\\infty, 3]"),
    ("work\n#### 1,234\n", "1,234"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
    ("Thus the answer is 17.", "17"),
    ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "$\\frac{1}{2}$"),
    ("Final Answer: The final answer is $28 \\%$. I hope it is correct.", "$28 \\%$"),
    ("Answer: 3.5", "3.5"),
    ("Final Answer: The largest $n$ is 34.", "34"),
    ("Q: what?\nA: blue", "blue"),
    ("we get $x = 5$", "x = 5"),
    ("we get \\(x^2\\) and finally 12 apples", "12"),
    ("it is -3.25 or so", "-3.25"),
    ("roughly 3/4 of them", "3/4"),
    ("x" * 200_000 + "\\boxed{5}", "5"),
]


@pytest.mark.parametrize("text,expected", EXTRACT, ids=range(len(EXTRACT)))
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


@pytest.mark.parametrize("pred", [r"\(x^2+1\)", r"$x^2+1$", r"$$x^2+1$$", r"\[x^2+1\]"])
def test_delimiters_around_the_whole_answer_are_one_spelling(pred, monkeypatch):
    """`\\(x\\)`, `$x$`, `$$x$$`, `\\[x\\]` reach the worker as `x`: one cache entry."""
    seen = []
    pool = get_pool()
    real = type(pool).compare

    def spy(self, a, b, *args, **kwargs):
        seen.append((a, b))
        return real(self, a, b, *args, **kwargs)

    monkeypatch.setattr(type(pool), "compare", spy)
    assert is_equivalent(pred, "(x+1)^2") is False
    assert is_equivalent(pred, r"1+x^{2}") is True
    assert all(a == "x^2+1" for a, _ in seen), seen


def test_unboxed_answer_read_alike_skips_the_second_extraction(monkeypatch):
    """A completion ending in "the answer is \\(16\\)." is read alike by both extractions,
    so a wrong number is decided without a worker job; a completion whose last span is not
    our answer still gets math-verify's own extraction."""
    calls = []
    pool = get_pool()
    real = type(pool).compare

    def spy(self, a, b, mode, atol, timeout_s, options=None, **limits):
        calls.append((options or {}).get("completion"))
        return real(self, a, b, mode, atol, timeout_s, options, **limits)

    monkeypatch.setattr(type(pool), "compare", spy)
    reward = get_reward("correctness")
    example = {"prompt": "p", "answer": "18"}
    assert reward(r"<think>4+12</think>The answer is \(16\).", example) == RewardResult(
        0.0, "wrong")
    assert calls == []
    assert reward(r"<think>4+12</think>The answer is \(16\), or $18$ if rounded up 2.",
                  example).score in (0.0, 1.0)
    assert calls and calls[-1] is not None  # the completion went to math-verify too


def test_correctness_reward_accepts_full_gsm8k_and_math_solutions():
    reward = get_reward("correctness")
    gsm8k = {"prompt": "p", "answer": "She has 3*4 = <<3*4=12>>12 eggs.\n#### 1,200"}
    assert reward("<answer>1200</answer>", gsm8k) == RewardResult(1.0)
    assert reward("#### 1200", gsm8k) == RewardResult(1.0)
    math_ = {"prompt": "p", "answer": "Hence $x = \\boxed{\\frac{3}{4}}$."}
    assert reward("<think>...</think> The answer is $0.75$.", math_) == RewardResult(1.0)
    assert reward("\\boxed{\\frac{4}{3}}", math_) == RewardResult(0.0, "wrong")


def test_config_options_reach_training_eval_and_distill():
    """`rewards.options.correctness` is what the RL pool, `eval` and the distillation
    filter bind; the shipped config's block is valid."""
    import importlib.util
    from pathlib import Path

    import ml_collections

    from jaxrl_reason.recipes.distill import verify_completions
    from jaxrl_reason.rewards.math import verifier_options
    from jaxrl_reason.rewards.pool import RewardPool, config_options

    path = Path(__file__).resolve().parents[2] / "configs" / "arith_grpo.py"
    spec = importlib.util.spec_from_file_location("_arith_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = config_options(module.get_config())["correctness"]
    assert verifier_options(**shipped)["targets"] == ("latex", "expr")

    config = ml_collections.ConfigDict({"rewards": {"options": {
        "correctness": {"float_rounding": 2}}}})
    completions, examples = ["so \\boxed{1.41}"] * 2, [{"prompt": "", "answer": "\\sqrt{2}"}] * 2
    with RewardPool({"correctness": 1.0}, options=config_options(config)) as pool:
        result = pool.score(completions, examples)
        assert list(result.total) == [1.0, 1.0], result.reasons
    with RewardPool({"correctness": 1.0}) as pool:  # default: 6 decimal places
        assert list(pool.score(completions, examples).total) == [0.0, 0.0]
    assert verify_completions(completions, examples, ["correctness"],
                              options=config_options(config)).all()
    with pytest.raises(ValueError, match="no option"):
        RewardPool({"correctness": 1.0}, options={"correctness": {"rounding": 2}})
