"""Preference pairs for reward-model training: (prompt, chosen, rejected[, margin]) records.

    pairs = read_preference_pairs("prefs.jsonl")   # one JSON object per line, checked
    pairs = arithmetic_preference_pairs(512, corruption=CORRUPTIONS)   # generated, offline
    train, held = split_pairs(pairs, 0.1, seed=0)  # held-out prompts never seen in training

A file's lines are {"prompt": str, "chosen": str, "rejected": str} with optional "id" (default
"<file stem>-<line>") and "margin" (a finite float, Llama 2's m(r)); a bad line is reported
with its file and line number. The generated pairs pair a worked arithmetic completion with a
corrupted one (a wrong answer, a wrong result in the reasoning too, a verbose repeat, or a
truncation); their train and eval splits are disjoint by problem (`arithmetic.problem_split`).
`jaxrl_reason.recipes.reward_model` trains on them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxrl_reason.data import arithmetic
from jaxrl_reason.data.files import jsonl_records

Pair = dict[str, Any]  # {"id": str, "prompt": str, "chosen": str, "rejected": str, "margin": float}
PAIR_FIELDS = ("prompt", "chosen", "rejected")


def _pair_from_record(record: Mapping[str, Any], default_id: str) -> Pair:
    pair: Pair = {}
    for name in PAIR_FIELDS:
        if name not in record:
            raise ValueError(f"missing field {name!r} (fields: {sorted(record)})")
        value = record[name]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"field {name!r} must be a non-empty string, got {value!r}")
        pair[name] = value
    if pair["chosen"] == pair["rejected"]:
        raise ValueError("'chosen' and 'rejected' are the same text")
    margin = record.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not np.isfinite(margin):
        raise ValueError(f"field 'margin' must be a finite number, got {margin!r}")
    pair["margin"] = float(margin)
    raw_id = record.get("id", default_id)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise ValueError(f"field 'id' must be a string or an int, got {raw_id!r}")
    pair["id"] = str(raw_id)
    for key, value in record.items():
        if key not in pair and isinstance(value, str):
            pair[key] = value
    return pair


def read_preference_pairs(path: str | os.PathLike) -> list[Pair]:
    """Reads preference pairs from a local JSONL file, one JSON object per non-blank line.

    Each object has "prompt", "chosen" and "rejected" (non-empty strings; chosen is the
    preferred response, and the two differ), optionally "margin" (a number, Llama 2's
    preference-strength margin; default 0) and "id" (string or int; default
    "<file stem>-<line>"). Other string fields (e.g. "kind") are kept as they are.

    Returns: a list of pair dicts {"id", "prompt", "chosen", "rejected", "margin", ...}.
    Raises:
      FileNotFoundError: no such file.
      ValueError: a malformed line (bad JSON, not an object, a missing or ill-typed field,
        identical chosen/rejected), naming `file:line` (1-based); or a file with no pairs.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    stem = os.path.splitext(os.path.basename(path))[0]
    pairs = []
    for where, line, record in jsonl_records(path):
        try:
            if isinstance(record, Exception):
                raise record
            pairs.append(_pair_from_record(record, f"{stem}-{line}"))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if not pairs:
        raise ValueError(f"{path}: no preference pairs (the file is empty or blank)")
    return pairs


