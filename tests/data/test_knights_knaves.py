"""Knights-and-Knaves task: the solver, unique solutions, traces, disjoint splits, determinism."""
import itertools
import re

import pytest

import jaxrl_reason.rewards.logic  # noqa: F401  (registers the "knights_knaves" reward)
from jaxrl_reason.data import knights_knaves as kk
from jaxrl_reason.rewards import get_reward

S = kk.Statement
LEVELS = range(1, kk.MAX_LEVEL + 1)
_TEMPLATES = [
    (re.compile(r"(\w+) is a knight\."), "knight"),
    (re.compile(r"(\w+) is a knave\."), "knave"),
    (re.compile(r"(\w+) and (\w+) are both knights\."), "both_knights"),
    (re.compile(r"At least one of (\w+) and (\w+) is a knave\."), "some_knave"),
    (re.compile(r"(\w+) and I are the same kind\."), "same"),
    (re.compile(r"(\w+) and I are different kinds\."), "different"),
    (re.compile(r"If (\w+) is a knight, then (\w+) is a knight\."), "implies"),
    (re.compile(r"Exactly one of (\w+) and (\w+) is a knight\."), "exactly_one"),
]


def _statements(example):
    """Rebuild the Statement list from the prompt text (checks the rendering too)."""
    names = example["names"]
    said = re.findall(r'(\w+) says: "([^"]+)"', example["prompt"])
    assert [speaker for speaker, _ in said] == names
    statements = []
    for speaker, text in said:
        sp = names.index(speaker)
        kinds = [(k, m.groups()) for p, k in _TEMPLATES if (m := p.fullmatch(text))]
        assert len(kinds) == 1, text
        kind, people = kinds[0]
        idx = [sp if p == "I" else names.index(p) for p in people]
        statements.append(S(sp, kind, idx[0], idx[1] if len(idx) > 1 else -1))
    return statements


def _examples(split, level, count, seed=0):
    return [kk.make_example(split, level, i, seed) for i in range(count)]


def test_truth_of_each_kind():
    cases = {  # kind: [(assignment of (speaker 0, a=1, b=2), expected truth)]
        "knight": [((True, True, True), True), ((True, False, True), False)],
        "knave": [((True, False, True), True), ((False, True, True), False)],
        "both_knights": [((True, True, True), True), ((True, True, False), False)],
        "some_knave": [((True, True, False), True), ((False, True, True), False)],
        "same": [((False, False, True), True), ((True, False, True), False)],
        "different": [((False, True, True), True), ((True, True, False), False)],
        "implies": [((True, False, False), True), ((True, True, True), True),
                    ((True, True, False), False)],
        "exactly_one": [((True, True, False), True), ((True, False, False), False)],
    }
    assert set(cases) == set(kk.KINDS)
    for kind, rows in cases.items():
        for assignment, expected in rows:
            assert kk.truth(S(0, kind, 1, 2), assignment) == expected, (kind, assignment)


def test_solver_on_hand_checked_puzzles():
    # Alice: "Bob is a knave." Bob: "Alice and I are both knights." If Alice were a knave,
    # Bob would be a knight whose claim is false; so Alice is a knight and Bob a knave.
    assert kk.solve([S(0, "knave", 1), S(1, "both_knights", 0, 1)], 2) == [(True, False)]
    # Alice: "Bob and I are the same kind." Bob: "Alice is a knave." -> Alice knave, Bob knight.
    assert kk.solve([S(0, "same", 1), S(1, "knave", 0)], 2) == [(False, True)]
    # Mutual praise has two solutions; "I am a knave" has none.
    assert kk.solve([S(0, "knight", 1), S(1, "knight", 0)], 2) == [(True, True), (False, False)]
    assert kk.solve([S(0, "knave", 0)], 1) == []
    # Alice: "Exactly one of Bob and Carol is a knight." Bob: "If Alice is a knight, then
    # Carol is a knight." Carol: "Alice is a knave." If Alice were a knight, Carol (calling
    # her a knave) would be a knave, so Bob a knight, whose implication fails: contradiction.
    # So Alice is a knave, Carol a knight, and Bob is Carol's kind (Alice lied): a knight.
    puzzle = [S(0, "exactly_one", 1, 2), S(1, "implies", 0, 2), S(2, "knave", 0)]
    assert kk.solve(puzzle, 3) == [(False, True, True)]
    assert kk.consistent(puzzle, (False, True, True))
    assert not kk.consistent(puzzle, (True, True, False))


