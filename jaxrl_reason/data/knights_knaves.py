"""Procedurally generated Knights-and-Knaves puzzles (as in Logic-RL, Xie et al. 2025).

Each inhabitant is a knight (always tells the truth) or a knave (always lies) and makes one
statement about the others (or about themself and another). A puzzle is drawn by picking a
random assignment, then for each speaker a random statement whose truth equals "speaker is
a knight"; the brute-force `solve` over all 2^n assignments keeps only puzzles with a unique
solution (otherwise all statements are redrawn). The SFT trace is the solver's depth-first
case analysis (people in order, knight before knave, contradictions named):

    prompt:     ... You meet 2 inhabitants: Alice and Bob. Alice says: "Bob is a knave."
                Bob says: "Alice and I are both knights." Who is a knight and who is a knave?
    completion: <think>Assume Alice is a knight. Assume Bob is a knight. Alice's statement
                is false, but Alice is a knight: contradiction. Assume Bob is a knave.
                So Alice is a knight, Bob is a knave.</think><answer>Alice is a knight,
                Bob is a knave</answer>

Difficulty levels = number of inhabitants: level L has L + 1 people (2..6). Level 1 is a
warm-up with only 12 distinct puzzles up to renaming (2 in eval); level 2 has 380 (80 in
eval); higher levels are effectively unbounded. SFT traces grow with the level (about 350
characters on average at level 1, 1,950 at level 5, at most ~5,500).

Statement kinds (`Statement.kind`, with persons a, b): "knight" (a is a knight), "knave",
"both_knights" (a and b), "some_knave" (at least one of a, b), "same" (a and the speaker are
the same kind), "different", "implies" (if a is a knight then b is a knight), "exactly_one"
(exactly one of a, b is a knight).

Train and eval splits are disjoint by construction: a puzzle is in the eval split iff a hash
of its canonical form falls in the eval bucket (1 in `EVAL_BUCKETS`). The canonical form
ignores names and is minimized over all relabelings of the people, so the same puzzle with
other names or in another order is in the same split.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_reason.data.levels import LevelSource, level_corpus

EVAL_BUCKETS = 5
MAX_LEVEL = 5
SPLITS = ("train", "eval")
NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack",
         "Kate", "Liam", "Mia", "Noah", "Olivia", "Paul", "Quinn", "Ruby", "Sam", "Tina")
KINDS = ("knight", "knave", "both_knights", "some_knave", "same", "different", "implies",
         "exactly_one")
_SYMMETRIC = ("both_knights", "some_knave", "exactly_one")
_PAIR_WITH_SPEAKER = ("both_knights", "some_knave")  # pair kinds whose pair may include "I"


@dataclasses.dataclass(frozen=True)
class Statement:
    """`speaker` claims `kind` about person `a` (and `b` for pair kinds, else -1)."""

    speaker: int
    kind: str
    a: int
    b: int = -1


def truth(statement: Statement, assignment: Sequence[bool]) -> bool:
    """Whether `statement` holds under `assignment` (assignment[i] True = person i knight)."""
    k, a, b = statement.kind, assignment[statement.a], assignment[statement.b]
    if k == "knight":
        return a
    if k == "knave":
        return not a
    if k == "both_knights":
        return a and b
    if k == "some_knave":
        return not (a and b)
    if k == "same":
        return a == assignment[statement.speaker]
    if k == "different":
        return a != assignment[statement.speaker]
    if k == "implies":
        return (not a) or b
    if k == "exactly_one":
        return a != b
    raise ValueError(f"unknown statement kind {k!r}")


def consistent(statements: Sequence[Statement], assignment: Sequence[bool]) -> bool:
    """Whether every speaker's statement is true iff the speaker is a knight."""
    return all(truth(s, assignment) == assignment[s.speaker] for s in statements)


def solve(statements: Sequence[Statement], n: int) -> list[tuple[bool, ...]]:
    """All assignments (tuples of n bools, True = knight) consistent with `statements`.

    Brute force over the 2^n assignments, in the order knight-before-knave per person.
    """
    return [a for a in itertools.product((True, False), repeat=n) if consistent(statements, a)]


def canonical_puzzle(statements: Sequence[Statement], n: int) -> str:
    """A name- and order-free key: the encoded statements, minimized over relabelings."""
    best = None
    for perm in itertools.permutations(range(n)):
        coded = []
        for s in statements:
            a, b = perm[s.a], (perm[s.b] if s.b >= 0 else -1)
            if s.kind in _SYMMETRIC:
                a, b = min(a, b), max(a, b)
            coded.append((perm[s.speaker], KINDS.index(s.kind), a, b))
        coded.sort()
        if best is None or coded < best:
            best = coded
    return f"{n}:" + ";".join(",".join(map(str, c)) for c in best)


def puzzle_split(statements: Sequence[Statement], n: int) -> str:
    """'eval' or 'train' for a puzzle (a hash of its canonical form)."""
    key = canonical_puzzle(statements, n).encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "eval" if bucket % EVAL_BUCKETS == 0 else "train"


def _draw_statement(rng: np.random.Generator, speaker: int, n: int) -> Statement:
    others = [i for i in range(n) if i != speaker]
    kinds = [k for k in KINDS if k not in ("implies", "exactly_one") or len(others) >= 2]
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind in ("knight", "knave", "same", "different"):
        return Statement(speaker, kind, others[int(rng.integers(len(others)))])
    pool = list(range(n)) if kind in _PAIR_WITH_SPEAKER else others
    a, b = (int(x) for x in rng.choice(pool, size=2, replace=False))
    return Statement(speaker, kind, a, b)


