r"""The oversized-number guard of the math verifier: whether an answer holds a number that
sympy would take seconds or gigabytes to expand (`9^{9^{9^9}}`, `{7}^{30000000}`,
`(10^{9999})^{9999}`, `1e100000000`, `{1000000}!`, `(12!)!`, `\binom{{1000000}}{500000}`).
The LaTeX grammar has no size limits, so such answers are refused in the trusted parent
(the comparison is "different") before any worker job is asked.

It works on a parse tree of the answer, not on its spellings, in one linear pass:

* tokens (one linear regex, `_TOKEN`): digit runs (with a decimal part and a scientific
  exponent, `1.5e300`), `^` and `**` (power), `!` (factorial), `_` (subscript), the groups
  `{...}`, `(...)`, `[...]`, `\{...\}` (kept on a stack; `}` closes up to its `{`, a
  closer without its opener is ignored), `\left` / `\right` / `\big`-like sizes and
  spacing commands (ignored), `\frac` / `\dfrac` / `\tfrac` / `\cfrac` / `\binom` /
  `\dbinom` / `\tbinom` (two arguments) and `\sqrt` (one, or two with `[n]`), any other
  command or run of letters (a symbol), anything else (a separator between terms: `+`,
  `-`, `=`, `,`, `\\`, ...). Whitespace is skipped, so `2 ^ { 3 }` is `2^{3}`.
* nodes: each operand gets `bits`, an upper bound of log2 of its magnitude (a symbol counts
  as the value 2, one bit; 0 and 1 count as 0 bits), and its exact value while it is a
  small integer. A number of d digits: its exact value, or d*log2(10) bits (plus
  |exponent|*log2(10) for scientific notation). `a^b` (right-associative over a bare chain
  `a^b^c`, the larger reading): bits(a)*value(b), with bits(a) at least 1 (a symbolic
  base counts as base 2) and value(b) its exact value or 2^bits(b); a base of exactly 0 or
  1 gives 0 bits whatever the exponent. `n!` (`!` binds to the whole power before it, as
  in latex2sympy: `10^{5}!` is (10^5)!; `!!` is a factorial of a factorial): n must be at
  most `MAX_FACTORIAL`; log2(n!) bits. `\binom{n}{k}`: n at most `MAX_FACTORIAL`; n bits.
  `\frac`, `\sqrt` and a group of several terms (a sum or product of its parts): the sum
  of the parts' bits plus one per extra part.

Oversized (refused) when any node exceeds `MAX_POWER_BITS` bits, an exponent bound
exceeds 2^64 over a base other than 0 or 1, a factorial or a binomial's top exceeds
`MAX_FACTORIAL`, or the groups nest deeper than `MAX_DEPTH`. Symbols count as 2 in
exponents too (so `9^{x+100000000}`, which sympy expands for minutes, is refused, and
`e^{x^2}` or `(x+1)^2` are not). The bounds only over-estimate: honest answers (`2^{10}`,
`10^{6}`, `5!`, `\binom{10}{3}`, `\frac{3}{4}`) are far below the limits.
"""
from __future__ import annotations

import math
import re

MAX_POWER_BITS = 200_000  # bits of the largest number an answer may spell (as `_sympy_tree`)
MAX_FACTORIAL = 10_000  # largest n of `n!` and of a binomial's top
MAX_DEPTH = 60  # deepest nesting of groups and command arguments (as `_sympy_tree`)
_MAX_EXPONENT_BITS = 64  # an exponent bound above 2^64 over a base >= 2 is oversized
_EXACT_DIGITS = 20  # integers up to this many digits keep their exact value
_LOG2_10 = math.log2(10)

# One token a match; every quantifier is possessive, so a token is never re-scanned.
_TOKEN = re.compile(
    r"(?P<cmd>\\[A-Za-z]++)|(?P<esc>\\.)"
    r"|(?P<num>\d++(?:\.\d++)?+)(?:[eE](?P<exp>[-+]?+\d++))?+"
    r"|(?P<word>[A-Za-z]++)|(?P<pow>\*\*|\^)|(?P<ch>\S)",
    re.S,
)
_SCIENTIFIC = re.compile(r"\d[eE][-+]?\d")  # `1e5`, `2.5E-3`: a scientific exponent
_IGNORED = frozenset(
    "left right middle big Big bigg Bigg bigl bigr bigm Bigl Bigr Bigm biggl biggr biggm "
    "Biggl Biggr Biggm displaystyle textstyle scriptstyle quad qquad limits nolimits".split())
