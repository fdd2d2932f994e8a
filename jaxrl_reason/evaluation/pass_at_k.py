"""Evaluation statistics: pass@k (unbiased), maj@k, verifier-filtered best-of-k, accuracy
curves over samples per problem, and mean ± confidence interval over seeds (the t interval
itself, `mean_ci` and `student_t_quantile`, lives in `jaxrl_reason.evaluation.stats`).

Pure numpy and the standard library; no device code. The usual flow:

    per_seed = [seed_metrics(correct, answers, lengths, ks=(1, 4, 8)) for each seed]
    report = {"level 1-3 (held-out)": summarize_seeds(per_seed), ...}
    print(format_table(report, ["pass@1", "pass@8", "maj@8", "mean_length"]))

    curves = [accuracy_curve(correct, answers, scores, num_subsets=64) for each seed]
    summarize_curves(curves)  # {"k": [1, 2, 4, 8], "maj@k": {"mean": [...], "ci95": [...]}}

    pass_at_k_curve(correct)  # [pass@1, pass@2, ..., pass@n], every k (unbiased)

Conventions: `P` problems, `n` samples per problem. `correct[p, i]` says whether sample `i` of
problem `p` was verified correct; `answers[p][i]` is its extracted answer string, or None when
nothing answer-like was found; answers vote together when their strings are equal, so map
equivalent answers to one string first (`canonical_answers`). `scores[p, i]` is a test-time
verifier's score of the sample (no reference answer needed, e.g. a format check), used by
best-of-k to filter the samples before the vote.

Estimators over k < n samples: pass@k is the unbiased closed form; maj@k and best-of-k are
means over `num_subsets` random k-subsets of the n samples (every subset when there are at
most that many, so exact for small n), or the first k samples when num_subsets = 0.

Honest comparisons (Hochlehnert et al. 2025, "A Sober Look at Progress in LM Reasoning"):
one evaluation seed says little, so metrics are summarized over seeds with their standard
deviation and a t-interval (`summarize_seeds`), and two checkpoints are compared by a
paired bootstrap over problems and seeds (`jaxrl_reason.evaluation.compare.paired_bootstrap`), not
by their two means.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxrl_reason.evaluation.stats import mean_ci, student_t_quantile

__all__ = [
    "check_correct",
    "pass_at_k",
    "pass_at_k_batch",
    "maj_at_k",
    "best_of_k",
    "canonical_answers",
    "curve_ks",
    "accuracy_curve",
    "summarize_curves",
    "student_t_quantile",
    "mean_ci",
    "summarize_seeds",
    "seed_metrics",
    "format_table",
    "pass_at_k_curve",
    "domain_metrics",
]


# ----------------------------------------------------------------------------- pass@k / maj@k


def _check_int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    return int(value)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem (Chen et al. 2021, "Evaluating LLMs on Code").

    pass@k = 1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i),
    which never forms the (huge) binomial coefficients.

    Args:
      num_samples: n >= 1, samples drawn for the problem.
      num_correct: c in [0, n], how many of them are correct.
      k: 1 <= k <= n.
    Returns:
      float in [0, 1]: probability that at least one of k samples drawn without replacement
      from the n is correct.
    Raises:
      ValueError: if k > n, k < 1, n < 1 or c outside [0, n].
    """
    n = _check_int("num_samples", num_samples)
    c = _check_int("num_correct", num_correct)
    k = _check_int("k", k)
    if n < 1:
        raise ValueError(f"pass_at_k: num_samples must be >= 1, got {n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, num_samples={n}], got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: num_correct must be in [0, {n}], got {c}")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def check_correct(correct: np.ndarray, where: str) -> np.ndarray:
    """Validate a [P, n] correctness matrix (bool, or integers in {0, 1}); return it as bool."""
    arr = np.asarray(correct)
    if arr.ndim != 2:
        raise ValueError(f"{where}: correct must be [P, n], got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{where}: correct must have P >= 1 and n >= 1, got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if not np.issubdtype(arr.dtype, np.integer) or not np.isin(arr, (0, 1)).all():
            raise TypeError(
                f"{where}: correct must be bool (or 0/1 integers), got dtype {arr.dtype}")
        arr = arr.astype(bool)
    return arr


def pass_at_k_batch(correct: np.ndarray, k: int) -> float:
    """Mean unbiased pass@k over problems.

    Args:
      correct: [P, n] bool, correctness of each sample.
      k: 1 <= k <= n.
    Returns:
      float in [0, 1], mean over the P problems of `pass_at_k(n, c_p, k)`.
    """
    arr = check_correct(correct, "pass_at_k_batch")
    n = arr.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in arr.sum(axis=1)]))


