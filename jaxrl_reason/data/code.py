"""Procedurally generated Python function problems with hidden tests (the `code` task).

The model writes a one-line Python function from an English description; the `code` reward
runs it in the sandbox (`rewards/code.py`) against hidden assert tests and scores the
fraction passed (the tests of a problem run as one program, so the score is 0 or 1):

    prompt:     Write a Python function f(xs) that returns the sum of the numbers in the
                list xs that are greater than 4.
    completion: <think>Keep the numbers v of xs with v>4 and add them up. Check:
                f([2, 7, 5])=12.</think><answer>def f(xs): return sum(v for v in xs if
                v>4)</answer>
    tests:      ["assert f([2, 7, 5]) == 12\nassert f([]) == 0\n..."]

Difficulty levels (each a few families of descriptions):
    1: f(x) = a*x + b or a*x - b                               (x an integer)
    2: f(x) = one of two affine values depending on x being even, or greater than t
    3: f(xs) = sum / count / max of the numbers of a list passing a filter
               (greater than t, less than t, even, odd, divisible by m)
    4: f(xs) = sum of a*v + b over the numbers v of the list passing a filter
    5: f(xs) = the list of a*v (+ b) for the numbers v passing a filter, in order or
               reversed
The expected outputs are computed by running the reference solution in this process (our own
generated code, never a completion), so the tests and the reference always agree.

Train and eval splits are disjoint by construction: a problem is in the eval split iff a
hash of its canonical form (family and parameters, "sum_filter|gt|4") falls in the eval
bucket (1 in `EVAL_BUCKETS`).
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from jaxrl_reason.data.levels import LevelSource, level_corpus

EVAL_BUCKETS = 5
MAX_LEVEL = 5
SPLITS = ("train", "eval")
NUM_TESTS = 6  # hidden asserts per problem (plus the edge cases of list problems)

# Filters of list problems: name -> (English, Python condition on v with {t} / {m}).
_FILTERS = {
    "gt": ("greater than {t}", "v>{t}"),
    "lt": ("less than {t}", "v<{t}"),
    "even": ("even", "v%2==0"),
    "odd": ("odd", "v%2==1"),
    "div": ("divisible by {m}", "v%{m}==0"),
}


def canonical_problem(family: str, params: tuple) -> str:
    """('sum_filter', ('gt', 4)) -> 'sum_filter|gt|4'."""
    return "|".join([family, *map(str, params)])


def problem_split(family: str, params: tuple) -> str:
    """'eval' or 'train' for a problem (a hash of its canonical form)."""
    key = canonical_problem(family, params).encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "eval" if bucket % EVAL_BUCKETS == 0 else "train"


def _affine(a: int, b: int, var: str = "x") -> tuple[str, str]:
    """(English, Python) of a*var + b; b may be negative, a >= 2."""
    if b >= 0:
        return f"{a} times {var} plus {b}", f"{a}*{var}+{b}"
    return f"{a} times {var} minus {-b}", f"{a}*{var}-{-b}"


def _draw_filter(rng: np.random.Generator) -> tuple[tuple, str, str]:
    """(params, English, Python condition) of a random list filter."""
    name = str(rng.choice(list(_FILTERS)))
    words, cond = _FILTERS[name]
    if name in ("gt", "lt"):
        t = int(rng.integers(-3, 10))
        return (name, t), words.format(t=t), cond.format(t=t)
    if name == "div":
        m = int(rng.integers(3, 6))
        return (name, m), words.format(m=m), cond.format(m=m)
    return (name,), words, cond


def _level_1(rng):
    a, b = int(rng.integers(2, 13)), int(rng.integers(-20, 31))
    words, expr = _affine(a, b)
    return ("affine", (a, b), "x", f"returns {words}", expr,
            f"Compute {words}.")


def _level_2(rng):
    a, b = int(rng.integers(2, 10)), int(rng.integers(-9, 10))
    c, d = int(rng.integers(2, 10)), int(rng.integers(-9, 10))
    w1, e1 = _affine(a, b)
    w2, e2 = _affine(c, d)
    if rng.random() < 0.5:
        cond_words, cond = "x is even", "x%2==0"
        params = ("even", a, b, c, d)
    else:
        t = int(rng.integers(-5, 10))
        cond_words, cond = f"x is greater than {t}", f"x>{t}"
        params = ("gt", t, a, b, c, d)
    return ("cond", params, "x", f"returns {w1} if {cond_words}, else {w2}",
            f"{e1} if {cond} else {e2}", f"If {cond_words}, {w1}; else {w2}.")


def _level_3(rng):
    fparams, fwords, cond = _draw_filter(rng)
    kind = str(rng.choice(["sum", "count", "max"]))
    if kind == "sum":
        words = f"the sum of the numbers in the list xs that are {fwords}"
        expr, plan = f"sum(v for v in xs if {cond})", \
            f"Keep the numbers v of xs with {cond} and add them up."
    elif kind == "count":
        words = f"how many numbers in the list xs are {fwords}"
        expr, plan = f"sum(1 for v in xs if {cond})", f"Count the numbers v of xs with {cond}."
    else:
        words = f"the largest number in the list xs that is {fwords} (0 if there is none)"
        expr, plan = f"max([v for v in xs if {cond}], default=0)", \
            f"Take the largest number v of xs with {cond}, or 0 if there is none."
    return f"{kind}_filter", fparams, "xs", f"returns {words}", expr, plan


def _level_4(rng):
    fparams, fwords, cond = _draw_filter(rng)
    a, b = int(rng.integers(2, 10)), int(rng.integers(-9, 10))
    words, term = _affine(a, b, "v")
    return ("sum_affine", (*fparams, a, b), "xs",
            f"returns the sum of {words} over the numbers v in the list xs that are {fwords}",
            f"sum({term} for v in xs if {cond})",
            f"For each v of xs with {cond}, take {term}; add them up.")


def _level_5(rng):
    fparams, fwords, cond = _draw_filter(rng)
    a, b = int(rng.integers(2, 10)), int(rng.integers(-9, 10))
    words, term = _affine(a, b, "v")
    if rng.random() < 0.5:
        return ("map", (*fparams, a, b, "fwd"), "xs",
                f"returns the list of {words} for the numbers v in the list xs that are "
                f"{fwords}, in order", f"[{term} for v in xs if {cond}]",
                f"For each v of xs with {cond}, in order, take {term}.")
    return ("map", (*fparams, a, b, "rev"), "xs",
            f"returns the list of {words} for the numbers v in the list xs that are "
            f"{fwords}, in reverse order", f"[{term} for v in xs if {cond}][::-1]",
            f"For each v of xs with {cond}, take {term}; reverse the list.")


_DRAW = {1: _level_1, 2: _level_2, 3: _level_3, 4: _level_4, 5: _level_5}


def _inputs(rng: np.random.Generator, arg: str) -> list:
    """Test inputs: NUM_TESTS integers, or the empty list plus NUM_TESTS lists of 1-7 ints."""
    if arg == "x":
        return [int(x) for x in rng.integers(-20, 41, size=NUM_TESTS)]
    lists = [[]]
    for _ in range(NUM_TESTS):
        size = int(rng.integers(1, 8))
        lists.append([int(v) for v in rng.integers(-9, 21, size=size)])
    return lists


def reference_function(code: str):
    """The function `f` defined by a generated reference solution (trusted code only: the
    generator's own, never a completion)."""
    namespace: dict[str, Any] = {}
    exec(code, {"__builtins__": {"sum": sum, "max": max, "len": len}}, namespace)  # noqa: S102
    return namespace["f"]


def format_completion(plan: str, check: str, code: str) -> str:
    """The SFT target: <think>plan Check: f(input)=output.</think><answer>code</answer>."""
    return f"<think>{plan} Check: {check}.</think><answer>{code}</answer>"


def make_example(split: str, level: int, index: int, seed: int) -> dict[str, Any]:
    """The `index`-th problem of `split` at `level` for `seed` (deterministic).

    Returns a dict of python values: id (str), prompt (str), answer (str, the reference
    solution), completion (str, the SFT target), tests (list[str]: one program of asserts,
    the `code` reward's format), level (int), task ("code").
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level not in _DRAW:
        raise ValueError(f"code level must be in 1..{MAX_LEVEL}, got {level!r}")
    rng = np.random.default_rng([seed, SPLITS.index(split), level, index, 0xC0DE])
    while True:
        family, params, arg, words, expr, plan = _DRAW[level](rng)
        if problem_split(family, params) == split:
            break
    code = f"def f({arg}): return {expr}"
    fn = reference_function(code)
    inputs = _inputs(np.random.default_rng(
        [int.from_bytes(hashlib.sha256(canonical_problem(family, params).encode())
                        .digest()[:4], "big")]), arg)
    asserts = "\n".join(f"assert f({x!r}) == {fn(x)!r}" for x in inputs)
    shown = inputs[-1]
    return {
        "id": f"code-{split}-L{level}-s{seed}-{index}",
        "prompt": f"Write a Python function f({arg}) that {words}.",
        "answer": code,
        "completion": format_completion(plan, f"f({shown!r})={fn(shown)!r}", code),
        "tests": [asserts],
        "level": level,
        "task": "code",
    }


class CodeSource(LevelSource):
    """Random-access source of code problems: item i has level `levels[i % len(levels)]`
    (see `LevelSource`); two sources with the same arguments hold identical items."""

    def __init__(self, split: str, levels: tuple[int, ...] | list[int], size: int, seed: int):
        super().__init__("code", make_example, MAX_LEVEL, split, levels, size, seed)


def tokenizer_corpus(num_examples: int = 2000, seed: int = 12345) -> list[str]:
    """Texts to train the task tokenizer on: prompts and completions of every level."""
    return level_corpus(make_example, MAX_LEVEL, num_examples, seed)
