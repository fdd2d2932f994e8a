r"""Math answers: extraction from a completion, equivalence with a gold answer, and the
`correctness` reward.

`is_equivalent` tries cheap decisions first and sympy last:

1. identical strings, or two plain integers (the built-in arithmetic task stops here);
2. normalized strings (`_latex.normalize`: wrappers such as `$`, `\boxed{}`, `\text{}`,
   units and spacing removed, unicode folded);
3. exact numbers (integers, decimals, fractions, `\frac`, mixed numbers, scientific
   notation, percentages, repeating decimals);
4. choice letters (`\text{(B)}` = `B`) and words (case-insensitive);
5. structures (`_latex_structures`) item by item: matrices entrywise with equal shapes,
   tuples and intervals in order, sets, lists, `\pm` pairs and unions in any order;
   inequalities in one variable as intervals;
6. relations: `x = 3` ~ `3`; equations and inequalities equal up to a constant factor;
7. sympy, in a worker process that is killed when the deadline passes (`_sympy_worker`).

Decisions:
  * Numbers compare exactly. A decimal literal with at least 6 significant digits also
    matches a value that rounds to it at its last digit (`0.333333` = 1/3, `1.41421` =
    sqrt(2)); shorter decimals are exact (`0.333` != 1/3, `1.414` != sqrt(2), `5.001` != 5).
  * Percent: `10\%` equals `10` and `0.1` (either reading); `10\%` vs `0.1\%` differ.
  * Degrees: the degree sign is dropped (`90^\circ` = `90`) and never converted to radians
    (`90^\circ` != `\frac{\pi}{2}`): the key's unit is part of the answer.
  * Unicode: NFKC plus math symbols (`−3` = `-3`, `１２３` = `123`, `½` = `1/2`, `√2`, `π`).
  * A named left side of `=` is dropped (`x = 3`, `k = 3` and `3` are equal); a relation
    whose sides are both expressions only equals a proportional relation.
  * A tuple equals a row or column vector with the same entries; a row and a column vector
    differ; `\{3\}` equals `3`.
  * Variables are assumed positive when expressions are compared numerically (sympy
    worker), so `\sqrt{x^2}` equals `x`.

Neither public function raises: anything they do not understand is "no answer" / "not
equivalent".
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from jaxrl_reason.rewards import _latex
from jaxrl_reason.rewards._latex_structures import (
    Structure,
    as_interval,
    as_relation,
    is_named,
    parse_structure,
    relation_interval,
)
from jaxrl_reason.rewards._latex_sympy import latex_to_sympy
from jaxrl_reason.rewards._sympy_worker import get_pool
from jaxrl_reason.rewards.base import RewardResult, register_reward

Verdict = Literal["equal", "different", "timeout"]

# Time budget of one sympy comparison inside the `correctness` reward. Kept below the
# default RewardPool timeout so that a slow comparison is reported as "correctness/timeout"
# by the reward itself rather than by the pool.
CORRECTNESS_TIMEOUT_S = 2.0
_MAX_INPUT_CHARS = 10_000  # longer answer strings are only compared verbatim
_MAX_SCAN_CHARS = 100_000  # extraction looks at this many final characters of a completion
_MAX_DEPTH = 8  # nesting of structures followed (sets of tuples of ...)

# ----------------------------------------------------------------------------- extraction

_GSM8K = re.compile(r"^[ \t]*####[ \t]*(\S[^\n]*?)[ \t]*$", re.M)
_STATEMENT = re.compile(
    r"(?:\b(?:final\s+answer|the\s+answer|answer)\s*(?:is|:)|^[ \t]*A:)[ \t:]*([^\n]+)",
    re.I | re.M,
)
# Span contents may not contain another opener, which keeps the scan linear.
_MATH_SPAN = re.compile(
    r"\$\$([^$]+)\$\$|\$([^$]+)\$|\\\(((?:(?!\\[()]).)+)\\\)|\\\[((?:(?!\\[\[\]]).)+)\\\]", re.S
)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    r"""The final answer of a completion, or None when it has nothing answer-like.

    Only what follows the last `</think>` is searched when that part holds an answer (so a
    `\boxed{}` in the reasoning does not count), else the whole text; of a very long text
    only the last 100,000 characters. In order of preference: the last `<answer>...</answer>`
    (its last `\boxed{}` or final-answer statement if it has one), else the last complete
    `\boxed{...}` (nested braces allowed; boxes just before it that are separated only by
    "and", commas or spaces join it: `\boxed{-2} and \boxed{1}` -> "-2,1"), else the last
    GSM8K `#### N` line, else the last
    final-answer statement ("the answer is ...", "Answer: ...", "A: ..."), else whichever of
    the last math span (`$...$`, `\(...\)`, `\[...\]`) and the last number ends later. An
    empty box or answer tag gives None. `text` is a str; anything else gives None.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        text = text[-_MAX_SCAN_CHARS:]
        think = text.rfind("</think>")
        if think >= 0:
            answer = _extract(text[think + len("</think>") :])
            if answer is not None:
                return answer
        return _extract(text)
    except Exception:
        return None


