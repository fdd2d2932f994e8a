"""The `knights_knaves` reward: parse who is a knight and who is a knave, compare with the key.

The answer text is the last `<answer>...</answer>` (or everything after an unclosed last
`<answer>`), else the text after the last `</think>`, else the last TAIL_CHARS characters.
It is split into words and the sentence ends `.` and `;` (one linear regex scan, no
backtracking), then read left to right with two forms, in any order and case:

    name-first:  "Alice is a knight, Bob: knave", "(1) Alice is a knave", "Alice and Bob
                 are knights", "Carol is not a knight" (`not` flips the role)
    role-first:  "Knights: Alice, Bob. Knaves: Carol", "The knave is Carol"

A role word (knight(s); knave(s) or liar(s)) assigns the names read since the previous
assignment; a role word with no pending names opens a list that lasts until the next role
word or `.`/`;`. Unknown words are skipped. Each name must get exactly one role (saying the
same role twice is fine, two roles is "conflicting"); a hedge such as "Alice is a knight or
a knave" gives Alice both roles.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards.base import RewardResult, register_reward

TAIL_CHARS = 1000  # how much of an untagged completion is read as its answer
MAX_ANSWER_CHARS = 20_000  # longer answer sections score 0 with reason "too_long"

_TOKEN = re.compile(r"[^\W\d_]+|[;.]")
_ROLES = {"knight": True, "knights": True, "knave": False, "knaves": False, "liar": False,
          "liars": False}
_SENTENCE_END = (".", ";")


def answer_section(completion: str) -> str | None:
    """The text the verifier reads (see the module docstring); None when `completion` is not
    a str or is blank."""
    if not isinstance(completion, str) or not completion.strip():
        return None
    open_ = completion.rfind("<answer>")
    if open_ >= 0:
        close = completion.find("</answer>", open_)
        end = close if close >= 0 else len(completion)
        return completion[open_ + len("<answer>") : end]
    think_end = completion.rfind("</think>")
    if think_end >= 0:
        return completion[think_end + len("</think>") :]
    return completion[-TAIL_CHARS:]


def parse_assignment(text: str, names: list[str]) -> tuple[dict[int, bool], bool]:
    """Read roles for `names` from `text`.

    Returns ({name index: True for knight, False for knave}, conflicting) where conflicting
    is True when some name got both roles (its last role is kept). Linear in len(text).
    """
    index = {name.lower(): i for i, name in enumerate(names)}
    roles: dict[int, bool] = {}
    conflicting = False
    pending: list[int] = []
    negated = False
    header: bool | None = None  # role of an open role-first list
    last: list[int] = []  # the names of the latest assignment, for "a knight or a knave"
    hedge = False

    def assign(role: bool) -> None:
        nonlocal conflicting, negated, last
        for i in pending:
            if roles.get(i, role) != role:
                conflicting = True
            roles[i] = role
        last = list(pending)
        pending.clear()
        negated = False

    for match in _TOKEN.finditer(text):
        word = match.group(0).lower()
        if word in index:
            pending.append(index[word])
            hedge = False
        elif word in _ROLES:
            role = _ROLES[word]
            if hedge and not pending and header is None:  # "Alice is a knight or a knave"
                pending.extend(last)
                assign(role)
            elif header is not None:  # a new list starts: close the open one
                assign(header)
                header = role
            elif pending:
                assign(role != negated)
            else:
                header = role
            hedge = False
        elif word == "not" and pending:
            negated = not negated
        elif word == "or":
            hedge = True
        elif word in _SENTENCE_END:
            if header is not None:
                assign(header)
            pending.clear()
            negated, header, hedge = False, None, False
    if header is not None:
        assign(header)
    return roles, conflicting


@register_reward("knights_knaves")
def knights_knaves(completion: str, example: Mapping[str, Any]) -> RewardResult:
    """1.0 iff the answer gives every person of `example["names"]` the role of
    `example["solution"]` (list[bool], True = knight).

    Reasons for 0.0: "not_text", "no_answer" (no person assigned), "too_long" (answer
    section over MAX_ANSWER_CHARS), "conflicting" (a person given both roles),
    "incomplete" (someone unassigned), "wrong". Never raises on the completion; raises
    ValueError when `example` lacks "names" or "solution" or they differ in length.
    """
    if "names" not in example or "solution" not in example:
        raise ValueError(
            f"knights_knaves: example needs 'names' and 'solution' (keys: {sorted(example)})")
    names, solution = [str(x) for x in example["names"]], [bool(x) for x in example["solution"]]
    if len(names) != len(solution) or not names:
        raise ValueError(f"knights_knaves: {len(names)} names but {len(solution)} roles")
    if not isinstance(completion, str):
        return RewardResult(0.0, "not_text")
    text = answer_section(completion)
    if text is None:
        return RewardResult(0.0, "no_answer")
    if len(text) > MAX_ANSWER_CHARS:
        return RewardResult(0.0, "too_long")
    try:
        roles, conflicting = parse_assignment(text, names)
    except Exception:  # defensive: a verifier bug must not crash the reward pool
        return RewardResult(0.0, "no_answer")
    if not roles:
        return RewardResult(0.0, "no_answer")
    if conflicting:
        return RewardResult(0.0, "conflicting")
    if len(roles) < len(names):
        return RewardResult(0.0, "incomplete")
    if any(roles[i] != role for i, role in enumerate(solution)):
        return RewardResult(0.0, "wrong")
    return RewardResult(1.0)