_TWO_ARGS = frozenset("frac dfrac tfrac cfrac binom dbinom tbinom".split())
_BINOMS = frozenset(("binom", "dbinom", "tbinom"))
_SYMBOL = (1.0, None)  # (bits, exact value): a symbol counts as the value 2


class _Oversized(Exception):
    """Raised inside the pass as soon as a node is over a limit."""


class _Frame:
    """An open group (`{`, `(`) or the arguments of a command (`args`)."""

    __slots__ = ("kind", "bits", "terms", "exact", "chain", "expect", "sub", "command",
                 "args", "need")

    def __init__(self, kind: str, command: str = "", need: int = 0):
        self.kind, self.command, self.need = kind, command, need
        self.bits, self.terms, self.exact = 0.0, 0, None
        self.chain: list = []  # a power chain a^b^c waiting for its end
        self.expect = self.sub = False  # after `^` / after `_`
        self.args: list = []


def oversized(text: str) -> bool:
    """Whether `text` holds a number sympy would take seconds or gigabytes to expand (see
    the module docstring for the rule). Linear in `len(text)`; never raises (a text the
    pass cannot bound counts as oversized)."""
    if not isinstance(text, str):
        return False
    if not any(c in text for c in "^!*") and "binom" not in text and \
            not _SCIENTIFIC.search(text) and \
            text.count("{") + text.count("(") + text.count("[") <= MAX_DEPTH:
        return False  # nothing to expand and no deep nesting: the common answer
    try:
        _Pass().run(text)
    except Exception:  # noqa: BLE001 - _Oversized, or anything the pass cannot bound
        return True
    return False


def _power(base: tuple, exponent: tuple) -> tuple:
    bits_a, exact_a = base
    bits_b, exact_b = exponent
    if exact_a in (0, 1):
        return 0.0, exact_a
    if exact_b is None:
        if bits_b > _MAX_EXPONENT_BITS:
            raise _Oversized
        value = 2.0 ** bits_b
    else:
        value = exact_b
    bits = max(bits_a, 1.0) * value
    if bits > MAX_POWER_BITS:
        raise _Oversized
    exact = exact_a ** exact_b if exact_a is not None and exact_b is not None and \
        bits <= _MAX_EXPONENT_BITS and exact_b >= 0 else None
    return bits, exact


def _count(node: tuple) -> float:
    """An upper bound of the integer a node stands for (a factorial's n, a binomial's top)."""
    bits, exact = node
    if exact is not None:
        return exact
    return 2.0 ** bits if bits <= _MAX_EXPONENT_BITS else math.inf


def _factorial(node: tuple) -> tuple:
    n = _count(node)
    if n > MAX_FACTORIAL:
        raise _Oversized
    n = max(0, math.ceil(n))
    return math.lgamma(n + 1) / math.log(2), math.factorial(n) if node[1] == n and n <= 20 \
        else None


def _number(digits: str, exponent: str | None) -> tuple:
    whole = digits.isdigit() and len(digits) <= _EXACT_DIGITS and exponent is None
    if whole:
        value = int(digits)
        return (math.log2(value) if value > 1 else 0.0), value
    bits = (len(digits) - digits.count(".")) * _LOG2_10
    if exponent is not None:
        if len(exponent.lstrip("+-")) > _EXACT_DIGITS:
            raise _Oversized
        bits += abs(int(exponent)) * _LOG2_10
    if bits > MAX_POWER_BITS:
        raise _Oversized
    return bits, None


