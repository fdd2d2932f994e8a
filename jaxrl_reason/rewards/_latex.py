"""String helpers for math answers: brace matching, normalization, numbers, LaTeX -> sympy.

Pure string code with no sympy import; `math.py` composes these into `is_equivalent`.
Every helper is linear-ish in its input and returns None rather than raising on input it
does not understand.
"""
from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 1000  # longer answers are compared as strings only
MAX_SYMPY_CHARS = 300  # longer expressions are not handed to sympy
MAX_DIGITS = 400  # integer literals longer than this are never converted to numbers
MAX_EXPONENT = 400  # |exponent| bound for scientific notation and powers of ten


def braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the `{...}` group opening at `text[start]`, and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for pos in range(start, len(text)):
        ch = text[pos]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : pos], pos + 1
    return None


def command_arg(text: str, pos: int) -> tuple[str, int] | None:
    """The argument of a LaTeX command whose name ends at `pos`: `{...}` or one token."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] == "{":
        return braced(text, pos)
    if text[pos] == "\\":
        m = re.match(r"\\[a-zA-Z]+", text[pos:])
        if m:
            return m.group(0), pos + m.end()
    if text[pos] in "}^_":
        return None
    return text[pos], pos + 1


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete `\boxed{...}` / `\fbox{...}` in `text`, else None.

    Linear time: braces are matched in one pass, so a text full of unclosed `\boxed{` is
    cheap.
    """
    matches = list(re.finditer(r"\\(?:boxed|fbox)\s*(?=[{ ])", text))
    if not matches:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for pos, ch in enumerate(text):
        if ch == "{":
            stack.append(pos)
        elif ch == "}" and stack:
            closing[stack.pop()] = pos
    for m in reversed(matches):
        pos = m.end()
        if text[pos] == "{":
            if pos in closing:
                return text[pos + 1 : closing[pos]].strip()
        else:  # `\boxed 5`
            tail = re.match(r" +([^\s$]+)", text[pos:])
            if tail:
                return tail.group(1)
    return None


def unwrap_commands(text: str, names: tuple[str, ...]) -> str:
    r"""Replace `\name{x}` by `x` for each command in `names` (brace-aware, innermost last)."""
    pattern = re.compile(r"\\(?:" + "|".join(names) + r")\s*\{")
    for _ in range(64):
        m = pattern.search(text)
        group = braced(text, m.end() - 1) if m else None
        if group is None:
            return text
        text = text[: m.start()] + group[0] + text[group[1] :]
    return text


_UNIT_WORD = r"[a-zA-Z]+\.?(?:\^\{?\d\}?)?"
_UNIT_WORDS = re.compile(r"^(?P<num>.*?\d)\s*(?P<unit>%s(?:\s+%s)*)$" % (_UNIT_WORD, _UNIT_WORD))
_NOT_UNITS = {"pi", "e", "i", "x", "y", "z", "n", "k", "sqrt", "ln", "log", "sin", "cos", "tan"}
_VAR = re.compile(r"[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?(?:\([a-zA-Z]\))?")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SPACING = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle|big|Big|bigg|Bigg)(?![a-zA-Z])|~")


