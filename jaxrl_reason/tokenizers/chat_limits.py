"""Time and size limits for rendering a chat template that may come from anywhere (a
downloaded `tokenizer_config.json` or `chat_template.jinja`).

Jinja's `ImmutableSandboxedEnvironment` keeps a template from reaching Python internals,
but not from running long or building huge strings: nested `range(100000)` loops run
without end, `'A' * 400000000` renders 410 MB. `LimitedSandbox` adds:

- a wall-clock budget per rendering (`MAX_RENDER_S`, set by `render`): checked at every
  iteration of every `{% for %}` loop (each loop's iterable is wrapped when the template is
  parsed), at every call (macros, methods, recursive loops), operator and filter, and at
  every piece of output;
- a cap on all the text one rendering produces (`MAX_PRODUCED` characters: every piece of
  output, also into a `{% set %}` block, a macro or a `caller()`, and every string an
  operator, filter or call returns), so no loop can pile up more than that, held or not;
- a size cap (`MAX_CHARS`) on the rendered text (counted as it is produced) and on every
  string, list or number a template builds: `*`, `+` and `~` are refused before they would
  make a string or list longer than `MAX_CHARS`; `**` and `*` before an integer of more
  than `MAX_INT_BITS` bits; a width, count or repetition argument above `MAX_CHARS`
  (filters `center`, `indent`, `batch`, `slice`, `tojson`'s indent; any int argument of a
  str/bytes/list method: `ljust`, `zfill`, `expandtabs`, ...), a
  `replace` or `join` whose result would exceed it, a `%` format string (operator or
  `format` filter) holding a run of seven digits, and a `str.format` field spec with a
  seven-digit width or a nested field are refused; every filter's and call's result is
  checked as well.

Anything over a limit raises `TemplateLimitError` (a `jinja2.TemplateError`, which
`apply_chat_template` reports as a ValueError naming the tokenizer). Range sizes keep
Jinja's own cap (`jinja2.sandbox.MAX_RANGE`, 100,000 items). The limits bound what one
rendering can cost in time and in the size of any single value; a template can still hold
several values of up to `MAX_CHARS` each at once.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import string
import time
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_RENDER_S = 2.0  # wall time of one rendering
MAX_CHARS = 1_000_000  # the rendered prompt, any string or list built, any width or count
MAX_INT_BITS = 100_000  # integers a template computes with `*` or `**`
MAX_PRODUCED = 16 * MAX_CHARS  # characters of all the text one rendering produces
_LONG_NUMBER = re.compile(r"\d{7}")  # a width or precision of seven digits or more
_LOOP, _CONCAT, _PIECE = "jaxrl_limited_loop", "jaxrl_limited_concat", "jaxrl_limited_piece"


class _Budget:
    """What the rendering in progress may still spend: its deadline, and characters."""

    def __init__(self, seconds: float, chars: int):
        self.deadline, self.chars = time.monotonic() + seconds, chars


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None)


class TemplateLimitError(jinja2.exceptions.SecurityError):
    """A chat template went over a time or size limit of `LimitedSandbox`."""


def _tick() -> None:
    """TemplateLimitError once the current rendering's deadline (`render`) has passed."""
    budget = _BUDGET.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise TemplateLimitError(f"chat template: rendering took more than {MAX_RENDER_S} s")


def _too_big(what: str, size: int) -> TemplateLimitError:
    return TemplateLimitError(f"chat template: {what} of {size} would exceed the limit of "
                              f"{MAX_CHARS}")


