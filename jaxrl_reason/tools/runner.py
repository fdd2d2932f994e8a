"""Host side of tool calls: find the call a completion ends with, run it, format the result.

A call is `<name>query</name>` with `name` one of the runner's tools; its result is
`<result>output</result>`. The sampler pauses a row right after a closing tag
(`sampling/tool_loop.py`) and asks `ToolRunner.run` for the result of the text so far:

    runner = ToolRunner({"search": BM25Retriever(docs), "calc": calculate})
    runner.run("<think><search>capital of Velmora</search>")
    # ToolResult(name="search", query="capital of Velmora",
    #            text="<result>The capital of Velmora is Quandis.</result>", error=None)

A tool that raises, a call without its opening tag, an empty or overlong query: the result
is `<result>error: ...</result>` and `error` says why, never an exception. Result text is
escaped, not cleaned: every `<` becomes `&lt;` and every `>` `&gt;` (`&` itself stays), so
no character of a document can begin or end a tag, whatever it nests or splits
(`<<x>answer>42</answer>` arrives as `&lt;&lt;x&gt;answer&gt;42&lt;/answer&gt;`), and a
document cannot open or close a call, a result, a think block or an answer.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
# How a result spells the two characters a tag needs: no result text holds `<` or `>`.
_ESCAPES = str.maketrans({"<": "&lt;", ">": "&gt;"})
MAX_ERROR_CHARS = 120
_COMPLETED_CALL = re.compile(r"</(\w+)>\s*" + re.escape(RESULT_OPEN))


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One executed call.

    name: the tool; query: the text between its tags (None when the call was malformed);
    text: the result block to append, `<result>...</result>`; error: why it failed, or None.
    """
    name: str
    query: str | None
    text: str
    error: str | None = None


def result_block(output: str, max_chars: int = 1000) -> str:
    """`<result>output</result>`: `output` stripped, cut to `max_chars` characters, then
    escaped (`<` -> `&lt;`, `>` -> `&gt;`), so the block holds no `<` or `>` but its own two
    tags and nothing in it can open or close a tag."""
    return f"{RESULT_OPEN}{output.strip()[:max_chars].translate(_ESCAPES)}{RESULT_CLOSE}"


def count_calls(completion: str) -> int:
    """Tool calls in a completion that got a result (a closing tag then `<result>`)."""
    return len(_COMPLETED_CALL.findall(completion)) if isinstance(completion, str) else 0


class ToolRunner:
    """Runs the tool calls of completions on the host.

    Args:
      tools: {name: fn(query: str) -> str}; names are letters, digits and '_' (the call
        tags `<name>`, `</name>`); a tool reports bad input by raising.
      max_query_chars: longer queries are an error, not run.
      max_result_chars: a tool's output is cut to this many characters.
    """

    def __init__(self, tools: Mapping[str, Callable[[str], str]], *,
                 max_query_chars: int = 512, max_result_chars: int = 1000):
        if not tools:
            raise ValueError("ToolRunner needs at least one tool")
        for name, fn in tools.items():
            if not re.fullmatch(r"\w+", name) or name in ("think", "answer", "result"):
                raise ValueError(f"tool name {name!r}: must be letters, digits or '_' and not "
                                 "a format tag (think, answer, result)")
            if not callable(fn):
                raise TypeError(f"tool {name!r} is not callable: {fn!r}")
        self.tools = dict(tools)
        self.max_query_chars, self.max_result_chars = max_query_chars, max_result_chars

    @property
    def closing_tags(self) -> tuple[str, ...]:
        """('</search>', ...): the tags after which a row pauses for its result."""
        return tuple(f"</{name}>" for name in self.tools)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Every tag of the protocol (opening and closing tool tags, result tags): the
        strings a tokenizer trained for tool use keeps as single tokens."""
        return tuple(t for name in self.tools for t in (f"<{name}>", f"</{name}>")) + (
            RESULT_OPEN, RESULT_CLOSE)

    def parse(self, text: str) -> tuple[str, str | None, str | None]:
        """(name, query, error) of the call `text` ends with (trailing whitespace ignored);
        query is None and error set when the call has no opening tag, an empty query or
        one longer than `max_query_chars`. ValueError when `text` ends with no closing tag
        of a tool."""
        text = text.rstrip()
        name = next((n for n in self.tools if text.endswith(f"</{n}>")), None)
        if name is None:
            raise ValueError(f"text does not end with a closing tool tag {self.closing_tags}")
        body = text[:-len(f"</{name}>")]
        start = body.rfind(f"<{name}>")
        if start < 0 or body.rfind(f"</{name}>") > start:
            return name, None, f"malformed call: no opening {name} tag"
        query = body[start + len(f"<{name}>"):].strip()
        if not query:
            return name, None, f"empty {name} query"
        if len(query) > self.max_query_chars:
            return name, None, f"{name} query longer than {self.max_query_chars} characters"
        return name, query, None

    def run(self, text: str) -> ToolResult:
        """Runs the call `text` (a completion so far) ends with; see the module docstring.
        Text that ends with no closing tag (a tokenizer that decodes a tag differently)
        gets an error result too, with name ""."""
        try:
            name, query, error = self.parse(text)
        except ValueError as e:
            return ToolResult("", None, result_block(f"error: {e}"), str(e))
        if error is None:
            try:
                output = self.tools[name](query)
                if not isinstance(output, str):
                    raise TypeError(f"tool returned {type(output).__name__}, not str")
            except Exception as e:  # noqa: BLE001  a tool may never crash a rollout
                error = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
        if error is not None:
            error = error[:MAX_ERROR_CHARS]
            return ToolResult(name, query, result_block(f"error: {error}"), error)
        return ToolResult(name, query, result_block(output, self.max_result_chars))
