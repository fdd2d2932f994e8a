r"""String helpers for math answers: unicode clean-up, brace matching, normalization, numbers.

Pure string code with no sympy import; `math.py` composes these with `_latex_structures`
(tuples, sets, intervals, matrices, relations) and `_latex_sympy` (LaTeX -> sympy text)
into `is_equivalent`. Every helper is linear in its input (its regexes are possessive,
anchored or start-restricted where backtracking could rescan a run, and
`tests/security/test_linear_text.py` times each on adversarial strings) and returns None
rather than raising on input it does not understand.

Numeric policy (used by `math.py`): numbers compare exactly as fractions, except that a
decimal literal with at least `APPROX_MIN_DIGITS` significant digits also matches any value
that rounds to it at its last digit (`0.333333` = 1/3, `1.41421` = sqrt(2); `0.333`, `1.414`
and `3.14` do not; `5.001` != 5; integers are always exact).
"""
from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

MAX_DIGITS = 400  # integer literals longer than this are never converted to numbers
MAX_EXPONENT = 400  # |exponent| bound for scientific notation and powers of ten
APPROX_MIN_DIGITS = 6  # significant digits a decimal needs to stand for a value it rounds

# ------------------------------------------------------------------------------- unicode

_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
# Applied before NFKC (which would turn some of them into plain letters or digits).
_UNICODE_SYMBOLS = {
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2010": "-", "\u2011": "-", "\u2012": "-",
    "\ufe63": "-", "×": "\\times ", "✕": "\\times ", "·": "\\cdot ", "⋅": "\\cdot ",
    "∙": "\\cdot ", "÷": "\\div ", "√": "\\sqrt ", "∛": "\\sqrt[3]", "π": "\\pi ",
    "∞": "\\infty ", "≤": "\\le ", "⩽": "\\le ", "≥": "\\ge ", "⩾": "\\ge ", "≠": "\\ne ",
    "±": "\\pm ", "∓": "\\mp ", "∪": "\\cup ", "∩": "\\cap ", "∈": "\\in ",
    "∅": "\\emptyset ", "ℝ": "\\mathbb{R}", "≈": "\\approx ", "⁄": "/", "∕": "/", "′": "'",
    "…": "...", "⟨": "\\langle ", "⟩": "\\rangle ", "θ": "\\theta ", "α": "\\alpha ",
    "β": "\\beta ", "γ": "\\gamma ", "λ": "\\lambda ", "μ": "\\mu ", "σ": "\\sigma ",
    "φ": "\\phi ", "ω": "\\omega ", "°": "^\\circ ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE_SYMBOLS)))
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")


def clean_unicode(text: str) -> str:
    """ASCII/LaTeX spellings of unicode math: NFKC (fullwidth digits, no-break spaces, `½`),
    unicode minus and dashes as `-`, superscripts as `^{..}`, `√ π ∞ ≤ × ±` as commands;
    control characters become spaces and invisible format characters are dropped."""
    if text.isascii():
        return _CONTROL.sub(" ", text) if _CONTROL.search(text) else text
    text = _INVISIBLE.sub("", text)
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{%s}" % m.group(0).translate(_SUPERSCRIPTS), text)
    text = _UNICODE_RE.sub(lambda m: _UNICODE_SYMBOLS[m.group(0)], text)
    text = unicodedata.normalize("NFKC", text)
    text = _UNICODE_RE.sub(lambda m: _UNICODE_SYMBOLS[m.group(0)], text)  # e.g. ½ -> 1⁄2
    return _CONTROL.sub(" ", text)


# -------------------------------------------------------------------------------- braces

_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)  # escaped characters (`\{`, `\\`) are skipped


