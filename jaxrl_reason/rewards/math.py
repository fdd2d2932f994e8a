r"""Math answers: extraction from a completion, equivalence with a gold answer, and the
`correctness` reward.

`is_equivalent` tries cheap decisions first and sympy last:

1. identical strings, or two plain integers (the built-in arithmetic task stops here);
2. normalized strings (wrappers such as `$`, `\boxed{}`, `\text{}` and units removed);
3. exact numbers (integers, decimals, fractions, `\frac`, mixed numbers, scientific
   notation, percentages);
4. structures (tuples, intervals, sets, unions, lists, `\pm`) element by element;
5. sympy, in a worker process that is killed when the deadline passes (`_sympy_worker`).

Neither public function raises: anything they do not understand is "no answer" / "not
equivalent".
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from jaxrl_reason.rewards import _latex
from jaxrl_reason.rewards._sympy_worker import get_pool
from jaxrl_reason.rewards.base import RewardResult, register_reward

Verdict = Literal["equal", "different", "timeout"]

# Time budget of one sympy comparison inside the `correctness` reward. Kept below the
# default RewardPool timeout so that a slow comparison is reported as "correctness/timeout"
# by the reward itself rather than by the pool.
CORRECTNESS_TIMEOUT_S = 2.0
_MAX_INPUT_CHARS = 20_000  # longer answer strings are only compared verbatim

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

    In order of preference: the last complete `\boxed{...}` (nested braces allowed), else
    the last `<answer>...</answer>`, else the last GSM8K `#### N` line, else the last
    final-answer statement ("the answer is ...", "Answer: ...", "A: ..."), else whichever
    of the last math span (`$...$`, `\(...\)`, `\[...\]`) and the last number ends later.
    An empty box or answer tag gives None. `text` is a str; anything else gives None.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        return _extract(text)
    except Exception:
        return None


def _extract(text: str) -> str | None:
    boxed = _latex.last_boxed(text)
    if boxed is not None:
        return boxed or None
    close = text.rfind("</answer>")
    open_ = text.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ >= 0:
        return text[open_ + len("<answer>") : close].strip() or None
    gsm = _GSM8K.findall(text)
    if gsm:
        return gsm[-1]
    statements = _STATEMENT.findall(text)
    if statements:
        answer = re.split(r"\.\s", statements[-1], maxsplit=1)[0].strip().rstrip(".").strip()
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
    r"""Whether two answer strings are mathematically equal.

    Handles numbers, fractions, LaTeX, sets, intervals, tuples, equations (`x=3`),
    percentages and units; either side may keep `$...$`, `\(...\)` or `\boxed{}` wrappers.
    Sympy runs in a worker process, and the whole call returns within about `timeout_s`
    seconds of wall time (a worker process's one-time start-up, ~0.5 s, is not counted).
    Safe to call from many threads. Non-str inputs and timeouts give False; never raises.
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
        return _compare(a, b, a_pct, b_pct, deadline)
    except Exception:
        return "different"


def _compare(a: str, b: str, a_pct: bool, b_pct: bool, deadline: float) -> Verdict:
    if not a or not b:
        return "different"
    if a == b:
        return "equal"
    va, vb = _latex.parse_number(a), _latex.parse_number(b)
    if va is not None and vb is not None:
        same = va == vb or (a_pct and va / 100 == vb) or (b_pct and vb / 100 == va)
        return "equal" if same else "different"
    if re.fullmatch(r"\(?[A-Za-z]\)?", a) and re.fullmatch(r"\(?[A-Za-z]\)?", b):
        return "equal" if a.strip("()").lower() == b.strip("()").lower() else "different"
    if re.fullmatch(r"[A-Za-z]{2,}", a) and re.fullmatch(r"[A-Za-z]{2,}", b):
        return "equal" if a.lower() == b.lower() else "different"
    sa, sb = _structure(a), _structure(b)
    if sa is not None or sb is not None:
        if sa is None or sb is None:
            return "different"
        return _compare_structures(sa, sb, deadline)
    if a.count("=") == 1 and b.count("=") == 1:
        (la, ra), (lb, rb) = a.split("="), b.split("=")
        return _sympy(f"({la})-({ra})", f"({lb})-({rb})", True, deadline)
    if "=" in a or "=" in b:
        return "different"
    return _sympy(a, b, False, deadline)


_OPEN, _CLOSE = "([{", ")]}"


def _split_top(s: str, sep: str) -> list[str]:
    r"""Split `s` on `sep` outside brackets (`\{ \}` count as brackets)."""
    parts, depth, start, pos = [], 0, 0, 0
    while pos < len(s):
        if s.startswith(sep, pos) and depth == 0:
            parts.append(s[start:pos])
            pos += len(sep)
            start = pos
            continue
        if s[pos] in _OPEN:
            depth += 1
        elif s[pos] in _CLOSE:
            depth -= 1
        pos += 1
    parts.append(s[start:])
    return parts


def _encloses(s: str) -> bool:
    """Whether the bracket opening `s` is closed by the last character (and not before)."""
    depth = 0
    for pos, ch in enumerate(s):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0 and pos != len(s) - 1:
                return False
    return depth == 0


def _structure(s: str) -> tuple[str, list[str]] | None:
    r"""(kind, items) for a set, tuple, interval, union, list or `\pm` pair; None for a scalar.

    Kinds: "set" and "list" are unordered, "tuple" and "interval" + bracket pair ordered,
    "union" an unordered collection of intervals.
    """
    union = _split_top(s, "\\cup")
    if len(union) > 1:
        return "union", union
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", [p for p in _split_top(s[2:-2], ",") if p]
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _encloses(s):
        items = _split_top(s[1:-1], ",")
        if len(items) >= 2:
            return ("tuple" if s[0] + s[-1] == "()" else "interval" + s[0] + s[-1]), items
        return None
    items = _split_top(s, ",")
    if len(items) >= 2:
        return "list", items
    for sign in ("\\pm", "\\mp"):
        if s.count(sign) == 1:
            return "list", [s.replace(sign, "+"), s.replace(sign, "-")]
    return None


def _compare_structures(
    sa: tuple[str, list[str]], sb: tuple[str, list[str]], deadline: float
) -> Verdict:
    (ka, ia), (kb, ib) = sa, sb
    kinds = {ka, kb}
    if len(ia) != len(ib) or not (ka == kb or kinds in ({"set", "list"}, {"tuple", "list"})):
        return "different"
    if not kinds <= {"set", "list", "union"}:
        return _all([_compare(x, y, False, False, deadline) for x, y in zip(ia, ib)])
    unmatched = list(ib)
    timed_out = False
    for x in ia:
        for j, y in enumerate(unmatched):
            v = _compare(x, y, False, False, deadline)
            timed_out |= v == "timeout"
            if v == "equal":
                del unmatched[j]
                break
        else:
            return "timeout" if timed_out else "different"
    return "equal"


def _all(verdicts: list[Verdict]) -> Verdict:
    if all(v == "equal" for v in verdicts):
        return "equal"
    return "different" if "different" in verdicts else "timeout"


_SYMPY_SAFE = re.compile(r"[\w\s+\-*/().,!<>=]*")


def _sympy(a: str, b: str, eq: bool, deadline: float) -> Verdict:
    """Compare two normalized LaTeX strings with sympy in a worker process."""
    ca, cb = _latex.latex_to_sympy(a), _latex.latex_to_sympy(b)
    if ca is None or cb is None or not _SYMPY_SAFE.fullmatch(ca) or not _SYMPY_SAFE.fullmatch(cb):
        return "different"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return "timeout"
    result = get_pool().compare(ca, cb, eq, remaining)
    if result is None:
        return "timeout"
    return "equal" if result else "different"


# ----------------------------------------------------------------------------------- reward


@register_reward("correctness")
def correctness(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff the extracted answer of `completion` is equivalent to `example["answer"]`.

    Reasons for 0.0: "no_answer" (nothing extractable), "wrong", "timeout" (sympy did not
    decide within CORRECTNESS_TIMEOUT_S). Raises ValueError when `example` has no "answer".
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
