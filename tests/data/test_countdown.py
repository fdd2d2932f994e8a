"""Countdown task: reachable targets, valid traces, level table, disjoint splits, determinism."""
import re
from collections import Counter
from fractions import Fraction

import pytest

import jaxrl_reason.rewards.countdown  # noqa: F401  (registers the "countdown" reward)
from jaxrl_reason.data import countdown as cd
from jaxrl_reason.rewards import arith_eval, get_reward

LEVELS = range(1, cd.MAX_LEVEL + 1)
_PROMPT = re.compile(r"Using the numbers \[([0-9, ]+)\], make (\d+)\. "
                     r"Use \+ - \* / and each number exactly once\.")
_COMPLETION = re.compile(r"<think>(.*)\. So ([0-9+\-*/()]+)=(\d+)\.</think><answer>(.*)</answer>")
_STEP = re.compile(r"(\d+)([+\-*/])(\d+)=(\d+)")


def _examples(split, level, count, seed=0):
    return [cd.make_example(split, level, i, seed) for i in range(count)]


@pytest.mark.parametrize("split", cd.SPLITS)
@pytest.mark.parametrize("level", LEVELS)
def test_examples_are_solved_by_their_answer(split, level):
    verifier = get_reward("countdown")
    for ex in _examples(split, level, 60, seed=level):
        assert set(ex) == {"id", "prompt", "answer", "completion", "level", "task", "numbers",
                           "target"}
        assert ex["task"] == "countdown" and ex["level"] == level
        assert ex["id"].startswith(f"countdown-{split}-L{level}-s{level}-")
        match = _PROMPT.fullmatch(ex["prompt"])
        assert match, ex["prompt"]
        assert [int(x) for x in match.group(1).split(", ")] == ex["numbers"]
        assert int(match.group(2)) == ex["target"]
        assert all(type(x) is int for x in ex["numbers"]) and type(ex["target"]) is int
        parsed = arith_eval.parse(ex["answer"])
        assert parsed.value == ex["target"] and Counter(parsed.numbers) == Counter(ex["numbers"])
        assert verifier(ex["completion"], ex).score == 1.0, ex
        assert cd.problem_split(ex["numbers"], ex["target"]) == split


@pytest.mark.parametrize("level", LEVELS)
def test_trace_steps_are_true_and_use_each_number_once(level):
    for ex in _examples("train", level, 80, seed=3):
        match = _COMPLETION.fullmatch(ex["completion"])
        assert match, ex["completion"]
        steps, expression, stated, answer = match.groups()
        assert expression == answer == ex["answer"] and int(stated) == ex["target"]
        available = Counter(ex["numbers"])
        last = None
        for step in steps.split(". "):
            a, op, b, c = _STEP.fullmatch(step).groups()
            a, b, c = int(a), int(b), int(c)
            assert Fraction(c) == arith_eval.evaluate(f"{a}{op}{b}") and c > 0, step
            for x in (a, b):  # each operand is a given number or an earlier result
                assert available[x] > 0, (step, ex)
                available[x] -= 1
            available[c] += 1
            last = c
        assert last == ex["target"] and +available == Counter([ex["target"]])


def test_level_table():
    """Number counts and ranges follow the table of the module docstring."""
    table = {1: (2, 40, 1, 100), 2: (3, 30, 1, 100), 3: (4, 50, 1, 100), 4: (5, 50, 10, 500)}
    for level, (count, top, lo, hi) in table.items():
        for ex in _examples("train", level, 100):
            assert len(ex["numbers"]) == count
            assert all(1 <= x <= top for x in ex["numbers"]), ex
            assert lo <= ex["target"] <= hi
    for ex in _examples("train", 5, 100):
        large = [x for x in ex["numbers"] if x in (25, 50, 75, 100)]
        small = [x for x in ex["numbers"] if x not in large]
        assert len(ex["numbers"]) == 6 and 1 <= len(large) <= 2, ex
        assert all(1 <= x <= 10 for x in small) and 100 <= ex["target"] <= 999
    ops = Counter(c for lv in LEVELS for ex in _examples("train", lv, 60) for c in ex["answer"])
    assert all(ops[op] > 10 for op in "+-*/()"), ops


def test_splits_are_disjoint():
    for level in (1, 3):
        eval_forms = {cd.canonical_problem(ex["numbers"], ex["target"])
                      for ex in _examples("eval", level, 200)}
        train_forms = {cd.canonical_problem(ex["numbers"], ex["target"])
                       for ex in _examples("train", level, 1500, seed=1)}
        assert eval_forms and not eval_forms & train_forms
    assert cd.canonical_problem([50, 3, 25, 7], 21) == "3,7,25,50->21"
    assert cd.problem_split([3, 7], 21) == cd.problem_split([7, 3], 21)


def test_deterministic_and_seed_dependent():
    assert _examples("train", 4, 20, seed=5) == _examples("train", 4, 20, seed=5)
    assert _examples("train", 4, 20, seed=5) != _examples("train", 4, 20, seed=6)
    assert cd.make_example("eval", 2, 3, 0) != cd.make_example("eval", 2, 4, 0)


def test_render_minimal_parentheses():
    assert cd._render(("-", 10, ("-", 5, 2))) == "10-(5-2)"
    assert cd._render(("-", ("-", 10, 5), 2)) == "10-5-2"
    assert cd._render(("*", ("+", 1, 2), ("/", 8, 4))) == "(1+2)*8/4"
    assert cd._render(("/", 8, ("*", 2, 2))) == "8/(2*2)"
    assert cd._render(("+", 1, ("-", 5, 2))) == "1+5-2"


def test_source_and_corpus():
    source = cd.CountdownSource("eval", [1, 3], size=6, seed=2)
    assert len(source) == 6 and [source[i]["level"] for i in range(6)] == [1, 3] * 3
    assert source[4] == cd.make_example("eval", 1, 2, 2)
    with pytest.raises(IndexError):
        source[6]
    for bad in [dict(split="test"), dict(levels=[]), dict(levels=[6]), dict(size=0)]:
        with pytest.raises(ValueError):
            cd.CountdownSource(**{"split": "train", "levels": [1], "size": 3, "seed": 0, **bad})
    with pytest.raises(ValueError):
        cd.make_example("train", 0, 0, 0)
    corpus = cd.tokenizer_corpus(10, seed=1)
    assert len(corpus) == 20 and corpus[0].startswith("Using the numbers")
