"""Code task: reference solutions pass their hidden tests (in the sandbox), wrong code fails,
the SFT trace's check is true, splits are disjoint, generation is deterministic."""
import re

import pytest

import jaxrl_reason.rewards.code  # noqa: F401  (registers the "code" reward)
from jaxrl_reason.data import code
from jaxrl_reason.data.tasks import get_task, task_source
from jaxrl_reason.rewards import get_reward

LEVELS = range(1, code.MAX_LEVEL + 1)
_COMPLETION = re.compile(r"<think>(.+) Check: f\((.+)\)=(.+)\.</think><answer>(def f\((x|xs)\): "
                         r"return .+)</answer>")


def _examples(split, level, count, seed=0):
    return [code.make_example(split, level, i, seed) for i in range(count)]


@pytest.mark.parametrize("split", code.SPLITS)
@pytest.mark.parametrize("level", LEVELS)
def test_examples_are_consistent(split, level):
    for ex in _examples(split, level, 40, seed=level):
        assert set(ex) == {"id", "prompt", "answer", "completion", "tests", "level", "task"}
        assert ex["task"] == "code" and ex["level"] == level
        assert ex["id"].startswith(f"code-{split}-L{level}-s{level}-")
        assert ex["prompt"].startswith("Write a Python function f(")
        match = _COMPLETION.fullmatch(ex["completion"])
        assert match, ex["completion"]
        assert match.group(4) == ex["answer"]
        fn = code.reference_function(ex["answer"])
        assert repr(fn(eval(match.group(2)))) == match.group(3)  # the trace's check is true
        (tests,) = ex["tests"]
        asserts = tests.split("\n")
        assert len(asserts) >= code.NUM_TESTS and all(a.startswith("assert f(") for a in asserts)
        exec(tests, {"f": fn})  # the reference passes its own tests


@pytest.mark.parametrize("level", LEVELS)
def test_reference_passes_and_wrong_code_fails_in_the_sandbox(level):
    reward = get_reward("code")
    ex = code.make_example("eval", level, 0, 0)
    assert reward(ex["completion"], ex).score == 1.0
    wrong = ex["completion"].replace("return ", "return 1+", 1) if ex["answer"].count(
        "[") == 0 else ex["completion"].replace("return [", "return [1]+[", 1)
    assert reward(wrong, ex).score == 0.0


def test_splits_are_disjoint_and_generation_deterministic():
    # A prompt states its family and every parameter, so it identifies the problem.
    for level in LEVELS:
        train = {ex["prompt"] for ex in _examples("train", level, 300)}
        held = {ex["prompt"] for ex in _examples("eval", level, 100)}
        assert not train & held
        assert code.problem_split("affine", (2, 3)) in code.SPLITS
    assert _examples("train", 3, 5, seed=1) == _examples("train", 3, 5, seed=1)
    assert _examples("train", 3, 5, seed=1) != _examples("train", 3, 5, seed=2)


def test_levels_have_room_and_errors_are_clear():
    assert len({ex["answer"] for ex in _examples("train", 1, 200)}) > 150
    with pytest.raises(ValueError, match="level must be in 1..5"):
        code.make_example("train", 6, 0, 0)
    with pytest.raises(ValueError, match="split"):
        code.make_example("test", 1, 0, 0)


def test_registered_task():
    task = get_task("code")
    assert task.verifier == "code" and task.max_level == code.MAX_LEVEL
    source = task_source(_config(), "train", (1, 2), 10, seed=0)
    assert [source[i]["level"] for i in range(4)] == [1, 2, 1, 2]
    corpus = task.corpus(_config(), 10)
    assert len(corpus) == 20 and any("def f(" in t for t in corpus)


def _config():
    import ml_collections
    return ml_collections.ConfigDict({"task": {"name": "code", "length_targets": (0, 0)}})