def _draw_puzzle(rng: np.random.Generator, n: int) -> tuple[list[Statement], tuple[bool, ...]]:
    """Statements with exactly one consistent assignment, and that assignment."""
    while True:
        assignment = tuple(bool(x) for x in rng.integers(0, 2, size=n))
        for _ in range(50):
            statements = []
            for speaker in range(n):
                while True:
                    s = _draw_statement(rng, speaker, n)
                    if truth(s, assignment) == assignment[speaker]:
                        break
                statements.append(s)
            if len(solve(statements, n)) == 1:
                return statements, assignment


def _role(knight: bool) -> str:
    return "knight" if knight else "knave"


def statement_text(s: Statement, names: Sequence[str]) -> str:
    """The statement as its speaker says it, e.g. 'Bob and I are both knights.'"""
    a = "I" if s.a == s.speaker else names[s.a]
    b = "I" if s.b == s.speaker else (names[s.b] if s.b >= 0 else "")
    if s.kind in _PAIR_WITH_SPEAKER and a == "I":
        a, b = b, a
    return {
        "knight": f"{a} is a knight.",
        "knave": f"{a} is a knave.",
        "both_knights": f"{a} and {b} are both knights.",
        "some_knave": f"At least one of {a} and {b} is a knave.",
        "same": f"{a} and I are the same kind.",
        "different": f"{a} and I are different kinds.",
        "implies": f"If {a} is a knight, then {b} is a knight.",
        "exactly_one": f"Exactly one of {a} and {b} is a knight.",
    }[s.kind]


def format_answer(names: Sequence[str], solution: Sequence[bool]) -> str:
    """'Alice is a knight, Bob is a knave' (names in puzzle order)."""
    return ", ".join(f"{name} is a {_role(k)}" for name, k in zip(names, solution))


def search_trace(statements: Sequence[Statement], names: Sequence[str]) -> list[str]:
    """Sentences of a depth-first case analysis that ends at the first consistent assignment.

    People are assumed in order, knight first; a statement is checked as soon as everyone it
    involves has an assumed kind.
    """
    n = len(names)
    ready: list[list[Statement]] = [[] for _ in range(n)]
    for s in statements:
        ready[max(s.speaker, s.a, s.b)].append(s)
    lines: list[str] = []

    def dfs(prefix: list[bool]) -> bool:
        i = len(prefix)
        if i == n:
            return True
        for knight in (True, False):
            assignment = prefix + [knight] + [True] * (n - i - 1)
            lines.append(f"Assume {names[i]} is a {_role(knight)}.")
            bad = next((s for s in ready[i] if truth(s, assignment) != assignment[s.speaker]),
                       None)
            if bad is not None:
                who = names[bad.speaker]
                lines.append(f"{who}'s statement is {str(truth(bad, assignment)).lower()}, "
                             f"but {who} is a {_role(assignment[bad.speaker])}: contradiction.")
            elif dfs(prefix + [knight]):
                return True
        if i > 0:
            lines.append(f"{names[i]} fits neither, so {names[i - 1]} is not a "
                         f"{_role(prefix[-1])}.")
        return False

    dfs([])
    return lines


def make_example(split: str, level: int, index: int, seed: int) -> dict[str, Any]:
    """The `index`-th puzzle of `split` at `level` for `seed` (deterministic).

    Returns a dict of python values: id (str), prompt (str), answer (str), completion (str,
    the SFT target), level (int), task ("knights_knaves"), names (list[str], level + 1
    people), solution (list[bool], True = knight, aligned with names).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not (isinstance(level, int) and 1 <= level <= MAX_LEVEL):
        raise ValueError(f"knights_knaves level must be in 1..{MAX_LEVEL}, got {level!r}")
    n = level + 1
    rng = np.random.default_rng([seed, SPLITS.index(split), level, index, 0x4B4B])
    while True:
        statements, solution = _draw_puzzle(rng, n)
        if puzzle_split(statements, n) == split:
            break
    names = [NAMES[int(k)] for k in rng.choice(len(NAMES), size=n, replace=False)]
    said = " ".join(f'{names[s.speaker]} says: "{statement_text(s, names)}"' for s in statements)
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    prompt = ("A very special island is inhabited only by knights and knaves. Knights always "
              "tell the truth, and knaves always lie. You meet "
              f"{n} inhabitants: {listed}. {said} Who is a knight and who is a knave?")
    answer = format_answer(names, solution)
    trace = " ".join(search_trace(statements, names))
    return {
        "id": f"kk-{split}-L{level}-s{seed}-{index}",
        "prompt": prompt,
        "answer": answer,
        "completion": f"<think>{trace} So {answer}.</think><answer>{answer}</answer>",
        "level": level,
        "task": "knights_knaves",
        "names": names,
        "solution": list(solution),
    }


class KnightsKnavesSource(LevelSource):
    """Random-access source of knights_knaves problems: item i has level `levels[i % len(levels)]`
    (see `LevelSource`); two sources with the same arguments hold identical items."""

    def __init__(self, split: str, levels: tuple[int, ...] | list[int], size: int, seed: int):
        super().__init__("knights_knaves", make_example, MAX_LEVEL, split, levels, size, seed)


def tokenizer_corpus(num_examples: int = 2000, seed: int = 12345) -> list[str]:
    """Texts to train the task tokenizer on: prompts and completions of every level."""
    return level_corpus(make_example, MAX_LEVEL, num_examples, seed)
