"""Evaluation on device: sample n completions per held-out problem for several seeds, verify
them on host threads, and summarize pass@k / maj@k / best-of-k / length with 95% intervals
over seeds, plus a curve of accuracy against samples per problem (k = 1, 2, 4, ..., n).

Test-time compute (config.eval, each read with a default so older configs still run):
  vote_subsets        maj@k and best_of@k for k < n average over this many random k-subsets
                      of the n samples (exact when there are fewer subsets); 0 = first k.
  best_of_verifier    registered reward scoring each sample without the reference answer
                      (default "format_strict"); best_of@k keeps the top-scored samples of k,
                      then votes. The task's verifier here gives the oracle bound (= pass@k).
  answer_equivalence  True: answers vote together when `rewards.math.is_equivalent` says
                      they are equal ("0.5" and "1/2"); False: exact strings.
  plot                True: `plot_curves` draws the curves next to the report (matplotlib).

The statistics themselves (unbiased pass@k, maj@k, best-of-k, t-intervals) live in
`jaxrl_reason.evaluation`, which is pure numpy.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from jaxrl_reason import evaluation
from jaxrl_reason.progress import ProgressBar
from jaxrl_reason.rewards.math import extract_answer, is_equivalent
from jaxrl_reason.rewards.pool import RewardPool
from jaxrl_reason.data.tasks import eval_sources, task_verifier
from jaxrl_reason.runtime import Runtime

REPORT_METRICS = ("pass@1", "maj@{n}", "best_of@{n}", "pass@{n}", "mean_length")
DEFAULTS = {"vote_subsets": 64, "best_of_verifier": "format_strict", "answer_equivalence": True,
            "plot": False}


def eval_option(cfg: ml_collections.ConfigDict, name: str):
    """config.eval.<name>, or its default from DEFAULTS when the config has no such field."""
    return cfg.get(name, DEFAULTS[name])


def level_set_name(levels: Sequence[int], train_levels: Sequence[int]) -> str:
    """'levels 1-3 (held-out)' for training levels, 'level 4' for one outside them."""
    levels = sorted(levels)
    name = f"level {levels[0]}" if len(levels) == 1 else f"levels {levels[0]}-{levels[-1]}"
    return name + (" (held-out)" if set(levels) <= set(train_levels) else "")


def eval_sets(config: ml_collections.ConfigDict) -> dict[str, list[dict]]:
    """Named held-out problem sets: the task's eval split for each `task.eval_levels` group,
    or each file of `task.eval_files` for a file task."""
    sources = eval_sources(config, config.eval.num_problems, config.eval.data_seed,
                           lambda levels: level_set_name(levels, config.task.train_levels))
    return {name: [source[i] for i in range(len(source))] for name, source in sources.items()}


def _padded_chunks(examples: Sequence[Mapping], size: int):
    """Chunks of exactly `size` examples (the last padded by repetition) + real counts."""
    for start in range(0, len(examples), size):
        chunk = list(examples[start:start + size])
        real = len(chunk)
        chunk += [chunk[-1]] * (size - real)
        yield chunk, real


def sample_and_verify(rt: Runtime, params, examples: Sequence[Mapping], pool: RewardPool, *,
                      seed: int, num_samples: int, temperature: float, top_p: float,
                      max_new_tokens: int, batch_prompts: int, verifier: str | None = None,
                      filter_verifier: str | None = None,
                      answer_equivalence: bool = False) -> dict[str, Any]:
    """Samples `num_samples` completions per example and verifies them.

    `verifier` names the pool component deciding correctness (default: the pool's total);
    `filter_verifier` a component whose scores are returned for best-of-k.
    Returns: correct bool [P, n], answers (P x n list of str | None; with
    `answer_equivalence`, equivalent answers of a problem share one string), lengths int
    [P, n], texts (P x n list of str), scores f32 [P, n] (filter_verifier's; None without).
    """
    correct, answers, lengths, texts, scores = [], [], [], [], []
    rng = jax.random.key(seed)
    equivalent = is_equivalent if answer_equivalence else None
    for i, (chunk, real) in enumerate(_padded_chunks(examples, batch_prompts)):
        pt, pv = rt.encode_prompts(chunk)
        out = rt.sampler(params, rt.put_prompts(pt), rt.put_prompts(pv),
                         jax.random.fold_in(rng, i), num_samples=num_samples,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        tokens, lens = jax.device_get((out.tokens, out.lengths))
        tokens, lens = tokens[:real * num_samples], lens[:real * num_samples]
        chunk_texts = [rt.tokenizer.decode(row[:n]) for row, n in zip(tokens, lens)]
        rows = [ex for ex in chunk[:real] for _ in range(num_samples)]
        batch = pool.score(chunk_texts, rows)
        verdict = batch.total if verifier is None else batch.components[verifier]
        correct.append(np.asarray(verdict).reshape(real, num_samples) > 0.5)
        if filter_verifier is not None:
            scores.append(np.asarray(batch.components[filter_verifier],
                                     np.float32).reshape(real, num_samples))
        lengths.append(np.asarray(lens).reshape(real, num_samples))
        for p in range(real):
            row_texts = chunk_texts[p * num_samples:(p + 1) * num_samples]
            texts.append(row_texts)
            row_answers = [extract_answer(t) for t in row_texts]
            answers.append(evaluation.canonical_answers(row_answers, key=str.strip,
                                                        equivalent=equivalent))
    return {"correct": np.concatenate(correct), "answers": answers,
            "lengths": np.concatenate(lengths), "texts": texts,
            "scores": np.concatenate(scores) if scores else None}


def evaluate(rt: Runtime, params, sets: Mapping[str, Sequence[Mapping]] | None = None, *,
             eval_cfg: ml_collections.ConfigDict | None = None, label: str = "",
             progress: bool = True) -> dict[str, Any]:
    """Evaluates `params` on every named set for every seed of `eval_cfg`.

    Returns {"sets": {name: {metric: {"mean", "ci95", "values"}}},
             "curves": {name: {"k": [1, 2, ..., n], "pass@k" | "maj@k" | "best_of@k":
                               {"mean": [...], "ci95": [...]}}},
             "config": {...}}.
    """
    cfg = eval_cfg or rt.config.eval
    sets = eval_sets(rt.config) if sets is None else sets
    n = cfg.num_samples
    ks = sorted({1, n} | {k for k in (2, 4, 8, 16) if k <= n})
    subsets = int(eval_option(cfg, "vote_subsets"))
    verifier = task_verifier(rt.config)
    filter_verifier = eval_option(cfg, "best_of_verifier") or None
    equivalence = bool(eval_option(cfg, "answer_equivalence"))
    report: dict[str, Any] = {"sets": {}, "curves": {}, "config": {
        "num_samples": n, "seeds": list(cfg.seeds), "temperature": cfg.temperature,
        "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "vote_subsets": subsets,
        "best_of_verifier": filter_verifier, "answer_equivalence": equivalence}}
    weights = {verifier: 1.0}
    if filter_verifier is not None and filter_verifier != verifier:
        weights[filter_verifier] = 0.0
    with RewardPool(weights, num_workers=rt.config.rewards.num_workers,
                    timeout_s=rt.config.rewards.timeout_s) as pool, \
            ProgressBar(len(sets) * len(cfg.seeds), f"eval{label}", enabled=progress) as bar:
        for name, examples in sets.items():
            per_seed, curves = [], []
            for seed in cfg.seeds:
                res = sample_and_verify(rt, params, examples, pool, seed=seed, num_samples=n,
                                        temperature=cfg.temperature, top_p=cfg.top_p,
                                        max_new_tokens=cfg.max_new_tokens,
                                        batch_prompts=cfg.batch_prompts, verifier=verifier,
                                        filter_verifier=filter_verifier,
                                        answer_equivalence=equivalence)
                per_seed.append(evaluation.seed_metrics(
                    res["correct"], res["answers"], res["lengths"], ks, scores=res["scores"],
                    num_subsets=subsets, seed=seed))
                curves.append(evaluation.accuracy_curve(
                    res["correct"], res["answers"], res["scores"], num_subsets=subsets,
                    seed=seed))
                bar.update(1)
            report["sets"][name] = evaluation.summarize_seeds(per_seed)
            report["curves"][name] = evaluation.summarize_curves(curves)
    return report


def plot_curves(report: Mapping[str, Any], path: str) -> str | None:
    """Draws each set's accuracy curves (pass@k, maj@k, best_of@k against k, log2 axis,
    95% intervals shaded) into one PNG at `path`; returns the path, or None when matplotlib
    is not installed or the report has no curves."""
    curves = report.get("curves") or {}
    if not curves:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.6), squeeze=False)
    for ax, (name, curve) in zip(axes[0], curves.items()):
        ks = np.asarray(curve["k"])
        for metric in ("pass@k", "maj@k", "best_of@k"):
            if metric not in curve:
                continue
            mean = 100 * np.asarray(curve[metric]["mean"], float)
            half = 100 * np.nan_to_num(np.asarray(curve[metric]["ci95"], float))
            ax.plot(ks, mean, marker="o", label=metric)
            ax.fill_between(ks, mean - half, mean + half, alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("samples per problem (k)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_curves(report: Mapping[str, Any]) -> str:
    """The curves as text, one line per set and metric: 'set  maj@k  k=1: 41.0  k=2: ...'."""
    lines = []
    for name, curve in (report.get("curves") or {}).items():
        for metric, values in curve.items():
            if metric == "k":
                continue
            cells = "  ".join(f"k={k}: {100 * m:.1f}" for k, m in zip(curve["k"], values["mean"]))
            lines.append(f"{name}  {metric}  {cells}")
    return "\n".join(lines)


def report_metrics(num_samples: int) -> list[str]:
    """The metric columns of the printed table for n samples per problem."""
    cols = [m.format(n=num_samples) for m in REPORT_METRICS]
    return list(dict.fromkeys(c for c in cols if num_samples > 1 or "@1" in c or "@" not in c))


def comparison_table(reports: Mapping[str, Mapping[str, Any]], num_samples: int) -> str:
    """One markdown table: rows '<checkpoint>: <set>', columns `report_metrics`."""
    rows = {f"{ckpt}: {name}": summary for ckpt, rep in reports.items()
            for name, summary in rep["sets"].items()}
    return evaluation.format_table(rows, report_metrics(num_samples))


def write_report(path: str, reports: Mapping[str, Any]) -> None:
    """Writes the JSON report (atomically: temp file + rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(reports, f, indent=1, default=float)
    os.replace(tmp, path)
