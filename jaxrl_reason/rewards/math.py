r"""Math answers: extraction from a completion, equivalence with a gold answer, and the
`correctness` reward.

Which layer decides what (`is_equivalent`, cheapest first):

1. this module: identical strings and two plain integers (the built-in arithmetic task
   stops here); unicode folding (`latex.clean_unicode`: NFKC plus math symbols, `−3` =
   `-3`, `１２３` = `123`, `½`, `√2`, `π`) and space thousands separators (`2 500`), which
   math-verify lacks;
2. this module, on the normalized strings (`latex.normalize`): pairs of plain numbers
   (integers, decimals, fractions, mixed numbers, scientific notation, percentages,
   repeating decimals) with the exact-decimal rule below; choice letters (`\text{(B)}` =
   `B`, `C` = `C. x = 42`) and single words (case-insensitive);
3. math-verify (`math_verify.parse` with its LaTeX grammar, `latex2sympy2_extended`, then
   `math_verify.verify`) for everything else: expressions, equation chains (`\sqrt{9} = 3`
   ~ `3`), labelled answers (`PQ=3, RS=8` ~ `3, 8`), sets, tuples, intervals, inequalities
   against intervals, matrices, `\pm`. It runs in a sympy worker job (`_sympy_worker`,
   `_latex_verify`), killed when it has used its CPU time (`CORRECTNESS_TIMEOUT_S` in the
   reward: the answer's own cost, whatever the machine's load); its own signal timeouts are
   off. Plain
   expressions (`sqrt(2)/2`, `x**2`) are parsed by our `_sympy_tree`, never by
   math-verify's `parse_expr` path, and bare answers without `$` (`\tfrac83`, `4, 12, 2`)
   are wrapped before the library sees them. In a `RewardPool`, `correctness_prefetch`
   first runs layers 1-2 on the whole batch and sends what is left to a few worker jobs of
   many comparisons each (sorted by gold, so each job parses a gold answer once); the
   per-answer calls then find their verdicts (see docs/security.md for what a hostile
   answer can do to the other comparisons of its job).

Untrusted text in the parent: every step before a worker job is linear in its input
(`tests/security/test_linear_text.py` times each regex on adversarial strings), extraction
reads at most the last `_MAX_SCAN_CHARS` characters, longer answers than `_MAX_INPUT_CHARS`
are compared verbatim only, and an answer or gold holding a number sympy would expand for
seconds is "different" before any job (`_oversized`: a bound computed on the answer's
parse tree). A completion is scored by one reading, never by whichever matches
(`_reading`).

Conventions:
  * Plain numbers compare exactly. A decimal literal with at least 6 significant digits
    also matches a value that rounds to it at its last digit (`0.333333` = 1/3); shorter
    decimals are exact (`0.333` != 1/3, `5.001` != 5). A decimal against an expression
    (`1.41421` vs `\sqrt2`) is math-verify's rule: equal after rounding to `float_rounding`
    decimal places.
  * Percent: `10\%` equals `10` and `0.1` (either reading); `10\%` vs `0.1\%` differ.
  * Degrees: the degree sign is dropped (`90^\circ` = `90`) and never converted to radians.
  * `strict=True` (math-verify's strict mode): variables matter and a set is not a tuple.

Options (`rewards.options.correctness`, also used by `eval` and the distillation filter):
`float_rounding`, `numeric_precision`, `strict` (math-verify's `verify` arguments),
`targets` (extraction targets: "latex", "expr" for plain expressions through `_sympy_tree`,
"string" for math-verify's string/letter extraction) and `set_relation` (math-verify's
`allow_set_relation_comp`: an inequality may equal an interval).

Neither public function raises: anything they do not understand is "no answer" / "not
equivalent".
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jaxrl_reason.rewards import latex
from jaxrl_reason.rewards._oversized import oversized as _oversized
from jaxrl_reason.rewards._reading import MATH_SPAN as _MATH_SPAN
from jaxrl_reason.rewards._reading import final_part as _final_part
from jaxrl_reason.rewards._reading import read_alike as _read_alike
from jaxrl_reason.rewards._reading import stated_after as _stated_after
from jaxrl_reason.rewards._reading import unwrap as _unwrap
from jaxrl_reason.rewards._sympy_worker import UNSCORED, get_pool
from jaxrl_reason.rewards.base import RewardResult, limit_scale, register_reward

# "timeout": the comparison used up its own CPU time (a verdict of the answer's cost);
# "unscored": not decided within the wall-clock backstop (the machine, not the answer).
Verdict = Literal["equal", "different", "timeout", "unscored"]

# CPU time of one sympy comparison inside the `correctness` reward (the job's own CPU time,
# not wall time: see `_sympy_worker`), scaled by the reward pool's `limit_scale()` (an
# evaluation retries an undecided answer with a longer limit). A comparison that uses it
# up is "correctness/timeout"; one the wall-clock backstop (`_sympy_worker.wall_backstop`)
# abandons is "correctness/unscored".
CORRECTNESS_TIMEOUT_S = 2.0
_MAX_INPUT_CHARS = 10_000  # longer answer strings are only compared verbatim
_MAX_SCAN_CHARS = 100_000  # extraction looks at this many final characters of a completion
# math-verify's defaults, except `set_relation` (an inequality may equal an interval).
DEFAULT_OPTIONS = {"float_rounding": 6, "numeric_precision": 15, "strict": True,
                   "targets": ("latex", "expr"), "set_relation": True}
_TARGETS = ("latex", "expr", "string")


def verifier_options(**options: Any) -> dict:
    """`DEFAULT_OPTIONS` updated with `options`, checked: `float_rounding` int in [0, 50],
    `numeric_precision` int in [1, 1000], `strict` / `set_relation` bool, `targets` a
    non-empty list of "latex", "expr", "string". Raises ValueError naming the bad option."""
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ValueError(f"unknown math verifier option(s) {unknown}; known: "
                         f"{sorted(DEFAULT_OPTIONS)}")
    out = {**DEFAULT_OPTIONS, **options}
    for name, low, high in (("float_rounding", 0, 50), ("numeric_precision", 1, 1000)):
        value = out[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"math verifier option {name}={value!r}: need an int in "
                             f"[{low}, {high}]")
    for name in ("strict", "set_relation"):
        if not isinstance(out[name], bool):
            raise ValueError(f"math verifier option {name}={out[name]!r}: need a bool")
    targets = out["targets"]
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets or \
            any(t not in _TARGETS for t in targets):
        raise ValueError(f"math verifier option targets={targets!r}: need a non-empty list "
                         f"of {list(_TARGETS)}")
    out["targets"] = tuple(dict.fromkeys(targets))
    return out


_DEFAULTS_CHECKED = verifier_options()

# ----------------------------------------------------------------------------- extraction

_STATEMENT = re.compile(
    r"(?:\b(?:final\s+answer|the\s+answer|answer)\s*(?:is|:)|^[ \t]*A:)[ \t:]*([^\n]+)",
    re.I | re.M,
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
    final-answer statement ("the answer is ...", "Answer: ...", "A: ..."), else a last line
    that is a bare undelimited answer (`\tfrac83`, `4, 12, 2`), else whichever of the last
    math span (`$...$`, `\(...\)`, `\[...\]`) and the last number ends later. An
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
        boxed = latex.final_boxed(inner)
        if boxed is not None or not inner:
            return boxed or None
        if _STATEMENT.search(inner):
            return _extract_loose(inner) or inner
        return inner
    boxed = latex.final_boxed(text)
    if boxed is not None:
        return boxed or None
    return _extract_loose(text)


def _gsm8k_answer(text: str) -> str | None:
    r"""What follows `####` on the last line that starts with it (after spaces or tabs), past
    spaces and tabs, when it starts with a non-space character; trailing spaces and tabs
    dropped. One pass over the lines (the regex `^[ \t]*####[ \t]*(\S[^\n]*?)[ \t]*$` it
    replaces backtracked quadratically on a long run of spaces)."""
    if "####" not in text:
        return None
    for line in reversed(text.split("\n")):
        head = line.lstrip(" \t")
        if head.startswith("####"):
            rest = head[4:].lstrip(" \t")
            if rest and not rest[0].isspace():
                return rest.rstrip(" \t")
    return None


def _extract_loose(text: str) -> str | None:
    gsm = _gsm8k_answer(text)
    if gsm is not None:
        return gsm
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
        answer = _prose_number(answer.strip().rstrip(".").strip())
        if answer:
            return answer
    span = None
    for span in _MATH_SPAN.finditer(text):
        pass
    number = None
    for number in _NUMBER.finditer(text):
        pass
    tail = _bare_tail(text)
    if tail is not None and all(m is None or tail.end() >= m.end() for m in (span, number)):
        return tail.group(0).strip()
    if span is None and number is None:
        return None
    if span is not None and (number is None or span.end() >= number.end()):
        return next(g for g in span.groups() if g is not None).strip() or None
    return number.group(0)


_PROSE_CHARS = 200  # of a final-answer statement that `_prose_number` looks at


def _prose_number(answer: str) -> str:
    """A final-answer statement that is a sentence (two prose words or more, no math
    delimiter or LaTeX command) with exactly one number reads as that number ("Jane started
    growing Sphere 3 hours ago" -> "3", as math-verify's anchored number extraction reads
    it); any other statement is returned as it is. Looks at the first `_PROSE_CHARS`
    characters only."""
    head = answer[:_PROSE_CHARS]
    if len(answer) > _PROSE_CHARS or "$" in head or "\\" in head:
        return answer
    words = itertools.islice(_PROSE_WORD.finditer(head), 2)
    numbers = list(itertools.islice(_NUMBER.finditer(head), 2))
    if len(list(words)) < 2 or len(numbers) != 1:
        return answer
    return numbers[0].group(0)


_BARE_LINE = re.compile(r"[\w\\{}()\[\],;+\-*/^=.:<>|!% ]{1,200}")
# A word of prose: lower-case or capitalised, two letters or more, not a LaTeX command
# (`PQ`, `RS`, `x`, `\frac` are not prose).
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Z]?[a-z]{2,}(?![A-Za-z])")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{\w+\*?\}")
_CLOSING = re.compile(r"\\[\])]")


def _bare_tail(text: str) -> re.Match | None:
    r"""The last line of `text` when it is an undelimited math answer (`\tfrac83`,
    `4, 12, 2`, `4+5`, `PQ=3, RS=8`): only digits, letters, LaTeX commands, brackets and
    operators, no prose word (`_PROSE_WORD`; environment names do not count), no closing
    `\]` or `\)`, at least one digit or command.
    Returns the match of the stripped line (without a final period), else None."""
    end = len(text.rstrip())
    start = text.rfind("\n", 0, end) + 1
    line = text[start:end].rstrip(".").strip()
    if not line or _CLOSING.search(line) or _PROSE_WORD.search(_ENVIRONMENT.sub(" ", line)) \
            or not re.search(r"\d|\\[A-Za-z]", line):
        return None
    offset = text.index(line, start)
    return _BARE_LINE.fullmatch(text, offset, offset + len(line))


# ---------------------------------------------------------------------------- equivalence

_SPACED_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:(?:\s|\\[,;: ]|~)+\d{3})+(?:\.\d+)?")
_SQRT_PAREN = re.compile(r"\\sqrt\s*\(([^(){}]*)\)")


def _fold(text: str) -> str:
    """Unicode folded (`latex.clean_unicode`), `2 500` / `2\\,500` spelled `2500` and
    `\\sqrt(2)` spelled `\\sqrt{2}`."""
    text = _SQRT_PAREN.sub(r"\\sqrt{\1}", latex.clean_unicode(text).strip())
    if _SPACED_THOUSANDS.fullmatch(text):
        text = re.sub(r"\s|\\[,;: ]|~", "", text)
    return text


def is_equivalent(pred: str, gold: str, timeout_s: float = 5.0, **options: Any) -> bool:
    r"""Whether two answer strings are mathematically equal (see the module docstring).

    Handles numbers, fractions, LaTeX, sets, intervals, tuples, matrices, equations (`x=3`),
    inequalities, percentages and units; either side may keep `$...$`, `\(...\)` or
    `\boxed{}` wrappers, or be a GSM8K answer ending in `#### N`. `options`: see
    `verifier_options` (ValueError on a bad one). math-verify runs in a worker process and
    may use `timeout_s` seconds of its own CPU time; the call returns within the wall-clock
    backstop `_sympy_worker.wall_backstop(timeout_s)` at most (the worker pool's first
    start-up, ~1-3 s, is not counted; call `_sympy_worker.get_pool().warm()` to pay it up
    front). Safe to call from many threads. Non-str inputs, timeouts and comparisons left
    undecided at the backstop give False (`equivalence_verdict` tells these apart).
    """
    opts = verifier_options(**options) if options else _DEFAULTS_CHECKED
    return _verdict(pred, gold, timeout_s, opts) == "equal"


def equivalence_verdict(pred: Any, gold: Any, timeout_s: float = 5.0,
                        **options: Any) -> Verdict:
    """`is_equivalent`'s verdict: "equal", "different", "timeout" (the comparison used up
    `timeout_s` seconds of its CPU time) or "unscored" (not decided within the wall-clock
    backstop: retry it with a longer limit rather than count it as different)."""
    opts = verifier_options(**options) if options else _DEFAULTS_CHECKED
    return _verdict(pred, gold, timeout_s, opts)


def _verdict(pred: Any, gold: Any, timeout_s: float, options: dict | None = None,
             completion: str | None = None) -> Verdict:
    """`is_equivalent` with the timeout and unscored cases kept apart from "different";
    `completion`: see `_parent_verdict`."""
    decided = _parent_verdict(pred, gold, options, completion)
    if isinstance(decided, str):
        return decided
    return _library(*decided, max(0.0, float(timeout_s)))


def _parent_verdict(pred: Any, gold: Any, options: dict | None = None,
                    completion: str | None = None) -> Verdict | tuple:
    """The verdict of the parent's own layers (1-2 of the module docstring), or, when the
    worker decides, its request `(pred, gold, options, completion)` for `_library` (folded
    answer texts). Answers longer than `_MAX_INPUT_CHARS` are only compared verbatim.
    `completion`: the final part of the completion `pred` came from, when math-verify may
    read it differently (one answer per completion, `_reading`): "equal" is final unless
    math is stated after `pred`; the rest goes to the worker with the options `later`
    (math stated after `pred`) and `pred_equal` (True when the parent found `pred` equal,
    else None: math-verify judges `pred` again, as without a completion)."""
    try:
        if not isinstance(pred, str) or not isinstance(gold, str):
            return "different"
        pred, gold = pred.strip(), gold.strip()
        if len(pred) > _MAX_INPUT_CHARS or len(gold) > _MAX_INPUT_CHARS:
            return "equal" if pred == gold else "different"
        p, g = _unwrap(pred), _unwrap(gold)
        if not p or not g:
            return "different"
        own, p, g = _own_verdict(p, g)
        options = options or _DEFAULTS_CHECKED
        later = completion is not None and _stated_after(completion, pred)
        if own == "equal" and not later or own == "different" and completion is None:
            return own
        if own == "different" and not later and latex.INT_RE.fullmatch(p) and \
                latex.INT_RE.fullmatch(g):
            return own  # the completion's reading is this integer: nothing to judge again
        if _oversized(p) or _oversized(g):  # not expanded: "different"
            return "different"
        if completion is not None:
            options = {**options, "later": later, "pred_equal": own == "equal" or None}
        return (p, g, options, completion)
    except Exception:
        return "different"


def _own_verdict(p: str, g: str) -> tuple[Verdict | None, str, str]:
    """Layers 1-2 on two unwrapped answers: ("equal", "different" or None when only
    math-verify can tell, and the two answers folded)."""
    if p == g:
        return "equal", p, g
    if latex.INT_RE.fullmatch(p) and latex.INT_RE.fullmatch(g) and len(p) + len(g) < 800:
        return ("equal" if int(p) == int(g) else "different"), p, g
    p, g = _fold(p), _fold(g)
    (a, a_pct), (b, b_pct) = latex.normalize(p), latex.normalize(g)
    if a and a == b:
        return "equal", p, g
    return _compare_numbers(a, b, a_pct, b_pct) or _compare_words(a, b), p, g


def _compare_numbers(a: str, b: str, a_pct: bool, b_pct: bool) -> Verdict | None:
    """Exact comparison of two plain numbers (decimal and percent policy); None if either
    side is not a number."""
    va, vb = latex.parse_number(a), latex.parse_number(b)
    if va is None or vb is None:
        return None
    ta, tb = latex.decimal_tolerance(a) or 0, latex.decimal_tolerance(b) or 0
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



def _library(pred: str, gold: str, options: dict, completion: str | None,
             cpu_s: float) -> Verdict:
    """math-verify's verdict on the folded answer texts, in a worker job (`_latex_verify`)
    allowed `cpu_s` seconds of its own CPU time (and the default wall-clock backstop); with
    `completion` (the final part of the text `pred` came from), the worker scores the one
    reading of it that `_reading` names (ours or math-verify's own extraction)."""
    if cpu_s <= 0:
        return "timeout"
    a, b, mode, atol, request = _worker_request(pred, gold, options, completion)
    result = get_pool().compare(a, b, mode, atol, cpu_s, request, detail=True)
    if result is None:
        return "timeout"
    if result == UNSCORED:
        return "unscored"
    return "equal" if result is True else "different"


def _worker_request(pred: str, gold: str, options: dict, completion: str | None) -> tuple:
    """The `SympyPool` request `(a, b, mode, atol, options)` of a math-verify comparison."""
    return (pred, gold, "mv", 0.0,
            {**options, "targets": list(options["targets"]), "completion": completion})


# ----------------------------------------------------------------------------------- reward


def _options_key(opts: dict) -> tuple:
    """A hashable form of checked verifier options."""
    return tuple(sorted(opts.items()))


def _prepare(completion: str, gold: str, opts: dict) -> Verdict | tuple | None:
    """The parent-side part of `correctness`: None (no answer), a final verdict, or the
    worker request for `_library` (see `_parent_verdict`)."""
    pred = extract_answer(completion)
    if pred is None:
        return None
    final = _final_part(completion)
    return _parent_verdict(pred, gold, opts, None if _read_alike(final, pred) else final)


# Parent-side results of the batch `correctness_prefetch` last prepared, (completion, gold,
# options) -> `_prepare`'s result, read by the `correctness` calls that follow (a repeated
# completion too); the next prefetch replaces them, so they hold one batch at most.
_PREPARED: dict = {}
_PREPARED_LOCK = threading.Lock()
_MISSING = object()
# Comparisons per batch job: more share more of a fork's cost and caches; fewer leave
# more jobs for the threads to run side by side.
_BATCH_JOB_SIZE = 64


@register_reward("correctness")
def correctness(completion: str, example: Mapping[str, Any], *, float_rounding: int = 6,
                numeric_precision: int = 15, strict: bool = True,
                targets: Sequence[str] = ("latex", "expr"),
                set_relation: bool = True) -> RewardResult:
    """1.0 iff the extracted answer of `completion` is equivalent to `example["answer"]`.

    `example["answer"]` may be a bare key, a MATH solution with `\\boxed{}` or a GSM8K
    solution ending in `#### N`. The keyword options (bound from
    `rewards.options.correctness`) are math-verify's: see `verifier_options`. Reasons for
    0.0: "no_answer" (nothing extractable), "wrong", "timeout" (the comparison used up its
    CPU time, CORRECTNESS_TIMEOUT_S times the pool's `limit_scale()`), "unscored" (not
    decided within the wall-clock backstop: the machine, not the answer). Raises
    ValueError when `example` has no "answer" or an option is invalid. One answer per
    completion (`_reading`): where our extraction and math-verify's may read a completion
    differently (anything but an answer tag, a lone `\\boxed{}` without a "final answer
    ... is" statement after it, or a final math span: `_read_alike`), the completion is
    scored by one of the two readings, chosen without looking at the gold: math-verify's
    when math is stated after our answer, else ours (math-verify's only when ours has no
    value). So a hedging completion (`$7$ or the answer: 3 apples`) is right for at most
    one gold answer. In a `RewardPool`, the batch is first prepared by
    `correctness_prefetch` (the `prefetch` attribute).
    """
    opts = verifier_options(float_rounding=float_rounding, numeric_precision=numeric_precision,
                            strict=strict, targets=tuple(targets), set_relation=set_relation)
    if "answer" not in example:
        raise ValueError(f"correctness: example has no 'answer' key (keys: {sorted(example)})")
    gold = str(example["answer"])
    cpu_s = CORRECTNESS_TIMEOUT_S * limit_scale()
    key = (completion, gold, _options_key(opts))
    with _PREPARED_LOCK:
        prepared = _PREPARED.get(key, _MISSING)
    if prepared is _MISSING:  # not prepared by a batch prefetch
        prepared = _prepare(completion, gold, opts)
    if prepared is None:
        return RewardResult(0.0, "no_answer")
    verdict = prepared if isinstance(prepared, str) else _library(*prepared, cpu_s)
    if verdict == "equal":
        return RewardResult(1.0)
    return RewardResult(0.0, "wrong" if verdict == "different" else verdict)


def correctness_prefetch(completions: Sequence[str], examples: Sequence[Mapping[str, Any]],
                         workers: int = 1, **options: Any) -> list:
    """Prepare a batch of `correctness` calls (N completions, N examples, the reward's
    keyword options): extract and decide in the parent what it can, and return tasks
    (callables without arguments) that decide the rest in worker jobs of up to
    `_BATCH_JOB_SIZE` comparisons each (`SympyPool.compare_many`), sorted by gold answer so
    a job parses each gold once. There are as many jobs as usable cores (`_parallel_jobs`,
    at most the sympy pool's workers; more if a job would exceed `_BATCH_JOB_SIZE`); with
    fewer `workers` threads than jobs, a task runs several jobs at once. `RewardPool` runs the
    tasks on its threads before the per-answer calls, which then find their results (a
    comparison a job did not decide is run singly by its call). Examples without an
    "answer" are left to the call (which raises)."""
    opts = verifier_options(**options)
    okey = _options_key(opts)
    prepared, requests = {}, {}
    for completion, example in zip(completions, examples):
        if not isinstance(completion, str) or "answer" not in example:
            continue
        gold = str(example["answer"])
        result = _prepare(completion, gold, opts)
        prepared[(completion, gold, okey)] = result
        if isinstance(result, tuple):
            request = _worker_request(*result)
            requests[(request[0], request[1], json.dumps(request[4], sort_keys=True))] = request
    with _PREPARED_LOCK:
        _PREPARED.clear()
        _PREPARED.update(prepared)
    ordered = sorted(requests.values(), key=lambda r: (r[1], r[0]))
    if not ordered:
        return []
    workers = max(1, int(workers))
    jobs = min(len(ordered), _parallel_jobs())
    jobs = max(jobs, -(-len(ordered) // _BATCH_JOB_SIZE))
    parts = _deal_by_gold(ordered, jobs)
    cpu_s = CORRECTNESS_TIMEOUT_S * limit_scale()
    calls = [functools.partial(get_pool().compare_many, part, cpu_s) for part in parts]
    return [functools.partial(_side_by_side, calls[k::workers])
            for k in range(min(workers, len(calls)))]


def _deal_by_gold(ordered: list, jobs: int) -> list[list]:
    """Split requests sorted by gold (`(pred, gold, ...)` tuples) into `jobs` parts, each
    cut into pieces of at most `_BATCH_JOB_SIZE`: each gold's requests stay together (a job parses a gold once) and the golds are dealt
    round-robin, so that a run of costly answers of one kind spreads over the jobs (on two
    idle cores: 2,071-2,119 answers/s against 1,879-1,904 for contiguous halves)."""
    parts = [[] for _ in range(jobs)]
    for k, (_, group) in enumerate(itertools.groupby(ordered, key=lambda r: r[1])):
        parts[k % jobs].extend(group)
    return [part[i:i + _BATCH_JOB_SIZE] for part in parts
            for i in range(0, len(part), _BATCH_JOB_SIZE)]


def _usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parallel_jobs() -> int:
    """How many sympy worker jobs a batch is split into: one per usable core, at most the
    pool's workers. Jobs beyond the cores only add forks and cold caches (math-verify's
    parsers fill theirs as a job goes): on one idle core, 512 answers in 1 job ran at 1,160
    answers/s against 882 in 4. A slow comparison holds up only its own job's rest until
    its deadline, after which they are rerun singly."""
    return max(1, min(get_pool().max_workers, _usable_cores()))


def _side_by_side(calls: list) -> None:
    """Run `calls` (callables) at the same time, each on a thread, and wait for all."""
    threads = [threading.Thread(target=call, daemon=True) for call in calls[1:]]
    for thread in threads:
        thread.start()
    try:
        calls[0]()
    finally:
        for thread in threads:
            thread.join()


correctness.prefetch = correctness_prefetch
