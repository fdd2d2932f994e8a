"""Tests for jaxrl_reason.evaluation.compare: per-problem scores, the paired bootstrap (against a
plain numpy loop and on cases whose answer is known), pass@k curves and the table."""
import numpy as np
import pytest

from jaxrl_reason.evaluation.compare import (BOOTSTRAP_CHUNK, format_comparison, paired_bootstrap,
                                     pass_at_k_curves, problem_scores)
from jaxrl_reason.evaluation.pass_at_k import pass_at_k


def _loop_bootstrap(a, b, num_resamples, seed, confidence=0.95):
    """The paired bootstrap written plainly: one resample at a time, explicit index grids,
    the same draws (problem indices [R, P], then seed indices [R, S]) as one chunk."""
    d = np.asarray(b, float) - np.asarray(a, float)
    p, s = d.shape
    rng = np.random.default_rng(seed)
    prob_idx = rng.integers(0, p, size=(num_resamples, p))
    seed_idx = rng.integers(0, s, size=(num_resamples, s))
    stats = np.array([d[np.ix_(prob_idx[r], seed_idx[r])].mean()
                      for r in range(num_resamples)])
    observed = d.mean()
    alpha = 1 - confidence
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    p_value = (1 + np.sum(np.abs(stats - observed) >= abs(observed) - 1e-12)) \
        / (num_resamples + 1)
    return observed, low, high, p_value


@pytest.mark.parametrize("shape", [(30, 3), (12, 1), (7, 5)])
def test_paired_bootstrap_matches_plain_numpy_loop(shape):
    rng = np.random.default_rng(1)
    a = rng.random(shape)
    b = np.clip(a + rng.normal(0.05, 0.2, size=shape), 0, 1)
    r = 1500
    assert r <= BOOTSTRAP_CHUNK  # one chunk: the loop above draws the same numbers
    out = paired_bootstrap(a, b, num_resamples=r, seed=3)
    observed, low, high, p_value = _loop_bootstrap(a, b, r, seed=3)
    assert out["diff"] == pytest.approx(observed, abs=1e-12)
    assert out["ci_low"] == pytest.approx(low, abs=1e-12)
    assert out["ci_high"] == pytest.approx(high, abs=1e-12)
    assert out["p_value"] == pytest.approx(p_value)
    assert out["mean_a"] == pytest.approx(a.mean()) and out["mean_b"] == pytest.approx(b.mean())
    assert (out["num_problems"], out["num_seeds"], out["num_resamples"]) == (*shape, r)


def test_identical_checkpoints_give_p_one_and_a_zero_interval():
    a = np.random.default_rng(0).random((50, 3))
    out = paired_bootstrap(a, a.copy())
    assert out["p_value"] == 1.0 and not out["significant"]
    assert out["diff"] == out["ci_low"] == out["ci_high"] == 0.0


def test_a_clear_shift_is_significant():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, size=(200, 3)) / 4  # pass@1 of 4 samples per problem
    b = np.clip(a + rng.choice([0.0, 0.25, 0.5], size=a.shape, p=[0.5, 0.3, 0.2]), 0, 1)
    out = paired_bootstrap(a, b, num_resamples=4000)
    assert out["p_value"] < 0.01 and out["significant"]
    assert 0 < out["ci_low"] < out["diff"] < out["ci_high"]
    # A constant shift no resample can undo: the smallest possible p-value.
    out = paired_bootstrap(a, a + 0.1, num_resamples=999)
    assert out["p_value"] == pytest.approx(1 / 1000)
    # Direction: B - A.
    assert paired_bootstrap(b, a, num_resamples=500)["diff"] == pytest.approx(-(b - a).mean())


def test_noise_only_is_rarely_significant():
    """Two draws of the same model: about 5% of tests at the 95% level are significant."""
    rng = np.random.default_rng(7)
    hard = rng.random(60)  # per-problem difficulty, shared by both checkpoints
    significant = 0
    for trial in range(40):
        a = rng.binomial(4, np.repeat(hard[:, None], 2, axis=1)) / 4
        b = rng.binomial(4, np.repeat(hard[:, None], 2, axis=1)) / 4
        significant += paired_bootstrap(a, b, num_resamples=400, seed=trial)["significant"]
    assert significant <= 8  # expected ~2 of 40


