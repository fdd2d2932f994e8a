"""Writes the small GSM8K-format sample files used by configs/gsm8k_file_grpo.py.

    python configs/data/make_sample_gsm8k.py     # rewrites sample_gsm8k_{train,test}.jsonl

Word problems over the arithmetic task's numbers, in GSM8K's record layout: {"question",
"answer"} where the answer is a worked solution with `<<a+b=c>>` calculator notes and a
final `#### N` line. They stand in for a real GSM8K file, which cannot be downloaded here.
"""
import json
import os

import numpy as np

_ADD = ("{name} has {a} {thing}. {pronoun} gets {b} more. How many {thing} does {name} have now?",
        "{name} has {a}+{b}={c} {thing}.")
_SUB = ("{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
        "{name} has {a}-{b}={c} {thing} left.")
_NAMES = (("Tom", "He"), ("Ana", "She"), ("Li", "He"), ("Maya", "She"), ("Omar", "He"))
_THINGS = ("apples", "stamps", "marbles", "books", "coins")


def record(rng: np.random.Generator) -> dict:
    name, pronoun = _NAMES[rng.integers(len(_NAMES))]
    thing = _THINGS[rng.integers(len(_THINGS))]
    digits = int(rng.integers(1, 4))
    a, b = (int(rng.integers(10 ** (digits - 1), 10 ** digits)) for _ in range(2))
    if rng.random() < 0.5:
        question, worked, c = _ADD[0], _ADD[1], a + b
        note = f"<<{a}+{b}={c}>>"
    else:
        a, b = max(a, b), min(a, b)
        question, worked, c = _SUB[0], _SUB[1], a - b
        note = f"<<{a}-{b}={c}>>"
    fields = dict(name=name, pronoun=pronoun, thing=thing, a=a, b=b, c=c)
    solution = worked.format(**fields).replace(f"={c}", f"={note}{c}", 1)
    return {"question": question.format(**fields), "answer": f"{solution}\n#### {c}"}


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for split, n, seed in (("train", 400, 0), ("test", 100, 1)):
        rng = np.random.default_rng(seed)
        with open(os.path.join(here, f"sample_gsm8k_{split}.jsonl"), "w") as f:
            for _ in range(n):
                f.write(json.dumps(record(rng)) + "\n")


if __name__ == "__main__":
    main()
