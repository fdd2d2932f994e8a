"""Tests for the format rewards and the reward registry."""
import pytest

from jaxrl_reason.rewards import RewardResult, available_rewards, get_reward, register_reward

EX = {"prompt": "p", "answer": "1"}

STRICT = [
    ("<think>a</think><answer>1</answer>", 1.0),
    ("  <think>\nlong\nthought\n</think>\n\n<answer> 1 </answer>\n", 1.0),
    ("<think></think><answer>1</answer>", 1.0),
    ("<think>a</think>x<answer>1</answer>", 0.0),
    ("hello <think>a</think><answer>1</answer>", 0.0),
    ("<think>a</think><answer>1</answer> bye", 0.0),
    ("<answer>1</answer><think>a</think>", 0.0),
    ("<think>a</think><answer> </answer>", 0.0),
    ("<think>a</think><think>b</think><answer>1</answer>", 0.0),
    ("<think>a<answer>1</answer></think>", 0.0),
    ("<think>a</think><answer>1", 0.0),
    ("<answer>1</answer>", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize("text,score", STRICT)
def test_format_strict(text, score):
    out = get_reward("format_strict")(text, EX)
    assert out.score == score
    assert (out.reason is None) == (score == 1.0)


LENIENT = [
    ("<think>a</think><answer>1</answer>", 1.0),
    ("preamble <think>a</think> text then <answer>1</answer> tail", 1.0),
    ("<think>a</think> so \\boxed{1}.", 1.0),
    ("<answer>1</answer>", 0.5),
    ("the result is \\boxed{1}", 0.5),
    ("<answer>1</answer><think>a</think>", 0.5),
    ("<think>a</think> no answer", 0.0),
    ("<think>a</think><answer>1", 0.0),
    ("plain text 1", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize("text,score", LENIENT)
def test_format_lenient(text, score):
    assert get_reward("format_lenient")(text, EX).score == score


def test_non_str_completion_is_malformed():
    assert get_reward("format_strict")(None, EX) == RewardResult(0.0, "not_text")
    assert get_reward("format_lenient")(3, EX) == RewardResult(0.0, "not_text")


def test_registry():
    assert {"correctness", "format_strict", "format_lenient"} <= set(available_rewards())
    with pytest.raises(ValueError, match="known rewards: .*correctness"):
        get_reward("no_such_reward")

    @register_reward("_test_registry_const")
    def const(completion, example):
        return 0.25

    assert get_reward("_test_registry_const") is const
    with pytest.raises(ValueError, match="already registered"):
        register_reward("_test_registry_const")(lambda c, e: 1.0)
    register_reward("_test_registry_const", overwrite=True)(const)
    with pytest.raises(ValueError, match="non-empty"):
        register_reward("")
    with pytest.raises(TypeError, match="not callable"):
        register_reward("_test_registry_bad")(3)


def test_reward_result_is_frozen():
    result = RewardResult(1.0)
    assert result.reason is None
    with pytest.raises(AttributeError):
        result.score = 0.0
