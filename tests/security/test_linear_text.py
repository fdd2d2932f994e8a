r"""Untrusted text in the trusted parent takes linear time (issue 40, items 1-3).

Model output, dataset answers and tool results reach the regexes of `jaxrl_reason/rewards/`,
`tools/` and `data/` in the trainer's own process, before any worker or deadline, holding
the GIL. Before: the oversized-number regexes of `rewards/math.py` backtracked cubically
(`\boxed{^` + 1,500 spaces + `1` + 1,500 spaces + `x}`: 13 s), the GSM8K `####` regex and
the code-fence regex quadratically, and so did a dozen normalisation regexes of
`rewards/latex.py` (`\text{a}` + 10,000 spaces + `x`: 0.9 s).

(a) `REGISTRY` lists every regex of those packages with how the code applies it: SEARCH
    (search, finditer, findall, sub, split: the engine tries every start position) or
    ANCHORED (match / fullmatch only). Each is run on adversarial strings built from its
    own literals and character classes, whitespace, braces and digits (one character
    repeated, a letter, a digit or a literal, with a character before or after it, then
    a long run then a character that breaks the match, two runs split by a digit, literals
    alternating with fillers, pairs of characters) at 10,000 characters, then the worst
    shapes again at 100,000, and must stay under `BOUND_US` of CPU time per character
    (`time.thread_time()`; generous, so load cannot make it flaky; a quadratic pattern is
    hundreds of times over at 100,000 characters, which `test_the_bound_catches_a_quadratic_
    regex` checks on the old GSM8K pattern). The parent-side entry points run the same way.
(b) A lint parses every module of the three packages and fails on a regex call that is not
    in `REGISTRY` (keyed by module and pattern string), on a stale entry, on an ANCHORED
    pattern applied by search, and on `re` imported under another name.
(c) The issue's attacks, replayed.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import itertools
import pathlib
import re
import re._constants as sre_constants
import re._parser as sre_parser
import signal
import time

import pytest

from jaxrl_reason.rewards import _oversized, code, countdown, latex, logic
from jaxrl_reason.rewards import math as math_reward
from jaxrl_reason.tools import calculator, retriever, runner
from cpu_bounds import gc_paused
from jaxrl_reason.data import files

ROOT = pathlib.Path(__file__).resolve().parents[2] / "jaxrl_reason"
PACKAGES = ("rewards", "tools", "data")
APPLY = {"compile", "search", "match", "fullmatch", "sub", "subn", "findall", "finditer",
         "split"}
BOUND_US = 20.0  # CPU microseconds per character
SIZES = (10_000, 100_000)
SEARCH, ANCHORED = "search", "anchored"

# (module, pattern) -> how the code applies it. The pattern is the string the module passes
# (its value when it is built from module constants), or "<expr> source" when it depends on
# a function's locals (see `DYNAMIC`). What each sees: completions (extraction reads the
# last 100,000 characters), answers and gold answers (10,000 characters after
# `math._parent_verdict`'s cap), tool queries (512) and results, dataset lines.
REGISTRY = {
    # rewards/math.py: extraction, layers 1-2 of the verifier
    ("rewards.math", r"(?:\b(?:final\s+answer|the\s+answer|answer)\s*(?:is|:)|^[ \t]*A:)[ \t:]*([^\n]+)"): SEARCH,  # noqa: E501
    ("rewards.math", r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?"): SEARCH,
    ("rewards.math", r"[\w\\{}()\[\],;+\-*/^=.:<>|!% ]{1,200}"): ANCHORED,
    ("rewards.math", r"(?<![\\A-Za-z])[A-Z]?[a-z]{2,}(?![A-Za-z])"): SEARCH,
    ("rewards.math", r"\\(?:begin|end)\{\w+\*?\}"): SEARCH,
    ("rewards.math", r"\\[\])]"): SEARCH,
    ("rewards.math", r"[-+]?\d{1,3}(?:(?:\s|\\[,;: ]|~)+\d{3})+(?:\.\d+)?"): ANCHORED,
    ("rewards.math", r"\\sqrt\s*\(([^(){}]*)\)"): SEARCH,
    ("rewards.math", r"\(?([A-Za-z])\)?"): ANCHORED,
    ("rewards.math", r"\(([A-J])\)|([A-J])[.:)](?!\d)"): ANCHORED,
    ("rewards.math", r"\s|\\[,;: ]|~"): SEARCH,
    ("rewards.math", r"[A-Za-z]{2,}"): ANCHORED,
    ("rewards.math", r"\.\s"): SEARCH,
    ("rewards.math", r"\s(?:is|are|was|equals)\s"): SEARCH,
    ("rewards.math", r"\d|\\[A-Za-z]"): SEARCH,
    # rewards/_reading.py (one answer per completion) and _oversized.py (the number guard)
    ("rewards._reading", r"\$\$([^$]+)\$\$|\$([^$]+)\$|\\\(((?:(?!\\[()]).)+)\\\)|\\\[((?:(?!\\[\[\]]).)+)\\\]"): SEARCH,  # noqa: E501
    ("rewards._reading", r"[\d\\$]"): SEARCH,
    ("rewards._oversized", r"(?P<cmd>\\[A-Za-z]++)|(?P<esc>\\.)|(?P<num>\d++(?:\.\d++)?+)(?:[eE](?P<exp>[-+]?+\d++))?+|(?P<word>[A-Za-z]++)|(?P<pow>\*\*|\^)|(?P<ch>\S)"): SEARCH,  # noqa: E501
    ("rewards._oversized", r"\d[eE][-+]?\d"): SEARCH,
    # rewards/latex.py: unicode folding, boxes, normalisation, numbers
    ("rewards.latex", r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+"): SEARCH,
    ("rewards.latex", "|".join(map(re.escape, latex._UNICODE_SYMBOLS))): SEARCH,
    ("rewards.latex", r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"): SEARCH,
    ("rewards.latex", "[\xad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"): SEARCH,
    ("rewards.latex", r"\\.|[{}]"): SEARCH,
    ("rewards.latex", r"\\(?:boxed|fbox)\s*(?=[{ ])"): SEARCH,
    ("rewards.latex", r"[\s$.,;:]*(?:(?:\\q?quad|\\text\{[^{}$]{0,30}\}|and|or|\\[,;]|&)[\s$.,;:]*)*"): ANCHORED,  # noqa: E501 (on at most 40 characters)
    ("rewards.latex", r"\\\\|\\[,;:! >]|\\(?:left|right)\.|\\(?:q?quad|displaystyle|textstyle|scriptstyle|left|right|[bB]ig{1,2}[lrm]?|middle|limits|nolimits|hfill|mathstrut|strut|hline)(?![a-zA-Z])|~"): SEARCH,  # noqa: E501
    ("rewards.latex", r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree(?![a-zA-Z])"): SEARCH,
    ("rewards.latex", r"(?:\\?%|\bper\s?cent\b|\bpct\b)\s*+(?:\.\s*+)?+$"): SEARCH,
    ("rewards.latex", r"(?<=\S)(?:\s*+,\s++|\s++)(?:or|and)\s++(?=\S)"): SEARCH,
    ("rewards.latex", r"(?P<unit>(?:\}?\d\{?\^)?\.?[a-zA-Z]+(?:\s+(?:\}?\d\{?\^)?\.?[a-zA-Z]+)*)(?P<sep>\s*)(?:(?=[\d}])|(?<![a-zA-Z])(?=[a-zA-Z]+\\))"): ANCHORED,  # noqa: E501
    ("rewards.latex", r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$"): ANCHORED,
    ("rewards.latex", r"(\\[a-zA-Z]+)?\s+(?=([a-zA-Z])?)"): SEARCH,
    ("rewards.latex", r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*\\in(?![a-zA-Z])"): SEARCH,
    ("rewards.latex", r"\s*+(?:[a-zA-Z]|\\[a-zA-Z]++)?+(?:_\{?+\w++\}?+)?+\s*+"): ANCHORED,
    ("rewards.latex", r"^(?P<num>.*?[^\s+\-*/=^_(\[{,])\s*+\\(?:text|textrm|textnormal|textit|textbf|mbox|mathrm)\s*+\{\s*+(?P<unit>[A-Za-z][A-Za-z .]*+)\s*+\}\s*+(?:\^\s*+\{?+\d\}?+)?+\s*+$"): ANCHORED,  # noqa: E501
    ("rewards.latex", r"[-+]?\d+"): ANCHORED,
    ("rewards.latex", r"[-+]?(?:\d+\.\d*|\.\d+)"): ANCHORED,
    ("rewards.latex", r"(?P<m>[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++))(?:[eE]|\\times10\^\{?|\\cdot10\^\{?|\*10\^\{?|\*10\*\*)(?P<e>[-+]?\d+)\}?"): ANCHORED,  # noqa: E501
    ("rewards.latex", r"(?P<s>[-+]?)10\^\{?(?P<e>[-+]?\d+)\}?"): ANCHORED,
    ("rewards.latex", r"(?P<s>[-+]?)\\frac\{(?P<n>[-+]?[\d.]+)\}\{(?P<d>[-+]?[\d.]+)\}"): ANCHORED,
    ("rewards.latex", r"(?P<s>)(?P<n>[-+]?[\d.]+)/(?P<d>[-+]?[\d.]+)"): ANCHORED,
    ("rewards.latex", r"(?P<w>[-+]?\d+)(?:\\frac\{(?P<n>\d+)\}\{(?P<d>\d+)\}|_(?P<n2>\d+)/(?P<d2>\d+))"): ANCHORED,  # noqa: E501
    ("rewards.latex", r"(?P<s>[-+]?)(?P<i>\d*)\.(?P<f>\d*)\\overline\{(?P<r>\d+)\}"): ANCHORED,
    ("rewards.latex", r"[-+]?(?P<i>\d*)\.(?P<f>\d+)(?:(?:[eE]|\\times10\^\{?|\\cdot10\^\{?)(?P<e>[-+]?\d+)\}?)?"): ANCHORED,  # noqa: E501
    ("rewards.latex", r"<expr> '\\\\(?:' + '|'.join(names) + ')\\s*\\{'"): SEARCH,
    ("rewards.latex", r"\{\s*,\s*\}|,\s*\\!\s*"): SEARCH,
    ("rewards.latex", r"\\[()\[\]]"): SEARCH,
    ("rewards.latex", r"(?<!\s)\s++\^"): SEARCH,
    ("rewards.latex", r"(^|[,(\[])\+\\infty"): SEARCH,
    ("rewards.latex", r"([_^])\{([A-Za-z0-9])\}"): SEARCH,
    ("rewards.latex", r"\\(?:[a-zA-Z]+|.)"): ANCHORED,  # on at most 40 characters
    ("rewards.latex", r"\\(frac|binom)\s*([0-9A-Za-z])\s*([0-9A-Za-z])"): SEARCH,
    ("rewards.latex", r"\\(frac|binom)\s*([0-9A-Za-z])\s*(?=\{)"): SEARCH,
    ("rewards.latex", r"\\(frac|binom)(\{[^{}]*\})\s*([0-9A-Za-z])"): SEARCH,
    ("rewards.latex", r"\\sqrt\s*([0-9A-Za-z])"): SEARCH,
    ("rewards.latex", "<expr> pattern"): SEARCH,  # `_RELATIONS` and `_CANONICAL`
    ("rewards.latex", r"\d,\s+\d"): SEARCH,
    ("rewards.latex", r" +([^\s$]+)"): ANCHORED,  # on at most 200 characters
    ("rewards.latex", r"[(\[{]"): SEARCH,
    ("rewards.latex", r"\\?%"): SEARCH,
    # rewards: the math worker's side (bounded by its CPU limit too), code, other rewards
    ("rewards._latex_verify", r"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d{1,4}+)?+"): ANCHORED,  # noqa: E501
    ("rewards._latex_verify", r"\$|\\\(|\\\[|\\boxed|\\fbox"): SEARCH,
    ("rewards._latex_verify", r"\*\*|(?<![\\A-Za-z])[A-Za-z]{2,}\s*\("): SEARCH,
    ("rewards._latex_verify", r"[-+]?\d+"): ANCHORED,
    ("rewards._sympy_tree", r"[A-Za-z][A-Za-z0-9_]{0,30}"): ANCHORED,
    ("rewards._sympy_tree", r"(?:[0-9]*+\.)?+[0-9]++(?:[eE][-+]?+[0-9]{1,3}+)?+|[0-9]++\."): ANCHORED,  # noqa: E501
    ("rewards._sympy_tree", r"[\w\s+\-*/().,!\[\]^]*"): ANCHORED,
    ("rewards.code", r"```[ \t]*+([\w+#.-]*+)[^\n`]*+\n(.*?)```"): SEARCH,
    ("rewards.code", r'[\[\]{}"\\]'): SEARCH,  # the sandbox's status lines
    ("rewards.length", r"Think for (\d{1,7}) tokens"): SEARCH,
    ("rewards.logic", r"[^\W\d_]+|[;.]"): SEARCH,
    ("rewards.tool_use", r"\s+"): SEARCH,
    # tools: queries (model output) and results
    ("tools.calculator", r"(?<!\d)(\d+)\.(\d+)"): SEARCH,
    ("tools.retriever", r"[^\W_]+"): SEARCH,
    ("tools.runner", r"</(\w+)>\s*<result>"): SEARCH,
    ("tools.runner", r"\w+"): ANCHORED,  # tool names, from the config
    # data: dataset lines
    ("data.files", r"<<[^<>\n]*>>"): SEARCH,
    ("data.files", r"[.\[]"): SEARCH,  # a field path of the line
}

# Patterns built from a function's locals: the concrete patterns their call sites take.
DYNAMIC = {
    ("rewards.latex", r"<expr> '\\\\(?:' + '|'.join(names) + ')\\s*\\{'"):
        lambda: [r"\\(?:" + "|".join(latex._TEXT_WRAPPERS) + r")\s*\{"],
    ("rewards.latex", "<expr> pattern"):
        lambda: [p for p, _ in latex._RELATIONS + latex._CANONICAL],
}

# Shapes the generator does not build (several literals in a row) for some patterns.
EXTRA = {
    ("rewards.latex", r"^(?P<num>.*?[^\s+\-*/=^_(\[{,])\s*+\\(?:text|textrm|textnormal|textit|textbf|mbox|mathrm)\s*+\{\s*+(?P<unit>[A-Za-z][A-Za-z .]*+)\s*+\}\s*+(?:\^\s*+\{?+\d\}?+)?+\s*+$"):  # noqa: E501
        [lambda n: "a\\text{a}" + " " * n + "x", lambda n: "a\\text{a" + " " * n + "x}",
         lambda n: "a\\text{a}" * (n // 9) + "#"],
    ("rewards.latex", r"(?P<unit>(?:\}?\d\{?\^)?\.?[a-zA-Z]+(?:\s+(?:\}?\d\{?\^)?\.?[a-zA-Z]+)*)(?P<sep>\s*)(?:(?=[\d}])|(?<![a-zA-Z])(?=[a-zA-Z]+\\))"):  # noqa: E501
        [lambda n: ("1" + " a^1" * (n // 4) + "!")[::-1], lambda n: ("1 " + "a " * (n // 2))[::-1]],
    ("rewards.code", r"```[ \t]*+([\w+#.-]*+)[^\n`]*+\n(.*?)```"):
        [lambda n: "```" + "a" * n, lambda n: "```python\n" + "``" * (n // 2)],
}


# ------------------------------------------------------------------------ the regex sites


def _module_name(path: pathlib.Path) -> str:
    return f"{path.parent.name}.{path.stem}"


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            yield _module_name(path), path, ast.parse(path.read_text(encoding="utf-8"))


def _evaluate(node: ast.AST, module: str):
    """The value of a pattern or flags expression, in its module's namespace, or None."""
    if isinstance(node, ast.Constant):
        return node.value
    try:
        return eval(ast.unparse(node), vars(importlib.import_module(f"jaxrl_reason.{module}")))
    except Exception:  # noqa: BLE001 - a function's locals: a dynamic pattern
        return None


