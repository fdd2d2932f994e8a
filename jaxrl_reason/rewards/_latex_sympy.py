r"""LaTeX -> expression text for the sympy worker process (no sympy import here).

`latex_to_sympy` handles `\frac`, `\binom`, `\sqrt[n]{}`, powers, subscripted names, `\pi`,
`\infty`, `\cdot`/`\times`/`\div`, named functions with LaTeX arguments (`\sin 2x`,
`\sin^2 x`, `\sin^{-1} x`, `\log_2 8`), `|x|`, floor/ceiling, factorials, Greek letters,
matrix environments (as `Matrix([[..]])`), `i` (imaginary unit) and `e` (Euler's number)
when they stand alone. It refuses power towers, huge literals, factorials of literals
above `MAX_FACTORIAL` and factorials of factorials or powers, so the worker is rarely asked
to build a giant number (what slips through is cut by the worker's deadline). Its output
only holds names, numbers, `+-*/()[],!` and spaces (no `__`, no `.name`); the worker
builds sympy objects from its syntax tree (`_sympy_tree`), never evaluating it.
"""
from __future__ import annotations

import re

from jaxrl_reason.rewards._latex import MAX_DIGITS, braced, command_arg
from jaxrl_reason.rewards._latex_structures import parse_matrix

MAX_SYMPY_CHARS = 600  # longer expressions are not handed to sympy
MAX_FACTORIAL = 1000  # n! of a literal n above this is refused
_MAX_DEPTH = 20  # brace nesting the converter follows

_FUNCS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "log": "log", "ln": "log", "exp": "exp", "lg": "log10",
}
_INVERSE = {
    "sin": "asin", "cos": "acos", "tan": "atan", "cot": "acot", "sec": "asec", "csc": "acsc",
}
_SYMBOLS = {
    "pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "div": "/", "lfloor": " floor(",
    "rfloor": ")", "lceil": " ceiling(", "rceil": ")",
}
GREEK = frozenset({
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon",
    "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi",
    "Sigma", "Phi", "Psi", "Omega",
})
_PLAIN = frozenset("0123456789.+-*/()!, abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_SIMPLE_ARG = re.compile(r"(?:[0-9.]+|[a-zA-Z]|\\(?:pi|%s)(?![a-zA-Z]))+(?:\^(?:\{[^{}]*\}|\w))?"
                         % "|".join(sorted(GREEK)))


_COMMAND = re.compile(r"\\([a-zA-Z]+)")


class _Unsupported(Exception):
    """Raised inside the converter for LaTeX it does not translate."""


def latex_to_sympy(s: str) -> str | None:
    """Expression text (`_sympy_tree` grammar) for a normalized LaTeX expression, or None."""
    if not s or len(s) > MAX_SYMPY_CHARS:
        return None
    try:
        out = _convert(s, 0)
    except (_Unsupported, RecursionError, IndexError, ValueError):
        return None
    out = re.sub(r"(?<![a-zA-Z_])([EI])(?![a-zA-Z_(])", r"\1_0", out)  # variables E, I
    out = re.sub(r"(?<![a-zA-Z_])i(?![a-zA-Z_(])", "I", out)
    out = re.sub(r"(?<![a-zA-Z_])e(?![a-zA-Z_(])", "E", out)
    out = re.sub(r"\s+", " ", out).strip()
    if (
        not out
        or "__" in out
        or re.search(r"\.\s*[A-Za-z_]|\d{%d,}|\d[eE][-+]?\d{3,}" % MAX_DIGITS, out)
        or not re.fullmatch(r"[\w\s+\-*/().,!\[\]]*", out)
    ):
        return None
    return out


def _convert(s: str, depth: int) -> str:
    if depth > _MAX_DEPTH:
        raise _Unsupported("nesting")
    out: list[str] = []
    pos, after_power = 0, False
    while pos < len(s):
        ch, power = s[pos], False
        if ch == "\\":
            m = _COMMAND.match(s, pos)
            if not m:
                raise _Unsupported(s[pos : pos + 2])
            name, pos = m.group(1), m.end()
            if name in ("frac", "binom"):
                a, pos = _arg(s, pos)
                b, pos = _arg(s, pos)
                ca, cb = _convert(a, depth + 1), _convert(b, depth + 1)
                if name == "binom" and re.search(r"\d{6,}", ca):
                    raise _Unsupported("huge binomial")
                out.append(f"(({ca})/({cb}))" if name == "frac" else f" binomial({ca},{cb})")
            elif name == "sqrt":
                text, pos = _sqrt(s, pos, depth)
                out.append(text)
            elif name in _FUNCS:
                text, pos = _function(s, pos, name, depth)
                out.append(text)
            elif name == "begin":
                text, pos = _matrix(s, m.start(), depth)
                out.append(text)
            elif name in _SYMBOLS:
                out.append(_SYMBOLS[name])
            elif name in GREEK:
                out.append(" lamda " if name == "lambda" else f" {name} ")
            else:
                raise _Unsupported(name)
        elif ch == "^":
            if after_power:
                raise _Unsupported("power tower")
            a, pos = _arg(s, pos + 1)
            exponent = _convert(a, depth + 1)
            if "**" in exponent or any(len(d) > 4 for d in re.findall(r"\d+", exponent)):
                raise _Unsupported("large power")
            out.append(f"**({exponent})")
            power = True
        elif ch == "_":
            if pos > 0 and s[pos - 1].isdigit():
                raise _Unsupported("base subscript")  # `204_5` is not 2045
            a, pos = _arg(s, pos + 1)
            if not re.fullmatch(r"[a-zA-Z0-9]+", a):
                raise _Unsupported("subscript")
            out.append("_" + a)
        elif ch == "{":
            group = braced(s, pos)
            if group is None:
                raise _Unsupported("unbalanced")
            out.append("(" + _convert(group[0], depth + 1) + ")")
            pos = group[1]
        elif ch == "|":
            end = _closing_bar(s, pos)
            out.append(" Abs(" + _convert(s[pos + 1 : end], depth + 1) + ") ")
            pos = end + 1
        elif ch == "!":
            literal = re.search(r"\d+$", s[max(0, pos - 8) : pos])
            if literal and int(literal.group(0)) > MAX_FACTORIAL:
                raise _Unsupported("huge factorial")
            if out and out[-1].endswith(")") and re.search(r"!|\*\*", _last_group(out)):
                raise _Unsupported("factorial of a factorial or power")  # `(12!)!`
            out.append("!")
            pos += 1
        elif ch in _PLAIN:
            out.append(ch)
            pos += 1
        else:
            raise _Unsupported(ch)
        after_power = power
    return "".join(out)


def _last_group(out: list[str]) -> str:
    """The parenthesized group that ends the output so far (for `(...)!`)."""
    text, depth = "".join(out), 0
    for pos in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[pos], 0)
        if depth == 0:
            return text[pos:]
    return text


