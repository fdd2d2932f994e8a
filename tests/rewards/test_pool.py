"""Tests for RewardPool: weighting, failure handling, limits, concurrency."""
import os
import threading
import time

import numpy as np
import pytest
from busy_cpu import saturated

from jaxrl_reason.rewards import BatchRewards, RewardPool, RewardResult, register_reward

_RELEASE = threading.Event()  # lets the hung test component finish at the end of the test
_STOP_SPIN = threading.Event()  # ends the endless CPU burner at the end of its test


@register_reward("_test_len")
def _len_reward(completion, example):
    return float(len(completion))


@register_reward("_test_raises")
def _raises(completion, example):
    if completion == "bad":
        raise RuntimeError("boom")
    return RewardResult(0.0, "meh")


@register_reward("_test_nonfinite")
def _nonfinite(completion, example):
    return {"nan": float("nan"), "inf": float("inf")}.get(completion, 1.0)


@register_reward("_test_wrong_type")
def _wrong_type(completion, example):
    return "1.0"


@register_reward("_test_hangs")
def _hangs(completion, example):
    if completion == "hang":
        _RELEASE.wait(30.0)
    return 1.0


@register_reward("_test_burn")
def _burn(completion, example):
    """"burn:X" spends X seconds of this thread's CPU time, "spin" spins until told to stop
    (or 30 s of CPU), anything else answers at once; each scores 1."""
    if completion == "spin":
        limit = 30.0
    elif completion.startswith("burn:"):
        limit = float(completion[5:])
    else:
        return 1.0
    end = time.thread_time() + limit
    while time.thread_time() < end and not (completion == "spin" and _STOP_SPIN.is_set()):
        pass
    return 1.0


@register_reward("_test_unscored")
def _says_unscored(completion, example):
    return RewardResult(0.0, "unscored") if completion == "?" else RewardResult(1.0)


@register_reward("_test_slow")
def _slow(completion, example):
    time.sleep(0.2)
    return 1.0


def _examples(n):
    return [{"prompt": "p", "answer": "4"} for _ in range(n)]