def normalize(text: str) -> tuple[str, bool]:
    """Canonical string form of one answer, and whether it carried a percent sign.

    Strips `$`, `\\(\\)`, `\\[\\]`, `\\boxed{}`, `\\text{}`-like wrappers, spacing macros,
    degree signs, trailing unit words, a leading `x =`, thousands separators and all spaces;
    spells `\\dfrac`/`\\tfrac` as `\\frac` and `\\frac12` / `\\sqrt2` with braces.
    """
    s = text.strip()
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\[()\[\]]", "", s)
    s = _SPACING.sub(" ", s)
    s = re.sub(r"\\(?:dfrac|tfrac)", r"\\frac", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree", "", s)
    s = re.sub(r"\\text\{\s*(?:degrees?|units?|cm|m|km|inches|feet|dollars|cents)\s*\}\s*$", "", s)
    s = unwrap_commands(s, ("text", "textbf", "textit", "mathrm", "mathbf", "mbox", "operatorname"))
    s = s.replace("{,}", ",")
    percent = bool(re.search(r"\\?%\s*$", s))
    s = re.sub(r"\\?%", "", s).strip().rstrip(".").strip()
    if s.count("=") == 1:
        left, right = s.split("=")
        if _VAR.fullmatch(left.strip()):
            s = right
        elif _VAR.fullmatch(right.strip()):
            s = left
    unit = _UNIT_WORDS.match(s)
    if (
        unit
        and unit.group("unit").split()[0].rstrip(".") not in _NOT_UNITS
        and parse_number(unit.group("num").strip()) is not None
    ):
        s = unit.group("num")
    s = re.sub(r"\s+", "", s)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = re.sub(r"\\(frac|sqrt)(\d)(\d)?", lambda m: _brace_digits(m), s)
    return s, percent


def _brace_digits(m: re.Match) -> str:
    if m.group(1) == "frac" and m.group(3):
        return "\\frac{%s}{%s}" % (m.group(2), m.group(3))
    return "\\%s{%s}%s" % (m.group(1), m.group(2), m.group(3) or "")


INT_RE = re.compile(r"[-+]?\d+")
_DEC = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+)")
_SCI = re.compile(
    r"(?P<m>[-+]?(?:\d+\.?\d*|\.\d+))"
    r"(?:[eE]|\\times10\^\{?|\*10\^\{?|\*10\*\*)(?P<e>[-+]?\d+)\}?"
)
_FRAC = re.compile(r"(?P<s>[-+]?)\\frac\{(?P<n>[-+]?[\d.]+)\}\{(?P<d>[-+]?[\d.]+)\}")
_SLASH = re.compile(r"(?P<n>[-+]?[\d.]+)/(?P<d>[-+]?[\d.]+)")
_MIXED = re.compile(
    r"(?P<w>[-+]?\d+)(?:\\frac\{(?P<n>\d+)\}\{(?P<d>\d+)\}|_(?P<n2>\d+)/(?P<d2>\d+))"
)


def _plain(s: str) -> Fraction | None:
    if len(s) > MAX_DIGITS:
        return None
    if INT_RE.fullmatch(s) or _DEC.fullmatch(s):
        return Fraction(s)
    return None


def parse_number(s: str) -> Fraction | None:
    r"""Exact value of a plain number string, else None.

    Accepts integers, decimals, scientific notation (`1.5e3`, `1.5\times10^{3}`),
    fractions `a/b` and `\frac{a}{b}`, and mixed numbers (`3\frac{1}{2}`, `3_1/2`).
    Never evaluates anything bigger than `MAX_DIGITS` digits or `10**MAX_EXPONENT`.
    """
    s = s.replace(" ", "")
    if not s or len(s) > MAX_DIGITS:
        return None
    value = _plain(s)
    if value is not None:
        return value
    m = _SCI.fullmatch(s)
    if m:
        exp = int(m.group("e"))
        return Fraction(m.group("m")) * Fraction(10) ** exp if abs(exp) <= MAX_EXPONENT else None
    for pattern, num, den in ((_FRAC, "n", "d"), (_SLASH, "n", "d")):
        m = pattern.fullmatch(s)
        if m:
            n, d = _plain(m.group(num)), _plain(m.group(den))
            if n is None or d is None or d == 0:
                return None
            sign = -1 if m.groupdict().get("s") == "-" else 1
            return sign * n / d
    m = _MIXED.fullmatch(s)
    if m:
        whole = int(m.group("w"))
        n, d = int(m.group("n") or m.group("n2")), int(m.group("d") or m.group("d2"))
        if d == 0 or n >= d:
            return None
        frac = Fraction(n, d)
        return whole - frac if m.group("w").startswith("-") else whole + frac
    return None


