"""Sympy objects from untrusted expression text without evaluating any string.

`build(text)` turns the output of `_latex_sympy.latex_to_sympy` (names, numbers,
`+-*/()[],!`, `**`, implicit multiplication such as `2x` or `x y`) into a sympy object.

How: sympy's tokenizer-level transformations (`stringify_expr`: implicit multiplication,
symbol splitting, `x!` -> `factorial(x)`, numbers -> `Integer(...)`/`Float('...')`) rewrite
the token stream into Python source text; they only look tokens and names up, they never
call anything. That text is then parsed by `ast.parse` (which builds a tree and runs
nothing), and `_Builder` walks the tree admitting only:

- numbers: `Integer(<int>)`, `Float('<decimal>')`, bare int literals;
- symbols: `Symbol('<identifier>')`, the Greek letter names, the capital letters but `E`
  and `I`, and the constants `E`, `I`, `pi`, `oo`;
- the operators `+ - * / **` (binary) and `+ -` (unary);
- calls of a fixed table of sympy functions (trigonometric and inverse, hyperbolic, exp,
  log, log10, sqrt, Abs, floor, ceiling, factorial, binomial), `Matrix` of a list of lists,
  and undefined functions `Function('<identifier>')(args)`.

Anything else (attributes, subscripts, other names, keywords, lambdas, strings outside
`Symbol`/`Float`/`Function`, ...) raises `Rejected`. Limits: `MAX_CHARS` of text,
`MAX_NODES` tree nodes, `MAX_DEPTH` nesting, `MAX_INT_DIGITS` per integer literal, integer
powers of numbers that would exceed `MAX_POWER_BITS`, factorials above `MAX_FACTORIAL`.

This file is loaded by path inside the sympy worker process (it imports nothing from the
package); the sympy import happens on first use.
"""
from __future__ import annotations

import ast
import math
import re
import tokenize

MAX_CHARS = 2000
MAX_NODES = 4000
MAX_DEPTH = 60
MAX_INT_DIGITS = 400
MAX_POWER_BITS = 200_000  # |exponent| * log2|base| of a number raised to an integer
MAX_FACTORIAL = 10_000
MAX_MATRIX_ENTRIES = 400

GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lamda mu nu "
    "xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi "
    "Psi Omega"
).split()
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,30}")
_DECIMAL = re.compile(r"(?:[0-9]*+\.)?+[0-9]++(?:[eE][-+]?+[0-9]{1,3}+)?+|[0-9]++\.")
_STATE: dict = {}


class Rejected(ValueError):
    """The text is not an admitted expression (the message says which part and why)."""


def _setup() -> dict:
    """Import sympy once: the name tables of the tokenizer pass and the admitted callables."""
    if _STATE:
        return _STATE
    import sympy
    from sympy.parsing import sympy_parser as sp

    f = sympy
    functions = {
        "sin": f.sin, "cos": f.cos, "tan": f.tan, "cot": f.cot, "sec": f.sec, "csc": f.csc,
        "asin": f.asin, "acos": f.acos, "atan": f.atan, "acot": f.acot, "asec": f.asec,
        "acsc": f.acsc, "sinh": f.sinh, "cosh": f.cosh, "tanh": f.tanh, "exp": f.exp,
        "log": f.log, "log10": lambda x: f.log(x, 10), "sqrt": f.sqrt, "Abs": f.Abs,
        "floor": f.floor, "ceiling": f.ceiling, "factorial": f.factorial,
        "binomial": f.binomial,
    }
    constants = {"E": f.E, "I": f.I, "pi": f.pi, "oo": f.oo}
    local = dict(constants)
    local.update({name: f.Symbol(name) for name in GREEK})
    local.update({c: f.Symbol(c) for c in "ABCDFGHJKLMNOPQRSTUVWXYZ"})
    # The tokenizer pass only asks whether a name exists and whether it is callable: it sees
    # the admitted names (and `Matrix`), so every other name becomes Symbol('...').
    # The constructors the pass itself emits must be known callables too, or implicit
    # multiplication would turn `Integer(2)` into `Integer*(2)`.
    names = dict(local, **functions, Matrix=f.Matrix, Integer=f.Integer, Float=f.Float,
                 Symbol=f.Symbol, Function=f.Function)
    _STATE.update(
        sympy=sympy, functions=functions, local=local, names=names, stringify=sp.stringify_expr,
        transforms=sp.standard_transformations + (
            sp.implicit_multiplication_application, sp.convert_xor),
    )
    return _STATE