def test_pairing_shrinks_the_interval():
    """Problems that are hard for both checkpoints cancel out of a paired difference."""
    rng = np.random.default_rng(2)
    hard = rng.random((100, 1))
    a = np.clip(hard + rng.normal(0, 0.02, (100, 3)), 0, 1)
    b = np.clip(hard + 0.03 + rng.normal(0, 0.02, (100, 3)), 0, 1)
    paired = paired_bootstrap(a, b, num_resamples=2000)
    # Unpaired: resample A's and B's problems independently.
    draws = [b[rng.integers(0, 100, 100)].mean() - a[rng.integers(0, 100, 100)].mean()
             for _ in range(2000)]
    unpaired_width = np.subtract(*np.quantile(draws, [0.975, 0.025]))
    assert paired["ci_high"] - paired["ci_low"] < unpaired_width / 5
    assert paired["significant"]


def test_paired_bootstrap_options_and_chunks():
    rng = np.random.default_rng(4)
    a, b = rng.random((20, 3)), rng.random((20, 3))
    one_dim = paired_bootstrap(a[:, 0], b[:, 0], num_resamples=300)
    assert one_dim["num_seeds"] == 1
    fixed_seeds = paired_bootstrap(a, b, num_resamples=300, resample_seeds=False)
    assert fixed_seeds["diff"] == pytest.approx((b - a).mean())
    # More resamples than one chunk: deterministic per seed, different across seeds.
    many = [paired_bootstrap(a, b, num_resamples=BOOTSTRAP_CHUNK + 7, seed=s)
            for s in (0, 0, 1)]
    assert many[0] == many[1] and many[0]["ci_low"] != many[2]["ci_low"]
    wide = paired_bootstrap(a, b, num_resamples=2000, confidence=0.99)
    narrow = paired_bootstrap(a, b, num_resamples=2000, confidence=0.8)
    assert wide["ci_low"] < narrow["ci_low"] < narrow["ci_high"] < wide["ci_high"]


@pytest.mark.parametrize("kwargs,match", [
    ({"scores_a": np.zeros((5, 2)), "scores_b": np.zeros((5, 3))}, "same shape"),
    ({"scores_a": np.zeros((1, 2)), "scores_b": np.zeros((1, 2))}, "at least 2 problems"),
    ({"scores_a": np.zeros((2, 2, 2)), "scores_b": np.zeros((2, 2, 2))}, r"\[P, S\]"),
    ({"scores_a": [0.1, np.nan], "scores_b": [0.1, 0.2]}, "finite"),
    ({"scores_a": [0.1, 0.2], "scores_b": [0.1, 0.2], "num_resamples": 0}, "num_resamples"),
    ({"scores_a": [0.1, 0.2], "scores_b": [0.1, 0.2], "confidence": 1.0}, "confidence"),
])
def test_paired_bootstrap_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(**kwargs)


def test_problem_scores():
    correct = np.zeros((2, 3, 4), bool)  # [S, P, n]
    correct[0, 0, :2] = True
    correct[1, 0, :] = True
    correct[1, 2, 0] = True
    s1 = problem_scores(correct, k=1)
    assert s1.shape == (3, 2)
    np.testing.assert_allclose(s1, [[0.5, 1.0], [0.0, 0.0], [0.0, 0.25]])
    s2 = problem_scores(correct, k=2)
    assert s2[0, 0] == pytest.approx(pass_at_k(4, 2, 2))
    assert s2[2, 1] == pytest.approx(pass_at_k(4, 1, 2))
    assert problem_scores(correct[0]).shape == (3, 1)  # one seed, [P, n]
    with pytest.raises(ValueError, match="k must be"):
        problem_scores(correct, k=5)
    with pytest.raises(ValueError, match=r"\[S, P, n\]"):
        problem_scores(np.zeros(4, bool))


def test_pass_at_k_curves():
    rng = np.random.default_rng(0)
    correct = rng.random((3, 10, 8)) < 0.3
    curve = pass_at_k_curves(correct)
    assert curve["k"] == list(range(1, 9))
    assert np.all(np.diff(curve["mean"]) >= 0)  # pass@k never decreases in k
    assert curve["mean"][0] == pytest.approx(correct.mean())
    assert all(h >= 0 for h in curve["ci95"])
    assert np.isnan(pass_at_k_curves(correct[:1])["ci95"][0])  # one seed: no interval


def test_format_comparison():
    a = np.random.default_rng(0).random((30, 2))
    tests = {"levels 1-3": {"pass@1": paired_bootstrap(a, a + 0.05, num_resamples=200),
                            "pass@4": paired_bootstrap(a, a, num_resamples=200)}}
    table = format_comparison(tests, ("sft", "rl"))
    lines = table.split("\n")
    assert len(lines) == 4 and "rl - sft (%)" in lines[0]
    assert "+5.0 [+5.0, +5.0] (95%)" in lines[2] and "| yes" in lines[2]
    assert "1.0000" in lines[3] and "| no" in lines[3]
    with pytest.raises(ValueError):
        format_comparison({})
