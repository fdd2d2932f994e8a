"""Format rewards for the R1 template `<think>...</think><answer>...</answer>`.

Both are plain string scans (linear time, no regex backtracking), so they are cheap enough
for every completion of every step.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards.base import RewardResult, register_reward

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@register_reward("format_strict")
def format_strict(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff `completion` is exactly `<think>...</think>` then `<answer>...</answer>`.

    Whitespace is allowed around and between the two sections, nothing else; each tag occurs
    exactly once and the answer is not blank. Reasons for 0.0: "not_text", "tag_count",
    "layout" (text outside the sections or sections out of order), "empty_answer".
    """
    if not isinstance(completion, str):
        return RewardResult(0.0, "not_text")
    if any(completion.count(tag) != 1 for tag in _TAGS):
        return RewardResult(0.0, "tag_count")
    text = completion.strip()
    think_end = text.find("</think>")
    answer_start = text.find("<answer>")
    if not (
        text.startswith("<think>")
        and text.endswith("</answer>")
        and think_end < answer_start
        and not text[think_end + len("</think>") : answer_start].strip()
    ):
        return RewardResult(0.0, "layout")
    if not text[answer_start + len("<answer>") : -len("</answer>")].strip():
        return RewardResult(0.0, "empty_answer")
    return RewardResult(1.0)


def _has_answer(text: str) -> bool:
    start = text.find("<answer>")
    if start >= 0 and text.find("</answer>", start) >= 0:
        return True
    return "\\boxed{" in text


@register_reward("format_lenient")
def format_lenient(completion: str, example: Mapping[str, Any]) -> RewardResult:
    r"""1.0 for a `<think>...</think>` section followed (anywhere after) by an answer section.

    An answer section is `<answer>...</answer>` or `\boxed{`. 0.5 when there is only an answer
    section (reason "no_think"); 0.0 otherwise (reason "no_answer", or "not_text").
    """
    if not isinstance(completion, str):
        return RewardResult(0.0, "not_text")
    think_start = completion.find("<think>")
    think_end = -1
    if think_start >= 0:
        think_end = completion.find("</think>", think_start + len("<think>"))
    if think_end >= 0 and _has_answer(completion[think_end + len("</think>") :]):
        return RewardResult(1.0)
    if _has_answer(completion):
        return RewardResult(0.5, "no_think")
    return RewardResult(0.0, "no_answer")