def build(text: str):
    """The sympy object (an Expr or a Matrix) that `text` denotes; `Rejected` if not admitted.

    Raises only `Rejected` for text outside the grammar; sympy's own errors (for example a
    ZeroDivisionError) propagate.
    """
    if not isinstance(text, str):
        raise Rejected(f"expected str, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise Rejected(f"{len(text)} characters > {MAX_CHARS}")
    if not re.fullmatch(r"[\w\s+\-*/().,!\[\]^]*", text, re.ASCII) or "__" in text:
        raise Rejected("characters outside names, numbers and + - * / ( ) [ ] , ! ^")
    st = _setup()
    try:
        source = st["stringify"](text, {}, dict(st["names"]), st["transforms"])
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, tokenize.TokenError, ValueError, TypeError, RecursionError,
            MemoryError) as e:
        raise Rejected(f"does not parse: {type(e).__name__}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise Rejected(f"{nodes} tree nodes > {MAX_NODES}")
    return _Builder(st).node(tree.body, 0)


class _Builder:
    """Walks an `ast` expression tree and builds the sympy object, admitting only the
    grammar in the module docstring."""

    def __init__(self, state: dict) -> None:
        self.sympy = state["sympy"]
        self.functions = state["functions"]
        self.local = state["local"]

    def node(self, n: ast.AST, depth: int):
        if depth > MAX_DEPTH:
            raise Rejected(f"nesting deeper than {MAX_DEPTH}")
        if isinstance(n, ast.BinOp):
            return self.binop(n, depth)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            value = self.node(n.operand, depth + 1)
            return -value if isinstance(n.op, ast.USub) else value
        if isinstance(n, ast.Name):
            if n.id in self.local:
                return self.local[n.id]
            raise Rejected(f"name {n.id!r} is not admitted")
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return self.integer(n.value)
        if isinstance(n, ast.Call):
            return self.call(n, depth)
        raise Rejected(f"{type(n).__name__} is not admitted")

    def integer(self, value: int):
        if abs(value) >= 10**MAX_INT_DIGITS:
            raise Rejected(f"integer literal over {MAX_INT_DIGITS} digits")
        return self.sympy.Integer(value)

    def binop(self, n: ast.BinOp, depth: int):
        a, b = self.node(n.left, depth + 1), self.node(n.right, depth + 1)
        op = type(n.op)
        if op is ast.Add:
            return a + b
        if op is ast.Sub:
            return a - b
        if op is ast.Mult:
            return a * b
        if op is ast.Div:
            return a / b
        if op is ast.Pow:
            self.check_power(a, b)
            return a**b
        raise Rejected(f"operator {op.__name__} is not admitted")

    def check_power(self, base, exponent) -> None:
        """Refuse number ** integer powers whose result would be huge (or whose inverse
        would be tiny): |exponent| * log2|base| above MAX_POWER_BITS."""
        s = self.sympy
        if not (isinstance(exponent, s.Integer) and isinstance(base, s.Rational)):
            return
        if base in (0, 1, -1):
            return
        size = max(abs(base.p), abs(base.q))
        if abs(int(exponent)) * math.log2(size) > MAX_POWER_BITS:
            raise Rejected("power too large")

    def call(self, n: ast.Call, depth: int):
        if n.keywords:
            raise Rejected("keyword arguments are not admitted")
        func = n.func
        if isinstance(func, ast.Call):  # Function('f')(args): an undefined function
            name = self.string_arg(func, "Function")
            return self.sympy.Function(name)(*self.args(n.args, depth))
        if not isinstance(func, ast.Name):
            raise Rejected(f"call of {type(func).__name__} is not admitted")
        name = func.id
        if name == "Integer":
            if len(n.args) == 1 and isinstance(n.args[0], ast.Constant) and \
                    type(n.args[0].value) is int:
                return self.integer(n.args[0].value)
            raise Rejected("Integer() takes one int literal")
        if name == "Float":
            text = self.string_arg(n, "Float")
            if not _DECIMAL.fullmatch(text) or len(text) > MAX_INT_DIGITS:
                raise Rejected(f"bad decimal {text[:40]!r}")
            return self.sympy.Float(text)
        if name == "Symbol":
            return self.sympy.Symbol(self.string_arg(n, "Symbol"))
        if name == "Matrix":
            return self.matrix(n, depth)
        if name not in self.functions:
            raise Rejected(f"function {name!r} is not admitted")
        args = self.args(n.args, depth)
        if name == "factorial" and len(args) == 1 and args[0].is_Integer and \
                abs(int(args[0])) > MAX_FACTORIAL:
            raise Rejected(f"factorial above {MAX_FACTORIAL}")
        if name == "binomial" and len(args) == 2 and args[0].is_Integer and \
                abs(int(args[0])) > 10**6:
            raise Rejected("binomial too large")
        return self.functions[name](*args)

    def args(self, nodes: list[ast.expr], depth: int) -> list:
        if len(nodes) > 8:
            raise Rejected("more than 8 arguments")
        return [self.node(a, depth + 1) for a in nodes]

    @staticmethod
    def string_arg(n: ast.Call, what: str) -> str:
        """The single identifier-like string literal argument of `what(...)`."""
        if len(n.args) != 1 or n.keywords or not isinstance(n.args[0], ast.Constant) or \
                not isinstance(n.args[0].value, str):
            raise Rejected(f"{what}() takes one string literal")
        text = n.args[0].value
        if what != "Float" and not _IDENT.fullmatch(text):
            raise Rejected(f"{what} name {text[:40]!r} is not an identifier")
        return text

    def matrix(self, n: ast.Call, depth: int):
        if len(n.args) != 1 or not isinstance(n.args[0], ast.List) or not n.args[0].elts:
            raise Rejected("Matrix() takes one list of rows")
        rows = []
        for row in n.args[0].elts:
            if not isinstance(row, ast.List) or not row.elts:
                raise Rejected("a Matrix row must be a non-empty list")
            rows.append([self.node(x, depth + 2) for x in row.elts])
        if len({len(r) for r in rows}) != 1:
            raise Rejected("Matrix rows of different lengths")
        if len(rows) * len(rows[0]) > MAX_MATRIX_ENTRIES:
            raise Rejected(f"Matrix over {MAX_MATRIX_ENTRIES} entries")
        return self.sympy.Matrix(rows)