def _arg(s: str, pos: int) -> tuple[str, int]:
    group = command_arg(s, pos)
    if group is None:
        raise _Unsupported("missing argument")
    return group


def _sqrt(s: str, pos: int, depth: int) -> tuple[str, int]:
    index = None
    if pos < len(s) and s[pos] == "[":
        end = s.find("]", pos)
        if end < 0:
            raise _Unsupported("sqrt index")
        index, pos = _convert(s[pos + 1 : end], depth + 1), end + 1
    if pos < len(s) and s[pos] == "(":
        end = _closing_paren(s, pos)
        inner, pos = s[pos + 1 : end], end + 1
    else:
        inner, pos = _arg(s, pos)
    inner = _convert(inner, depth + 1)
    return (f" sqrt({inner})" if index is None else f"(({inner})**(1/({index})))"), pos


def _function(s: str, pos: int, name: str, depth: int) -> tuple[str, int]:
    r"""`\sin^2 x`, `\log_{2}(8)`, `\cos\theta` -> sympy calls; the argument is a group or a
    run of digits, letters and Greek letters (`\sin 2x \cos y` -> sin(2x)*cos(y))."""
    power = base = None
    for _ in range(2):
        while pos < len(s) and s[pos] == " ":
            pos += 1
        if pos < len(s) and s[pos] in "^_":
            script = s[pos]
            arg, pos = _arg(s, pos + 1)
            if script == "^":
                power = _convert(arg, depth + 1)
            else:
                base = _convert(arg, depth + 1)
    while pos < len(s) and s[pos] == " ":
        pos += 1
    if pos < len(s) and s[pos] == "(":
        end = _closing_paren(s, pos)
        inner, pos = s[pos + 1 : end], end + 1
    elif pos < len(s) and s[pos] == "{":
        inner, pos = _arg(s, pos)
    else:
        m = _SIMPLE_ARG.match(s, pos)
        if not m:
            raise _Unsupported("function argument")
        inner, pos = m.group(0), m.end()
    text = f"{_FUNCS[name]}({_convert(inner, depth + 1)})"
    if power is not None and power.strip("()") == "-1" and name in _INVERSE:
        text, power = f"{_INVERSE[name]}({_convert(inner, depth + 1)})", None
    if base is not None:
        if name not in ("log", "ln"):
            raise _Unsupported("subscripted function")
        text = f"(log({_convert(inner, depth + 1)})/log({base}))"
    if power is not None:
        text = f"(({text})**({power}))"
    return f" {text} ", pos


def _closing_paren(s: str, pos: int) -> int:
    depth = 0
    for m in re.finditer(r"[()]", s[pos:]):
        depth += 1 if m.group(0) == "(" else -1
        if depth == 0:
            return pos + m.start()
    raise _Unsupported("unbalanced parenthesis")


def _closing_bar(s: str, pos: int) -> int:
    depth = 0
    for m in re.finditer(r"[()\[\]{}|]", s[pos + 1 :]):
        tok = m.group(0)
        if tok == "|" and depth == 0:
            return pos + 1 + m.start()
        if tok != "|":
            depth += 1 if tok in "([{" else -1
    raise _Unsupported("unbalanced |")


def _matrix(s: str, start: int, depth: int) -> tuple[str, int]:
    head = re.compile(r"\\begin\{(\w+)\}").match(s, start)
    if not head:
        raise _Unsupported("begin")
    level = 0
    for m in re.finditer(r"\\(begin|end)\{%s\}" % re.escape(head.group(1)), s[start:]):
        level += 1 if m.group(1) == "begin" else -1
        if level == 0:
            end = start + m.end()
            break
    else:
        raise _Unsupported("unclosed environment")
    rows = parse_matrix(s[start:end])
    if rows is None:
        raise _Unsupported("environment")
    body = ",".join("[" + ",".join(_convert(c, depth + 1) for c in row) + "]" for row in rows)
    return f" Matrix([{body}]) ", end
