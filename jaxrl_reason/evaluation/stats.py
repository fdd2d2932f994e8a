"""Confidence intervals of a mean over a few seeds: Student's t quantile (the inverse of its
CDF through the regularized incomplete beta, by bisection) and `mean_ci`, the mean and the
half-width of its t interval. Pure python/numpy, no scipy: the evaluation reports, the
algorithm comparisons and the pipeline's summaries use them."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t distribution: the t with P(T <= t) = p.

    Inverts the CDF (regularized incomplete beta) by bisection to ~1e-12 relative accuracy.
    Example: student_t_quantile(0.975, 2) = 4.3027.

    Args:
      p: probability in (0, 1).
      df: degrees of freedom, > 0.
    Returns:
      float.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"student_t_quantile: df must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _student_t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            raise ValueError(f"student_t_quantile: p={p} too close to 1 for df={df}")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval of the mean.

    half_width = t_{(1 + confidence) / 2, m - 1} * s / sqrt(m), with s the sample standard
    deviation (ddof=1) of the m values. With a single value the interval is undefined and the
    half-width is NaN (not 0: one seed says nothing about the spread).

    Args:
      values: m >= 1 finite floats (e.g. one metric, one value per seed).
      confidence: in (0, 1).
    Returns:
      (mean, half_width) as floats.
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("mean_ci: values is empty")
    if not np.isfinite(arr).all():
        raise ValueError(f"mean_ci: values must be finite, got {arr.tolist()}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"mean_ci: confidence must be in (0, 1), got {confidence}")
    mean = float(arr.mean())
    if arr.size == 1:
        return mean, float("nan")
    t = student_t_quantile((1.0 + confidence) / 2.0, arr.size - 1)
    return mean, float(t * arr.std(ddof=1) / math.sqrt(arr.size))
