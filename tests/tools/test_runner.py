"""The host-side tool runner: call parsing, results, error results (never exceptions),
result escaping, counting calls, and the config block's validation."""
import ml_collections
import pytest

from jaxrl_reason.data import search_facts
from jaxrl_reason.tools import (ToolRunner, available_corpora, build_tool_runner, calculate,
                                count_calls, result_block, tool_config_problems, tool_symbols)


def search(query):
    return f"The capital of {query.split()[-1]} is Quandis."


def raising(query):
    raise RuntimeError("backend down")


RUNNER = ToolRunner({"search": search, "calc": calculate, "broken": raising,
                     "wrong": lambda q: 42})


@pytest.mark.parametrize("text, name, result, error", [
    ("<think><search>capital of Velmora</search>", "search",
     "<result>The capital of Velmora is Quandis.</result>", None),
    ("so <calc>1342+250</calc>  ", "calc", "<result>1592</result>", None),
    ("<calc>1</calc><result>1</result> then <calc>2*3</calc>", "calc", "<result>6</result>",
     None),
    ("no opening</search>", "search", None, "malformed call: no opening search tag"),
    ("<search>a</search> b</search>", "search", None, "malformed call"),
    ("<search>   </search>", "search", None, "empty search query"),
    ("<calc>import os</calc>", "calc", None, "unexpected character"),
    ("<calc>1/0</calc>", "calc", None, "division by zero"),
    ("<broken>x</broken>", "broken", None, "RuntimeError: backend down"),
    ("<wrong>x</wrong>", "wrong", None, "TypeError: tool returned int, not str"),
])
def test_run(text, name, result, error):
    out = RUNNER.run(text)
    assert out.name == name
    if error is None:
        assert out.text == result and out.error is None
    else:
        assert error in out.error and out.text == f"<result>error: {out.error}</result>"
        assert out.text.count("<") == 2  # no tag-like piece inside an error result


def test_query_limits_and_unknown_endings():
    runner = ToolRunner({"search": search}, max_query_chars=10)
    assert "longer than 10" in runner.run("<search>" + "x" * 11 + "</search>").error
    with pytest.raises(ValueError, match="does not end with a closing tool tag"):
        runner.parse("<search>x</search> and more")
    assert "does not end with" in runner.run("<search>x</search> and more").error
    assert runner.closing_tags == ("</search>",)
    assert runner.symbols == ("<search>", "</search>", "<result>", "</result>")
    with pytest.raises(ValueError, match="format tag"):
        ToolRunner({"answer": search})
    with pytest.raises(ValueError):
        ToolRunner({})


def test_result_block_escapes_and_cuts():
    assert result_block("a <answer>7</answer> </search><result>b") == (
        "<result>a &lt;answer&gt;7&lt;/answer&gt; &lt;/search&gt;&lt;result&gt;b</result>")
    assert result_block("x" * 50, max_chars=5) == "<result>xxxxx</result>"
    assert result_block("  a<b  ", max_chars=2) == "<result>a&lt;</result>"  # cut, then escaped
    assert count_calls("<search>q</search><result>r</result><calc>1</calc> <result>1</result>"
                       " <search>q</search>") == 2
    assert count_calls(None) == 0


def tools_block(**overrides):
    block = {"enabled": True, "names": ("search", "calc"), "search_corpus": "search_facts",
             "search_top_k": 1, "max_calls": 2, "max_result_tokens": 32}
    block.update(overrides)
    return ml_collections.ConfigDict(block)


def test_config_problems():
    assert search_facts.TASK in available_corpora()  # registered by the task module
    assert tool_config_problems(tools_block()) == []
    assert tool_config_problems(None) == [] and tool_config_problems(
        tools_block(enabled=False, names="bogus")) == []
    problems = tool_config_problems(tools_block(names=("search", "shell"), max_calls=0,
                                                search_corpus="/nope.jsonl", top_k=3))
    assert any(p.startswith("tools.top_k: unknown key") for p in problems)
    assert any(p.startswith("tools.names:") for p in problems)
    assert any(p.startswith("tools.max_calls:") for p in problems)
    assert any(p.startswith("tools.search_corpus:") for p in problems)
    runner = build_tool_runner(tools_block())
    assert runner.run("<search>capital of Quandis</search>").error is None
    config = ml_collections.ConfigDict({"tools": tools_block(names=("calc",))})
    assert tool_symbols(config) == ("<calc>", "</calc>", "<result>", "</result>")
    assert tool_symbols(ml_collections.ConfigDict({"seed": 0})) == ()
