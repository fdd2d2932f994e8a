"""Arithmetic task: correct answers, parseable worked traces, disjoint splits, determinism."""
import re

import pytest

from jaxrl_reason.data import arithmetic as ar

LEVELS = range(1, ar.MAX_LEVEL + 1)
_PROMPT = re.compile(r"What is ([0-9+\-]+)\?")


def _expression(example):
    match = _PROMPT.fullmatch(example["prompt"])
    assert match, example["prompt"]
    return match.group(1)


def _examples(split, level, count, seed=0):
    return [ar.make_example(split, level, i, seed) for i in range(count)]


@pytest.mark.parametrize("split", ar.SPLITS)
@pytest.mark.parametrize("level", LEVELS)
def test_answers_equal_python_eval(split, level):
    for ex in _examples(split, level, 150, seed=level):
        expression = _expression(ex)
        assert ex["answer"] == str(eval(expression)), ex  # noqa: S307  digits and +/- only
        assert int(ex["answer"]) >= 0
        assert ex["level"] == level and ex["task"] == "arithmetic"
        assert ex["id"] == f"arith-{split}-L{level}-s{level}-{ex['id'].rsplit('-', 1)[1]}"
        assert ar.problem_split(expression) == split


def test_level_shapes():
    """Operand counts and digit ranges follow the level table of the module docstring."""
    allowed = {1: ({2}, 1, 2, "+"), 2: ({2}, 2, 2, "+-"), 3: ({2}, 3, 3, "+-"),
               4: ({2}, 4, 4, "+-"), 5: ({3}, 3, 4, "+")}
    for level, (counts, lo, hi, ops) in allowed.items():
        for ex in _examples("train", level, 200):
            expression = _expression(ex)
            operands = re.split(r"[+\-]", expression)
            assert len(operands) in counts
            assert all(lo <= len(x) <= hi for x in operands), expression
            assert set(re.sub(r"\d", "", expression)) <= set(ops)
    ops_seen = {op for ex in _examples("train", 2, 200) for op in "+-" if op in ex["prompt"]}
    assert ops_seen == {"+", "-"}


def test_reordered_sums_share_a_split():
    """3+5 and 5+3 are one problem: a reordering of an eval problem is never trained on."""
    for ex in _examples("eval", 3, 200):
        expression = _expression(ex)
        if "+" in expression:
            a, b = expression.split("+")
            assert ar.problem_split(f"{b}+{a}") == "eval"
    assert ar.canonical_problem("589+347") == "347+589" == ar.canonical_problem("347+589")


@pytest.mark.parametrize("level", LEVELS)
def test_completion_trace_parses_to_the_answer(level):
    pattern = re.compile(r"<think>(.*)\. So ([0-9+\-]+)=(\d+)\.</think><answer>(\d+)</answer>",
                         re.S)
    for ex in _examples("train", level, 150, seed=7):
        match = pattern.fullmatch(ex["completion"])
        assert match, ex["completion"]
        steps, expression, stated, answer = match.groups()
        assert expression == _expression(ex) and stated == answer == ex["answer"]
        written = re.findall(r"write (\d)\b", steps)
        assert len(written) == len(steps.split(". ")), steps  # one written digit per step
        assert int("".join(reversed(written))) == int(ex["answer"]), ex["completion"]
        for step in steps.split(". "):  # every column equation is true
            if step.startswith("write "):  # the final carry has no equation
                continue
            lhs, rhs = step.split(", write")[0].split("=")
            assert eval(lhs) == int(rhs), step  # noqa: S307


def test_traces_on_hand_examples():
    assert ar.addition_trace([347, 589]) == [
        "7+9=16, write 6 carry 1", "4+8+1=13, write 3 carry 1", "3+5+1=9, write 9"]
    assert ar.addition_trace([95, 7]) == ["5+7=12, write 2 carry 1", "9+1=10, write 0 carry 1",
                                          "write 1"]
    assert ar.subtraction_trace(503, 78) == [
        "3-8+10=5, write 5 borrow 1", "0-7-1+10=2, write 2 borrow 1", "5-0-1=4, write 4"]
    assert ar.format_completion("1+2", ["1+2=3, write 3"], 3) == (
        "<think>1+2=3, write 3. So 1+2=3.</think><answer>3</answer>")


