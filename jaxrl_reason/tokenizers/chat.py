"""Chat prompts: a model's Jinja chat template rendered as transformers does
(`apply_chat_template`), and the R1 instruction put to a chat model (`r1_messages`,
`r1_chat_prompt`).
"""
from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_reason.data.templates import R1_INSTRUCTION
from jaxrl_reason.tokenizers.base import (
    CONFIG_FILE,
    SPECIAL_NAMES,
    HF_INSTALL_HINT,
    TokenizerBase,
)
from jaxrl_reason.tokenizers.files import load_tokenizer
from jaxrl_reason.tokenizers.hf import HFTokenizer
from jaxrl_reason.tokenizers.sentencepiece import Tokenizer


def _import_jinja2():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise ImportError(f"chat templates need jinja2: {HF_INSTALL_HINT}") from None
    return jinja2


@functools.lru_cache(maxsize=16)
def _compiled_template(text: str):
    """The template compiled as transformers does: sandboxed, trim/lstrip blocks, loop
    controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text; in
    `chat_limits.LimitedSandbox` (time and size limits: a template may come from a
    download)."""
    jinja2 = _import_jinja2()
    from jaxrl_reason.tokenizers import chat_limits

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = chat_limits.LimitedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.limit_filters()
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(text)


def apply_chat_template(tokenizer: str | os.PathLike | Tokenizer | HFTokenizer,
                        messages: Sequence[Mapping[str, Any]],
                        add_generation_prompt: bool = True, **variables: Any) -> str:
    """Renders a model's Jinja chat template for `messages`, as transformers does.

    Args:
      tokenizer: a `Tokenizer`/`HFTokenizer` or a model directory (`load_tokenizer`).
      messages: a non-empty list of dicts with "role" ("system", "user", "assistant", ...)
        and "content" (usually a str).
      add_generation_prompt: end with the header of an assistant turn (to sample from).
      **variables: more template variables, e.g. `enable_thinking=False` (Qwen3),
        `tools=[...]`, `date_string="26 Jul 2024"` (Llama 3).

    Returns:
      The prompt text. It holds the bos token when the template writes one (Gemma,
      Llama 3), so encode it with `add_bos=False`.

    Raises:
      ValueError: the tokenizer has no chat template, the template is not valid Jinja, it
        rejects the conversation (its `raise_exception` message, e.g. Gemma's "Conversation
        roles must alternate"), fails on arithmetic or recursion, or goes over a limit of
        `chat_limits` (`MAX_RENDER_S` seconds, `MAX_CHARS` characters of output or of any
        value it builds). TypeError: malformed messages. ImportError: no jinja2.
    """
    tok = tokenizer if isinstance(tokenizer, TokenizerBase) else load_tokenizer(tokenizer)
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TypeError(f"messages[{i}] must be a dict with a str 'role', got {m!r}")
    if tok.chat_template is None:
        raise ValueError(
            f"{tok.source} has no chat template ({CONFIG_FILE} has no 'chat_template' and "
            "there is no chat_template.jinja): a base model takes a plain prompt template "
            "(jaxrl_reason.data.templates) instead")
    jinja2 = _import_jinja2()
    context = {f"{n}_token": getattr(tok, f"{n}_token") for n in SPECIAL_NAMES}
    context = {k: v for k, v in context.items() if v is not None}
    context.update(tools=None, documents=None)
    context.update(variables)
    from jaxrl_reason.tokenizers import chat_limits

    try:
        template = _compiled_template(tok.chat_template)
        return chat_limits.render(template, messages=[dict(m) for m in messages],
                                  add_generation_prompt=add_generation_prompt, **context)
    except (jinja2.TemplateError, ArithmeticError, RecursionError) as e:
        raise ValueError(f"chat template of {tok.source}: {type(e).__name__}: {e}") from None


def r1_instruction() -> str:
    """The R1 instruction (reason in <think> </think>, answer in <answer> </answer>):
    `jaxrl_reason.data.templates.R1_INSTRUCTION`, the "r1" prompt template without its
    User/Assistant frame."""
    return R1_INSTRUCTION


def r1_messages(problem: str, *, system: bool = True) -> list[dict[str, str]]:
    """A chat asking for `<think>...</think><answer>...</answer>` about `problem`.

    With `system=True` the R1 instruction is the system message and the problem the user
    message (the Open-R1 convention); with False both go in one user message (for models
    whose template rejects a system role, e.g. Gemma 2, or that were trained without one).
    """
    if not isinstance(problem, str):
        raise TypeError(f"problem must be a str, got {type(problem).__name__}")
    if system:
        return [{"role": "system", "content": r1_instruction()},
                {"role": "user", "content": problem}]
    return [{"role": "user", "content": f"{r1_instruction()}\n\n{problem}"}]


def r1_chat_prompt(tokenizer: str | os.PathLike | Tokenizer | HFTokenizer, problem: str, *,
                   system: bool = True) -> str:
    """`apply_chat_template(tokenizer, r1_messages(problem, system=system))`: the prompt
    text, ending with the assistant header; encode it with `add_bos=False`."""
    return apply_chat_template(tokenizer, r1_messages(problem, system=system),
                               add_generation_prompt=True)