def write_preference_pairs(path: str | os.PathLike, pairs: Iterable[Mapping[str, Any]]) -> int:
    """Writes pairs as JSONL ({"id", "prompt", "chosen", "rejected", "margin"} per line,
    and "kind" when present; atomically: temp file + rename). Returns the number of lines."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp, n = path + ".tmp", 0
    with open(tmp, "w", encoding="utf-8") as f:
        for pair in pairs:
            record = {k: pair[k] for k in ("id", *PAIR_FIELDS, "margin", "kind") if k in pair}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _corrupt_number(text: str, rng: np.random.Generator) -> str:
    """`text` (a non-negative integer) with one digit replaced by a different digit (no
    leading zero): a wrong answer of the same length."""
    i = int(rng.integers(len(text)))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and d == "0"
                                                               and len(text) > 1)]
    return text[:i] + choices[int(rng.integers(len(choices)))] + text[i + 1:]


CORRUPTIONS = ("answer", "result", "verbose", "truncated")


def _rejected(chosen: str, answer: str, kind: str, rng: np.random.Generator) -> str:
    """The dispreferred version of a worked arithmetic completion (see CORRUPTIONS)."""
    head, _, tail = chosen.partition("</think>")  # "<think>steps. So e=r." / "<answer>r</answer>"
    if kind in ("answer", "result"):
        wrong = _corrupt_number(answer, rng)
        rejected = chosen.replace(f"<answer>{answer}</answer>", f"<answer>{wrong}</answer>")
        if kind == "result":
            rejected = rejected.replace(f"={answer}.</think>", f"={wrong}.</think>")
        return rejected
    if kind == "verbose":
        body = head[len("<think>"):]
        return f"<think>{body} Let me check again. {body}</think>{tail}"
    cut = int(rng.integers(len("<think>") + 1, len(head)))  # "truncated": no answer
    return head[:cut]


def arithmetic_preference_pairs(num_pairs: int, *, split: str = "train",
                                levels: Sequence[int] = (1, 2), seed: int = 0,
                                corruption: str | Sequence[str] = "answer") -> list[Pair]:
    """Procedurally generated preference pairs on the arithmetic task (no download).

    The prompt is an arithmetic problem ("What is 47+85?", `data.arithmetic`); chosen is its
    worked column-by-column completion; rejected is, by `corruption`:

      "answer": the same completion with a wrong `<answer>` (one digit changed, same length)
        while the trace still ends "So 47+85=132.": a response contradicting its reasoning.
      "result": the final statement is wrong too; only the column steps, which write the
        right digits, give it away.
      "verbose": correct, but the whole trace is repeated after "Let me check again."
        (long2short: the shorter correct reasoning is preferred).
      "truncated": cut off inside the reasoning, with no answer.

    A sequence of kinds is cycled through (pair i gets kind i % len); the pair's "kind"
    field names it. Train and eval splits are disjoint by problem
    (`arithmetic.problem_split`). Pair i uses level `levels[i % len(levels)]`; the same
    arguments give the same pairs.
    """
    kinds = (corruption,) if isinstance(corruption, str) else tuple(corruption)
    for kind in kinds:
        if kind not in CORRUPTIONS:
            raise ValueError(f"corruption must be in {CORRUPTIONS}, got {kind!r}")
    pairs = []
    for i in range(num_pairs):
        example = arithmetic.make_example(split, levels[i % len(levels)], i, seed)
        kind = kinds[i % len(kinds)]
        rejected = _rejected(example["completion"], example["answer"], kind,
                             np.random.default_rng([seed, 7, i]))
        pairs.append({"id": f"pref-{example['id']}", "prompt": example["prompt"],
                      "chosen": example["completion"], "rejected": rejected, "margin": 0.0,
                      "kind": kind})
    return pairs


def split_pairs(pairs: Sequence[Pair], eval_fraction: float, *,
                seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, held_out): a seeded random `eval_fraction` of `pairs` is held out (at least
    one pair, and at least one left to train on). Pairs sharing a prompt go to the same side,
    so held-out accuracy is measured on prompts the model never saw.

    Raises ValueError when `eval_fraction` is not in (0, 1) or there are fewer than two
    distinct prompts.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
    prompts = list(dict.fromkeys(p["prompt"] for p in pairs))
    if len(prompts) < 2:
        raise ValueError(f"cannot hold out pairs: the {len(pairs)} pairs have "
                         f"{len(prompts)} distinct prompt(s); give --eval_data instead")
    order = np.random.default_rng(seed).permutation(len(prompts))
    n_eval = min(max(1, round(eval_fraction * len(prompts))), len(prompts) - 1)
    held = {prompts[i] for i in order[:n_eval]}
    return ([p for p in pairs if p["prompt"] not in held],
            [p for p in pairs if p["prompt"] in held])