def pass_at_k_curve(correct: np.ndarray, max_k: int | None = None) -> list[float]:
    """Mean unbiased pass@k over problems for every k = 1, 2, ..., max_k.

    Args:
      correct: [P, n] bool, correctness of each sample.
      max_k: largest k, 1 <= max_k <= n (default n).
    Returns:
      list of max_k floats in [0, 1]; entry k - 1 is `pass_at_k_batch(correct, k)`, so the
      list never decreases.
    """
    arr = check_correct(correct, "pass_at_k_curve")
    n = arr.shape[1]
    max_k = n if max_k is None else _check_k(max_k, n, "pass_at_k_curve")
    return [pass_at_k_batch(arr, k) for k in range(1, max_k + 1)]


def _majority_index(answers: Sequence[str | None]) -> int | None:
    """Index of the first sample carrying the most frequent non-None answer (ties: the answer
    that occurs first wins); None when every answer is None."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        if not isinstance(a, str):
            raise TypeError(f"maj_at_k: answers must be str or None, got {type(a).__name__}")
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, i)
    if not counts:
        return None
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return first[best]


def _subsets(n: int, k: int, num_subsets: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Index sets of size k out of n: the first k (num_subsets = 0), every subset when there
    are at most num_subsets of them, else num_subsets random ones (without replacement)."""
    if num_subsets <= 0 or k == n:
        return [np.arange(k)]
    if math.comb(n, k) <= num_subsets:
        return [np.array(c) for c in itertools.combinations(range(n), k)]
    return [np.sort(rng.choice(n, size=k, replace=False)) for _ in range(num_subsets)]


def _check_answers(answers, num_problems: int, n: int, where: str) -> None:
    if len(answers) != num_problems:
        raise ValueError(f"{where}: answers has {len(answers)} problems, correct has "
                         f"{num_problems}")
    for p, row in enumerate(answers):
        if len(row) != n:
            raise ValueError(f"{where}: answers[{p}] has {len(row)} samples, expected {n}")


def _check_k(k: object, n: int, where: str) -> int:
    k = _check_int("k", k)
    if not 1 <= k <= n:
        raise ValueError(f"{where}: k must be in [1, n={n}], got k={k}")
    return k


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: np.ndarray, k: int,
             num_subsets: int = 0, seed: int = 0) -> float:
    """maj@k: accuracy of the majority-voted answer among k samples of each problem.

    For each problem the non-None answers among the k samples are counted; the most frequent
    one wins (ties go to the answer that appears first; None never wins). The problem scores 1
    when the first sample carrying the voted answer is correct, 0 otherwise (also 0 when all k
    answers are None). Answers are compared as exact strings, so normalize them beforehand
    (`canonical_answers`).

    Args:
      answers: P sequences of n answers (str or None).
      correct: [P, n] bool, correctness of each sample.
      k: 1 <= k <= n.
      num_subsets: 0 = the first k samples; m > 0 = the mean over m random k-subsets of the
        n samples (all of them when C(n, k) <= m: exact).
      seed: seed of the random subsets.
    Returns:
      float in [0, 1], mean score over the P problems.
    """
    arr = check_correct(correct, "maj_at_k")
    num_problems, n = arr.shape
    k = _check_k(k, n, "maj_at_k")
    _check_answers(answers, num_problems, n, "maj_at_k")
    rng = np.random.default_rng(seed)
    scores = []
    for p, row in enumerate(answers):
        row = list(row)
        values = []
        for subset in _subsets(n, k, num_subsets, rng):
            idx = _majority_index([row[i] for i in subset])
            values.append(0.0 if idx is None else float(arr[p, subset[idx]]))
        scores.append(np.mean(values))
    return float(np.mean(scores))


