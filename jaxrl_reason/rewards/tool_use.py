"""Rewards for tool-use tasks (`data/search_facts.py`): a short-answer verifier and a
tool-call indicator.

- `exact_match`: 1.0 when the text of the last `<answer>...</answer>` equals the example's
  "answer" after normalization (case, surrounding whitespace and punctuation, inner runs
  of whitespace, a leading article "the"); the tool results in the completion count for
  nothing, only what the model puts in its answer. Reasons for 0: "no_answer", "wrong".
- `tool_use`: 1.0 when the completion made at least one tool call that got a result
  (`</search><result>`, `</calc><result>`, ...); reason "no_call" otherwise. Weighted 0 it
  is the rollouts' tool-call rate, logged as `reward/tool_use`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards.base import RewardResult, register_reward
from jaxrl_reason.tools.runner import count_calls

MAX_ANSWER_CHARS = 1000  # longer answers are "wrong" without normalizing them
_SPACE = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """'  The  Orbe. ' -> 'orbe': lower case, whitespace runs to one space, surrounding
    punctuation and a leading 'the ' removed."""
    text = _SPACE.sub(" ", text.lower()).strip().strip(".,;:!?\"'").strip()
    return text[4:] if text.startswith("the ") else text


def answer_tag_text(completion: str) -> str | None:
    """The text inside the last `<answer>...</answer>`, or None when there is none."""
    if not isinstance(completion, str):
        return None
    start = completion.rfind("<answer>")
    end = completion.find("</answer>", start)
    if start < 0 or end < 0:
        return None
    return completion[start + len("<answer>"):end]


@register_reward("exact_match")
def exact_match(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff the `<answer>` text equals example["answer"] (normalized); see the module."""
    answer = answer_tag_text(completion)
    if answer is None or not answer.strip():
        return RewardResult(0.0, "no_answer")
    if len(answer) > MAX_ANSWER_CHARS:
        return RewardResult(0.0, "wrong")
    if normalize_answer(answer) == normalize_answer(str(example["answer"])):
        return RewardResult(1.0)
    return RewardResult(0.0, "wrong")


@register_reward("tool_use")
def tool_use(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 when the completion made a tool call that got a result, else 0 ("no_call")."""
    return RewardResult(1.0) if count_calls(completion) else RewardResult(0.0, "no_call")
