r"""The `countdown` reward: does the answer expression reach the target with the given numbers?

The expression is the content of the last `<answer>...</answer>` (else of the last
`\boxed{}`), optionally followed by "= target". It must use every number of
`example["numbers"]` exactly once (as a multiset: [5, 5, 2] needs two 5s) and only
+ - * / and parentheses; it is evaluated exactly (`arith_eval`, fractions, no eval()), so
intermediate fractions are allowed as long as the final value equals `example["target"]`.

    <think>...</think><answer>(50-25)*3</answer>       with numbers [3, 25, 50], target 75 -> 1.0
    <answer>(50 - 25) × 3 = 75</answer>                                                -> 1.0
    <answer>50*3/2</answer>                                        -> 0.0 "wrong_numbers"
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards import arith_eval, latex
from jaxrl_reason.rewards.base import RewardResult, register_reward

# LaTeX spellings of the operators (inside \boxed{} or $...$), mapped before parsing.
_LATEX_OPS = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\left(", "("),
              ("\\right)", ")"), ("$", ""))


def extract_expression(completion: str) -> str | None:
    r"""The answer text of `completion`: last `<answer>...</answer>`, else last `\boxed{}`.

    Returns the stripped content (possibly "") or None when neither is present. Linear time;
    never raises (non-str gives None).
    """
    if not isinstance(completion, str):
        return None
    close = completion.rfind("</answer>")
    open_ = completion.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ >= 0:
        return completion[open_ + len("<answer>") : close].strip()
    try:
        boxed = latex.last_boxed(completion)
    except Exception:
        return None
    return None if boxed is None else boxed.strip()


def _split_target(text: str) -> tuple[str, str | None]:
    """'(1+2)*3 = 9' -> ('(1+2)*3', '9'); a text without '=' -> (text, None)."""
    if "=" not in text:
        return text, None
    lhs, _, rhs = text.rpartition("=")
    return lhs, rhs.strip().rstrip(".").strip()


def check_solution(expression: str, numbers: list[int], target: int) -> RewardResult:
    """Score one expression string (already extracted) against `numbers` and `target`.

    `numbers` is a list of ints (a multiset), `target` an int. Returns RewardResult(1.0) or
    0.0 with reason "parse_error", "too_long", "wrong_numbers", "division_by_zero" or
    "wrong_value". Never raises.
    """
    text = expression
    for symbol, ascii_op in _LATEX_OPS:
        if symbol in text:
            text = text.replace(symbol, ascii_op)
    text, stated = _split_target(text.strip())
    if len(text) > arith_eval.MAX_CHARS:
        return RewardResult(0.0, "too_long")
    try:
        parsed = arith_eval.parse(text)
    except arith_eval.ExpressionTooLong:
        return RewardResult(0.0, "too_long")
    except (arith_eval.ExpressionError, RecursionError):
        return RewardResult(0.0, "parse_error")
    if stated is not None:
        if not (stated.isascii() and stated.lstrip("-").isdigit() and len(stated) <= 20):
            return RewardResult(0.0, "parse_error")
        if int(stated) != target:
            return RewardResult(0.0, "wrong_value")
    if Counter(parsed.numbers) != Counter(numbers):
        return RewardResult(0.0, "wrong_numbers")
    if parsed.value is None:
        return RewardResult(0.0, "division_by_zero")
    if parsed.value != target:
        return RewardResult(0.0, "wrong_value")
    return RewardResult(1.0)


@register_reward("countdown")
def countdown(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff the answer expression uses `example["numbers"]` exactly once each and equals
    `example["target"]`.

    Reasons for 0.0: "not_text", "no_answer" (no/empty answer section), "parse_error",
    "too_long" (> 200 characters), "wrong_numbers", "division_by_zero", "wrong_value"
    (including a trailing "= N" with N != target). Never raises on the completion; raises
    ValueError when `example` lacks "numbers" or "target" (a data bug).
    """
    if "numbers" not in example or "target" not in example:
        raise ValueError(
            f"countdown: example needs 'numbers' and 'target' (keys: {sorted(example)})")
    numbers = [int(x) for x in example["numbers"]]
    target = int(example["target"])
    if not isinstance(completion, str):
        return RewardResult(0.0, "not_text")
    expression = extract_expression(completion)
    if not expression:
        return RewardResult(0.0, "no_answer")
    try:
        return check_solution(expression, numbers, target)
    except Exception:  # defensive: a verifier bug must not crash the reward pool
        return RewardResult(0.0, "parse_error")
