"""Length-shaped rewards against the papers' formulas (written per element, in plain python),
and their composition in RewardPool as batch rewards."""
import math

import numpy as np
import pytest

from jaxrl_reason.rewards import (
    BatchContext,
    RewardPool,
    RewardResult,
    register_batch_reward,
    register_reward,
)
from jaxrl_reason.rewards import length as L

RNG = np.random.default_rng(0)


def _random_batch(n_groups=5, g=4, max_len=64):
    lengths = RNG.integers(1, max_len + 1, size=n_groups * g)
    correct = RNG.random(n_groups * g) < 0.5
    truncated = lengths == max_len
    return lengths, correct, truncated


# ----------------------------------------------------------------------- the formulas


def test_kimi_matches_paper():
    lengths, correct, _ = _random_batch()
    g = 4
    got = L.kimi_length_reward(lengths, correct, g)
    for i in range(len(lengths)):
        grp = lengths[(i // g) * g:(i // g + 1) * g]
        lo, hi = grp.min(), grp.max()
        lam = 0.0 if hi == lo else 0.5 - (lengths[i] - lo) / (hi - lo)
        want = lam if correct[i] else min(0.0, lam)
        assert got[i] == pytest.approx(want, abs=1e-6)
    assert got.dtype == np.float32


def test_kimi_equal_lengths_is_zero_and_extremes():
    assert np.all(L.kimi_length_reward([7, 7, 7], [True, False, True], 3) == 0)
    got = L.kimi_length_reward([10, 20, 30, 10, 20, 30], [1, 1, 1, 0, 0, 0], 6)
    np.testing.assert_allclose(got, [0.5, 0.0, -0.5, 0.0, 0.0, -0.5])


def test_l1_exact_and_max_match_paper():
    lengths, correct, _ = _random_batch()
    targets = RNG.integers(1, 80, size=len(lengths))
    alpha, delta = 0.01, 0.5
    exact = L.l1_exact_penalty(lengths, targets, alpha)
    mx = L.l1_max_reward(lengths, targets, correct, alpha, delta)
    for i in range(len(lengths)):
        assert exact[i] == pytest.approx(-alpha * abs(targets[i] - lengths[i]), abs=1e-6)
        want = float(correct[i]) * min(1.0, max(0.0, alpha * (targets[i] - lengths[i]) + delta))
        assert mx[i] == pytest.approx(want, abs=1e-6)


def test_cosine_matches_paper_endpoints_and_formula():
    t_max = 100
    got = L.cosine_length_reward([0, 100, 0, 100, 50, 50, 100], [1, 1, 0, 0, 1, 0, 1],
                                 [0, 0, 0, 0, 0, 0, 1], t_max)
    np.testing.assert_allclose(got, [2.0, 1.0, -10.0, 0.0, 1.5, -5.0, -10.0], atol=1e-6)
    lengths, correct, truncated = _random_batch(max_len=t_max)
    got = L.cosine_length_reward(lengths, correct, truncated, t_max, correct_short=3,
                                 correct_long=0.5, wrong_short=-4, wrong_long=-1, exceed=-7)
    for i, n in enumerate(lengths):
        r0, rl = (3, 0.5) if correct[i] else (-4, -1)
        # Yeo et al.: eta_min + (eta_max - eta_min)(1 + cos(t pi / T)) / 2, r0 at t = 0.
        want = -7 if truncated[i] else rl + 0.5 * (r0 - rl) * (1 + math.cos(n * math.pi / t_max))
        assert got[i] == pytest.approx(want, abs=1e-5)


def test_dapo_overlong_matches_paper():
    l_max, cache = 20, 4
    lengths = np.arange(0, 21)
    got = L.dapo_overlong_penalty(lengths, lengths > l_max, l_max, cache)
    for n, v in zip(lengths, got):
        want = 0.0 if n <= l_max - cache else ((l_max - cache) - n) / cache
        assert v == pytest.approx(want)
    assert got[-1] == -1.0
    assert L.dapo_overlong_penalty([5], [True], l_max, cache)[0] == -1.0
    with pytest.raises(ValueError, match="cache_length"):
        L.dapo_overlong_penalty([1], [False], 10, 10)


def test_target_lengths_from_key_or_prompt():
    exs = [{"target_length": 12, "prompt": "x"},
           {"prompt": "What is 2+2? Think for 40 tokens."}]
    np.testing.assert_array_equal(L.target_lengths(exs), [12, 40])
    with pytest.raises(ValueError, match="'p7'.*no target length"):
        L.target_lengths([{"id": "p7", "prompt": "What is 2+2?"}])


def test_group_mismatch_raises():
    with pytest.raises(ValueError, match="groups of 4"):
        L.kimi_length_reward([1, 2, 3], [1, 1, 1], 4)


# ------------------------------------------------------------------ pool composition


@register_reward("_test_right_if_a")
def _right_if_a(completion, example):
    return RewardResult(1.0 if completion.startswith("a") else 0.0)


@register_batch_reward("_test_batch_boom")
def _batch_boom(ctx):
    raise RuntimeError("boom")


@register_batch_reward("_test_batch_nan")
def _batch_nan(ctx, value: float = float("nan")):
    return np.full(len(ctx.completions), value)


def _submit(pool, texts, lengths, truncated, max_length=32, group_size=2):
    exs = [{"prompt": "p", "answer": "1"}] * len(texts)
    return pool.score(texts, exs, lengths=lengths, truncated=truncated,
                      max_length=max_length, group_size=group_size)


def test_pool_runs_verifier_for_batch_reward_and_weights_it_zero():
    with RewardPool({"length_kimi": 1.0}, verifier="_test_right_if_a", num_workers=2) as pool:
        out = _submit(pool, ["a", "a", "b", "a"], [10, 20, 10, 30], [False] * 4)
    np.testing.assert_allclose(out.components["_test_right_if_a"], [1, 1, 0, 1])
    np.testing.assert_allclose(out.components["length_kimi"], [0.5, -0.5, 0.0, -0.5])
    np.testing.assert_allclose(out.total, out.components["length_kimi"])


def test_pool_options_bind_and_unknown_option_errors():
    weights = {"_test_right_if_a": 1.0, "overlong_dapo": 0.5}
    with RewardPool(weights, options={"overlong_dapo": {"cache_length": 8}},
                    num_workers=1) as pool:
        out = _submit(pool, ["a", "b"], [28, 32], [False, True])
    np.testing.assert_allclose(out.components["overlong_dapo"], [-0.5, -1.0])
    np.testing.assert_allclose(out.total, [1 - 0.25, -0.5])
    with pytest.raises(ValueError, match="no option.*'cache'.*cache_length"):
        RewardPool(weights, options={"overlong_dapo": {"cache": 8}})
    with pytest.raises(ValueError, match="options given for 'length_kimmi'"):
        RewardPool(weights, options={"length_kimmi": {}})
    # Options of a registered but unweighted reward are defaults a config may carry.
    RewardPool(weights, options={"length_kimi": {"unused": 1}}).close()


def test_pool_needs_lengths_for_batch_rewards():
    with RewardPool({"overlong_dapo": 1.0}, num_workers=1) as pool:
        assert pool.needs_lengths
        with pytest.raises(ValueError, match="need lengths="):
            pool.submit(["a"], [{"prompt": "p", "answer": "1"}])
        with pytest.raises(ValueError, match="groups of 2"):
            pool.submit(["a"] * 3, [{"prompt": "p", "answer": "1"}] * 3, lengths=[1, 2, 3],
                        truncated=[0, 0, 0], max_length=8, group_size=2)


def test_failing_batch_reward_scores_zero_with_reason():
    weights = {"_test_right_if_a": 1.0, "_test_batch_boom": 1.0, "_test_batch_nan": 1.0}
    with RewardPool(weights, num_workers=1) as pool:
        out = _submit(pool, ["a", "b"], [1, 2], [False, False])
    np.testing.assert_allclose(out.total, [1.0, 0.0])
    assert out.reasons["_test_batch_boom/exception"] == 2
    assert out.reasons["_test_batch_nan/nonfinite"] == 2


def test_batch_context_fields():
    seen = {}

    @register_batch_reward("_test_ctx_probe", needs_correct=True, overwrite=True)
    def probe(ctx: BatchContext):
        seen.update(vars(ctx))
        return np.zeros(len(ctx.completions))

    with RewardPool({"_test_ctx_probe": 1.0}, verifier="_test_right_if_a",
                    num_workers=1) as pool:
        _submit(pool, ["a", "b"], [3, 4], [False, True], max_length=4, group_size=2)
    assert seen["max_length"] == 4 and seen["group_size"] == 2
    np.testing.assert_array_equal(seen["correct"], [True, False])
    np.testing.assert_array_equal(seen["truncated"], [False, True])