def best_of_k(answers: Sequence[Sequence[str | None]], scores: np.ndarray, correct: np.ndarray,
              k: int, num_subsets: int = 0, seed: int = 0) -> float:
    """Verifier-filtered best-of-k: of k samples keep those with the highest verifier score,
    then take the majority answer among them (ties: the first; when none of them has an
    answer, the first kept sample). The problem scores `correct` of the chosen sample.

    With a test-time verifier (e.g. a format check) this is the accuracy of filtering then
    voting; with the ground-truth verifier as `scores` it is pass@k (an oracle's upper bound).

    Args:
      answers: P sequences of n answers (str or None), compared as exact strings.
      scores: [P, n] float, the verifier's score of each sample (higher is better).
      correct: [P, n] bool.
      k, num_subsets, seed: as in `maj_at_k`.
    Returns:
      float in [0, 1], mean over the P problems.
    """
    arr = check_correct(correct, "best_of_k")
    num_problems, n = arr.shape
    sc = np.asarray(scores, dtype=np.float64)
    if sc.shape != arr.shape:
        raise ValueError(f"best_of_k: scores shape {sc.shape} != correct shape {arr.shape}")
    k = _check_k(k, n, "best_of_k")
    _check_answers(answers, num_problems, n, "best_of_k")
    rng = np.random.default_rng(seed)
    out = []
    for p, row in enumerate(answers):
        values = []
        for subset in _subsets(n, k, num_subsets, rng):
            best = sc[p, subset].max()
            kept = [int(i) for i in subset if sc[p, i] == best]
            idx = _majority_index([row[i] for i in kept])
            values.append(float(arr[p, kept[0 if idx is None else idx]]))
        out.append(np.mean(values))
    return float(np.mean(out))


