"""The `knights_knaves` reward: answer formats in both directions, robustness, speed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrl_reason.rewards.logic as lg
from jaxrl_reason.rewards import get_reward
from cpu_bounds import Bound

EX = {"prompt": "...", "answer": "Alice is a knight, Bob is a knave, Carol is a knight",
      "names": ["Alice", "Bob", "Carol"], "solution": [True, False, True]}


def _tagged(answer):
    think = "<think>Assume Alice is a knight. Assume Bob is a knight.</think>"
    return f"{think}<answer>{answer}</answer>"


@pytest.mark.parametrize("answer", [
    "Alice is a knight, Bob is a knave, Carol is a knight",
    "Alice is a knight, Bob is a knave, and Carol is a knight.",
    "Carol is a knight. Bob is a knave. Alice is a knight.",
    "alice is a KNIGHT, BOB is a Knave, carol is a knight",
    "(1) Alice is a knight\n(2) Bob is a knave\n(3) Carol is a knight",
    "1. Alice: knight\n2. Bob: knave\n3. Carol: knight",
    "Alice: Knight; Bob: Knave; Carol: Knight",
    "- Alice - knight\n- Bob - knave\n- Carol - knight",
    "Alice and Carol are knights, and Bob is a knave.",
    "Alice and Carol are knights; Bob is a liar.",
    "Knights: Alice, Carol. Knaves: Bob.",
    "Knights: Alice, Carol\nKnaves: Bob",
    "Knaves: Bob\nKnights: Alice and Carol",
    "The knights are Alice and Carol, and the knave is Bob.",
    "Alice is a knight, Bob is not a knight, Carol is not a knave",
    "Alice is a knight, Bob is a knave, Carol is a knight, Alice is a knight",
    "**Alice** is a knight, **Bob** is a knave, **Carol** is a knight",
    "Alice=knight, Bob=knave, Carol=knight",
])
def test_correct_formats(answer):
    assert lg.knights_knaves(_tagged(answer), EX) == lg.RewardResult(1.0), answer


@pytest.mark.parametrize("completion, reason", [
    (_tagged("Alice is a knight, Bob is a knave, Carol is a knave"), "wrong"),
    (_tagged("Alice is a knave, Bob is a knight, Carol is a knave"), "wrong"),
    (_tagged("Knights: Alice, Bob, Carol"), "wrong"),
    (_tagged("Alice and Bob and Carol are knights"), "wrong"),
    (_tagged("Alice is a knight, Bob is a knave"), "incomplete"),
    (_tagged("Knights: Alice"), "incomplete"),
    (_tagged("Alice is a knight, Bob is a knave, Carol is a knight, Alice is a knave"),
     "conflicting"),
    (_tagged("Alice is a knight or a knave, Bob is a knave, Carol is a knight"), "conflicting"),
    (_tagged("Knights: Alice, Bob, Carol. Knaves: Bob."), "conflicting"),
    (_tagged("I cannot tell."), "no_answer"),
    (_tagged(""), "no_answer"),
    (_tagged("Alice, Bob, Carol"), "no_answer"),
    (_tagged("Dave is a knight"), "no_answer"),
    ("", "no_answer"),
    ("   \n", "no_answer"),
    # The last <answer> counts, not an earlier one.
    ("<answer>Alice is a knight, Bob is a knave, Carol is a knight</answer>"
     "<answer>Alice is a knave, Bob is a knave, Carol is a knight</answer>", "wrong"),
])
def test_wrong_answers(completion, reason):
    assert lg.knights_knaves(completion, EX) == lg.RewardResult(0.0, reason), completion


def test_answer_section_fallbacks():
    text = ("<think>Assume Alice is a knave.</think> Alice is a knight, Bob is a knave, "
            "Carol is a knight.")
    assert lg.knights_knaves(text, EX).score == 1.0  # after </think>
    text = "Reasoning... Assume Alice is a knave. " * 40 + "\nAnswer: Alice is a knight"
    assert lg.knights_knaves(text, EX).reason == "conflicting"  # the untagged tail
    assert lg.knights_knaves("Alice is a knight, Bob is a knave, Carol is a knight", EX).score == 1
    truncated = "<think>...</think><answer>Alice is a knight, Bob is a knave, Carol is a knight"
    assert lg.knights_knaves(truncated, EX).score == 1.0  # an unclosed last <answer>
    assert lg.answer_section("x" * 5000) == "x" * lg.TAIL_CHARS
    assert lg.answer_section(None) is None


def test_parse_assignment():
    roles, conflicting = lg.parse_assignment("Bob is a knave and Alice is a knight",
                                             ["Alice", "Bob"])
    assert roles == {0: True, 1: False} and not conflicting
    roles, conflicting = lg.parse_assignment("Alice knight Alice knave", ["Alice"])
    assert roles == {0: False} and conflicting


def test_not_text_bad_examples_and_registry():
    assert lg.knights_knaves(None, EX) == lg.RewardResult(0.0, "not_text")
    assert lg.knights_knaves(["Alice is a knight"], EX).reason == "not_text"
    for bad in [{"prompt": "p", "answer": "a"}, {**EX, "solution": [True]}, {**EX, "names": []}]:
        with pytest.raises(ValueError):
            lg.knights_knaves(_tagged(EX["answer"]), bad)
    assert get_reward("knights_knaves") is lg.knights_knaves


def test_huge_inputs_are_fast():
    huge = [
        _tagged("Alice is a knight " * 60_000),
        "Alice " * 200_000,
        "<answer>" * 200_000,
        "knight " * 150_000 + "</answer>",
        "<think>" + "Alice is a knave. " * 60_000 + "</think><answer>" + EX["answer"] + "</answer>",
        "a" * 1_000_000,
    ]
    with Bound(cpu_s=2.0, wall_s=60.0):  # thread CPU: load cannot make it fail
        results = [lg.knights_knaves(c, EX) for c in huge]
    assert [r.reason for r in results][:1] == ["too_long"] and results[4].score == 1.0


_WORDS = st.sampled_from(["Alice", "bob", "CAROL", "is", "a", "knight", "knave", "knights",
                          "not", "or", "and", ":", ".", ";", ",", "\n", "<answer>", "</answer>",
                          "</think>", "liar", "Dave", "(1)", " "])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(_WORDS, max_size=60).map(" ".join)))
def test_random_text_never_raises(text):
    for completion in (text, f"<answer>{text}</answer>"):
        result = lg.knights_knaves(completion, EX)
        assert result.score in (0.0, 1.0)
        assert (result.score == 1.0) == (result.reason is None)
