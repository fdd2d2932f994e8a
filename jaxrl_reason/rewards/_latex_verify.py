r"""math-verify inside a sympy worker job: hardening, parsing of one answer, the verdict.

Loaded by path inside the worker process (it imports nothing from the package), like
`_sympy_tree`. The zygote calls `harden()` once after importing math-verify and warming it
up on constant answers (`WARM`; sympy imports some modules lazily, and a few of them
`sympify` constant strings at import), before any untrusted text arrives, so every forked job inherits it:

- sympy's `parse_expr` / `eval_expr` (the only place where sympy turns a string into code,
  reached by `sympify(str)`, `Number(str)` and math-verify's plain-expression path) and the
  copies bound by `latex2sympy2_extended` and `math_verify.parser` are replaced by
  `numeric_literal`, which accepts a plain decimal literal and raises on anything else;
- `latex2sympy2_extended.sets` / `.logic` call `sympify` on parser output; they get sympy's
  strict `_sympify`, which never parses a string.

So no text that reaches the LaTeX grammar (ANTLR: a tree, then sympy constructors) can be
run as Python, whatever the grammar lets through.

`two_stage_parsing()` (also called by the zygote before the warm-up) makes the LaTeX
grammar try ANTLR's fast SLL prediction before its full-context LL prediction.

`verdict(pred, gold, options, tree)` parses both answers and calls `math_verify.verify`.
An answer is parsed, first success wins:

1. plain-expression syntax (`sqrt(2)/2`, `x**2`, a named call; no backslash), when the
   "expr" target is on: `tree.build` (`_sympy_tree`, the restricted AST walk; math-verify's
   own `ExprExtractionConfig` goes through `parse_expr` and is never used);
2. math-verify's LaTeX extraction (and string extraction when "string" is on); an answer
   without `$`, `\(`, `\[` or `\boxed` is wrapped in `$...$` first, so bare answers
   (`\tfrac83`, `4, 12, 2`) parse;
3. the last side of an equation chain that did not parse whole (`23 \bmod 7 = 2` -> `2`);
4. `tree.build` of the text, when "expr" is on.

With the `correctness` reward, the completion itself may also go to math-verify's own
extraction (`_library_extract`); one reading of it is scored, never whichever matches
(`verdict`, and the rule in `rewards/_reading.py`).
"""
from __future__ import annotations

import re

_NUMERIC = re.compile(r"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d{1,4}+)?+")
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_PLAIN_SYNTAX = re.compile(r"\*\*|(?<![\\A-Za-z])[A-Za-z]{2,}\s*\(")
TARGETS = ("latex", "expr", "string")

# Constant answer pairs the zygote compares before `harden` (the first few also through
# the completion path), so that the grammar's lazily built parser tables, sympy's lazy imports and
# caches are filled once in the zygote rather than lost with every forked job.
WARM = [
    (r"\frac{1}{2}", "0.5"), (r"\sqrt{9} = 3", "3"), (r"\{1, 2\}", "(1,2)"),
    (r"x \in [2, 5)", r"2 \le x < 5"), (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", "(1,2)"),
    (r"25\%", "0.25"), ("sqrt(2)/2", r"\frac{\sqrt2}{2}"), ("B", r"\text{(B)}"),
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)"), ("(a+b)^2", "a^2+2ab+b^2"),
    ("(x-1)^2", "x^2-2x+1"), ("y = 2x + 1", "2x+1"), ("3x+4y=20", r"y=-\frac{3}{4}x+5"),
    (r"(-\infty, 3]", r"x \le 3"), (r"(-\infty,1)\cup(2,\infty)", r"x<1 \text{ or } x>2"),
    (r"1 \pm \sqrt{5}", r"1+\sqrt{5}, 1-\sqrt{5}"), (r"\frac{x+2}{7}", r"\frac{x}{7}+\frac{2}{7}"),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
     r"\left[\begin{array}{cc}1 & 2 \\ 3 & 4\end{array}\right]"),
    (r"\begin{bmatrix}1\\-2\end{bmatrix}", "(1,-2)"), (r"2\sqrt{3}", r"\sqrt{12}"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"), (r"e^{i\pi}", "-1"), (r"\infty", r"-\infty"),
    (r"\text{odd}", "odd"), (r"90^\circ", r"\frac{\pi}{2}"), (r"1.5\times10^{3}", "1500"),
    (r"2\frac{1}{2}", "2.5"), (r"\sin(\frac{\pi}{6})", r"\cos\frac{\pi}{3}"),
    (r"\log_2 8", r"\ln e^3"), (r"|x-1|", r"\left|1-x\right|"), (r"\binom{6}{3}", "20"),
    (r"\{(1,2),(3,4)\}", r"\{(3,4),(1,2)\}"),
    (r"a_1 + b_{2}", r"b_2+a_1"), (r"x^{\frac{1}{3}}", r"\sqrt[3]{x}"), ("PQ=3, RS=8", "3, 8"),
    (r"-1<g(x)<2", "(-1,2)"), (r"\dfrac{3}{4}", r"\tfrac34"), ("4, 12, 2", r"\{2, 4, 12\}"),
    (r"\$1{,}200", "1200"), (r"\text{18 dollars}", "18"), (r"f(x) = x^2 - 4x + 4", "(x-2)^2"),
]


