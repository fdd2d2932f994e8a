"""Tools a policy may call mid-completion (`<search>query</search>`, `<calc>expr</calc>`):
a BM25 retriever over a local corpus, a sandboxed calculator, and the host-side runner.
Host code only (no jax): `sampling/tool_loop.py` runs the tool loop on the device side.

`config.tools` (validated by `tool_config_problems`; `enabled = False` or no block: off):

    enabled            bool   generation pauses rows at closing tags and runs the tools
    names              tuple  tools offered: "search" and/or "calc"
    search_corpus      str    a built-in corpus name (e.g. "search_facts") or a local file
    search_top_k       int    documents per search result
    max_calls          int    tool calls per completion; later closing tags are plain text
    max_result_tokens  int    a result block is cut to this many tokens (static shape)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.tools.calculator import calculate
from jaxrl_reason.tools.retriever import (BM25Retriever, available_corpora, load_corpus,
                                          register_corpus)
from jaxrl_reason.tools.runner import (RESULT_CLOSE, RESULT_OPEN, ToolResult, ToolRunner,
                                       count_calls, result_block)

TOOL_NAMES = ("search", "calc")
CONFIG_KEYS = ("enabled", "names", "search_corpus", "search_top_k", "max_calls",
               "max_result_tokens")

__all__ = ["BM25Retriever", "CONFIG_KEYS", "RESULT_CLOSE", "RESULT_OPEN", "TOOL_NAMES",
           "ToolResult", "ToolRunner", "available_corpora", "build_tool_runner", "calculate",
           "count_calls", "load_corpus", "register_corpus", "result_block", "tool_config_problems",
           "tool_symbols", "tools_enabled"]


def tools_enabled(config: Mapping[str, Any]) -> bool:
    """Whether the run's config has a `tools` block with `enabled` true."""
    tools = config.get("tools") if hasattr(config, "get") else None
    return bool(tools and tools.get("enabled", False))


def tool_config_problems(tools: Mapping[str, Any] | None) -> list[str]:
    """'tools.key: message' for every problem of a `tools` config block (empty if valid or
    absent). Checks unknown keys, the tool names, positive limits and that the corpus exists."""
    if tools is None or not tools.get("enabled", False):
        return []
    problems = [f"tools.{k}: unknown key; known keys: {list(CONFIG_KEYS)}"
                for k in tools if k not in CONFIG_KEYS]
    names = tools.get("names", ())
    if isinstance(names, str) or not names or any(n not in TOOL_NAMES for n in names) \
            or len(set(names)) != len(names):
        problems.append(f"tools.names: must be a non-empty list of distinct tools from "
                        f"{list(TOOL_NAMES)}, got {names!r}")
    for key, low in (("max_calls", 1), ("max_result_tokens", 4), ("search_top_k", 1)):
        value = tools.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"tools.{key}: must be an integer >= {low}, got {value!r}")
    if "search" in (names or ()) and not isinstance(names, str):
        corpus = tools.get("search_corpus")
        if not isinstance(corpus, str) or not corpus:
            problems.append(f"tools.search_corpus: must be a built-in corpus name "
                            f"{available_corpora()} or a file path, got {corpus!r}")
        elif corpus not in available_corpora() and not os.path.isfile(corpus):
            problems.append(f"tools.search_corpus: {corpus!r} is neither a built-in corpus "
                            f"{available_corpora()} nor a file")
    return problems


def build_tool_runner(tools: Mapping[str, Any]) -> ToolRunner:
    """The ToolRunner of a (valid) `config.tools` block."""
    fns = {}
    for name in tools["names"]:
        if name == "search":
            fns[name] = BM25Retriever(load_corpus(tools["search_corpus"]),
                                      top_k=int(tools["search_top_k"]))
        elif name == "calc":
            fns[name] = calculate
        else:
            raise ValueError(f"tools.names: unknown tool {name!r}; known: {list(TOOL_NAMES)}")
    return ToolRunner(fns)


def tool_symbols(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Tags a tokenizer trained for this config keeps as single tokens: every tool tag and
    the result tags when tools are enabled, else ()."""
    if not tools_enabled(config):
        return ()
    names = tuple(config["tools"]["names"])
    return tuple(t for n in names for t in (f"<{n}>", f"</{n}>")) + (RESULT_OPEN, RESULT_CLOSE)
