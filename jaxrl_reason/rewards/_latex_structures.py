r"""Answer structures in a normalized answer string (see `_latex.normalize`): matrices, sets,
tuples, intervals, unions, unordered lists, and relations (`=`, `<`, `<=`, `>`, `>=`, `!=`).

Pure string code. Splitting happens outside brackets only, in one regex pass per split;
nothing here recurses on the input, so deep nesting is cheap.

Conventions (`math.py` compares what these return):
  * `(a, b)` is a tuple (also an open interval), `[a, b]`, `[a, b)`, `(a, b]` intervals; a
    bracketed list of three or more items is a tuple.
  * `\{...\}`, bare `a, b` lists and `a \pm b` are unordered; `\emptyset` is the empty set.
  * a matrix is `\begin{pmatrix|bmatrix|Bmatrix|matrix|smallmatrix|array}`, optionally inside
    `(...)` or `[...]`; rows split on `\\`, entries on `&` (determinant bars `vmatrix` are not
    matrices).
  * `x < 3`, `x \ge 2`, `0 < x <= 1` with a single variable are intervals.
"""
from __future__ import annotations

import dataclasses
import re

from jaxrl_reason.rewards._latex import braced

MAX_ITEMS = 64  # longer sets/lists/matrices are not split (compared as strings)

_BRACKET = "()[]{}"


@dataclasses.dataclass(frozen=True)
class Structure:
    """A parsed answer structure.

    Attributes:
      kind: "matrix" (items: tuple of rows, each a tuple of entry strings), "set" and "list"
        (unordered items), "tuple" (ordered items), "interval" (two endpoints, see `ends`),
        "union" (unordered parts, each an interval or set string).
      items: the item strings (rows for a matrix).
      ends: for an interval, its brackets, e.g. "[)".
    """

    kind: str
    items: tuple
    ends: str = ""


def split_top(s: str, sep: str) -> list[str]:
    r"""Split `s` on `sep` where no bracket is open (`\{ \}` count as brackets)."""
    if sep not in s:
        return [s]
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"[()\[\]{}]|" + re.escape(sep), s):
        ch = m.group(0)
        if ch == sep and depth == 0:
            parts.append(s[start : m.start()])
            start = m.end()
        elif len(ch) == 1 and ch in _BRACKET:
            depth += 1 if ch in "([{" else -1
    parts.append(s[start:])
    return parts


def encloses(s: str) -> bool:
    """Whether the bracket opening `s` is closed by its last character (and not before)."""
    depth = 0
    for m in re.finditer(r"[()\[\]{}]", s):
        depth += 1 if m.group(0) in "([{" else -1
        if depth <= 0:
            return m.end() == len(s)
    return False


def expand_pm(items: list[str]) -> list[str]:
    r"""Items with one `\pm` (or `\mp`) become two: `1\pm\sqrt{2}` -> `1+\sqrt{2}`, `1-\sqrt{2}`."""
    out = []
    for item in items:
        signs = [sign for sign in ("\\pm", "\\mp") if sign in item]
        if len(signs) == 1 and item.count(signs[0]) == 1:
            out += [item.replace(signs[0], "+"), item.replace(signs[0], "-")]
        else:
            out.append(item)
    return out


# -------------------------------------------------------------------------------- matrix

_MATRIX = re.compile(
    r"\\begin\{(?P<env>[pbB]?matrix|smallmatrix|array)\}(?P<body>.*)\\end\{(?P=env)\}", re.S
)


def parse_matrix(s: str) -> tuple[tuple[str, ...], ...] | None:
    """Rows of entry strings of a matrix environment spanning all of `s`, else None."""
    if "\\begin{" not in s:
        return None
    if len(s) > 2 and s[0] in "([" and s[-1] in ")]" and encloses(s):
        s = s[1:-1]
    m = _MATRIX.fullmatch(s)
    if not m:
        return None
    body = m.group("body")
    depth = 0
    for env in re.finditer(r"\\(begin|end)\{", body):
        depth += 1 if env.group(1) == "begin" else -1
        if depth < 0:
            return None  # two matrices side by side, e.g. `A + B`
    if m.group("env") == "array" and body.startswith("{"):
        spec = braced(body, 0)
        body = body[spec[1] :] if spec else body
    rows = split_top(body, "\\\\")
    if rows and not rows[-1]:
        rows.pop()
    cells = tuple(tuple(split_top(row, "&")) for row in rows)
    if not cells or len(cells) * len(cells[0]) > MAX_ITEMS:
        return None
    if any(len(row) != len(cells[0]) or not all(row) for row in cells):
        return None
    return cells


# ----------------------------------------------------------------------------- relations

_REL_OPS = ("<=", ">=", "!=", "<", ">", "=")
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}
_GREEK = r"\\(?:alpha|beta|gamma|delta|epsilon|theta|lambda|mu|nu|phi|psi|omega|sigma|rho|tau)"
_VAR = re.compile(r"(?:[a-zA-Z]|%s)(?:_\{?\w+\}?)?" % _GREEK)
_NAMED = re.compile(r"%s'*(?:\([a-zA-Z]\))?|\((?:%s,)+%s\)" % ((_VAR.pattern,) * 3))