def _spend(chars: int) -> None:
    """Charges `chars` produced characters to the rendering in progress (TemplateLimitError
    past `MAX_PRODUCED`); nothing outside a rendering (compile-time constant folding)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.chars -= chars
        if budget.chars < 0:
            raise TemplateLimitError(f"chat template: produced more than {MAX_PRODUCED} "
                                     "characters of text")


def _check_size(value: Any) -> Any:
    """`value`, or TemplateLimitError when it is a string or collection of more than
    `MAX_CHARS` items or an integer of more than `MAX_INT_BITS` bits; a string's length is
    charged to the rendering (`_spend`)."""
    if isinstance(value, (str, bytes)):
        _spend(len(value))
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) and \
            len(value) > MAX_CHARS:
        raise _too_big(f"a {type(value).__name__}", len(value))
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"chat template: an integer over {MAX_INT_BITS} bits")
    return value


def _count(value: Any, what: str) -> None:
    """TemplateLimitError for an int width/count/repetition argument above `MAX_CHARS`."""
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_CHARS:
        raise _too_big(what, value)


def _check_format(fmt: Any, args: tuple = (), kwargs: dict | None = None) -> None:
    """Refuses a `%`/`format` string with a seven-digit run (a width or precision of a
    million or more) and int arguments above `MAX_CHARS` (a `*` width)."""
    if isinstance(fmt, str) and _LONG_NUMBER.search(fmt):
        raise TemplateLimitError("chat template: a format width or precision of seven "
                                 "digits or more")
    for value in (*args, *(kwargs or {}).values()):
        _count(value, "a format argument")


def _check_str_format(fmt: str, args: tuple, kwargs: dict) -> None:
    """`str.format`: refuses long widths in a field's spec and specs nested from arguments."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _, _, spec, _ in fields:
        if spec and ("{" in spec or _LONG_NUMBER.search(spec)):
            raise TemplateLimitError("chat template: a format spec with a nested field or a "
                                     "width of seven digits or more")
    for value in (*args, *kwargs.values()):
        _count(value, "a format argument")


def _check_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    """Refuses a `replace` whose result would be longer than `MAX_CHARS`."""
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        hits = len(s) + 1 if old == "" else s.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        size = len(s) + hits * (len(new) - len(old))
        if size > MAX_CHARS:
            raise _too_big("a replaced string", size)


def _check_join(sep: Any, items: Any) -> None:
    """Refuses a `join` of strings whose result would be longer than `MAX_CHARS`."""
    if isinstance(items, (list, tuple)) and all(isinstance(x, str) for x in items):
        size = sum(map(len, items)) + len(str(sep)) * max(0, len(items) - 1)
        if size > MAX_CHARS:
            raise _too_big("a joined string", size)