def numeric_literal(text, *args, **kwargs):
    """Stand-in for sympy's `parse_expr`: a sympy Integer/Float of a plain decimal literal
    (`"12"`, `"-0.5"`, `"1e3"`, at most 400 characters); anything else raises ValueError."""
    import sympy

    t = text.strip() if isinstance(text, str) else None
    if t is None or len(t) > 400 or not _NUMERIC.fullmatch(t):
        raise ValueError("string evaluation is disabled inside the math worker")
    return sympy.Integer(int(t)) if re.fullmatch(r"[-+]?\d+", t) else sympy.Float(t)


def _refuse(*args, **kwargs):
    """Stand-in for sympy's `eval_expr`: always raises ValueError."""
    raise ValueError("code evaluation is disabled inside the math worker")


def harden() -> None:
    """Cut every string-to-code path of sympy, latex2sympy2_extended and math-verify (see
    the module docstring). Idempotent."""
    import sympy.physics.units  # noqa: F401  (imported lazily by relation solving; it
    #                             sympifies constant names at import, so import it now)
    import latex2sympy2_extended.latex2sympy2 as l2s
    import latex2sympy2_extended.logic as l2s_logic
    import latex2sympy2_extended.sets as l2s_sets
    import math_verify.parser as mv_parser
    import sympy.parsing.sympy_parser as sympy_parser
    from sympy.core.sympify import _sympify

    for module in (sympy_parser, l2s, mv_parser):
        module.parse_expr = numeric_literal
    sympy_parser.eval_expr = _refuse
    l2s_sets.sympify = _sympify
    l2s_logic.sympify = _sympify
    mv_parser.parse_expr_cached.cache_clear()
    mv_parser.parse_latex_cached.cache_clear()


def two_stage_parsing() -> None:
    """Make `latex2sympy2_extended` parse in ANTLR's two stages: SLL prediction first, and
    the full-context LL prediction (its default, 3-7x slower on answer strings) only when
    SLL fails. A successful SLL parse of an unambiguous input is the LL parse; on the
    regression suite's and the benchmark's answers and a few thousand generated ones the
    results are identical (`tests/rewards/test_math_regression.py` checks a sample). Idempotent."""
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

    if getattr(_Latex2Sympy, "_two_stage", False):
        return
    ll_parse, create_parser = _Latex2Sympy.parse, _Latex2Sympy.create_parser

    def sll_parser(self, latex_str):
        parser = create_parser(self, latex_str)
        if getattr(self, "_sll", False):
            parser._interp.predictionMode = PredictionMode.SLL
        return parser

    def parse(self, latex_str):
        self._sll = True
        try:
            return ll_parse(self, latex_str)
        except Exception:  # a syntax error under SLL (or any failure): parse again with LL
            pass
        finally:
            self._sll = False
        return ll_parse(self, latex_str)

    _Latex2Sympy.create_parser, _Latex2Sympy.parse = sll_parser, parse
    _Latex2Sympy._two_stage = True


def _has_value(parsed: list) -> bool:
    """Whether math-verify's parse result holds a sympy object (not only the raw string)."""
    return any(not isinstance(x, str) for x in parsed)