def split_relation(s: str) -> tuple[list[str], list[str]]:
    """`s` cut at relation operators outside brackets: (parts, operators)."""
    if not re.search(r"[<>=]", s):
        return [s], []
    parts, ops, depth, start = [], [], 0, 0
    for m in re.finditer(r"<=|>=|!=|[<>=]|[()\[\]{}]", s):
        tok = m.group(0)
        if tok in _REL_OPS:
            if depth == 0:
                parts.append(s[start : m.start()])
                ops.append(tok)
                start = m.end()
        else:
            depth += 1 if tok in "([{" else -1
    parts.append(s[start:])
    return parts, ops


def is_named(s: str) -> bool:
    """Whether `s` only names what it equals: `x`, `x_1`, `f(x)`, `\\theta`, `(x,y)`."""
    return bool(_NAMED.fullmatch(s))


def as_relation(s: str) -> tuple[str, str, str] | None:
    """(lhs, op, rhs) of a relation, with `>`/`>=` flipped to `<`/`<=` and a named side of
    an equation put on the left; a chain `x = a = b` keeps its ends. None if no relation or
    an inequality chain (see `relation_interval`)."""
    parts, ops = split_relation(s)
    if not ops or not all(parts):
        return None
    if set(ops) == {"="}:
        lhs, op, rhs = parts[0], "=", parts[-1]
    elif len(ops) == 1:
        lhs, op, rhs = parts[0], ops[0], parts[1]
    else:
        return None
    if op in (">", ">=") or (op in ("=", "!=") and is_named(rhs) and not is_named(lhs)):
        lhs, op, rhs = rhs, _FLIP[op], lhs
    return lhs, op, rhs


def _mentions(s: str, var: str) -> bool:
    return bool(re.search(r"(?<![a-zA-Z\\])%s(?![a-zA-Z])" % re.escape(var), s))


def relation_interval(s: str) -> Structure | None:
    """The interval of `x < a`, `x >= a`, `a < x <= b` (one variable, constant bounds)."""
    parts, ops = split_relation(s)
    if not ops or len(ops) > 2 or not all(parts) or {"=", "!="} & set(ops):
        return None
    if len(ops) == 1:
        (lhs, rhs), op = parts, ops[0]
        if not (_VAR.fullmatch(lhs) and not _mentions(rhs, lhs)):
            if not (_VAR.fullmatch(rhs) and not _mentions(lhs, rhs)):
                return None
            lhs, rhs, op = rhs, lhs, _FLIP[op]
        if op in ("<", "<="):
            return Structure("interval", ("-\\infty", rhs), "(" + (")" if op == "<" else "]"))
        return Structure("interval", (rhs, "\\infty"), ("(" if op == ">" else "[") + ")")
    low, var, high = parts
    if not _VAR.fullmatch(var) or _mentions(low, var) or _mentions(high, var):
        return None
    if ops[0][0] == ">" and ops[1][0] == ">":
        low, high, ops = high, low, [_FLIP[ops[1]], _FLIP[ops[0]]]
    if ops[0][0] != "<" or ops[1][0] != "<":
        return None
    ends = ("(" if ops[0] == "<" else "[") + (")" if ops[1] == "<" else "]")
    return Structure("interval", (low, high), ends)


# ---------------------------------------------------------------------------- structures


def parse_structure(s: str) -> Structure | None:
    """The structure `s` spells at its top level (see the module docstring), None for a
    scalar or a relation."""
    if not s:
        return None
    rows = parse_matrix(s)
    if rows is not None:
        return Structure("matrix", rows)
    if s == "\\emptyset":
        return Structure("set", ())
    parts = split_top(s, "\\cup")
    if len(parts) > 1:
        return Structure("union", tuple(parts)) if all(parts) and len(parts) <= MAX_ITEMS else None
    if s.startswith("\\{") and s.endswith("\\}") and encloses(s[1:]):
        items = expand_pm(split_top(s[2:-2], ","))
        return Structure("set", tuple(items)) if all(items) and len(items) <= MAX_ITEMS else None
    if len(s) > 2 and s[0] in "([" and s[-1] in ")]" and encloses(s):
        items = split_top(s[1:-1], ",")
        if not all(items) or len(items) > MAX_ITEMS or len(items) < 2:
            return None
        if s[0] + s[-1] == "()" or (len(items) > 2 and s[0] + s[-1] == "[]"):
            return Structure("tuple", tuple(items))
        return Structure("interval", tuple(items), s[0] + s[-1]) if len(items) == 2 else None
    items = split_top(s, ",")
    if len(items) >= 2:
        items = expand_pm(items)
        return Structure("list", tuple(items)) if all(items) and len(items) <= MAX_ITEMS else None
    items = expand_pm([s])
    return Structure("list", tuple(items)) if len(items) == 2 else None


def as_interval(s: str, structure: Structure | None) -> Structure | None:
    """`structure` as an interval if it is one (a 2-tuple is an open interval), else the
    interval of the relation `s`, else None."""
    if structure is None:
        return relation_interval(s)
    if structure.kind == "interval":
        return structure
    if structure.kind == "tuple" and len(structure.items) == 2:
        return Structure("interval", structure.items, "()")
    return None
