"""The sandboxed calculator: exact arithmetic, decimals, formatting, and refusals."""
from fractions import Fraction

import pytest

from jaxrl_reason.tools.calculator import calculate, format_number


@pytest.mark.parametrize("expression, want", [
    ("1342+250", "1592"), ("7/2*3", "10.5"), ("2.5*(4-1.5)", "6.25"), ("1/3", "0.333333"),
    ("-(2-9)", "7"), (" 10 / 4 ", "2.5"), ("2/3*3", "2"), ("0.1+0.2", "0.3"),
    ("12×3−1", "35"),
])
def test_values(expression, want):
    assert calculate(expression) == want


@pytest.mark.parametrize("expression", [
    "import os", "__import__('os').system('true')", "2**9", "2^9", "1/0", "(1+2", "",
    "1" * 13, "(" * 40 + "1" + ")" * 40, "9" * 12 + "*" + "9" * 12 + "*" + "9" * 12, 7,
])
def test_refusals_are_value_errors(expression):
    with pytest.raises(ValueError):
        calculate(expression)


def test_format_number():
    assert format_number(Fraction(-7, 2)) == "-3.5"
    assert format_number(Fraction(1, 10**7)) == "0"
    assert format_number(Fraction(2, 3)) == "0.666667"
