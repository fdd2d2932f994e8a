"""Procedurally generated Countdown problems (TinyZero): reach a target with + - * /.

Every given number must be used exactly once. A problem is built backwards from a solution:
the numbers are combined pairwise in random order, each step a friendly operation (a sum; a
difference larger - smaller > 0; a product up to MAX_INTERMEDIATE; an exact division by a
divisor > 1), until one value is left; that value is the target. So every target is
reachable, every intermediate value is a positive integer, and the SFT trace lists the steps:

    prompt:     Using the numbers [7, 3, 50, 25], make 21. Use + - * / and each number
                exactly once.
    completion: <think>50-25=25. 25-7=18. 18+3=21. So 50-25-7+3=21.</think>
                <answer>50-25-7+3</answer>

Difficulty levels (count of numbers, their range, target range):
    1: 2 numbers in 1..40,                                 target 1..100
    2: 3 numbers in 1..30,                                 target 1..100
    3: 4 numbers in 1..50,                                 target 1..100 (TinyZero-like)
    4: 5 numbers in 1..50,                                 target 10..500
    5: 6 numbers, 4-5 in 1..10 and 1-2 of 25/50/75/100,    target 100..999 (the TV show)
Level 1 holds about 1,850 distinct problems (about 370 in eval); the others many more.

Train and eval splits are disjoint by construction: a problem is in the eval split iff a
hash of its canonical form (sorted numbers and target, "3,7,25,50->21") falls in the eval
bucket (1 in `EVAL_BUCKETS`), so a reordering of an eval problem is never trained on.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from jaxrl_reason.data.levels import LevelSource, level_corpus

from jaxrl_reason.rewards import arith_eval

EVAL_BUCKETS = 5
MAX_LEVEL = 5
SPLITS = ("train", "eval")
MAX_INTERMEDIATE = 10_000  # largest product allowed in a construction step

# level -> (count, small-number max, number of large numbers {25,50,75,100} (range), target lo, hi)
_LEVELS: dict[int, tuple[int, int, tuple[int, int], int, int]] = {
    1: (2, 40, (0, 0), 1, 100),
    2: (3, 30, (0, 0), 1, 100),
    3: (4, 50, (0, 0), 1, 100),
    4: (5, 50, (0, 0), 10, 500),
    5: (6, 10, (1, 2), 100, 999),
}
_LARGE = (25, 50, 75, 100)
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def canonical_problem(numbers: list[int], target: int) -> str:
    """([7, 3, 50, 25], 21) -> '3,7,25,50->21' (the numbers sorted)."""
    return ",".join(str(x) for x in sorted(numbers)) + f"->{target}"


def problem_split(numbers: list[int], target: int) -> str:
    """'eval' or 'train' for a problem (a hash of its canonical form)."""
    key = canonical_problem(numbers, target).encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "eval" if bucket % EVAL_BUCKETS == 0 else "train"


def _render(node: tuple) -> str:
    """An expression tree (int, or (op, left, right)) as a string with minimal parentheses."""
    if isinstance(node, int):
        return str(node)
    op, left, right = node
    lhs, rhs = _render(left), _render(right)
    if not isinstance(left, int) and _PRECEDENCE[left[0]] < _PRECEDENCE[op]:
        lhs = f"({lhs})"
    if not isinstance(right, int) and (
        _PRECEDENCE[right[0]] < _PRECEDENCE[op]
        or (_PRECEDENCE[right[0]] == _PRECEDENCE[op] and op in "-/")
    ):
        rhs = f"({rhs})"
    return f"{lhs}{op}{rhs}"


def _combine(rng: np.random.Generator, a: tuple[int, Any], b: tuple[int, Any]):
    """A random friendly operation on two (value, tree) pairs: (op, larger, smaller, value)."""
    big, small = (a, b) if a[0] >= b[0] else (b, a)
    x, y = big[0], small[0]
    options = [("+", x + y)]
    if x > y:
        options.append(("-", x - y))
    if 1 < y and x * y <= MAX_INTERMEDIATE:
        options.append(("*", x * y))
    if 1 < y and x % y == 0:
        options += [("/", x // y)] * 2  # divisions are rare; make them likelier
    op, value = options[int(rng.integers(len(options)))]
    return op, big, small, value


def _draw_numbers(rng: np.random.Generator, level: int) -> list[int]:
    count, small_max, (large_lo, large_hi), _, _ = _LEVELS[level]
    num_large = int(rng.integers(large_lo, large_hi + 1))
    large = [int(x) for x in rng.choice(_LARGE, size=num_large, replace=False)]
    return large + [int(rng.integers(1, small_max + 1)) for _ in range(count - num_large)]


def _draw_problem(rng: np.random.Generator, level: int):
    """(numbers in prompt order, target, solution tree, steps) or None for a bad draw."""
    numbers = _draw_numbers(rng, level)
    pool: list[tuple[int, Any]] = [(x, x) for x in numbers]  # (value, tree)
    steps = []
    while len(pool) > 1:
        i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
        op, big, small, value = _combine(rng, pool[i], pool[j])
        steps.append(f"{big[0]}{op}{small[0]}={value}")
        tree = (op, big[1], small[1])
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, tree)]
    target, tree = pool[0]
    _, _, _, lo, hi = _LEVELS[level]
    if not lo <= target <= hi:
        return None
    order = rng.permutation(len(numbers))
    return [numbers[k] for k in order], target, tree, steps


def format_completion(steps: list[str], expression: str, target: int) -> str:
    """The SFT target: <think>step. step. So expr=target.</think><answer>expr</answer>."""
    return (f"<think>{'. '.join(steps)}. So {expression}={target}.</think>"
            f"<answer>{expression}</answer>")


def make_example(split: str, level: int, index: int, seed: int) -> dict[str, Any]:
    """The `index`-th problem of `split` at `level` for `seed` (deterministic).

    Returns a dict of python values: id (str), prompt (str), answer (str, a solution
    expression), completion (str, the SFT target), level (int), task ("countdown"),
    numbers (list[int], prompt order), target (int).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level not in _LEVELS:
        raise ValueError(f"countdown level must be in 1..{MAX_LEVEL}, got {level!r}")
    rng = np.random.default_rng([seed, SPLITS.index(split), level, index, 0xC0D])
    while True:
        drawn = _draw_problem(rng, level)
        if drawn is not None and problem_split(drawn[0], drawn[1]) == split:
            break
    numbers, target, tree, steps = drawn
    expression = _render(tree)
    parsed = arith_eval.parse(expression)  # self-check the construction
    if parsed.value != target or sorted(parsed.numbers) != sorted(numbers):
        raise AssertionError(f"countdown generator bug: {expression} for {numbers}->{target}")
    return {
        "id": f"countdown-{split}-L{level}-s{seed}-{index}",
        "prompt": (f"Using the numbers {numbers}, make {target}. "
                   "Use + - * / and each number exactly once."),
        "answer": expression,
        "completion": format_completion(steps, expression, target),
        "level": level,
        "task": "countdown",
        "numbers": numbers,
        "target": target,
    }


class CountdownSource(LevelSource):
    """Random-access source of countdown problems: item i has level `levels[i % len(levels)]`
    (see `LevelSource`); two sources with the same arguments hold identical items."""

    def __init__(self, split: str, levels: tuple[int, ...] | list[int], size: int, seed: int):
        super().__init__("countdown", make_example, MAX_LEVEL, split, levels, size, seed)


def tokenizer_corpus(num_examples: int = 2000, seed: int = 12345) -> list[str]:
    """Texts to train the task tokenizer on: prompts and completions of every level."""
    return level_corpus(make_example, MAX_LEVEL, num_examples, seed)