def _extract(text: str) -> str | None:
    close = text.rfind("</answer>")
    open_ = text.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ >= 0:
        inner = text[open_ + len("<answer>") : close].strip()
        boxed = _latex.final_boxed(inner)
        if boxed is not None or not inner:
            return boxed or None
        if _STATEMENT.search(inner):
            return _extract_loose(inner) or inner
        return inner
    boxed = _latex.final_boxed(text)
    if boxed is not None:
        return boxed or None
    return _extract_loose(text)


def _extract_loose(text: str) -> str | None:
    gsm = _GSM8K.findall(text)
    if gsm:
        return gsm[-1]
    statements = _STATEMENT.findall(text)
    if statements:
        answer = statements[-1]
        for _ in range(3):  # "Final Answer: The final answer is 5."
            inner = _STATEMENT.search(answer)
            if inner is None:
                break
            answer = inner.group(1)
        answer = re.split(r"\.\s", answer, maxsplit=1)[0]
        answer = re.split(r"\s(?:is|are|was|equals)\s", answer)[-1]  # "The largest $n$ is 34"
        answer = answer.strip().rstrip(".").strip()
        if answer:
            return answer
    span = None
    for span in _MATH_SPAN.finditer(text):
        pass
    number = None
    for number in _NUMBER.finditer(text):
        pass
    if span is None and number is None:
        return None
    if span is not None and (number is None or span.end() >= number.end()):
        return next(g for g in span.groups() if g is not None).strip() or None
    return number.group(0)


# ---------------------------------------------------------------------------- equivalence


