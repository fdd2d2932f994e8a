"""Do two checkpoints differ? Per-problem scores and a paired bootstrap over problems and seeds.

Pure numpy; no device code. Both checkpoints answer the same P problems, n samples each, with
the same S sampling seeds, so their scores are paired by (problem, seed):

    scores_a = problem_scores(correct_a, k=1)     # [P, S] from bool [S, P, n]
    scores_b = problem_scores(correct_b, k=1)
    paired_bootstrap(scores_a, scores_b)
    # {"mean_a": 0.50, "mean_b": 0.60, "diff": 0.10, "ci_low": 0.07, "ci_high": 0.13,
    #  "p_value": 0.0001, "significant": True, ...}

Why paired, and why over problems: following Hochlehnert et al. (2025, "A Sober Look at
Progress in LM Reasoning"), most of the variance of a benchmark score is which problems it
holds and which samples were drawn, and two checkpoints share the problems. Resampling the
problems (with replacement, the same draw for A and B) keeps the pairing, so a problem that
is hard for both cancels out of the difference instead of widening its interval, and
resampling the seeds too (also paired) adds the sampling noise of the evaluation itself.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_reason.evaluation.pass_at_k import check_correct, pass_at_k, pass_at_k_curve
from jaxrl_reason.evaluation.stats import mean_ci

__all__ = ["problem_scores", "paired_bootstrap", "pass_at_k_curves", "format_comparison",
           "BOOTSTRAP_CHUNK"]

BOOTSTRAP_CHUNK = 2000  # resamples drawn per block (bounds memory at chunk x P indices)


def problem_scores(correct: np.ndarray, k: int = 1) -> np.ndarray:
    """Per-problem unbiased pass@k of each seed.

    Args:
      correct: [S, P, n] bool (seed, problem, sample), or [P, n] for a single seed.
      k: 1 <= k <= n; k = 1 gives the fraction of a problem's samples that are correct.
    Returns:
      [P, S] float64 in [0, 1].
    """
    arr = np.asarray(correct)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"problem_scores: correct must be [S, P, n] or [P, n], got shape "
                         f"{arr.shape}")
    per_seed = [check_correct(c, "problem_scores") for c in arr]
    n = per_seed[0].shape[1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"problem_scores: k must be an int in [1, n={n}], got {k!r}")
    return np.array([[pass_at_k(n, int(c), int(k)) for c in seed.sum(axis=1)]
                     for seed in per_seed], np.float64).T


def _as_scores(scores: Any, name: str) -> np.ndarray:
    arr = np.asarray(scores, np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"paired_bootstrap: {name} must be [P] or [P, S] with P, S >= 1, "
                         f"got shape {np.shape(scores)}")
    if not np.isfinite(arr).all():
        raise ValueError(f"paired_bootstrap: {name} must be finite")
    return arr


def _counts(indices: np.ndarray, size: int) -> np.ndarray:
    """[c, m] int draws in [0, size) -> [c, size] float64 counts of each index per row."""
    c = indices.shape[0]
    flat = (indices + size * np.arange(c)[:, None]).ravel()
    return np.bincount(flat, minlength=c * size).reshape(c, size).astype(np.float64)


def paired_bootstrap(scores_a: Any, scores_b: Any, *, num_resamples: int = 10_000,
                     confidence: float = 0.95, seed: int = 0,
                     resample_seeds: bool = True) -> dict[str, Any]:
    """Paired bootstrap test of mean(scores_b) - mean(scores_a) over problems and seeds.

    The statistic is the mean over problems and seeds of d = scores_b - scores_a. Each
    resample draws P problem indices with replacement and (with `resample_seeds`) S seed
    indices with replacement, the same draw for A and B (that is the pairing), and takes the
    mean of d over the drawn grid. Draws come from `np.random.default_rng(seed)` in blocks of
    `BOOTSTRAP_CHUNK` resamples: per block, the problem indices int [c, P], then the seed
    indices int [c, S]. A plain loop computing `d[np.ix_(p_idx[r], s_idx[r])].mean()` gives
    the same statistics.

    Interval: the percentile interval of the resampled statistics at `confidence`.
    p-value (two-sided): the bootstrap distribution shifted to the null of no difference
    (Hall & Wilson 1991): p = (1 + #{r : |t_r - t| >= |t|}) / (num_resamples + 1), with t the
    observed difference and t_r the resampled ones. Identical scores give p = 1; a shift
    that no resample undoes gives p = 1 / (num_resamples + 1).

    Args:
      scores_a, scores_b: [P] or [P, S] float (problem, seed), e.g. `problem_scores(...)`;
        the same shape, P >= 2.
      num_resamples: R >= 1 bootstrap resamples.
      confidence: interval level in (0, 1); `significant` is p < 1 - confidence.
      seed: seed of the resampling.
      resample_seeds: False resamples problems only (each resample keeps every seed).
    Returns:
      {"mean_a", "mean_b": float means; "diff": mean_b - mean_a; "ci_low", "ci_high": float
       interval of diff; "p_value": float in (0, 1]; "significant": bool; "num_problems": P,
       "num_seeds": S, "num_resamples": R, "confidence": float}.
    Raises:
      ValueError: shapes that differ or are not [P] / [P, S], P < 2, non-finite scores, a bad
        num_resamples or confidence.
    """
    a, b = _as_scores(scores_a, "scores_a"), _as_scores(scores_b, "scores_b")
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: scores_a {a.shape} and scores_b {b.shape} must "
                         "have the same shape (the same problems and seeds)")
    num_problems, num_seeds = a.shape
    if num_problems < 2:
        raise ValueError(f"paired_bootstrap: needs at least 2 problems to resample, got "
                         f"{num_problems}")
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, (int, np.integer)) \
            or num_resamples < 1:
        raise ValueError(f"paired_bootstrap: num_resamples must be an int >= 1, got "
                         f"{num_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"paired_bootstrap: confidence must be in (0, 1), got {confidence}")
    d = b - a
    observed = float(d.mean())
    rng = np.random.default_rng(seed)
    stats = np.empty(int(num_resamples), np.float64)
    for start in range(0, int(num_resamples), BOOTSTRAP_CHUNK):
        c = min(BOOTSTRAP_CHUNK, int(num_resamples) - start)
        problem_counts = _counts(rng.integers(0, num_problems, size=(c, num_problems)),
                                 num_problems)
        if resample_seeds:
            seed_counts = _counts(rng.integers(0, num_seeds, size=(c, num_seeds)), num_seeds)
        else:
            seed_counts = np.ones((c, num_seeds))
        stats[start:start + c] = np.einsum("rp,ps,rs->r", problem_counts, d, seed_counts) \
            / (num_problems * num_seeds)
    alpha = 1.0 - confidence
    low, high = np.quantile(stats, [alpha / 2.0, 1.0 - alpha / 2.0])
    tol = 1e-12 * max(1.0, abs(observed))  # float summation order, not a real difference
    extreme = int(np.sum(np.abs(stats - observed) >= abs(observed) - tol))
    p_value = (1 + extreme) / (int(num_resamples) + 1)
    return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "diff": observed,
            "ci_low": float(low), "ci_high": float(high), "p_value": float(p_value),
            "significant": bool(p_value < alpha), "num_problems": int(num_problems),
            "num_seeds": int(num_seeds), "num_resamples": int(num_resamples),
            "confidence": float(confidence)}


def pass_at_k_curves(correct: np.ndarray, confidence: float = 0.95) -> dict[str, list]:
    """pass@k for every k = 1..n, mean and t-interval half-width over seeds.

    Args:
      correct: [S, P, n] bool (seed, problem, sample).
    Returns:
      {"k": [1, ..., n], "mean": [n floats], "ci95": [n floats] (NaN for one seed)}.
    """
    arr = np.asarray(correct)
    if arr.ndim != 3:
        raise ValueError(f"pass_at_k_curves: correct must be [S, P, n], got shape {arr.shape}")
    per_seed = [pass_at_k_curve(c) for c in arr]
    pairs = [mean_ci([curve[j] for curve in per_seed], confidence)
             for j in range(arr.shape[2])]
    return {"k": list(range(1, arr.shape[2] + 1)), "mean": [m for m, _ in pairs],
            "ci95": [h for _, h in pairs]}


def _percent(x: float) -> str:
    return f"{100 * x:.1f}"


def format_comparison(tests: Mapping[str, Mapping[str, Mapping[str, Any]]],
                      labels: Sequence[str] = ("A", "B")) -> str:
    """A Markdown table of paired tests, one row per (evaluation set, metric).

    Args:
      tests: {set name: {metric: paired_bootstrap(...) output}}; metrics such as "pass@1"
        are shown in percent.
      labels: names of the two checkpoints for the column headers.
    Returns:
      columns: set, metric, A (%), B (%), B - A (%) [95% interval], p-value, significant.
    """
    if not tests:
        raise ValueError("format_comparison: no tests")
    a, b = labels
    header = ["eval set", "metric", f"{a} (%)", f"{b} (%)", f"{b} - {a} (%) [interval]",
              "p-value", "significant"]
    rows = []
    for name, metrics in tests.items():
        for metric, t in metrics.items():
            level = round(100 * t["confidence"])
            rows.append([name, metric, _percent(t["mean_a"]), _percent(t["mean_b"]),
                         f"{100 * t['diff']:+.1f} [{100 * t['ci_low']:+.1f}, "
                         f"{100 * t['ci_high']:+.1f}] ({level}%)",
                         f"{t['p_value']:.4f}" if t["p_value"] >= 1e-4
                         else f"{t['p_value']:.1e}",
                         "yes" if t["significant"] else "no"])
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])