@pytest.mark.parametrize("level", [1, 2])
def test_train_and_eval_splits_are_disjoint(level):
    train = _examples("train", level, 2000, seed=0)
    evals = _examples("eval", level, 2000, seed=0)
    train_prompts = {ex["prompt"] for ex in train}
    eval_prompts = {ex["prompt"] for ex in evals}
    assert not train_prompts & eval_prompts
    assert len(eval_prompts) > 200  # the eval split is not degenerate
    assert all(ar.problem_split(_expression(ex)) == "eval" for ex in evals)
    assert all(ar.problem_split(_expression(ex)) == "train" for ex in train)


def test_problem_split_is_a_stable_hash_bucket():
    expressions = [f"{a}+{b}" for a in range(60) for b in range(60)]
    fraction = sum(ar.problem_split(e) == "eval" for e in expressions) / len(expressions)
    assert abs(fraction - 1 / ar.EVAL_BUCKETS) < 0.03
    assert all(ar.problem_split(e) == ar.problem_split(e) for e in expressions[:50])


def test_determinism():
    for level in LEVELS:
        assert ar.make_example("train", level, 17, 3) == ar.make_example("train", level, 17, 3)
    seed0 = [ex["prompt"] for ex in _examples("train", 3, 30, seed=0)]
    seed1 = [ex["prompt"] for ex in _examples("train", 3, 30, seed=1)]
    assert seed0 != seed1
    assert len(set(seed0)) > 25  # indices give different problems
    a = ar.ArithmeticSource("eval", [1, 3], size=10, seed=4)
    b = ar.ArithmeticSource("eval", (1, 3), size=10, seed=4)
    assert [a[i] for i in range(10)] == [b[i] for i in range(10)]


def test_make_example_errors():
    with pytest.raises(ValueError, match="split must be one of"):
        ar.make_example("test", 1, 0, 0)
    with pytest.raises(ValueError, match=r"level must be in 1\.\.5, got 6"):
        ar.make_example("train", 6, 0, 0)


def test_arithmetic_source():
    source = ar.ArithmeticSource("train", [2, 4], size=7, seed=9)
    assert len(source) == 7
    assert [source[i]["level"] for i in range(7)] == [2, 4, 2, 4, 2, 4, 2]
    assert source[5] == ar.make_example("train", 4, 2, 9)
    assert "ArithmeticSource(split='train'" in repr(source)
    for bad in (7, -1, 100):
        with pytest.raises(IndexError, match=f"index {bad} out of range for source of size 7"):
            source[bad]


@pytest.mark.parametrize("kwargs, match", [
    (dict(levels=[]), "at least one level"),
    (dict(levels=[1, 9]), r"level must be in 1\.\.5, got 9"),
    (dict(levels=[0]), "got 0"),
    (dict(size=0), "size must be positive, got 0"),
])
def test_arithmetic_source_errors(kwargs, match):
    args = dict(split="train", levels=[1], size=5, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        ar.ArithmeticSource(**args)


def test_tokenizer_corpus_covers_every_level():
    corpus = ar.tokenizer_corpus(20, seed=5)
    assert len(corpus) == 40
    prompts, completions = corpus[0::2], corpus[1::2]
    assert all(p.startswith("What is ") for p in prompts)
    assert all(c.startswith("<think>") and c.endswith("</answer>") for c in completions)
    levels = []
    for i, prompt in enumerate(prompts):
        level = next(lv for lv in LEVELS if ar.make_example("train", lv, i, 5)["prompt"] == prompt)
        levels.append(level)
    assert set(levels) == set(LEVELS)
    # Level 5 problems are long (5-6 digit operands or four operands), level 1 short.
    assert max(len(p) for p in prompts[0::5]) <= len("What is 99+99?")
    assert min(len(p) for p in prompts[4::5]) >= len("What is 10000-10000?") - 2