def is_equivalent(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    r"""Whether two answer strings are mathematically equal (see the module docstring).

    Handles numbers, fractions, LaTeX, sets, intervals, tuples, matrices, equations (`x=3`),
    inequalities, percentages and units; either side may keep `$...$`, `\(...\)` or
    `\boxed{}` wrappers, or be a GSM8K answer ending in `#### N`. Sympy runs in a worker
    process, and the whole call returns within about `timeout_s` seconds of wall time (only
    the worker pool's first start-up, ~0.5-2 s, is not counted; call
    `_sympy_worker.get_pool().warm()` to pay it up front). Safe to call from many threads.
    Non-str inputs and timeouts give False; never raises.
    """
    return _verdict(pred, gold, timeout_s) == "equal"


def _verdict(pred: Any, gold: Any, timeout_s: float) -> Verdict:
    """`is_equivalent` with the timeout case kept apart from "different"."""
    try:
        if not isinstance(pred, str) or not isinstance(gold, str):
            return "different"
        p, g = pred.strip(), gold.strip()
        if not p or not g:
            return "different"
        if p == g:
            return "equal"
        if _latex.INT_RE.fullmatch(p) and _latex.INT_RE.fullmatch(g) and len(p) + len(g) < 800:
            return "equal" if int(p) == int(g) else "different"
        if len(p) > _MAX_INPUT_CHARS or len(g) > _MAX_INPUT_CHARS:
            return "different"
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        (a, a_pct), (b, b_pct) = _latex.normalize(p), _latex.normalize(g)
        return _compare(a, b, deadline, 0, a_pct, b_pct)
    except Exception:
        return "different"


def _compare(
    a: str, b: str, deadline: float, depth: int, a_pct: bool = False, b_pct: bool = False
) -> Verdict:
    if not a or not b or depth > _MAX_DEPTH:
        return "different"
    if a == b:
        return "equal"
    if time.monotonic() > deadline:
        return "timeout"
    verdict = _compare_numbers(a, b, a_pct, b_pct) or _compare_words(a, b)
    if verdict is not None:
        return verdict
    sa, sb = parse_structure(a), parse_structure(b)
    if sa is not None or sb is not None:
        return _compare_structures(a, b, sa, sb, deadline, depth)
    ra, rb = as_relation(a), as_relation(b)
    if ra is not None or rb is not None:
        return _compare_relations(ra, rb, a, b, deadline, depth)
    verdict = _expressions(a, b, "expr", deadline)
    if verdict == "different" and a_pct != b_pct:  # `\frac{100}{3}\%` vs `\frac13`
        a, b = (f"\\frac{{{a}}}{{100}}", b) if a_pct else (a, f"\\frac{{{b}}}{{100}}")
        verdict = _expressions(a, b, "expr", deadline)
    return verdict


def _compare_numbers(a: str, b: str, a_pct: bool, b_pct: bool) -> Verdict | None:
    """Exact comparison of two plain numbers (decimal and percent policy); None if either
    side is not a number."""
    va, vb = _latex.parse_number(a), _latex.parse_number(b)
    if va is None or vb is None:
        return None
    ta, tb = _latex.decimal_tolerance(a) or 0, _latex.decimal_tolerance(b) or 0
    readings = [(va, ta, vb, tb)]
    if a_pct and not b_pct:
        readings.append((va / 100, ta / 100, vb, tb))
    if b_pct and not a_pct:
        readings.append((va, ta, vb / 100, tb / 100))
    same = any(abs(x - y) <= max(tx, ty) for x, tx, y, ty in readings)
    return "equal" if same else "different"


_CHOICE = re.compile(r"\(?([A-Za-z])\)?")
_CHOICE_PREFIX = re.compile(r"\(([A-J])\)|([A-J])[.:)](?!\d)")


def _compare_words(a: str, b: str) -> Verdict | None:
    """Choice letters (`(B)` = `B`, `C` = `C. x = 42`) and words, case-insensitive."""
    ma, mb = _CHOICE.fullmatch(a), _CHOICE.fullmatch(b)
    if ma and mb:
        return "equal" if ma.group(1).lower() == mb.group(1).lower() else "different"
    if ma or mb:
        letter, other = (ma, b) if ma else (mb, a)
        prefix = _CHOICE_PREFIX.match(other)
        if prefix and letter.group(1).isupper() and len(other) > 2:
            return "equal" if letter.group(1) in prefix.groups() else "different"
        return None
    if re.fullmatch(r"[A-Za-z]{2,}", a) and re.fullmatch(r"[A-Za-z]{2,}", b):
        if a.lower() == b.lower():
            return "equal"
        short_products = len(a) <= 3 and len(b) <= 3 and a.islower() and b.islower()
        return None if short_products else "different"  # `ab` vs `ba` goes to sympy
    return None


# ----------------------------------------------------------------------------- structures


def _compare_structures(
    a: str, b: str, sa: Structure | None, sb: Structure | None, deadline: float, depth: int
) -> Verdict:
    kinds = {sa.kind if sa else None, sb.kind if sb else None}
    if sa is not None and sb is not None and sa.kind == sb.kind != "union":
        if sa.kind in ("tuple", "interval", "matrix"):
            if sa.ends != sb.ends or _shape(sa) != _shape(sb):
                return "different"
            return _ordered(_flat(sa), _flat(sb), deadline, depth)
        return _unordered(list(sa.items), list(sb.items), deadline, depth)
    if "matrix" in kinds:
        return _compare_matrix(a, b, sa, sb, deadline, depth)
    if kinds & {"interval", "union", None}:
        pa, pb = _union_parts(a, sa), _union_parts(b, sb)
        if pa is not None and pb is not None:
            if len(pa) == len(pb) == 1:
                ia, ib = (as_interval(p, parse_structure(p)) for p in (pa[0], pb[0]))
                if ia is None or ib is None or ia.ends != ib.ends:
                    return "different"
                return _ordered(list(ia.items), list(ib.items), deadline, depth)
            return _unordered(pa, pb, deadline, depth)
    if None in kinds:
        single, scalar, other = (sa, b, a) if sa is not None else (sb, a, b)
        relation = as_relation(scalar)
        if relation is not None and relation[1] == "=" and is_named(relation[0]):
            return _compare(relation[2], other, deadline, depth + 1)  # `(a,b) = (2,3)`
        if single.kind == "set" and len(single.items) == 1:  # `\{3\}` vs `3`
            return _compare(single.items[0], scalar, deadline, depth + 1)
        return "different"
    if kinds <= {"set", "list"}:
        return _unordered(list(sa.items), list(sb.items), deadline, depth)
    if kinds == {"tuple", "list"}:
        return _ordered(list(sa.items), list(sb.items), deadline, depth)
    return "different"


def _shape(s: Structure) -> tuple[int, ...]:
    return (len(s.items), len(s.items[0])) if s.kind == "matrix" else (len(s.items),)


def _flat(s: Structure) -> list[str]:
    return [x for row in s.items for x in row] if s.kind == "matrix" else list(s.items)


def _compare_matrix(
    a: str, b: str, sa: Structure | None, sb: Structure | None, deadline: float, depth: int
) -> Verdict:
    """A matrix against a non-matrix: a tuple/list equals a row or column vector with the
    same entries; a matrix expression (`\\frac12\\begin{pmatrix}..`) goes to sympy."""
    if sa is not None and sa.kind == "matrix":
        matrix, other, other_text = sa, sb, b
    else:
        matrix, other, other_text = sb, sa, a
    rows, cols = _shape(matrix)
    if other is not None and other.kind in ("tuple", "list") and min(rows, cols) == 1:
        if len(other.items) != rows * cols:
            return "different"
        return _ordered(_flat(matrix), list(other.items), deadline, depth)
    if other is None and "\\begin{" in other_text:
        return _expressions(a, b, "expr", deadline)
    return "different"


def _interval_text(s: Structure) -> str:
    return f"{s.ends[0]}{s.items[0]},{s.items[1]}{s.ends[1]}"


def _union_parts(s: str, st: Structure | None) -> list[str] | None:
    """The parts of a union of intervals/sets (one part for an interval or inequality; a
    list of inequalities, e.g. `x<1 or x>2`, counts as a union), else None."""
    if st is None:
        interval = relation_interval(s)
        return [_interval_text(interval)] if interval else None
    if st.kind == "union":
        return list(st.items)
    if as_interval(s, st) is not None:
        return [s]
    if st.kind == "list":
        intervals = [relation_interval(item) for item in st.items]
        if all(intervals):
            return [_interval_text(i) for i in intervals]
    return None


def _ordered(xs: list[str], ys: list[str], deadline: float, depth: int) -> Verdict:
    if len(xs) != len(ys):
        return "different"
    verdicts = []
    for x, y in zip(xs, ys):
        verdict = _compare(x, y, deadline, depth + 1)
        if verdict == "different":
            return "different"
        verdicts.append(verdict)
    return "equal" if all(v == "equal" for v in verdicts) else "timeout"


def _unordered(xs: list[str], ys: list[str], deadline: float, depth: int) -> Verdict:
    """Greedy one-to-one matching of two collections (`\\pm` already expanded)."""
    if len(xs) != len(ys):
        return "different"
    unmatched, timed_out = list(ys), False
    for x in xs:
        for j, y in enumerate(unmatched):
            verdict = _compare(x, y, deadline, depth + 1)
            timed_out |= verdict == "timeout"
            if verdict == "equal":
                del unmatched[j]
                break
        else:
            return "timeout" if timed_out else "different"
    return "equal"


# ------------------------------------------------------------------------------ relations


def _compare_relations(
    ra: tuple[str, str, str] | None,
    rb: tuple[str, str, str] | None,
    a: str,
    b: str,
    deadline: float,
    depth: int,
) -> Verdict:
    """Relations from `as_relation` (lhs, op, rhs), at least one not None."""
    if ra is None or rb is None:
        (lhs, op, rhs), other = (ra, b) if ra is not None else (rb, a)
        if op == "=" and is_named(lhs):
            return _compare(rhs, other, deadline, depth + 1)
        return "different"
    (la, op, ra_), (lb, op_b, rb_) = ra, rb
    if op != op_b:
        return "different"
    if op == "=" and is_named(la) and is_named(lb):
        return _compare(ra_, rb_, deadline, depth + 1)
    if la == lb and op != "=":
        return _compare(ra_, rb_, deadline, depth + 1)
    converted = [latex_to_sympy(x) for x in (la, ra_, lb, rb_)]
    if None in converted:
        return "different"
    ca, cb = f"({converted[0]})-({converted[1]})", f"({converted[2]})-({converted[3]})"
    return _sympy(ca, cb, "eq" if op in ("=", "!=") else "rel", 0.0, deadline)


# ---------------------------------------------------------------------------------- sympy


def _expressions(a: str, b: str, mode: str, deadline: float) -> Verdict:
    """Compare two normalized LaTeX expressions with sympy."""
    ca, cb = latex_to_sympy(a), latex_to_sympy(b)
    if ca is None or cb is None:
        return "different"
    atol = _latex.decimal_tolerance(a) or _latex.decimal_tolerance(b) or 0
    return _sympy(ca, cb, mode, float(atol), deadline)


def _sympy(ca: str, cb: str, mode: str, atol: float, deadline: float) -> Verdict:
    """Run one comparison of sympy strings in a worker process, within the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return "timeout"
    result = get_pool().compare(ca, cb, mode, atol, remaining)
    if result is None:
        return "timeout"
    return "equal" if result else "different"


# ----------------------------------------------------------------------------------- reward


@register_reward("correctness")
def correctness(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff the extracted answer of `completion` is equivalent to `example["answer"]`.

    `example["answer"]` may be a bare key, a MATH solution with `\\boxed{}` or a GSM8K
    solution ending in `#### N`. Reasons for 0.0: "no_answer" (nothing extractable),
    "wrong", "timeout" (sympy did not decide within CORRECTNESS_TIMEOUT_S). Raises
    ValueError when `example` has no "answer".
    """
    if "answer" not in example:
        raise ValueError(f"correctness: example has no 'answer' key (keys: {sorted(example)})")
    pred = extract_answer(completion)
    if pred is None:
        return RewardResult(0.0, "no_answer")
    verdict = _verdict(pred, str(example["answer"]), CORRECTNESS_TIMEOUT_S)
    if verdict == "equal":
        return RewardResult(1.0)
    return RewardResult(0.0, "wrong" if verdict == "different" else "timeout")