def _flags_node(call: ast.Call) -> ast.AST | None:
    position = {"compile": 1, "split": 3, "sub": 4, "subn": 4}.get(call.func.attr, 2)
    keyword = next((k.value for k in call.keywords if k.arg == "flags"), None)
    return call.args[position] if len(call.args) > position else keyword


def regex_sites() -> list[dict]:
    """Every `re.<function>(pattern, ...)` call of the three packages: module, line,
    function, key (the pattern, or "<expr> source"), flags, and the module-level name a
    `re.compile` is assigned to."""
    sites = []
    for module, _, tree in _modules():
        targets = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                targets[id(node.value)] = node.targets[0].id
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("re", "regex") and node.func.attr in APPLY):
                continue
            pattern = _evaluate(node.args[0], module)
            key = pattern if isinstance(pattern, str) else f"<expr> {ast.unparse(node.args[0])}"
            flags = _flags_node(node)
            sites.append({"module": module, "line": node.lineno, "function": node.func.attr,
                          "key": key, "flags": 0 if flags is None else _evaluate(flags, module),
                          "name": targets.get(id(node))})
    return sites


SITES = regex_sites()


def _applications() -> dict[tuple[str, str], set[str]]:
    """(module, name) of a module-level compiled pattern -> the methods the three packages
    call on it, "<other>" for any other use of the name (passed around, aliased)."""
    compiled = {(s["module"], s["name"]) for s in SITES if s["name"]}
    uses: dict[tuple[str, str], set[str]] = {key: set() for key in compiled}
    for module, _, tree in _modules():
        alias = {}  # local name -> (defining module, name), or a module alias -> module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrl_reason."):
                source = node.module.split(".", 1)[1]
                for a in node.names:
                    if (source, a.name) in compiled:
                        alias[a.asname or a.name] = (source, a.name)
                    alias.setdefault(a.asname or a.name, f"{source}.{a.name}")
        parents = {id(child): parent for parent in ast.walk(tree)
                   for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                key = alias.get(node.id) if isinstance(alias.get(node.id), tuple) else \
                    (module, node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    isinstance(alias.get(node.value.id), str):
                key = (alias[node.value.id], node.attr)
            if key not in uses:
                continue
            parent = parents.get(id(node))
            method = parent.attr if isinstance(parent, ast.Attribute) and \
                parent.value is node else "<other>"
            uses[key].add(method)
    return uses


# ----------------------------------------------------------------- adversarial strings

_FILLERS = (" ", "\t", "\n", "{", "}", "(", "1", "a", "\\", "$", ",", ".", "^", "#")
_BREAKERS = ("#", "x", "1")


def _classes(items, words: list[str], chars: set[str], prefix: str = "") -> None:
    """Collect a parsed pattern's literal runs (a common prefix factored out of
    alternatives stays in front of each) and one or two characters of each class."""
    run = list(prefix)

    def flush():
        if run:
            words.append("".join(run))
            run.clear()

    for op, av in items:
        if op is sre_constants.LITERAL:
            run.append(chr(av))
            chars.add(chr(av))
            continue
        pending = "".join(run)
        flush()
        if op is sre_constants.IN:
            negated = any(o is sre_constants.NEGATE for o, _ in av)
            for o, a in av:
                if o is sre_constants.LITERAL:
                    chars.add(chr(a))
                elif o is sre_constants.RANGE:
                    chars.update((chr(a[0]), chr(a[1])))
                elif o is sre_constants.CATEGORY:
                    chars.update({"CATEGORY_DIGIT": "1", "CATEGORY_SPACE": " ",
                                  "CATEGORY_WORD": "a_1"}.get(str(a), "a-"))
            if negated:
                chars.update("a 1")
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT,
                    sre_constants.POSSESSIVE_REPEAT):
            _classes(av[2], words, chars)
        elif op is sre_constants.SUBPATTERN:
            _classes(av[3], words, chars)
        elif op is sre_constants.ATOMIC_GROUP:
            _classes(av, words, chars)
        elif op is sre_constants.BRANCH:
            for branch in av[1]:
                _classes(branch, words, chars, pending)
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            _classes(av[1], words, chars)
    flush()


def shapes(pattern: str, flags: int = 0) -> list[tuple[str, object]]:
    """(name, build(n) -> a string of about n characters): the adversarial strings of a
    pattern (see the module docstring)."""
    words: list[str] = []
    chars: set[str] = set()
    _classes(sre_parser.parse(pattern, flags), words, chars)
    words = sorted(set(words), key=lambda w: (-len(w), w))[:4]
    fillers = list(dict.fromkeys([*sorted(chars)[:12], *_FILLERS]))
    out = {}
    for c in fillers:
        out[f"{c!r}*n"] = lambda n, c=c: c * n
        for t in _BREAKERS[:2]:
            if t != c:
                for h in ("", "1", "a"):
                    out[f"{h!r}+{c!r}*n+{t!r}"] = lambda n, h=h, c=c, t=t: h + c * n + t
    for w in words:
        out[f"{w!r}*k"] = lambda n, w=w: w * (n // len(w))
        for c in fillers:
            t = next(b for b in _BREAKERS if b != c)
            for head, tail in (("", ""), ("a", ""), ("", "a"), ("", " a")):
                out[f"{head!r}+{w!r}+{tail!r}+{c!r}*n+{t!r}"] = \
                    lambda n, w=head + w + tail, c=c, t=t: w + c * n + t
            out[f"{w!r}+{c!r}*n/2+'1'+{c!r}*n/2+'x'"] = \
                lambda n, w=w, c=c: w + c * (n // 2) + "1" + c * (n // 2) + "x"
            out[f"({w!r}+{c!r})*k"] = lambda n, w=w, c=c: (w + c) * (n // (len(w) + 1))
    for a, b in itertools.combinations(fillers[:10], 2):
        out[f"({a!r}+{b!r})*k"] = lambda n, a=a, b=b: (a + b) * (n // 2)
    return list(out.items())


class _Overrun(Exception):
    """The CPU budget of one run ran out (a regex is interrupted between steps)."""


@contextlib.contextmanager
def _cpu_budget(seconds: float):
    """Raise `_Overrun` in the main thread after `seconds` of this process's user CPU."""
    def expire(*_):
        raise _Overrun

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def us_per_char(fn, text: str) -> float:
    """CPU microseconds per character of `fn(text)` on this thread; inf when it runs past
    the bound by a margin (cut there: a quadratic regex would run for hours)."""
    budget = BOUND_US * 1e-6 * len(text) * 1.5 + 0.5
    try:
        with gc_paused(), _cpu_budget(budget):  # a collection's cost is the heap's, not fn's
            start = time.thread_time()
            fn(text)
            spent = time.thread_time() - start
    except _Overrun:
        return float("inf")
    return spent / max(1, len(text)) * 1e6


def _apply(compiled: re.Pattern, use: str):
    if use == ANCHORED:
        return lambda text: (compiled.match(text), compiled.fullmatch(text))
    return lambda text: sum(1 for _ in compiled.finditer(text))


def _worst(fn, builders, keep: int = 3) -> list[tuple[float, str]]:
    """The `keep` slowest shapes at 10,000 characters, then each at 100,000: the worst
    (µs/char, shape) over both sizes, slowest first."""
    small = sorted(((us_per_char(fn, build(SIZES[0])), name, build)
                    for name, build in builders), key=lambda r: -r[0])
    results = [(t, f"{name} @{SIZES[0]}") for t, name, _ in small]
    for _, name, build in small[:keep]:
        results.append((us_per_char(fn, build(SIZES[1])), f"{name} @{SIZES[1]}"))
    return sorted(results, key=lambda r: -r[0])


# ------------------------------------------------------------------------------ (a) time


def _concrete(key: tuple[str, str]) -> list[tuple[str, int]]:
    """(pattern, flags) of every site of a registry key."""
    out = []
    for site in SITES:
        if (site["module"], site["key"]) != key:
            continue
        patterns = DYNAMIC[key]() if key in DYNAMIC else [site["key"]]
        out += [(p, site["flags"] or 0) for p in patterns]
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("key", sorted(REGISTRY), ids=lambda k: f"{k[0]}:{k[1][:40]}")
def test_every_registered_regex_is_linear(key):
    use = REGISTRY[key]
    for pattern, flags in _concrete(key):
        compiled = re.compile(pattern, flags)
        builders = shapes(pattern, flags) + [(f"extra{i}", build) for i, build
                                             in enumerate(EXTRA.get(key, ()))]
        worst = _worst(_apply(compiled, use), builders)
        assert worst[0][0] <= BOUND_US, (pattern, use, worst[:3])


def test_the_bound_catches_a_quadratic_regex():
    """The GSM8K pattern this issue replaced is quadratic on a line of spaces: the shapes
    find it (the slowest at 2,000 characters) and at 100,000 characters it is far over the
    bound (cut by the CPU budget)."""
    old = re.compile(r"^[ \t]*####[ \t]*(\S[^\n]*?)[ \t]*$", re.M)
    apply = _apply(old, SEARCH)
    slowest = max(shapes(old.pattern, re.M), key=lambda shape: us_per_char(apply, shape[1](2000)))
    assert us_per_char(apply, slowest[1](SIZES[1])) == float("inf"), slowest[0]
    assert us_per_char(apply, "#### a" + " " * SIZES[0] + "b") > BOUND_US  # the issue's


# Strings the parent-side entry points see, each built to about n characters.
HOSTILE = {
    "caret spaces": lambda n: "\\boxed{^" + " " * (n // 2) + "1" + " " * (n // 2) + "x}",
    "gsm8k spaces": lambda n: "#### a" + " " * n + "b",
    "fence": lambda n: "```" + "a" * n,
    "text unit": lambda n: "a\\text{a}" + " " * n + "x",
    "unit words": lambda n: "1" + " a^1" * (n // 4) + "!",
    "percent": lambda n: "5%" + " " * n + "x",
    "or": lambda n: "x" + " " * n + "or",
    "mathbb": lambda n: "\\mathbb" + " " * n + "x",
    "boxes": lambda n: "\\boxed{" * (n // 7),
    "braces": lambda n: "{" * (n // 2) + "1" + "}" * (n // 2),
    "powers": lambda n: "{9}^" * (n // 4) + "9",
    "factorials": lambda n: "(1)!" * (n // 4),
    "spans": lambda n: "$" + "a" * n,
    "parens": lambda n: "\\(" * (n // 2),
    "statements": lambda n: "the answer is " * (n // 14),
    "digits dot": lambda n: "1" * n + ".",
    "decimal": lambda n: "." + "1" * n + "x",
    "tags": lambda n: "<answer>" * (n // 8) + "</answer>",
    "spaces": lambda n: " " * n + "1",
    "tabs newlines": lambda n: "\t\n" * (n // 2),
    "calc notes": lambda n: "<<" * (n // 2),
    "closing tags": lambda n: "</a>" + " " * n,
    "words": lambda n: "ab " * (n // 3),
}
_OPTIONS = math_reward.verifier_options()
_RUNNER = runner.ToolRunner({"calc": calculator.calculate,
                             "search": retriever.BM25Retriever(["a b c", "d e f"])})


def _quietly(fn):
    def call(text):
        with contextlib.suppress(ValueError):
            fn(text)
    return call


ENTRY_POINTS = {
    "math.extract_answer": math_reward.extract_answer,
    "math completion": lambda t: math_reward._prepare(t, "5", _OPTIONS),
    "math gold": lambda t: math_reward._prepare("\\boxed{5}", t, _OPTIONS),
    "math answer": lambda t: math_reward._parent_verdict(t[:10_000], "5"),
    "math answer uncapped": lambda t: math_reward._parent_verdict(t, t[::-1]),
    "latex.normalize": latex.normalize,
    "oversized": _oversized.oversized,
    "code.extract_code": code.extract_code,
    "countdown": countdown.extract_expression,
    "logic": lambda t: logic.parse_assignment(logic.answer_section(t) or "", ["A", "B"]),
    "calculator": _quietly(calculator.calculate),
    "tool runner": lambda t: _RUNNER.run(f"<search>{t}</search>"),
    "tool runner calc": lambda t: _RUNNER.run(f"<calc>{t}</calc>"),
    "tool result": lambda t: runner.result_block(t),
    "count_calls": runner.count_calls,
    "retriever": _quietly(_RUNNER.tools["search"]),
    "gsm8k line": _quietly(lambda t: files._gsm8k_answer(t + "\n#### 5", "answer")),
    "math line": _quietly(lambda t: files._math_answer(t + "\\boxed{5}", "solution")),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_parent_side_entry_points_are_linear(entry):
    fn = ENTRY_POINTS[entry]
    worst = _worst(fn, list(HOSTILE.items()), keep=4)
    assert worst[0][0] <= BOUND_US, (entry, worst[:3])


# ------------------------------------------------------------------------------ (b) lint


def test_every_regex_is_registered():
    """A regex of rewards/, tools/ or data/ that is not in REGISTRY (a new one, or one
    changed) fails here: add it with how it is applied, and the timing test covers it."""
    found = {(s["module"], s["key"]) for s in SITES}
    missing = sorted(f"{s['module']}:{s['line']} re.{s['function']}({s['key']!r})"
                     for s in SITES if (s["module"], s["key"]) not in REGISTRY)
    assert not missing, "unregistered regexes:\n" + "\n".join(missing)
    assert sorted(set(REGISTRY) - found) == [], "registry entries with no regex left"
    assert set(DYNAMIC) <= set(REGISTRY) and set(EXTRA) <= set(REGISTRY)


def test_anchored_patterns_are_only_applied_anchored():
    """A pattern registered ANCHORED is timed with match/fullmatch only, so it may only be
    applied that way (by name, in any module of the packages)."""
    uses = _applications()
    wrong = []
    for site in SITES:
        if REGISTRY.get((site["module"], site["key"])) != ANCHORED:
            continue
        applied = uses.get((site["module"], site["name"]), set()) if site["name"] else \
            {site["function"]}
        if not applied or not applied <= {"match", "fullmatch"}:
            wrong.append((site["module"], site["line"], site["name"], sorted(applied)))
    assert wrong == []


def test_regex_modules_are_imported_plainly():
    """`import re` (or `import regex`), never an alias or names taken from it, so the lint
    sees every call."""
    bad = []
    for module, _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [(module, a.name) for a in node.names
                        if a.name in ("re", "regex", "sre_compile") and a.asname]
            elif isinstance(node, ast.ImportFrom) and node.module in ("re", "regex"):
                bad.append((module, node.module))
    assert bad == []


# --------------------------------------------------------------------- (c) the attacks

CARET = "\\boxed{^" + " " * 1500 + "1" + " " * 1500 + "x}"
OVERSIZED = ["{7}^{30000000}", "{1000000}!", "\\binom{{1000000}}{500000}", "{9}^{{9}^{99}}",
             "(12!)!", "(10^{9999})^{9999}", "9^{9^{9^9}}", "1e100000000",
             "\\boxed{0+{7}^{2000003}}", "\\left(10^{9999}\\right)^{9999}", "10^{5}!",
             "9^{x+100000000}", "(x+1)^{1000000}", "\\dbinom{10^6}{5\\cdot 10^5}",
             "{" * 100 + "1" + "}" * 100]
HONEST = ["2^{10}", "e^{x^2}", "\\frac{3}{4}", "10^{6}", "5!", "\\binom{10}{3}", "(x+1)^2",
          "\\sqrt[3]{8}", "10000!", "1.5e300", "x_1^2+x_{10}^{3}", "2\\cdot 10^{5}",
          "1^{10^{100}}", "(2^{4})!", "\\binom{n}{k}", "f^{-1}(x)", "7!/(3!4!)", "5!!"]


def test_the_caret_answer_is_fast_and_its_honest_neighbour_scores():
    """Before: 13 s in the parent (the main thread frozen), and `\\boxed{5}` in the same
    batch of a `RewardPool(timeout_s=1)` scored 0. Now the parent's part of the attack (as
    an answer and as a dataset's gold answer) is milliseconds, and the batch scores the
    honest answer."""
    from jaxrl_reason.rewards import RewardPool
    from jaxrl_reason.rewards._sympy_worker import get_pool

    for completion, gold in ((CARET, "5"), ("\\boxed{5}", CARET), (CARET * 30, "5")):
        start = time.thread_time()
        math_reward._prepare(completion, gold, _OPTIONS)
        assert time.thread_time() - start < 0.2
    get_pool().warm()  # the pool's start-up is not what this measures
    with RewardPool({"correctness": 1.0}, num_workers=2, timeout_s=1.0) as pool:
        start = time.monotonic()
        out = pool.score([CARET, "\\boxed{5}", CARET], [{"answer": "5"}] * 3)
        elapsed = time.monotonic() - start
    assert out.components["correctness"].tolist() == [0.0, 1.0, 0.0]
    assert elapsed < 10.0  # worker start-up, a loaded machine; was over 30 s for this batch


def test_oversized_spellings_are_refused_before_any_worker(monkeypatch):
    """The brace-wrapped spellings the regexes missed are refused on the parse tree, in the
    parent: no worker is asked. Honest powers, factorials and binomials are not."""
    def no_worker():
        raise AssertionError("a worker was asked")

    monkeypatch.setattr(math_reward, "get_pool", no_worker)
    for text in OVERSIZED:
        assert _oversized.oversized(text), text
        for pred, gold in ((text, "1"), ("1", text), (f"\\boxed{{{text}}}", "7")):
            assert math_reward.equivalence_verdict(pred, gold) == "different", (pred, gold)
    assert [t for t in HONEST if _oversized.oversized(t)] == []


def test_the_gsm8k_line_of_spaces_is_fast():
    """Before: 40,000 characters, 12 s (the regex backtracked over the spaces)."""
    text = "#### a" + " " * 40_000 + "b"
    start = time.thread_time()
    assert math_reward.extract_answer(text) == "a" + " " * 40_000 + "b"
    assert math_reward.extract_answer("Work.\n#### 42  \nThanks") == "42"
    assert time.thread_time() - start < 0.1


def test_a_fence_without_a_line_end_is_fast():
    start = time.thread_time()
    assert code.extract_code("```" + "a" * 200_000) is None
    assert code.extract_code("```" * 50_000) is None
    assert code.extract_code("x" * (code.MAX_COMPLETION_CHARS + 1) + "```\nprint(1)\n```") \
        is None
    assert code.extract_code("```py\nprint(1)\n```") == "print(1)"
    assert time.thread_time() - start < 0.2