@pytest.mark.parametrize("split", kk.SPLITS)
@pytest.mark.parametrize("level", LEVELS)
def test_examples_have_a_unique_solution_and_score_one(split, level):
    verifier = get_reward("knights_knaves")
    for ex in _examples(split, level, 25, seed=level):
        assert set(ex) == {"id", "prompt", "answer", "completion", "level", "task", "names",
                           "solution"}
        assert ex["task"] == "knights_knaves" and ex["level"] == level
        n = level + 1
        assert len(ex["names"]) == len(set(ex["names"])) == len(ex["solution"]) == n
        assert set(ex["names"]) <= set(kk.NAMES)
        assert all(type(x) is bool for x in ex["solution"])
        statements = _statements(ex)
        assert kk.solve(statements, n) == [tuple(ex["solution"])]
        assert kk.puzzle_split(statements, n) == split
        assert ex["answer"] == kk.format_answer(ex["names"], ex["solution"])
        assert ex["prompt"].endswith("Who is a knight and who is a knave?")
        assert ex["completion"].endswith(f"So {ex['answer']}.</think><answer>{ex['answer']}"
                                         "</answer>")
        assert verifier(ex["completion"], ex).score == 1.0


@pytest.mark.parametrize("level", LEVELS)
def test_trace_contradictions_are_real(level):
    """Replays the trace: every 'contradiction' is one under the assumptions made so far."""
    for ex in _examples("train", level, 20, seed=11):
        names, statements = ex["names"], _statements(ex)
        think = ex["completion"].split("</think>")[0][len("<think>"):]
        assumed = {}
        for sentence in re.findall(r"[^.]+\.", think):
            sentence = sentence.strip()
            if m := re.fullmatch(r"Assume (\w+) is a (knight|knave)\.", sentence):
                i = names.index(m.group(1))
                assumed = {k: v for k, v in assumed.items() if k < i}
                assumed[i] = m.group(2) == "knight"
            elif m := re.fullmatch(r"(\w+)'s statement is (true|false), but \1 is a "
                                   r"(knight|knave): contradiction\.", sentence):
                sp = names.index(m.group(1))
                s = statements[sp]
                full = [assumed.get(i, True) for i in range(len(names))]
                assert all(p in assumed for p in (s.speaker, s.a) + ((s.b,) if s.b >= 0 else ()))
                assert kk.truth(s, full) == (m.group(2) == "true") != full[sp]
                assert full[sp] == (m.group(3) == "knight")
            elif not re.fullmatch(r"\w+ fits neither, so \w+ is not a (knight|knave)\.", sentence):
                assert sentence.startswith("So "), sentence
        assert [assumed[i] for i in range(len(names))] == ex["solution"]


def test_canonical_form_ignores_names_and_order():
    puzzle = [S(0, "exactly_one", 1, 2), S(1, "implies", 0, 2), S(2, "knave", 0)]
    for perm in itertools.permutations(range(3)):
        relabeled = [S(perm[s.speaker], s.kind, perm[s.a], perm[s.b] if s.b >= 0 else -1)
                     for s in reversed(puzzle)]
        assert kk.canonical_puzzle(relabeled, 3) == kk.canonical_puzzle(puzzle, 3)
    swapped = [S(0, "exactly_one", 2, 1), *puzzle[1:]]
    assert kk.canonical_puzzle(swapped, 3) == kk.canonical_puzzle(puzzle, 3)
    other = [S(0, "knave", 1), S(1, "same", 0)]
    assert kk.canonical_puzzle(other, 2) != kk.canonical_puzzle([S(0, "knave", 1),
                                                                 S(1, "knight", 0)], 2)


def test_splits_are_disjoint():
    for level in (2, 3):
        eval_forms = {kk.canonical_puzzle(_statements(ex), level + 1)
                      for ex in _examples("eval", level, 80)}
        train_forms = {kk.canonical_puzzle(_statements(ex), level + 1)
                       for ex in _examples("train", level, 500, seed=1)}
        assert len(eval_forms) > 10 and not eval_forms & train_forms


def test_deterministic_and_seed_dependent():
    assert _examples("train", 3, 10, seed=5) == _examples("train", 3, 10, seed=5)
    assert _examples("train", 3, 10, seed=5) != _examples("train", 3, 10, seed=6)


def test_source_and_corpus():
    source = kk.KnightsKnavesSource("eval", (2, 5), size=4, seed=3)
    assert len(source) == 4 and [source[i]["level"] for i in range(4)] == [2, 5, 2, 5]
    assert source[3] == kk.make_example("eval", 5, 1, 3)
    with pytest.raises(IndexError):
        source[4]
    for bad in [dict(split="dev"), dict(levels=[]), dict(levels=[0]), dict(size=-1)]:
        with pytest.raises(ValueError):
            kk.KnightsKnavesSource(**{"split": "train", "levels": [1], "size": 3, "seed": 0,
                                      **bad})
    with pytest.raises(ValueError):
        kk.make_example("train", 6, 0, 0)
    corpus = kk.tokenizer_corpus(5, seed=0)
    assert len(corpus) == 10 and corpus[1].startswith("<think>Assume")