def match_braces(text: str, start: int = 0) -> dict[int, int]:
    """Index of each `{` (from `start` on) -> index of its matching `}`; one linear pass."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN.finditer(text, start):
        ch = m.group(0)
        if ch == "{":
            stack.append(m.start())
        elif ch == "}" and stack:
            closing[stack.pop()] = m.start()
    return closing


def braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the `{...}` group opening at `text[start]`, and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for m in _BRACE_TOKEN.finditer(text, start):
        ch = m.group(0)
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : m.start()], m.end()
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
        m = re.match(r"\\(?:[a-zA-Z]+|.)", text[pos:pos + 40])
        if m:
            return m.group(0), pos + m.end()
    if text[pos] in "}^_&":
        return None
    return text[pos], pos + 1


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(?=[{ ])")


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete `\boxed{...}` / `\fbox{...}` in `text`, else None.

    Linear time: braces are matched in one pass from the first candidate on, so a text full
    of unclosed `\boxed{` is cheap.
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    closing = match_braces(text, matches[0].start())
    for m in reversed(matches):
        pos = m.end()
        if text[pos] == "{":
            if pos in closing:
                return text[pos + 1 : closing[pos]].strip()
        else:  # `\boxed 5`
            tail = re.match(r" +([^\s$]+)", text[pos : pos + 200])
            if tail:
                return tail.group(1)
    return None


_BOX_GAP = re.compile(r"[\s$.,;:]*(?:(?:\\q?quad|\\text\{[^{}$]{0,30}\}|and|or|\\[,;]|&)[\s$.,;:]*)*")


def final_boxed(text: str) -> str | None:
    r"""Like `last_boxed`, but boxes right before the last one that are separated from it only
    by punctuation, spaces, `and`/`or`, `\quad` or a short `\text{}` (`\text{ for part (a)
    and }`) join it as a list: `\boxed{-2} and
    \boxed{1}` -> `-2,1` (repeats of the same box count once)."""
    matches = [m for m in _BOXED.finditer(text) if text[m.end()] == "{"]
    if len(matches) < 2:
        return last_boxed(text)
    closing = match_braces(text, matches[0].start())
    boxes = [(m.start(), m.end(), closing[m.end()]) for m in matches if m.end() in closing]
    if not boxes:
        return last_boxed(text)
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap = text[box[2] + 1 : group[0][0]]
        if box[2] > group[0][0] or len(gap) > 40 or not _BOX_GAP.fullmatch(gap):  # nested
            break
        group.insert(0, box)
    contents = [text[b[1] + 1 : b[2]].strip() for b in group]
    unique = list(dict.fromkeys(contents))
    return ",".join(unique) if len(unique) > 1 else unique[0]


def unwrap_commands(text: str, names: tuple[str, ...], pad: str = "") -> str:
    r"""Replace `\name{x}` by `pad + x + pad` for each command in `names` (nesting allowed).

    One pass: braces are matched once, then every wrapper found is cut out.
    """
    pattern = re.compile(r"\\(?:" + "|".join(names) + r")\s*\{")
    starts = [(m.end() - 1, m.start()) for m in pattern.finditer(text)]
    if not starts:
        return text
    closing = match_braces(text, starts[0][1])
    cuts = []
    for brace, start in starts:
        close = closing.get(brace)
        if close is not None:
            cuts += [(start, brace + 1), (close, close + 1)]
    out, pos = [], 0
    for begin, end in sorted(cuts):
        out += [text[pos:begin], pad]
        pos = end
    out.append(text[pos:])
    return "".join(out)


_TOKEN = r"\s*([0-9A-Za-z])"
_BRACING = (
    (re.compile(r"\\(frac|binom)" + _TOKEN + _TOKEN), r"\\\1{\2}{\3}"),
    (re.compile(r"\\(frac|binom)" + _TOKEN + r"\s*(?=\{)"), r"\\\1{\2}"),
    (re.compile(r"\\(frac|binom)(\{[^{}]*\})" + _TOKEN), r"\\\1\2{\3}"),
    (re.compile(r"\\sqrt" + _TOKEN), r"\\sqrt{\1}"),
)


def _brace_args(s: str) -> str:
    r"""`\frac12` -> `\frac{1}{2}`, `\sqrt2` -> `\sqrt{2}`, `\frac{1}2` -> `\frac{1}{2}`."""
    for pattern, repl in _BRACING:
        s = pattern.sub(repl, s)
    return s


# ----------------------------------------------------------------------------- normalize

_TEXT_WRAPPERS = (
    "text", "textbf", "textit", "textrm", "textsf", "texttt", "textnormal", "textup", "mbox",
    "hbox", "mathrm", "mathbf", "mathit", "mathsf", "mathtt", "mathnormal", "boldsymbol", "bm",
    "operatorname", "underline", "boxed", "fbox", "emph",
)
_SPACING = re.compile(
    r"\\\\|\\[,;:! >]|\\(?:left|right)\.|\\(?:q?quad|displaystyle|textstyle|scriptstyle|left|"
    r"right|[bB]ig{1,2}[lrm]?|middle|limits|nolimits|hfill|mathstrut|strut|hline)(?![a-zA-Z])|~"
)
_RELATIONS = (
    (r"\\(?:leqslant|leq|le)(?![a-zA-Z])|=<", "<="),
    (r"\\(?:geqslant|geq|ge)(?![a-zA-Z])|=>", ">="),
    (r"\\(?:neq|ne)(?![a-zA-Z])|=/=|<>", "!="),
    (r"\\lt(?![a-zA-Z])", "<"),
    (r"\\gt(?![a-zA-Z])", ">"),
)
_CANONICAL = (
    (r"\\(?:dfrac|tfrac|cfrac)(?![a-zA-Z])", r"\\frac"),
    (r"\\(?:dbinom|tbinom)(?![a-zA-Z])", r"\\binom"),
    (r"\\(?:emptyset|varnothing|empty)(?![a-zA-Z])|\\\{\s*\\\}", r"\\emptyset"),
    (r"\\mathbb\s*+(?:\{\s*+)?+R\s*+\}?+|\\R(?![a-zA-Z])", r"(-\\infty,\\infty)"),
    (r"\\infin(?![a-zA-Z])", r"\\infty"),
    (r"\\lbrace(?![a-zA-Z])", r"\\{"),
    (r"\\rbrace(?![a-zA-Z])", r"\\}"),
    (r"\\lbrack(?![a-zA-Z])", "["),
    (r"\\rbrack(?![a-zA-Z])", "]"),
    (r"\\langle(?![a-zA-Z])", "("),
    (r"\\rangle(?![a-zA-Z])", ")"),
    (r"\\[lr]?vert(?![a-zA-Z])|\\\|", "|"),
    (r"\\(?:dots|ldots|cdots)(?![a-zA-Z])", "..."),
)
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree(?![a-zA-Z])")
_PERCENT = re.compile(r"(?:\\?%|\bper\s?cent\b|\bpct\b)\s*+(?:\.\s*+)?+$", re.I)
_OR_AND = re.compile(r"(?<=\S)(?:\s*+,\s++|\s++)(?:or|and)\s++(?=\S)")
# A number, spaces, unit words (`[a-zA-Z]+\.?(?:\^\{?\d\}?)?`, spaced) to the end, read
# from the end: on the reversed text the greedy words give the shortest number at once, in
# one pass (the forward `^(?P<num>.*?...)` tried every shorter number against the whole
# tail: quadratic). The number ends with a digit, `}` or a command not followed by a letter.
_UNIT_WORD_REVERSED = r"(?:\}?\d\{?\^)?\.?[a-zA-Z]+"
_UNIT_TAIL_REVERSED = re.compile(
    r"(?P<unit>%s(?:\s+%s)*)(?P<sep>\s*)(?:(?=[\d}])|(?<![a-zA-Z])(?=[a-zA-Z]+\\))"
    % (_UNIT_WORD_REVERSED, _UNIT_WORD_REVERSED)
)
# Words that are variables or functions rather than units after a number.
_NOT_UNITS = {"pi", "e", "i", "x", "y", "z", "n", "k", "sqrt", "ln", "log", "sin", "cos", "tan",
              "or", "and", "infty", "a", "b", "c", "d", "t", "r", "u", "v", "w", "p", "q"}
# Unit abbreviations: glued to a plain number (`10cm`) or after an expression (`2\\pi m`).
_GLUED_UNITS = {"cm", "mm", "km", "kg", "mg", "ml", "ft", "mph", "hrs", "hr", "min", "sec", "mi",
                "yd", "lbs", "lb", "oz", "units", "degrees", "in"}
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_WHITESPACE = re.compile(r"(\\[a-zA-Z]+)?\s+(?=([a-zA-Z])?)")
_ELEMENT_OF = re.compile(r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*\\in(?![a-zA-Z])")
_BARE_VAR = re.compile(r"\s*+(?:[a-zA-Z]|\\[a-zA-Z]++)?+(?:_\{?+\w++\}?+)?+\s*+")


def _strip_units(s: str) -> str:
    """Drop trailing unit words: after a plain number a known unit (`10cm`, `3 ft`) or a
    spaced word of one or 3+ letters (`5 m`, `12 apples`); after an expression a spaced
    known unit or 3+ letter word (`4\\sqrt{2} cm`, `6\\pi square units`). Variables stay
    (`2x`, `2ab`, `\\frac12 ab`, `\\pi h`, `\\pi r`)."""
    tail = _unit_tail(s.strip())
    if tail is None:
        return s
    num, sep, unit = tail
    bare = [w.rstrip(".").split("^")[0] for w in unit.split()]
    if set(bare) & _NOT_UNITS:
        return s
    known, sep = bare[0] in _GLUED_UNITS, bool(sep)
    if parse_number(num.strip()) is not None:  # `5 m`, `12 apples`, `10cm`
        keep = not (known or (sep and len(bare[0]) != 2))
    else:  # `6\\pi square units`, `4\\sqrt{2} cm`
        keep = not (sep and (known or len(bare[0]) >= 3))
    return s if keep else num


def _unit_tail(s: str) -> tuple[str, str, str] | None:
    """(number, spaces, unit words) of `s` ending in unit words after a number (the
    shortest number without a line break), else None; linear (`_UNIT_TAIL_REVERSED`)."""
    m = _UNIT_TAIL_REVERSED.match(s[::-1])
    if m is None:
        return None
    num = s[:len(s) - m.end()]
    if "\n" in num:
        return None
    return num, m.group("sep")[::-1], m.group("unit")[::-1]


_TEXT_UNIT = re.compile(  # possessive after the command: one scan of the tail per candidate
    r"^(?P<num>.*?[^\s+\-*/=^_(\[{,])\s*+\\(?:text|textrm|textnormal|textit|textbf|mbox|mathrm)"
    r"\s*+\{\s*+(?P<unit>[A-Za-z][A-Za-z .]*+)\s*+\}\s*+(?:\^\s*+\{?+\d\}?+)?+\s*+$"
)


def _strip_text_unit(s: str) -> str:
    r"""`5\sqrt{2}\text{ m}` -> `5\sqrt{2}`: a trailing `\text{word}` after an expression."""
    m = _TEXT_UNIT.match(s)
    if m and not set(m.group("unit").replace(".", " ").split()) & _NOT_UNITS:
        return m.group("num")
    return s


def _keep_command_space(m: re.Match) -> str:
    r"""Whitespace goes, except one space ending a command before a letter (`\pi r`)."""
    return (m.group(1) or "") + (" " if m.group(1) and m.group(2) else "")


def _answer_key(s: str) -> str:
    r"""The key of an answer text: its last `\boxed{}`, else what follows a GSM8K `####`."""
    boxed = final_boxed(s) if "\\boxed" in s or "\\fbox" in s else None
    if boxed is not None:
        return boxed
    if "####" in s:
        tail = s.rpartition("####")[2].strip()
        if tail and "\n" not in tail:
            return tail
    return s


def normalize(text: str) -> tuple[str, bool]:
    r"""Canonical string form of one answer, and whether it carried a percent sign.

    Takes the last `\boxed{}` (or `#### key`); strips `$`, `\(\)`, `\[\]`, `\text{}`-like
    wrappers, spacing macros, degree signs, trailing unit words, a leading `x \in`, an
    `\approx` tail, thousands separators and spaces; spells relations as `<= >= != < >`,
    `\dfrac`/`\tfrac` as `\frac`, `\frac12` / `\sqrt2` with braces, `\varnothing` as
    `\emptyset`, `\mathbb{R}` as `(-\infty,\infty)` and "a or b" / "a and b" as "a,b".
    """
    s = _answer_key(clean_unicode(text).strip())
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\{\s*,\s*\}|,\s*\\!\s*", ",", s)  # thousands: `1{,}000`, `1,\!000`
    s = re.sub(r"\\[()\[\]]", " ", s)
    s = _SPACING.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s)
    for pattern, repl in _RELATIONS + _CANONICAL:
        s = re.sub(pattern, repl, s)
    s = _DEGREES.sub("", s)
    s = re.sub(r"(?<!\s)\s++\^", "^", unwrap_commands(_strip_text_unit(s), _TEXT_WRAPPERS,
                                                      pad=" "))
    percent = bool(_PERCENT.search(s))
    s = _PERCENT.sub("", s)
    s = re.sub(r"\\?%", "", s).strip().rstrip(".").rstrip("\\").strip()
    if "\\approx" in s:
        before, _, after = s.partition("\\approx")
        s = after if _BARE_VAR.fullmatch(before) else before
    s = _ELEMENT_OF.sub("", s)
    s = _OR_AND.sub(",", s)
    if "," in s and not re.search(r"[(\[{]", s):
        s = ",".join(_strip_units(part) for part in s.split(","))
    else:
        s = _strip_units(s)
    spaced_commas = bool(re.search(r"\d,\s+\d", s))  # `32, 349` is a list
    s = _WHITESPACE.sub(_keep_command_space, s)
    s = s.rstrip(".,;").rstrip("\\")
    if _THOUSANDS.match(s) and not spaced_commas:
        s = s.replace(",", "")
    s = re.sub(r"(^|[,(\[])\+\\infty", r"\1\\infty", s)
    s = re.sub(r"([_^])\{([A-Za-z0-9])\}", r"\1\2", s)
    return _brace_args(s), percent


# ------------------------------------------------------------------------------- numbers

INT_RE = re.compile(r"[-+]?\d+")
_DEC = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+)")
_SCI = re.compile(
    r"(?P<m>[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++))"
    r"(?:[eE]|\\times10\^\{?|\\cdot10\^\{?|\*10\^\{?|\*10\*\*)(?P<e>[-+]?\d+)\}?"
)
_POW10 = re.compile(r"(?P<s>[-+]?)10\^\{?(?P<e>[-+]?\d+)\}?")
_FRAC = re.compile(r"(?P<s>[-+]?)\\frac\{(?P<n>[-+]?[\d.]+)\}\{(?P<d>[-+]?[\d.]+)\}")
_SLASH = re.compile(r"(?P<s>)(?P<n>[-+]?[\d.]+)/(?P<d>[-+]?[\d.]+)")
_MIXED = re.compile(
    r"(?P<w>[-+]?\d+)(?:\\frac\{(?P<n>\d+)\}\{(?P<d>\d+)\}|_(?P<n2>\d+)/(?P<d2>\d+))"
)
_REPEAT = re.compile(r"(?P<s>[-+]?)(?P<i>\d*)\.(?P<f>\d*)\\overline\{(?P<r>\d+)\}")


def _plain(s: str) -> Fraction | None:
    if len(s) > MAX_DIGITS:
        return None
    if INT_RE.fullmatch(s) or _DEC.fullmatch(s):
        return Fraction(s)
    return None


def parse_number(s: str) -> Fraction | None:
    r"""Exact value of a plain number string, else None.

    Accepts integers, decimals, scientific notation (`1.5e3`, `1.5\times10^{3}`, `10^{3}`),
    fractions `a/b` and `\frac{a}{b}`, mixed numbers (`3\frac{1}{2}`, `3_1/2`) and repeating
    decimals (`0.1\overline{6}`). Never evaluates anything bigger than `MAX_DIGITS` digits or
    `10**MAX_EXPONENT`.
    """
    s = s.replace(" ", "")
    if not s or len(s) > MAX_DIGITS:
        return None
    value = _plain(s)
    if value is not None:
        return value
    for m in (_SCI.fullmatch(s), _POW10.fullmatch(s)):  # anchored uses only: linear
        if m:
            exp = int(m.group("e"))
            if abs(exp) > MAX_EXPONENT:
                return None
            sign = m.groupdict().get("s")
            mantissa = Fraction(m.group("m")) if sign is None else Fraction(sign + "1")
            return mantissa * Fraction(10) ** exp
    for m in (_FRAC.fullmatch(s), _SLASH.fullmatch(s)):  # anchored uses only: linear
        if m:
            n, d = _plain(m.group("n")), _plain(m.group("d"))
            if n is None or d is None or d == 0:
                return None
            return (-1 if m.group("s") == "-" else 1) * n / d
    m = _MIXED.fullmatch(s)
    if m:
        whole = int(m.group("w"))
        n, d = int(m.group("n") or m.group("n2")), int(m.group("d") or m.group("d2"))
        if d == 0 or n >= d:
            return None
        return whole - Fraction(n, d) if m.group("w").startswith("-") else whole + Fraction(n, d)
    m = _REPEAT.fullmatch(s)
    if m and len(m.group("r")) <= 50:
        head = Fraction((m.group("i") or "0") + "." + (m.group("f") or "0"))
        cycle = Fraction(int(m.group("r")), 10 ** len(m.group("f")) * (10 ** len(m.group("r")) - 1))
        return -(head + cycle) if m.group("s") == "-" else head + cycle
    return None


_DECIMAL_LITERAL = re.compile(
    r"[-+]?(?P<i>\d*)\.(?P<f>\d+)(?:(?:[eE]|\\times10\^\{?|\\cdot10\^\{?)(?P<e>[-+]?\d+)\}?)?"
)


def decimal_tolerance(s: str) -> Fraction | None:
    """Half a unit in the last place of a decimal literal with at least `APPROX_MIN_DIGITS`
    significant digits (`0.333333` -> 5e-7), else None (integers and short decimals are exact).
    """
    m = _DECIMAL_LITERAL.fullmatch(s)
    if not m or len(s) > MAX_DIGITS:
        return None
    exp = int(m.group("e") or 0)
    significant = len((m.group("i") + m.group("f")).lstrip("0"))
    if abs(exp) > MAX_EXPONENT or significant < APPROX_MIN_DIGITS:
        return None
    return Fraction(1, 2) * Fraction(10) ** (exp - len(m.group("f")))
