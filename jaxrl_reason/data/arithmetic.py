"""Procedurally generated multi-digit arithmetic with a worked, column-by-column chain of thought.

Every problem is an addition of 2-3 non-negative integers or a subtraction a - b with a >= b.
The SFT target ("completion") works the columns from the right, writing the digit and the
carry/borrow of each, then states the result:

    prompt:     What is 347+589?
    completion: <think>7+9=16, write 6 carry 1. 4+8+1=13, write 3 carry 1. 3+5+1=9, write 9.
                So 347+589=936.</think><answer>936</answer>

Difficulty levels (operands, digits per operand, operators):
    1: 2 operands, 1-2 digits, +
    2: 2 operands, 2 digits, + or -
    3: 2 operands, 3 digits, + or -
    4: 2 operands, 4 digits, + or -
    5: 3 operands, 3-4 digits, +

Train and eval splits are disjoint by construction: a problem belongs to the eval split iff a
hash of its canonical form (sorted operands for a sum, so 3+5 and 5+3 are one problem) falls
in the eval bucket (1 in `EVAL_BUCKETS`), so no seed or size can make an eval problem, or a
reordering of one, appear in training.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from jaxrl_reason.data.levels import LevelSource, level_corpus

EVAL_BUCKETS = 5
MAX_LEVEL = 5
SPLITS = ("train", "eval")

# level -> list of (num_operands, min_digits, max_digits, operators) variants.
_LEVELS: dict[int, list[tuple[int, int, int, str]]] = {
    1: [(2, 1, 2, "+")],
    2: [(2, 2, 2, "+-")],
    3: [(2, 3, 3, "+-")],
    4: [(2, 4, 4, "+-")],
    5: [(3, 3, 4, "+")],
}


def canonical_problem(expression: str) -> str:
    """'589+347' -> '347+589' (a sum's operands sorted); differences are unchanged."""
    if "+" in expression:
        return "+".join(sorted(expression.split("+"), key=int))
    return expression


def problem_split(expression: str) -> str:
    """'eval' or 'train' for an expression such as '347+589' (hash of its canonical form)."""
    key = canonical_problem(expression).encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "eval" if bucket % EVAL_BUCKETS == 0 else "train"


def _digits_right_to_left(n: int, width: int) -> list[int]:
    return [(n // 10 ** i) % 10 for i in range(width)]


def addition_trace(operands: list[int]) -> list[str]:
    """Column steps of a multi-operand addition, rightmost column first."""
    width = max(len(str(x)) for x in operands)
    columns = [_digits_right_to_left(x, width) for x in operands]
    steps, carry = [], 0
    for i in range(width):
        terms = [c[i] for c, x in zip(columns, operands) if i < len(str(x))]
        if carry:
            terms.append(carry)
        total = sum(terms)
        digit, carry = total % 10, total // 10
        lhs = "+".join(str(t) for t in terms) if len(terms) > 1 else str(terms[0])
        step = f"{lhs}={total}, write {digit}"
        if carry:
            step += f" carry {carry}"
        steps.append(step)
    if carry:
        steps.append(f"write {carry}")
    return steps


def subtraction_trace(a: int, b: int) -> list[str]:
    """Column steps of a - b (a >= b >= 0), rightmost column first, with borrows."""
    width = len(str(a))
    da, db = _digits_right_to_left(a, width), _digits_right_to_left(b, width)
    steps, borrow = [], 0
    for i in range(width):
        lhs = f"{da[i]}-{db[i]}" + (f"-{borrow}" if borrow else "")
        value = da[i] - db[i] - borrow
        if value < 0:
            steps.append(f"{lhs}+10={value + 10}, write {value + 10} borrow 1")
            borrow = 1
        else:
            steps.append(f"{lhs}={value}, write {value}")
            borrow = 0
    return steps


def format_completion(expression: str, steps: list[str], result: int) -> str:
    """The SFT target: <think>steps. So expr=result.</think><answer>result</answer>."""
    return (f"<think>{'. '.join(steps)}. So {expression}={result}.</think>"
            f"<answer>{result}</answer>")


def _draw_problem(rng: np.random.Generator, level: int) -> tuple[str, int, list[str]]:
    num_operands, lo, hi, ops = _LEVELS[level][rng.integers(len(_LEVELS[level]))]
    operator = ops[rng.integers(len(ops))]

    def number():
        digits = int(rng.integers(lo, hi + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return int(rng.integers(low, 10 ** digits))

    operands = [number() for _ in range(num_operands)]
    if operator == "-":
        a, b = sorted(operands, reverse=True)
        return f"{a}-{b}", a - b, subtraction_trace(a, b)
    return "+".join(map(str, operands)), sum(operands), addition_trace(operands)


def make_example(split: str, level: int, index: int, seed: int) -> dict[str, Any]:
    """The `index`-th problem of `split` at `level` for `seed` (deterministic).

    Returns a dict of python values: id (str), prompt (str), answer (str), completion (str,
    the worked SFT target), level (int), task ("arithmetic").
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level not in _LEVELS:
        raise ValueError(f"arithmetic level must be in 1..{MAX_LEVEL}, got {level!r}")
    rng = np.random.default_rng([seed, SPLITS.index(split), level, index])
    while True:
        expression, result, steps = _draw_problem(rng, level)
        if problem_split(expression) == split:
            break
    return {
        "id": f"arith-{split}-L{level}-s{seed}-{index}",
        "prompt": f"What is {expression}?",
        "answer": str(result),
        "completion": format_completion(expression, steps, result),
        "level": level,
        "task": "arithmetic",
    }


class ArithmeticSource(LevelSource):
    """Random-access source of arithmetic problems: item i has level `levels[i % len(levels)]`
    (see `LevelSource`); two sources with the same arguments hold identical items."""

    def __init__(self, split: str, levels: tuple[int, ...] | list[int], size: int, seed: int):
        super().__init__("arithmetic", make_example, MAX_LEVEL, split, levels, size, seed)


def tokenizer_corpus(num_examples: int = 2000, seed: int = 12345) -> list[str]:
    """Texts to train the task tokenizer on: prompts and completions of every level."""
    return level_corpus(make_example, MAX_LEVEL, num_examples, seed)