class _Pass:
    """One left-to-right pass over the tokens, keeping the open groups on a stack."""

    def __init__(self):
        self.stack = [_Frame("{")]
        self.braces = 0  # open `{` frames above the root

    def run(self, text: str) -> None:
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "exp":  # `num` with a scientific exponent
                self.primary(_number(m.group("num"), m.group("exp")))
            elif kind == "num":
                self.primary(_number(m.group("num"), None))
            elif kind == "cmd":
                self.command(m.group(0)[1:])
            elif kind == "word":
                self.primary(_SYMBOL)
            elif kind == "pow":
                self.operator("^")
            elif kind == "esc":
                char = m.group(0)[1]
                if char == "{":
                    self.open("\\{")
                elif char == "}":
                    self.close(")")
                elif char not in ",;:! ":  # spacing commands are skipped
                    self.operator(",")
            else:
                char = m.group(0)
                if char in "{([":
                    self.open(char)
                elif char in "})]":
                    self.close(char)
                else:
                    self.operator(char)
        while len(self.stack) > 1:
            self.close_top()
        self.commit(self.stack[0])

    def command(self, name: str) -> None:
        if name in _IGNORED:
            return
        if name in _TWO_ARGS:
            self.push(_Frame("args", name, 2))
        elif name == "sqrt":
            self.push(_Frame("args", name, 1))
        else:
            self.primary(_SYMBOL)

    def push(self, frame: _Frame) -> None:
        if len(self.stack) > MAX_DEPTH:
            raise _Oversized
        self.stack.append(frame)

    def open(self, char: str) -> None:
        top = self.stack[-1]
        if top.kind == "args" and top.command == "sqrt" and not top.args and char == "[":
            top.need = 2  # `\sqrt[n]{x}`
        kind = "{" if char == "{" else "("
        self.push(_Frame(kind))
        self.braces += kind == "{"

    def close(self, char: str) -> None:
        if char == "}":
            if not self.braces:
                return
            while self.stack[-1].kind != "{":
                self.close_top()
            self.close_top()
            return
        while self.stack[-1].kind == "args":
            self.close_top()
        if self.stack[-1].kind == "(":
            self.close_top()

    def close_top(self) -> None:
        frame = self.stack.pop()
        if frame.kind == "{":
            self.braces -= 1
        self.primary(self.value(frame))

    def value(self, frame: _Frame) -> tuple:
        if frame.kind != "args":
            self.commit(frame)
            if frame.terms == 0:
                return _SYMBOL
            return frame.bits + frame.terms - 1, frame.exact if frame.terms == 1 else None
        args = frame.args or [_SYMBOL]
        if frame.command in _BINOMS:
            top = _count(args[0])
            if top > MAX_FACTORIAL:
                raise _Oversized
            exact = math.comb(args[0][1], args[1][1]) if len(args) == 2 and all(
                isinstance(a[1], int) and a[1] >= 0 for a in args) else None
            return float(max(1, math.ceil(top))), exact
        bits = sum(a[0] for a in args) + len(args) - 1
        if bits > MAX_POWER_BITS:
            raise _Oversized
        return bits, None

    def primary(self, node: tuple) -> None:
        frame = self.stack[-1]
        if frame.kind == "args":
            frame.args.append(node)
            if len(frame.args) >= frame.need:
                self.stack.pop()
                self.primary(self.value(frame))
            return
        if frame.sub:  # a subscript names, it does not multiply
            frame.sub = False
        elif frame.expect:
            frame.chain.append(node)
            frame.expect = False
        else:
            self.commit(frame)
            frame.chain = [node]

    def operator(self, op: str) -> None:
        while self.stack[-1].kind == "args":  # `\frac12^3`: the command ends here
            frame = self.stack.pop()
            self.primary(self.value(frame))
        frame = self.stack[-1]
        if op == "^":
            if not frame.expect:
                if not frame.chain:
                    frame.chain = [_SYMBOL]
                frame.expect, frame.sub = True, False
        elif op == "!":
            if frame.chain and not frame.expect:
                frame.chain = [_factorial(self.resolve(frame.chain))]
        elif op == "_":
            frame.sub = bool(frame.chain)
        elif op in "+-" and frame.expect:
            pass  # a sign of the exponent: `2^-5`
        else:
            self.commit(frame)

    @staticmethod
    def resolve(chain: list) -> tuple:
        node = chain[-1]
        for base in reversed(chain[:-1]):
            node = _power(base, node)
        return node

    def commit(self, frame: _Frame) -> None:
        """End the frame's pending power chain: one more term of the group."""
        if not frame.chain:
            frame.expect = frame.sub = False
            return
        node = self.resolve(frame.chain)
        frame.chain, frame.expect, frame.sub = [], False, False
        frame.terms += 1
        frame.bits += node[0]
        frame.exact = node[1] if frame.terms == 1 else None
        if frame.bits + frame.terms - 1 > MAX_POWER_BITS:
            raise _Oversized
