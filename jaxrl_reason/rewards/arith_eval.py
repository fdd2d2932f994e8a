"""A small, safe evaluator of integer arithmetic expressions (+ - * / and parentheses).

Used by the countdown verifier and by the countdown generator to check its own solutions.
No eval/exec/ast: a tokenizer and a recursive-descent parser over this grammar,

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := '-' factor | INT | '(' expr ')'

computing exact `fractions.Fraction` values (so 7/2*2 is exactly 7). Hard limits keep every
call cheap: at most MAX_CHARS characters, MAX_DEPTH nested parentheses / unary minuses and
MAX_DIGITS digits per literal, so recursion is shallow and values stay small. There is no
power operator: `2**9` and `2^9` are syntax errors.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

MAX_CHARS = 200  # longer inputs raise ExpressionTooLong before any parsing
MAX_DEPTH = 32  # nested parentheses plus unary minuses
MAX_DIGITS = 12  # digits of one integer literal

# Common typographic operators, mapped to ASCII before tokenizing.
_ALIASES = {"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"}
_OPERATORS = "+-*/()"


class ExpressionError(ValueError):
    """The text is not a well-formed expression within the limits (a syntax error)."""


class ExpressionTooLong(ExpressionError):
    """The text is longer than MAX_CHARS characters."""


class DivisionByZero(ZeroDivisionError):
    """A well-formed expression divides by zero (raised by `evaluate` only)."""


@dataclasses.dataclass(frozen=True)
class Expression:
    """A parsed expression.

    Attributes:
      numbers: the integer literals in order of appearance (ints >= 0; a unary minus is an
        operator, not part of the literal).
      value: the exact value, or None when evaluating it divides by zero.
    """

    numbers: tuple[int, ...]
    value: Fraction | None


def _tokenize(text: str) -> list[str | int]:
    tokens: list[str | int] = []
    pos, n = 0, len(text)
    while pos < n:
        ch = _ALIASES.get(text[pos], text[pos])
        if ch in " \t\n\r":
            pos += 1
        elif ch in _OPERATORS:
            tokens.append(ch)
            pos += 1
        elif "0" <= ch <= "9":
            end = pos
            while end < n and "0" <= text[end] <= "9":
                end += 1
            if end - pos > MAX_DIGITS:
                raise ExpressionError(f"integer literal longer than {MAX_DIGITS} digits")
            tokens.append(int(text[pos:end]))
            pos = end
        else:
            raise ExpressionError(f"unexpected character {ch!r} at {pos}")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str | int]):
        self.tokens, self.pos, self.depth = tokens, 0, 0
        self.numbers: list[int] = []
        self.divided_by_zero = False

    def peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                self.divided_by_zero = True  # keep parsing: syntax errors take precedence
                value = Fraction(0)
            else:
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        token = self.peek()
        if isinstance(token, int):
            self.pos += 1
            self.numbers.append(token)
            return Fraction(token)
        if token not in ("-", "("):
            raise ExpressionError(f"expected a number or '(' at token {self.pos}, got {token!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH}")
        self.pos += 1
        if token == "-":
            value = -self.factor()
        else:
            value = self.expr()
            if self.peek() != ")":
                raise ExpressionError(f"missing ')' at token {self.pos}")
            self.pos += 1
        self.depth -= 1
        return value


def parse(text: str) -> Expression:
    """Parse and evaluate `text`; the literals used and the exact value (None on x/0).

    Raises ExpressionTooLong (len > MAX_CHARS) or ExpressionError (anything malformed, a
    non-str, too deep, a literal too long). Never raises RecursionError.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expression must be a str, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ExpressionTooLong(f"expression longer than {MAX_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected token {tokens[parser.pos]!r} at {parser.pos}")
    return Expression(tuple(parser.numbers), None if parser.divided_by_zero else value)


def evaluate(text: str) -> Fraction:
    """The exact value of `text`, e.g. evaluate("(50-25)/5*3") == Fraction(15).

    Raises ExpressionError / ExpressionTooLong as `parse` does, DivisionByZero on x/0.
    """
    expression = parse(text)
    if expression.value is None:
        raise DivisionByZero(f"division by zero in {text!r}")
    return expression.value