def canonical_answers(answers: Sequence[str | None], key: Callable[[str], str] | None = None,
                      equivalent: Callable[[str, str], bool] | None = None) -> list[str | None]:
    """Maps each answer of one problem to its group's representative, so that equivalent
    answers vote together in `maj_at_k` / `best_of_k`.

    Two answers are in one group when their `key` strings are equal (default: the answer
    itself), or when `equivalent(representative, answer)` holds (called once per new key and
    existing group, so sympy-backed checks stay cheap for the few distinct answers of a
    problem). The representative is the group's first answer. None stays None.

    Example: canonical_answers(["0.5", "1/2", "2", None], equivalent=is_equivalent)
             == ["0.5", "0.5", "2", None].
    """
    key = key or (lambda a: a)
    rep_of_key: dict[str, str] = {}
    reps: list[str] = []
    out: list[str | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        kk = key(a)
        if kk not in rep_of_key:
            match = None
            if equivalent is not None:
                match = next((r for r in reps if equivalent(r, a)), None)
            if match is None:
                reps.append(a)
                match = a
            rep_of_key[kk] = match
        out.append(rep_of_key[kk])
    return out


def curve_ks(n: int) -> list[int]:
    """Samples per problem on an accuracy curve: 1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def accuracy_curve(correct: np.ndarray, answers: Sequence[Sequence[str | None]],
                   scores: np.ndarray | None = None, ks: Sequence[int] | None = None,
                   num_subsets: int = 64, seed: int = 0) -> dict[str, list]:
    """Accuracy against samples per problem, for one seed.

    Returns {"k": ks, "pass@k": [...], "maj@k": [...]} and, when `scores` is given,
    "best_of@k": [...]; one value per k (default `curve_ks(n)`).
    """
    arr = check_correct(correct, "accuracy_curve")
    n = arr.shape[1]
    ks = curve_ks(n) if ks is None else sorted({_check_k(k, n, "accuracy_curve") for k in ks})
    out: dict[str, list] = {"k": list(ks),
                            "pass@k": [pass_at_k_batch(arr, k) for k in ks],
                            "maj@k": [maj_at_k(answers, arr, k, num_subsets, seed) for k in ks]}
    if scores is not None:
        out["best_of@k"] = [best_of_k(answers, scores, arr, k, num_subsets, seed) for k in ks]
    return out


def summarize_curves(per_seed: Sequence[Mapping[str, list]],
                     confidence: float = 0.95) -> dict[str, Any]:
    """Mean and CI half-width over seeds of each curve of `accuracy_curve` outputs.

    Returns {"k": ks, metric: {"mean": [...], "ci95": [...]}} (ci95 NaN for one seed).
    """
    if not per_seed:
        raise ValueError("summarize_curves: per_seed is empty")
    ks = list(per_seed[0]["k"])
    if any(list(c["k"]) != ks for c in per_seed):
        raise ValueError("summarize_curves: the seeds' curves have different k")
    out: dict[str, Any] = {"k": ks}
    for name in per_seed[0]:
        if name == "k":
            continue
        pairs = [mean_ci([c[name][j] for c in per_seed], confidence) for j in range(len(ks))]
        out[name] = {"mean": [m for m, _ in pairs], "ci95": [h for _, h in pairs]}
    return out


# ----------------------------------------------------------------------------- seeds


def summarize_seeds(per_seed: Sequence[Mapping[str, float]],
                    confidence: float = 0.95) -> dict[str, dict]:
    """Mean and confidence interval of each metric over seeds.

    Args:
      per_seed: one dict per seed, all with the same metric names, e.g.
        [{"pass@1": 0.61, "maj@4": 0.70, "mean_length": 212.0}, ...].
      confidence: interval level; the key is "ci95" whatever the level, for a stable schema.
    Returns:
      {metric: {"mean": float, "std": float sample standard deviation over seeds (ddof=1;
                NaN for one seed), "ci95": float half-width of the t-interval of the mean
                (NaN for one seed), "values": list[float] in seed order}}.
    """
    if len(per_seed) == 0:
        raise ValueError("summarize_seeds: per_seed is empty")
    names = list(per_seed[0])
    for i, d in enumerate(per_seed):
        if set(d) != set(names):
            raise ValueError(f"summarize_seeds: seed {i} has metrics {sorted(d)}, seed 0 has "
                             f"{sorted(names)}")
    out: dict[str, dict] = {}
    for name in names:
        values = [float(d[name]) for d in per_seed]
        mean, half = mean_ci(values, confidence)
        std = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
        out[name] = {"mean": mean, "std": std, "ci95": half, "values": values}
    return out


def seed_metrics(correct: np.ndarray, answers: Sequence[Sequence[str | None]],
                 lengths: np.ndarray, ks: Sequence[int], scores: np.ndarray | None = None,
                 num_subsets: int = 0, seed: int = 0) -> dict[str, float]:
    """All metrics of one evaluation seed.

    Args:
      correct: [P, n] bool, correctness of each sample.
      answers: P sequences of n extracted answers (str or None).
      lengths: [P, n] int, completion length of each sample in tokens.
      ks: the k values; those > n are skipped (a run with fewer samples reports fewer k).
      scores: optional [P, n] float test-time verifier scores: adds best_of@k.
      num_subsets, seed: the maj@k / best_of@k estimator (see `maj_at_k`; 0 = first k).
    Returns:
      {"accuracy": mean correctness (= pass@1), "pass@k" for each k in ks with k <= n,
       "maj@k" for each k in ks with 1 < k <= n, "best_of@k" likewise when scores are given,
       "mean_length": mean of lengths}.
    """
    arr = check_correct(correct, "seed_metrics")
    lens = np.asarray(lengths)
    if lens.shape != arr.shape:
        raise ValueError(f"seed_metrics: lengths shape {lens.shape} != correct shape {arr.shape}")
    if not np.issubdtype(lens.dtype, np.integer):
        raise TypeError(f"seed_metrics: lengths must be integers, got dtype {lens.dtype}")
    n = arr.shape[1]
    ks = sorted({_check_int("each k in ks", k) for k in ks})
    if ks and ks[0] < 1:
        raise ValueError(f"seed_metrics: every k must be >= 1, got {ks}")
    out: dict[str, float] = {"accuracy": float(arr.mean())}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = pass_at_k_batch(arr, k)
    for k in ks:
        if 1 < k <= n:
            out[f"maj@{k}"] = maj_at_k(answers, arr, k, num_subsets, seed)
    if scores is not None:
        for k in ks:
            if 1 < k <= n:
                out[f"best_of@{k}"] = best_of_k(answers, scores, arr, k, num_subsets, seed)
    out["mean_length"] = float(lens.mean())
    return out


# ----------------------------------------------------------------------------- domains


def domain_metrics(domains: Sequence[str | None], rewards: np.ndarray,
                   verdicts: np.ndarray | None = None,
                   lengths: np.ndarray | None = None) -> dict[str, float]:
    """Per-domain means of one batch of a task mixture (rows of a domain-less example, None,
    are left out; a batch without any domain gives {}).

    Args:
      domains: N domain names (str) or None, one per row.
      rewards: [N] float, the total reward of each row.
      verdicts: optional [N] float, the verifier's score of each row (1 = correct).
      lengths: optional [N] int, completion length in tokens.
    Returns:
      for each domain d present, sorted: "reward/d" (mean reward), "accuracy/d" (mean
      verdict, with verdicts), "length/d" (mean length, with lengths) and "frac/d" (the
      share of the N rows that are d's).
    """
    rewards = np.asarray(rewards, np.float64).reshape(-1)
    if len(domains) != rewards.shape[0]:
        raise ValueError(f"domain_metrics: {len(domains)} domains but {rewards.shape[0]} "
                         "rewards")
    named = {"accuracy": verdicts, "length": lengths}
    for name, values in named.items():
        if values is not None and np.asarray(values).reshape(-1).shape != rewards.shape:
            raise ValueError(f"domain_metrics: {name} values have shape "
                             f"{np.asarray(values).shape}, expected ({rewards.shape[0]},)")
    labels = np.array([d if d is not None else "" for d in domains], dtype=object)
    out: dict[str, float] = {}
    for domain in sorted({d for d in domains if d is not None}):
        rows = labels == domain
        out[f"reward/{domain}"] = float(rewards[rows].mean())
        for name, values in named.items():
            if values is not None:
                out[f"{name}/{domain}"] = float(
                    np.asarray(values, np.float64).reshape(-1)[rows].mean())
        out[f"frac/{domain}"] = float(rows.mean())
    return out


# ----------------------------------------------------------------------------- table


def _is_percent(metric: str) -> bool:
    return metric.startswith(("pass@", "maj@", "best_of@")) or metric == "accuracy"


def _is_length(metric: str) -> bool:
    return "length" in metric


def _header(metric: str) -> str:
    if _is_percent(metric):
        return f"{metric} (%)"
    if _is_length(metric):
        return f"{metric} (tokens)"
    return metric


def _cell(summary: Mapping[str, float] | None, metric: str, show_std: bool = False) -> str:
    if summary is None:
        return "-"
    scale = 100.0 if _is_percent(metric) else 1.0
    fmt = "{:.1f}" if _is_percent(metric) or _is_length(metric) else "{:.4g}"
    mean = fmt.format(summary["mean"] * scale)
    half = summary.get("ci95", float("nan"))
    if half is None or not math.isfinite(half):
        return mean
    cell = f"{mean} ± {fmt.format(half * scale)}"
    std = summary.get("std")
    if show_std and std is not None and math.isfinite(std):
        cell += f" (sd {fmt.format(std * scale)})"
    return cell


def format_table(report: Mapping[str, Mapping[str, Mapping]], metrics: Sequence[str],
                 show_std: bool = False) -> str:
    """A Markdown table of evaluation results, one row per evaluation set.

    Cells read "63.2 ± 2.1": pass@k, maj@k, best_of@k and accuracy in percent, lengths in
    tokens (both one decimal), other metrics with 4 significant digits. The "± half-width"
    part is left out when the interval is undefined (one seed); a metric missing from a row
    shows "-". With `show_std`, cells read "63.2 ± 2.1 (sd 1.7)": the seeds' standard
    deviation follows the interval (summaries without a "std" show none).

    Args:
      report: {set name: summarize_seeds(...) output}, e.g. {"level 4": {"pass@1": {...}}}.
      metrics: the columns, in order.
      show_std: add the standard deviation over seeds to each cell.
    Returns:
      the table as a str (no trailing newline).
    """
    if not report:
        raise ValueError("format_table: report is empty")
    if not metrics:
        raise ValueError("format_table: metrics is empty")
    header = ["eval set"] + [_header(m) for m in metrics]
    rows = [[name] + [_cell(summary.get(m), m, show_std) for m in metrics]
            for name, summary in report.items()]
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])
