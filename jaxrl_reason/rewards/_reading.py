r"""One answer per completion: which reading of a completion the `correctness` reward scores.

A completion has two readings: ours (`math.extract_answer`: the last answer tag, else the
last box, else the last GSM8K line, else the last final-answer statement, else a bare
last line, else the later of the last math span and the last number) and math-verify's
own extraction of its final part (`final_part`; its LaTeX extraction prefers a "final
answer is" statement, then a box, then the last math span). Scoring a completion as right
when either reading matches would reward hedging: `$7$ or the answer: 3 apples` scored
1.0 against gold 3 and against gold 7. The rule, which never looks at the gold answer:

1. When both readings are the same text (`read_alike`: an answer tag, a single box with no
   "final answer ... is" after it, our answer is the last math span with nothing after
   it), ours is the answer.
2. Else, when math is stated after our answer (`stated_after`: a `$`, `\(`, `\)`, `\[`,
   `\]`, `\boxed` or `\fbox` after the last occurrence of our answer's text in the final
   part), math-verify's reading is the answer when it has a value (the last stated
   candidate: `So $\boxed{200}$ first. The final answer is $10,455$.` reads 10455, `The
   answer is 3. Or maybe $7$.` reads 7), else ours.
3. Else ours is the answer (it is stated last: `$7$ or the answer: 3 apples` reads 3), and
   math-verify's reading is used only when ours has no value (math-verify cannot parse
   it; the parent's number and word rules count as a value).

So a completion is right for at most one answer, whatever the gold: a list of candidates
joined into one answer (`\boxed{3} or \boxed{7}` -> `3,7`, `3 or 7`) is a list, equal to
the gold list `3, 7` and to neither 3 nor 7. The parent applies rule 3 itself; rule 2
and the fallback of rule 3 run in the worker (`_latex_verify.verdict`, with the request
options `later` and `pred_equal`).
"""
from __future__ import annotations

import re

from jaxrl_reason.rewards import latex

FINAL_CHARS = 4000  # of a completion's final part handed to math-verify's extraction
# Span contents may not contain another opener, which keeps the scan linear.
MATH_SPAN = re.compile(
    r"\$\$([^$]+)\$\$|\$([^$]+)\$|\\\(((?:(?!\\[()]).)+)\\\)|\\\[((?:(?!\\[\[\]]).)+)\\\]", re.S
)
_MATH_MARKS = ("$", "\\(", "\\)", "\\[", "\\]", "\\boxed", "\\fbox")
_DIGIT_OR_MATH = re.compile(r"[\d\\$]")


def final_part(text: str) -> str:
    """What follows the last `</think>` (the whole text without one), its last
    `FINAL_CHARS` characters, unicode folded."""
    think = text.rfind("</think>")
    tail = text[think + len("</think>"):] if think >= 0 else text
    return latex.clean_unicode(tail[-FINAL_CHARS:])


def unwrap(text: str) -> str:
    r"""`text` without math delimiters around the whole of it (`$x$`, `$$x$$`, `\(x\)`,
    `\[x\]` -> `x`): the same answer to every layer, and one cache entry for its spellings."""
    whole = MATH_SPAN.fullmatch(text)
    if whole is None:
        return text
    return next(group for group in whole.groups() if group is not None).strip() or text


def read_alike(final: str, pred: str) -> bool:
    r"""Whether math-verify's own extraction of the completion's `final` part would read the
    answer we extracted, `pred`: an answer tag, or a single `\boxed{}` with no "final answer
    ... is" statement after it (math-verify prefers such a statement to a box, and joins the
    boxes of several spans), or `pred` is the last math span of `final` with no digit,
    backslash or `$` after it (math-verify's LaTeX extraction takes that span too). Then the
    completion has one reading, and the worker does not parse it again."""
    if "</answer>" in final:
        return True
    boxes = final.count("\\boxed") + final.count("\\fbox")
    if boxes:
        box = max(final.rfind("\\boxed"), final.rfind("\\fbox"))
        return boxes == 1 and not final_answer_is(final[box:])
    last = None
    for last in MATH_SPAN.finditer(final):
        pass
    if last is None or _DIGIT_OR_MATH.search(final, last.end()):
        return False
    return unwrap(last.group(0)) == unwrap(pred.strip())


def final_answer_is(text: str) -> bool:
    """Whether `text` has math-verify's "final answer ... is" anchor: "final answer"
    (any case) with " is" within the next 100 characters. Linear: one `str.find` per
    occurrence."""
    lower = text.lower()
    start = lower.find("final answer")
    while start >= 0:
        end = start + len("final answer")
        window = lower[end:end + 104]
        if any(window.find(ws + "is", 0, 102) >= 0 for ws in (" ", "\n", "\t")):
            return True
        start = lower.find("final answer", end)
    return False


def stated_after(final: str, pred: str) -> bool:
    r"""Whether the completion's `final` part states math after our answer `pred` (rule 2
    of the module docstring): a `$`, `\(`, `\)`, `\[`, `\]`, `\boxed` or `\fbox` after the
    end of the last occurrence of `pred` (unicode folded like `final`). An answer `final`
    does not hold verbatim (joined boxes, an answer tag before the final part) counts as
    stated last."""
    if len(pred) > 2 * len(final):  # cannot occur in `final`, even folded
        return False
    text = latex.clean_unicode(pred.strip())
    at = final.rfind(text) if text else -1
    if at < 0:
        return False
    tail = final[at + len(text):]
    return any(mark in tail for mark in _MATH_MARKS)