def _check_method(obj: Any, args: tuple, kwargs: dict) -> None:
    """Pre-checks a call of a builtin method of a str/bytes/list (the ones that can grow a
    value from a small argument)."""
    obj = getattr(obj, "__wrapped__", obj)  # the sandbox hands out str.format wrapped
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, (str, bytes, list)):
        return
    if isinstance(owner, str) and name in ("format", "format_map"):
        mapping = args[0] if name == "format_map" and args and isinstance(args[0], dict) else {}
        _check_str_format(owner, args if name == "format" else (), {**kwargs, **mapping})
        return
    for value in (*args, *kwargs.values()):
        _count(value, f"an argument of {name}")
    if name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else None)
    elif name == "join" and args:
        _check_join(owner, args[0])
    elif name == "expandtabs" and isinstance(owner, str):
        size = len(owner) + owner.count("\t") * int(args[0] if args else kwargs.get("tabsize", 8))
        if size > MAX_CHARS:
            raise _too_big("an expanded string", size)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Pre-checks `left <operator> right` for the intercepted operators."""
    seqs = (str, bytes, list, tuple)
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, seqs) and isinstance(times, int):
                if len(seq) * max(0, times) > MAX_CHARS:
                    raise _too_big(f"a repeated {type(seq).__name__}", len(seq) * times)
        if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"chat template: a product over {MAX_INT_BITS} bits")
    elif operator == "+":
        if isinstance(left, seqs) and isinstance(right, seqs) and \
                len(left) + len(right) > MAX_CHARS:
            raise _too_big(f"a concatenated {type(left).__name__}", len(left) + len(right))
    elif operator == "**" and ints and abs(left) > 1 and right > 0:
        if right > MAX_INT_BITS or right * left.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"chat template: a power over {MAX_INT_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        _check_format(left, right if isinstance(right, tuple) else (right,))


class _Loop:
    """The iterable of a `{% for %}` loop, ticking the deadline at each item (and keeping
    `len()` when the wrapped iterable has one, for `loop.length`)."""

    def __init__(self, iterable: Any):
        self.iterable = iterable

    def __iter__(self):
        for item in self.iterable:
            _tick()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)


def _concat(*parts: Any) -> str:
    """The `~` operator (what Jinja's `str_join` does), refused past `MAX_CHARS`."""
    _tick()
    texts = [str(p) for p in parts]
    size = sum(map(len, texts))
    if size > MAX_CHARS:
        raise _too_big("a concatenated string", size)
    _spend(size)
    return "".join(texts)


def _piece(value: Any) -> Any:
    """One piece of output (`{{ ... }}` or template text, wherever it goes: the prompt, a
    `{% set %}` block, a macro's result), charged to the rendering; `value` unchanged."""
    _tick()
    _spend(len(value) if isinstance(value, str) else len(str(value)))
    return value


class _Instrument(NodeTransformer):
    """Wraps every loop's iterable in `_Loop`, turns every `~` into a `_concat` call and
    passes every piece of output through `_piece`."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_LOOP, "load"), [node.iter], [], None, None,
                               lineno=node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        self.generic_visit(node)
        node.nodes = [nodes.Call(nodes.Name(_PIECE, "load"), [child], [], None, None,
                                 lineno=child.lineno or node.lineno) for child in node.nodes]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load"), list(node.nodes), [], None, None,
                          lineno=node.lineno)


def _check_indent(arguments: dict) -> None:
    """Refuses an `indent` whose width, or whose result, would exceed `MAX_CHARS`."""
    width = arguments.get("width", 4)
    width = len(width) if isinstance(width, str) else width
    if isinstance(width, int) and not isinstance(width, bool):
        lines = str(arguments.get("s", "")).count("\n") + 1
        _count(width, "an indent width")
        _count(len(str(arguments.get("s", ""))) + lines * width, "an indented string")


# Filters that grow a value from a small argument: name -> pre-check of the bound arguments.
_FILTER_CHECKS = {
    "center": lambda a: _count(a.get("width"), "a center width"),
    "indent": _check_indent,
    "batch": lambda a: _count(a.get("linecount"), "a batch size"),
    "slice": lambda a: _count(a.get("slices"), "a slice count"),
    "format": lambda a: _check_format(a.get("value"), a.get("args", ()), a.get("kwargs")),
    "replace": lambda a: _check_replace(a.get("s"), a.get("old"), a.get("new"),
                                        a.get("count")),
    "join": lambda a: _check_join(a.get("d", ""), a.get("value")),
    "tojson": lambda a: _count(a.get("indent"), "a json indent"),
}


def _limited_filter(name: str, fn):
    """`fn` (a filter) with the deadline ticked, its pre-check (`_FILTER_CHECKS`) and its
    result's size checked; keeps Jinja's pass-context marker (`functools.wraps`)."""
    check = _FILTER_CHECKS.get(name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature, check = None, None

    @functools.wraps(fn)
    def limited(*args, **kwargs):
        _tick()
        if check is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                bound = None  # the filter itself raises for wrong arguments
            if bound is not None:
                check(bound.arguments)
        return _check_size(fn(*args, **kwargs))

    return limited


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """`ImmutableSandboxedEnvironment` with the time and size limits of the module
    docstring (render with `render` for the time limit and the output cap)."""

    intercepted_binops = frozenset(["*", "+", "**", "%"])

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.globals[_LOOP] = _Loop
        self.globals[_CONCAT] = _concat
        self.globals[_PIECE] = _piece

    def limit_filters(self) -> None:
        """Wraps every filter registered so far (`_limited_filter`): call after adding the
        environment's own filters."""
        self.filters = {name: _limited_filter(name, fn) for name, fn in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        """Jinja's parse tree with loops and `~` instrumented (`_Instrument`)."""
        tree = _Instrument().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """An intercepted operator, pre-checked (`_check_binop`)."""
        _tick()
        _check_binop(operator, left, right)
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Every call a template makes, ticked, pre-checked (`_check_method`) and its
        result's size checked."""
        _tick()
        if __obj is _piece or __obj is _concat or __obj is _Loop:  # ours: they check
            return __obj(*args)
        _check_method(__obj, args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def render(template: jinja2.Template, **context: Any) -> str:
    """`template.render(**context)` within `MAX_RENDER_S` seconds of wall time and
    `MAX_CHARS` characters of output (TemplateLimitError past either)."""
    token = _BUDGET.set(_Budget(MAX_RENDER_S, MAX_PRODUCED))
    try:
        pieces, size = [], 0
        for piece in template.generate(**context):
            size += len(piece)
            if size > MAX_CHARS:
                raise _too_big("the rendered prompt", size)
            _tick()
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _BUDGET.reset(token)