# ---------------------------------------------------------------------- LaTeX -> sympy


_FUNCS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "log": "log", "ln": "log", "exp": "exp",
}
_SYMBOLS = {
    "pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/", "alpha": "alpha",
    "beta": "beta", "gamma": "gamma", "theta": "theta", "phi": "phi", "lambda": "lamda",
    "mu": "mu", "sigma": "sigma", "omega": "omega", "tau": "tau", "le": "<=", "ge": ">=",
    "leq": "<=", "geq": ">=", "lfloor": "floor(", "rfloor": ")", "lceil": "ceiling(",
    "rceil": ")",
}


class _Unsupported(Exception):
    """Raised inside the converter for LaTeX it does not translate."""


def latex_to_sympy(s: str) -> str | None:
    r"""A sympy `parse_expr` string for a normalized LaTeX expression, or None.

    Handles `\frac`, `\sqrt[n]{}`, `^`, `_`, `\pi`, `\infty`, `\cdot`, `\times`, `\div`,
    named functions, Greek letters, floor/ceiling, `i` (imaginary unit) and `e` (Euler's
    number) when they stand alone. Refuses towers of powers and huge literals so that the
    worker is never asked to build a giant number.
    """
    if len(s) > MAX_SYMPY_CHARS:
        return None
    try:
        out = _convert(s, 0)
    except (_Unsupported, RecursionError):
        return None
    if re.search(r"\d{%d,}|\d[eE][-+]?\d{4,}" % MAX_DIGITS, out) or not out.strip():
        return None
    return out


def _convert(s: str, depth: int) -> str:
    if depth > 20:
        raise _Unsupported("nesting")
    out: list[str] = []
    pos = 0
    while pos < len(s):
        ch = s[pos]
        if ch == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[pos:])
            if not m:
                raise _Unsupported(s[pos : pos + 2])
            name, pos = m.group(1), pos + m.end()
            if name == "frac" or name == "binom":
                a, pos = _arg(s, pos)
                b, pos = _arg(s, pos)
                ca, cb = _convert(a, depth + 1), _convert(b, depth + 1)
                out.append(f"(({ca})/({cb}))" if name == "frac" else f"binomial({ca},{cb})")
            elif name == "sqrt":
                index = None
                if pos < len(s) and s[pos] == "[":
                    end = s.find("]", pos)
                    if end < 0:
                        raise _Unsupported("sqrt index")
                    index, pos = _convert(s[pos + 1 : end], depth + 1), end + 1
                a, pos = _arg(s, pos)
                inner = _convert(a, depth + 1)
                out.append(f"sqrt({inner})" if index is None else f"(({inner})**(1/({index})))")
            elif name in _FUNCS:
                out.append(_FUNCS[name])
            elif name in _SYMBOLS:
                out.append(_SYMBOLS[name])
            else:
                raise _Unsupported(name)
        elif ch == "^":
            a, pos = _arg(s, pos + 1)
            exponent = _convert(a, depth + 1)
            if "**" in exponent or any(len(d) > 3 for d in re.findall(r"\d+", exponent)):
                raise _Unsupported("large power")
            out.append(f"**({exponent})")
        elif ch == "_":
            a, pos = _arg(s, pos + 1)
            if not re.fullmatch(r"[a-zA-Z0-9]+", a):
                raise _Unsupported("subscript")
            out.append("_" + a)
        elif ch in "{}":
            out.append("(" if ch == "{" else ")")
            pos += 1
        else:
            out.append(ch)
            pos += 1
    text = "".join(out)
    text = re.sub(r"(?<![a-zA-Z_])i(?![a-zA-Z_(])", "I", text)
    return re.sub(r"(?<![a-zA-Z_])e(?![a-zA-Z_(])", "E", text)


def _arg(s: str, pos: int) -> tuple[str, int]:
    group = command_arg(s, pos)
    if group is None:
        raise _Unsupported("missing argument")
    return group