def _tree(text: str, tree) -> list:
    """[sympy object, text] from the restricted AST walk, or [] when it rejects the text."""
    import sympy

    try:
        value = tree.build(text.replace("^", "**"))
        # latex2sympy's symbols are real; the same names must be the same symbols here.
        real = {s: sympy.Symbol(s.name, real=True) for s in value.free_symbols
                if isinstance(s, sympy.Symbol)}
        return [value.xreplace(real) if real else value, text]
    except Exception:
        return []


def _library(text: str, targets: tuple[str, ...]) -> list:
    """math-verify's LaTeX / string extraction of `text` (wrapped in `$` when bare)."""
    from math_verify import LatexExtractionConfig, StringExtractionConfig, parse

    configs = []
    if "latex" in targets:
        configs.append(LatexExtractionConfig())
    if "string" in targets:
        configs.append(StringExtractionConfig())
    if not configs:
        return []
    wrapped = text if _DELIMITED.search(text) else f"${text}$"
    return parse(wrapped, configs, parsing_timeout=None)


def parse_answer(text: str, targets: tuple[str, ...], tree) -> list:
    """The parsed forms of one answer string (a list for `math_verify.verify`; [] when
    nothing parsed). Order of attempts: see the module docstring."""
    plain = "expr" in targets and "\\" not in text and _PLAIN_SYNTAX.search(text)
    if plain:
        parsed = _tree(text, tree)
        if parsed:
            return parsed
    parsed = _library(text, targets)
    if not _has_value(parsed) and "=" in text:
        tail = _library(text.rsplit("=", 1)[1], targets)
        parsed = tail if _has_value(tail) else parsed
    if not _has_value(parsed) and "expr" in targets:
        parsed = _tree(text, tree) or parsed
    return parsed


def verdict(pred: str, gold: str, options: dict, tree) -> str:
    """math-verify's verdict on `pred` against `gold` with the config's options
    (`float_rounding`, `numeric_precision`, `strict`, `targets`, `set_relation`): "pred"
    when `pred` equals `gold`, else "". With `options["completion"]` (the final part of
    the completion `pred` was extracted from) one reading of the completion is scored,
    chosen without looking at `gold` (the rule of `rewards/_reading.py`): math-verify's
    own extraction of it when `options["later"]` (math stated after `pred`) and it has a
    value, else `pred` (`options["pred_equal"]`, when not None, is the parent's verdict on
    it), and math-verify's extraction when `pred` has no value; "completion" when that
    extraction is the reading and equals `gold`. No signal-based timeout (the worker's
    deadline bounds the job)."""
    from math_verify import verify

    targets = tuple(options.get("targets", ("latex", "expr")))
    g = parse_answer(gold, targets, tree)
    if not g:
        return ""
    settings = dict(float_rounding=int(options.get("float_rounding", 6)),
                    numeric_precision=int(options.get("numeric_precision", 15)),
                    strict=bool(options.get("strict", True)),
                    allow_set_relation_comp=bool(options.get("set_relation", True)),
                    timeout_seconds=None)
    completion = options.get("completion")
    if not isinstance(completion, str) or not completion.strip():
        completion = None
    known = options.get("pred_equal")
    if completion is not None and options.get("later"):
        theirs = _library_extract(completion, targets)
        same = isinstance(theirs[-1] if theirs else None, str) and \
            theirs[-1].strip() == pred.strip()  # the same text: the parent's verdict holds
        if _has_value(theirs) and not (same and isinstance(known, bool)):
            return "completion" if verify(g, theirs, **settings) else ""
    if isinstance(known, bool):
        return "pred" if known else ""
    p = parse_answer(pred, targets, tree)
    if completion is not None and not options.get("later") and not _has_value(p):
        theirs = _library_extract(completion, targets)  # ours has no value: theirs counts
        if _has_value(theirs):
            return "completion" if verify(g, theirs, **settings) else ""
        return "completion" if p and verify(g, p, **settings) else ""  # (not "pred": the
        # pool shares a "pred" match with other completions, which may have a value)
    return "pred" if p and verify(g, p, **settings) else ""


def _library_extract(completion: str, targets: tuple[str, ...]) -> list:
    """math-verify's own extraction from a whole completion (LaTeX / string targets, no
    wrapping: its regexes find the final answer)."""
    from math_verify import LatexExtractionConfig, StringExtractionConfig, parse

    configs = [LatexExtractionConfig()] if "latex" in targets else []
    if "string" in targets:
        configs.append(StringExtractionConfig())
    return parse(completion, configs, parsing_timeout=None) if configs else []
