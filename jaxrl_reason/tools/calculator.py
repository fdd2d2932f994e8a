"""The sandboxed calculator tool: exact arithmetic on a text expression, never `eval`.

    calculate("1342+250")      -> "1592"
    calculate("7/2*3")         -> "10.5"
    calculate("2.5*(4-1.5)")   -> "6.25"
    calculate("import os")     -> ValueError (the tool runner turns it into an error result)

The expression goes through the countdown verifier's recursive-descent evaluator
(`rewards/arith_eval.py`: + - * / and parentheses over exact fractions, bounded length,
nesting and literal size), after decimal literals are rewritten as fractions ("2.5" ->
"(25/10)"). Results print as integers, or as decimals rounded to `DECIMALS` places.
"""
from __future__ import annotations

import re
from fractions import Fraction

from jaxrl_reason.rewards import arith_eval

DECIMALS = 6  # places of a non-integer result
MAX_RESULT_DIGITS = 30  # longer integer parts are an error, not a wall of digits
_DECIMAL = re.compile(r"(?<!\d)(\d+)\.(\d+)")  # starts at a run of digits: linear


def _fractions(text: str) -> str:
    """'2.5*3' -> '(25/10)*3': decimal literals as exact fractions."""
    return _DECIMAL.sub(lambda m: f"({m.group(1)}{m.group(2)}/1{'0' * len(m.group(2))})", text)


def format_number(value: Fraction) -> str:
    """An exact value as text: '1592', '-3.5', '0.333333' (rounded to DECIMALS places).

    Raises ValueError when the integer part has more than MAX_RESULT_DIGITS digits.
    """
    if len(str(abs(value.numerator) // value.denominator)) > MAX_RESULT_DIGITS:
        raise ValueError(f"result has more than {MAX_RESULT_DIGITS} digits")
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10 ** DECIMALS)  # round half to even, exact
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10 ** DECIMALS)
    frac_text = str(frac).rjust(DECIMALS, "0").rstrip("0")
    return f"{sign}{whole}.{frac_text}" if frac_text else f"{sign}{whole}"


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (str) as text.

    Raises ValueError (a subclass of it) for anything that is not a well-formed expression
    within the evaluator's limits, for division by zero and for huge results.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a str, got {type(expression).__name__}")
    text = expression.strip()
    if len(text) > arith_eval.MAX_CHARS:  # before any rewriting (which only lengthens it)
        raise arith_eval.ExpressionTooLong(
            f"expression longer than {arith_eval.MAX_CHARS} characters")
    try:
        return format_number(arith_eval.evaluate(_fractions(text)))
    except arith_eval.DivisionByZero:
        raise ValueError("division by zero") from None
