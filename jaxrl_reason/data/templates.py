r"""Prompt templates: how a raw problem is put to the model.

A template is a `str.format` string with a `{prompt}` field (the raw problem text) and,
optionally, other example fields by name (`"[{type}, {level}] {prompt}"`). Literal braces
are doubled: `\\boxed{{}}`. Named templates live in `TEMPLATES`:

    plain   the problem text as it is
    r1      the DeepSeek-R1-Zero instruction: think inside <think></think>, answer inside
            <answer></answer> (the format the built-in arithmetic task trains)
    boxed   the problem, then "Please reason step by step, and put your final answer
            within \boxed{}." (the Qwen-Math / MATH convention)

`apply_template(example, template)` returns a copy with the raw problem in
`example["problem"]` and the rendered text in `example["prompt"]`.
"""
from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from typing import Any

# The DeepSeek-R1-Zero instruction alone (no braces): the system message of an R1 chat
# prompt (`jaxrl_reason.tokenizers.r1_messages`) and the head of the "r1" template.
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question, and the "
    "Assistant solves it. The Assistant first thinks about the reasoning process in "
    "the mind and then provides the User with the answer. The reasoning process and "
    "answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)

TEMPLATES: dict[str, str] = {
    "plain": "{prompt}",
    "r1": R1_INSTRUCTION + "\nUser: {prompt}\nAssistant:",
    "boxed": (
        "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    ),
}


@dataclasses.dataclass(frozen=True)
class Template:
    """A validated prompt template.

    Attributes:
      name: the registry name, or "custom" for a user format string.
      text: the `str.format` string.
      fields: the example fields it reads, in order of first use ("prompt" among them).
    """

    name: str
    text: str
    fields: tuple[str, ...]

    def render(self, example: Mapping[str, Any]) -> str:
        """The prompt text for `example` (a dict with "prompt" and every other field used).

        Raises:
          ValueError: the example lacks a field the template uses.
        """
        missing = [f for f in self.fields if f not in example]
        if missing:
            raise ValueError(
                f"template {self.name!r} uses field {missing[0]!r}, which the example "
                f"lacks (fields: {sorted(example)})"
            )
        return self.text.format_map({f: example[f] for f in self.fields})


def _parse_fields(name: str, text: str) -> tuple[str, ...]:
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:  # e.g. a single '{' or '}'
        raise ValueError(
            f"template {name!r} is not a valid format string ({e}); write literal braces "
            "as '{{' and '}}'"
        ) from None
    fields: list[str] = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            shown = "{" + field + "}"
            raise ValueError(
                f"template {name!r} has field {shown!r}: fields must be example field names "
                "such as {prompt} (write literal braces as '{{' and '}}')"
            )
        if spec or conversion:
            raise ValueError(
                f"template {name!r} field {field!r} has a conversion or format spec; use "
                "plain {name} fields"
            )
        if field not in fields:
            fields.append(field)
    if "prompt" not in fields:
        raise ValueError(f"template {name!r} has no {{prompt}} field: {text!r}")
    return tuple(fields)


def get_template(template: str | Template) -> Template:
    """A validated `Template` from a registry name or a format string.

    Args:
      template: a name in `TEMPLATES` ("plain", "r1", "boxed"), a format string
        containing `{prompt}` (any string with a brace is taken as a format string), or a
        `Template` (returned as is).

    Returns:
      The `Template`.

    Raises:
      ValueError: an unknown name, or a format string without `{prompt}`, with positional
        (`{}`, `{0}`) or attribute/index (`{a.b}`, `{a[0]}`) fields, conversions, format
        specs, or unbalanced braces.
      TypeError: `template` is not a string or a `Template`.
    """
    if isinstance(template, Template):
        return template
    if not isinstance(template, str):
        raise TypeError(
            f"template must be a name or a format string, got {type(template).__name__}"
        )
    if template in TEMPLATES:
        return Template(template, TEMPLATES[template], _parse_fields(template, TEMPLATES[template]))
    if "{" not in template and "}" not in template:
        raise ValueError(
            f"unknown template {template!r}: use one of {sorted(TEMPLATES)} or a format "
            "string containing {prompt}"
        )
    return Template("custom", template, _parse_fields("custom", template))


def register_template(name: str, text: str) -> None:
    """Adds a named template to `TEMPLATES` after validating it.

    Args:
      name: a new name (an identifier-like string without braces).
      text: a format string containing `{prompt}`.

    Raises:
      ValueError: the name is taken or has braces, or the text is not a valid template.
    """
    if name in TEMPLATES:
        raise ValueError(f"template {name!r} is already registered")
    if not name or "{" in name or "}" in name:
        raise ValueError(f"template name must be non-empty and brace-free, got {name!r}")
    _parse_fields(name, text)
    TEMPLATES[name] = text


def apply_template(example: Mapping[str, Any], template: str | Template) -> dict[str, Any]:
    """A copy of `example` whose "prompt" is rendered by `template`.

    Args:
      example: a dict with "prompt" (the raw problem, a str) and any fields the template
        uses.
      template: a `TEMPLATES` name, a format string containing `{prompt}`, or a `Template`.

    Returns:
      A new dict: the example's fields, "problem" = the raw problem text (overwriting any
      "problem" field), and "prompt" = the rendered prompt. Apply a template once: a
      second application wraps the already rendered prompt again.

    Raises:
      ValueError: an invalid template, or the example lacks a field it uses.
    """
    tpl = get_template(template)
    out = dict(example)
    out["prompt"] = tpl.render(example)
    out["problem"] = example["prompt"]
    return out