def test_weighted_total_and_components():
    texts = ["<think>x</think><answer>4</answer>", "<answer>5</answer>", "nothing"]
    weights = {"correctness": 1.0, "format_lenient": 0.5, "_test_len": 0.0}
    with RewardPool(weights, num_workers=2) as pool:
        out = pool.score(texts, _examples(3))
    assert isinstance(out, BatchRewards)
    assert out.total.dtype == np.float32 and out.total.shape == (3,)
    np.testing.assert_allclose(out.components["correctness"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(out.components["format_lenient"], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(out.components["_test_len"], [len(t) for t in texts])
    np.testing.assert_allclose(out.total, [1.5, 0.25, 0.0])
    assert out.reasons == {
        "correctness/wrong": 1,
        "correctness/no_answer": 1,
        "format_lenient/no_think": 1,
        "format_lenient/no_answer": 1,
    }
    assert out.seconds >= 0.0


def test_exceptions_nonfinite_and_bad_types_score_zero():
    texts = ["bad", "ok", "nan", "inf"]
    weights = {"_test_raises": 1.0, "_test_nonfinite": 2.0, "_test_wrong_type": 1.0}
    with RewardPool(weights, num_workers=3) as pool:
        out = pool.score(texts, _examples(4))
    np.testing.assert_allclose(out.components["_test_nonfinite"], [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(out.total, [2.0, 2.0, 0.0, 0.0])
    assert out.reasons["_test_raises/exception"] == 1
    assert out.reasons["_test_raises/meh"] == 3
    assert out.reasons["_test_nonfinite/nonfinite"] == 2
    assert out.reasons["_test_wrong_type/exception"] == 4


def test_hung_component_is_unscored_at_the_backstop_and_pool_keeps_working():
    """A call that waits (no CPU) is abandoned at the wall-clock backstop as unscored, not
    as a timeout; the others of its batch are scored."""
    texts = ["a", "hang", "b", "hang", "c"]
    try:
        weights = {"_test_hangs": 1.0, "_test_len": 1.0}
        with RewardPool(weights, num_workers=2, timeout_s=0.5, backstop_factor=1) as pool:
            start = time.monotonic()
            out = pool.score(texts, _examples(5))
            elapsed = time.monotonic() - start
            assert elapsed < 2.5
            assert out.reasons["_test_hangs/unscored"] == 2
            assert "_test_hangs/timeout" not in out.reasons
            assert out.unscored["_test_hangs"].tolist() == [False, True, False, True, False]
            assert not out.unscored["_test_len"].any() and out.unscored_count() == 2
            assert out.components["_test_hangs"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
            assert pool.abandoned_threads == 2
            # The replacement threads score the next batch normally.
            again = pool.score(["a", "b"], _examples(2))
            np.testing.assert_allclose(again.total, [2.0, 2.0])
            assert not again.reasons
    finally:
        _RELEASE.set()


@pytest.mark.saturates_cpu
def test_cpu_limit_is_charged_to_each_call_not_the_batch():
    """Per-call CPU time, not the batch's wall time: honest answers queued behind several
    slow-but-under-limit neighbours (together far over the limit) on one thread all score
    1, on a machine saturated by busy processes too; only the call that uses up its own
    CPU time is a timeout (and it is not unscored). The old batch deadline of `timeout_s`
    seconds of wall time scored everything after the first 0.5 s as 0."""
    texts = ["burn:0.3"] * 4 + ["ok"] * 3 + ["spin"] + ["ok"] * 2
    try:
        with saturated(4), RewardPool({"_test_burn": 1.0}, num_workers=1,
                                      timeout_s=0.5) as pool:
            out = pool.score(texts, _examples(len(texts)))
    finally:
        _STOP_SPIN.set()
    expected = [1.0] * 10
    expected[7] = 0.0
    assert out.total.tolist() == expected
    assert out.reasons == {"_test_burn/timeout": 1}
    assert out.timed_out["_test_burn"].tolist() == [i == 7 for i in range(10)]
    assert not out.unscored["_test_burn"].any()
    assert out.seconds > 0.5 * 4  # far beyond what the old batch deadline allowed


def test_a_reward_may_report_unscored_itself():
    with RewardPool({"_test_unscored": 1.0}, num_workers=2) as pool:
        out = pool.score(["a", "?", "b"], _examples(3))
    assert out.unscored["_test_unscored"].tolist() == [False, True, False]
    assert out.reasons == {"_test_unscored/unscored": 1} and out.unscored_count() == 1


def test_submit_returns_at_once_and_runs_concurrently():
    with RewardPool({"_test_slow": 1.0}, num_workers=4, timeout_s=5.0) as pool:
        start = time.monotonic()
        future = pool.submit(["x"] * 8, _examples(8))
        assert time.monotonic() - start < 0.1
        assert not future.done()
        out = future.result(timeout=5.0)
        elapsed = time.monotonic() - start
    np.testing.assert_allclose(out.total, np.ones(8))
    assert elapsed < 1.2  # 8 x 0.2 s on 4 threads is 0.4 s; serial would be 1.6 s


def test_batches_in_order_and_empty_batch():
    with RewardPool({"_test_len": 1.0}, num_workers=2) as pool:
        futures = [pool.submit(["a" * i], _examples(1)) for i in range(5)]
        assert [f.result().total[0] for f in futures] == [0.0, 1.0, 2.0, 3.0, 4.0]
        empty = pool.score([], [])
    assert empty.total.shape == (0,) and empty.components["_test_len"].shape == (0,)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown reward"):
        RewardPool({"nope": 1.0})
    with pytest.raises(ValueError, match="finite"):
        RewardPool({"_test_len": float("nan")})
    with pytest.raises(ValueError, match="non-empty"):
        RewardPool({})
    with pytest.raises(ValueError, match="num_workers"):
        RewardPool({"_test_len": 1.0}, num_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool({"_test_len": 1.0}, timeout_s=0)
    for bad in (0.5, float("inf"), True, "2"):
        with pytest.raises(ValueError, match="backstop_factor"):
            RewardPool({"_test_len": 1.0}, backstop_factor=bad)
        with pytest.raises(ValueError, match="limit_scale"):
            RewardPool({"_test_len": 1.0}, limit_scale=bad)
    pool = RewardPool({"_test_len": 1.0}, num_workers=1)
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        pool.submit(["a", "b"], _examples(1))
    with pytest.raises(TypeError, match=r"completions\[1\]"):
        pool.submit(["a", None], _examples(2))
    with pytest.raises(TypeError, match=r"examples\[0\]"):
        pool.submit(["a"], ["not a mapping"])
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="after close"):
        pool.submit(["a"], _examples(1))


def test_many_threads_share_the_math_verifier(monkeypatch):
    """Concurrency, not speed: generous time budgets, so that a loaded machine (the suite runs
    two workers on two cores) cannot turn a slow first sympy parse into a 0."""
    from jaxrl_reason.rewards import math as math_reward

    monkeypatch.setattr(math_reward, "CORRECTNESS_TIMEOUT_S", 60.0)
    texts = ["\\boxed{\\sqrt{16}}", "\\boxed{2+2}", "<answer>4</answer>", "\\boxed{5}"] * 4
    with RewardPool({"correctness": 1.0}, num_workers=4, timeout_s=120.0) as pool:
        out = pool.score(texts, _examples(len(texts)))
    np.testing.assert_allclose(out.total, [1.0, 1.0, 1.0, 0.0] * 4)


def test_user_reward_module_registers_by_path_and_bad_ones_are_named(tmp_path):
    from jaxrl_reason.rewards.pool import import_reward_modules

    module = tmp_path / "my_rewards.py"
    module.write_text("from jaxrl_reason.rewards import register_reward\n"
                      "@register_reward('_user_shout')\n"
                      "def shout(completion, example, bonus=0.0):\n"
                      "    return float(completion.isupper()) + bonus\n")
    import_reward_modules([str(module)])
    with RewardPool({"_user_shout": 1.0}, options={"_user_shout": {"bonus": 0.5}},
                    num_workers=1) as pool:
        out = pool.score(["HI", "hi"], _examples(2))
    np.testing.assert_allclose(out.total, [1.5, 0.5])
    with pytest.raises(ValueError, match="rewards.modules.*missing.py"):
        import_reward_modules([str(tmp_path / "missing.py")])
    with pytest.raises(ValueError, match="rewards.modules.*no_such_pkg"):
        import_reward_modules(["no_such_pkg.rewards"])


def test_config_validation_names_bad_rewards():
    from jaxrl_reason.cli import parse
    from jaxrl_reason.config.validation import validate_config

    import ml_collections
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _, fv = parse(["jaxrl-reason", "train", "--config",
                   os.path.join(repo, "configs", "arith_grpo.py") + ":smoke"])
    config = fv.config
    config.unlock()
    config.rewards.weights = ml_collections.ConfigDict({"correctnes": 1.0})
    config.rewards.options.overlong_dapo.cache_length = 3
    config.rewards.options.overlong_dapo.unused = 1
    problems = validate_config(config, 1)
    assert any(p.startswith("rewards.weights: unknown reward 'correctnes'") for p in problems)
    config.rewards.weights = ml_collections.ConfigDict({"overlong_dapo": 1.0})
    problems = validate_config(config, 1)
    assert any(p.startswith("rewards.options:") and "unused" in p for p in problems), problems
