"""The parent side of code tests: assert tests as call-and-compare, and decoding results.

`parse_assert_tests(source)` reads an assert test program (statements `assert CALL == VALUE`,
`assert VALUE == CALL`, `assert CALL`, `assert not CALL`, with an optional message) with
`ast.parse` (parsing only) and returns the calls the sandbox must evaluate (their source
text) and the expected values, read with `ast.literal_eval` (literals only: numbers,
strings, bytes, tuples, lists, sets, dicts, True/False/None, unary minus). The expected
values stay in the parent.

`decode(data)` turns the sandbox's tagged plain data (`_code_harness.plain`) back into fresh
builtin objects, or `OPAQUE` for anything the sandbox could not express as plain data (an
object with its own `__eq__` never reaches the parent). `passes(results, expected)` is the
verdict.
"""
from __future__ import annotations

import ast
import dataclasses
import math
from typing import Any

OPAQUE = object()  # a value the sandbox reported as an arbitrary object: equal to nothing
_MAX_INT_DIGITS = 4000


@dataclasses.dataclass(frozen=True)
class Check:
    """One converted assert: evaluate `call` in the sandbox; pass when its value == `expected`
    (`truthy`: pass when bool(value) == expected, for `assert CALL` / `assert not CALL`)."""

    call: str
    expected: Any
    truthy: bool = False


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """(True, value) if `node` is a literal, else (False, None)."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def parse_assert_tests(source: str, where: str = "test") -> list[Check]:
    """The checks of an assert test program; ValueError naming `where` and the line for a
    statement that is not one of the supported assert forms (a data problem)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError) as e:
        raise ValueError(f"code: {where} does not parse: {e}") from None
    checks = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assert):
            raise ValueError(f"code: {where} line {stmt.lineno}: only assert statements are "
                             f"supported, got {type(stmt).__name__}")
        checks.append(_check(stmt.test, f"{where} line {stmt.lineno}"))
    if not checks:
        raise ValueError(f"code: {where} holds no assert")
    return checks


def _check(test: ast.expr, where: str) -> Check:
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for call, value in ((left, right), (right, left)):
            ok, expected = _literal(value)
            if ok and not _literal(call)[0]:
                return Check(ast.unparse(call), expected)
        raise ValueError(f"code: {where}: `assert A == B` needs exactly one literal side")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check(ast.unparse(test.operand), False, truthy=True)
    if isinstance(test, ast.Compare) or _literal(test)[0]:
        raise ValueError(f"code: {where}: unsupported assert form {ast.unparse(test)[:80]!r} "
                         "(use `assert CALL == LITERAL`)")
    return Check(ast.unparse(test), True, truthy=True)


def decode(data: Any, depth: int = 0) -> Any:
    """Builtin objects from tagged plain data; OPAQUE for objects and malformed data."""
    if depth > 60 or not isinstance(data, dict) or set(data) != {"t", "v"}:
        return OPAQUE
    tag, v = data["t"], data["v"]
    if tag == "atom" and (v is None or type(v) in (bool, str)):
        return v
    if tag == "int" and isinstance(v, str) and len(v) <= _MAX_INT_DIGITS:
        try:
            return int(v)
        except ValueError:
            return OPAQUE
    if tag == "float" and isinstance(v, str) and len(v) < 40:
        try:
            return float(v)
        except ValueError:
            return OPAQUE
    if tag == "bytes" and isinstance(v, str):
        try:
            return bytes.fromhex(v)
        except ValueError:
            return OPAQUE
    if tag in ("list", "tuple", "set", "frozenset") and isinstance(v, list):
        items = [decode(x, depth + 1) for x in v]
        if any(x is OPAQUE for x in items):
            return OPAQUE
        try:
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        except TypeError:  # unhashable members of a set
            return OPAQUE
    if tag == "dict" and isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 for p in v):
        pairs = [(decode(k, depth + 1), decode(x, depth + 1)) for k, x in v]
        if any(k is OPAQUE or x is OPAQUE for k, x in pairs):
            return OPAQUE
        try:
            return dict(pairs)
        except TypeError:
            return OPAQUE
    return OPAQUE


def passes(results: Any, checks: list[Check]) -> bool:
    """Whether the sandbox's `results` (one `["ok", data]` or `["raise", name]` per check)
    satisfy every check; malformed results fail."""
    if not isinstance(results, list) or len(results) != len(checks):
        return False
    for item, check in zip(results, checks):
        if not (isinstance(item, list) and len(item) == 2 and item[0] == "ok"):
            return False
        value = decode(item[1])
        if value is OPAQUE:
            return False
        if check.truthy:
            if bool(value) != check.expected:
                return False
        elif not _equal(value, check.expected):
            return False
    return True


def _equal(value: Any, expected: Any) -> bool:
    """Python's `==` on builtin data (as the original assert), with nan never equal."""
    if isinstance(value, float) and isinstance(expected, float) and math.isnan(value):
        return False
    return bool(value == expected)
