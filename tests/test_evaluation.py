"""Tests for jaxrl_reason.evaluation: pass@k, maj@k, t quantiles, summaries, table."""
import itertools
import math

import numpy as np
import pytest

from jaxrl_reason.evaluation import (
    format_table,
    maj_at_k,
    mean_ci,
    pass_at_k,
    pass_at_k_batch,
    seed_metrics,
    student_t_quantile,
    summarize_seeds,
)


# ----------------------------------------------------------------------------- pass@k


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k),
                                                       abs=1e-12), (n, c, k)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # large n stays finite and in range (binomials here would overflow floats)
    v = pass_at_k(2000, 1, 1000)
    assert v == pytest.approx(0.5)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_int():
    with pytest.raises(TypeError, match="k"):
        pass_at_k(4, 1, 1.5)


def test_pass_at_k_batch_is_mean_over_problems():
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
    expected = np.mean([pass_at_k(4, 1, 2), 1.0, 0.0])
    assert pass_at_k_batch(correct, 2) == pytest.approx(expected)
    assert pass_at_k_batch(correct, 1) == pytest.approx(correct.mean())


def test_pass_at_k_batch_rejects_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="shape"):
        pass_at_k_batch(np.ones((4,), dtype=bool), 1)
    with pytest.raises(TypeError, match="dtype"):
        pass_at_k_batch(np.full((2, 2), 0.5), 1)
    with pytest.raises(ValueError, match="k"):
        pass_at_k_batch(np.ones((2, 2), dtype=bool), 3)


# ----------------------------------------------------------------------------- maj@k


def test_maj_at_k_majority_wins():
    answers = [["3", "4", "4", "3", "4"]]
    correct = np.array([[True, False, False, True, False]])
    assert maj_at_k(answers, correct, 5) == 0.0  # "4" x3 beats "3" x2
    assert maj_at_k(answers, correct, 4) == 1.0  # tie 2-2, "3" appears first
    assert maj_at_k(answers, correct, 1) == 1.0


def test_maj_at_k_none_never_wins():
    answers = [[None, None, "7", None], [None, None, None, None]]
    correct = np.array([[False, False, True, False], [False, False, False, False]])
    assert maj_at_k(answers, correct, 4) == pytest.approx(0.5)
    assert maj_at_k(answers, correct, 2) == 0.0  # only Nones among the first two


def test_maj_at_k_uses_only_first_k_samples():
    answers = [["1", "2", "2", "2"]]
    correct = np.array([[True, False, False, False]])
    assert maj_at_k(answers, correct, 2) == 1.0  # tie "1"/"2" -> "1" first
    assert maj_at_k(answers, correct, 3) == 0.0


def test_maj_at_k_rejects_mismatched_answers():
    correct = np.ones((2, 3), dtype=bool)
    with pytest.raises(ValueError, match="problems"):
        maj_at_k([["a", "a", "a"]], correct, 2)
    with pytest.raises(ValueError, match=r"answers\[1\]"):
        maj_at_k([["a", "a", "a"], ["a"]], correct, 2)
    with pytest.raises(TypeError, match="str or None"):
        maj_at_k([["a", 3, "a"], ["a", "a", "a"]], correct, 2)


# ----------------------------------------------------------------------------- t / CI


@pytest.mark.parametrize("df,expected", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228),
                                         (30, 2.042)])
def test_student_t_quantile_975(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_student_t_quantile_other_levels_and_symmetry():
    assert student_t_quantile(0.995, 5) == pytest.approx(4.032, abs=5e-4)
    assert student_t_quantile(0.95, 3) == pytest.approx(2.353, abs=5e-4)
    assert student_t_quantile(0.025, 2) == pytest.approx(-4.303, abs=5e-4)
    assert student_t_quantile(0.5, 7) == 0.0
    assert student_t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        student_t_quantile(0.9, 0)


def test_mean_ci_matches_formula():
    values = [0.5, 0.6, 0.7]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(0.6)
    assert half == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)


def test_mean_ci_single_value_has_nan_half_width():
    mean, half = mean_ci([0.42])
    assert mean == pytest.approx(0.42)
    assert math.isnan(half)


def test_mean_ci_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0, 2.0], confidence=1.5)


# ----------------------------------------------------------------------------- summaries


def test_summarize_seeds():
    per_seed = [{"pass@1": 0.5, "mean_length": 100.0}, {"pass@1": 0.7, "mean_length": 120.0}]
    out = summarize_seeds(per_seed)
    assert set(out) == {"pass@1", "mean_length"}
    assert out["pass@1"]["mean"] == pytest.approx(0.6)
    assert out["pass@1"]["values"] == [0.5, 0.7]
    assert out["pass@1"]["ci95"] == pytest.approx(12.7062 * np.std([0.5, 0.7], ddof=1)
                                                  / math.sqrt(2), rel=1e-4)
    with pytest.raises(ValueError, match="seed 1"):
        summarize_seeds([{"a": 1.0}, {"b": 1.0}])
    with pytest.raises(ValueError, match="empty"):
        summarize_seeds([])


def test_seed_metrics():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0]], dtype=bool)
    answers = [["5", "6", "6", "5"], ["1", None, "2", "2"]]
    lengths = np.array([[10, 20, 30, 40], [1, 2, 3, 4]], dtype=np.int32)
    out = seed_metrics(correct, answers, lengths, ks=(1, 2, 4, 8))
    assert set(out) == {"accuracy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4",
                        "mean_length"}
    assert out["accuracy"] == pytest.approx(0.25) == pytest.approx(out["pass@1"])
    assert out["pass@4"] == pytest.approx(0.5)
    assert out["pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + 0.0) / 2)
    assert out["maj@2"] == pytest.approx(0.5)  # problem 0: tie "5"/"6" -> "5" correct
    assert out["maj@4"] == pytest.approx(0.5)  # problem 0: tie 2-2 -> "5"
    assert out["mean_length"] == pytest.approx(13.75)


def test_seed_metrics_rejects_bad_lengths():
    correct = np.ones((1, 2), dtype=bool)
    with pytest.raises(ValueError, match="lengths shape"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 3), dtype=np.int32), ks=(1,))
    with pytest.raises(TypeError, match="integers"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 2)), ks=(1,))
    with pytest.raises(ValueError, match=">= 1"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 2), dtype=np.int32), ks=(0, 1))


# ----------------------------------------------------------------------------- table


def test_format_table():
    held_out = summarize_seeds([{"pass@1": 0.62, "maj@4": 0.70, "mean_length": 210.0},
                                {"pass@1": 0.64, "maj@4": 0.72, "mean_length": 230.0},
                                {"pass@1": 0.63, "maj@4": 0.74, "mean_length": 220.0}])
    hard = summarize_seeds([{"pass@1": 0.21, "mean_length": 400.0}])
    table = format_table({"level 1-3 (held-out)": held_out, "level 4": hard},
                         ["pass@1", "maj@4", "mean_length"])
    lines = table.split("\n")
    assert len(lines) == 4
    assert "pass@1 (%)" in lines[0] and "mean_length (tokens)" in lines[0]
    assert set(lines[1]) <= {"|", "-"}
    half = 4.3027 * 0.01 / math.sqrt(3) * 100
    assert f"63.0 ± {half:.1f}" in lines[2]
    assert "220.0 ± 24.8" in lines[2]
    # one seed: no interval; missing metric: "-"
    cells = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert cells == ["level 4", "21.0", "-", "400.0"]
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_format_table_rejects_empty():
    with pytest.raises(ValueError):
        format_table({}, ["pass@1"])
    with pytest.raises(ValueError):
        format_table({"a": {}}, [])
