"""Evaluation on device: sample n completions per held-out problem for several seeds, verify
them on host threads, and summarize pass@k / maj@k / length with 95% intervals over seeds.

The statistics themselves (unbiased pass@k, maj@k, t-intervals) live in
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
from jaxrl_reason.rewards.math import extract_answer
from jaxrl_reason.rewards.pool import RewardPool
from jaxrl_reason.data.tasks import eval_sources, task_verifier
from jaxrl_reason.runtime import Runtime

REPORT_METRICS = ("pass@1", "maj@{n}", "pass@{n}", "mean_length")


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
                      max_new_tokens: int, batch_prompts: int) -> dict[str, Any]:
    """Samples `num_samples` completions per example and verifies them.

    Returns: correct bool [P, n], answers (P x n list of str | None), lengths int [P, n],
    texts (P x n list of str).
    """
    correct, answers, lengths, texts = [], [], [], []
    rng = jax.random.key(seed)
    for i, (chunk, real) in enumerate(_padded_chunks(examples, batch_prompts)):
        pt, pv = rt.encode_prompts(chunk)
        out = rt.sampler(params, rt.put_prompts(pt), rt.put_prompts(pv),
                         jax.random.fold_in(rng, i), num_samples=num_samples,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        tokens, lens = jax.device_get((out.tokens, out.lengths))
        tokens, lens = tokens[:real * num_samples], lens[:real * num_samples]
        chunk_texts = [rt.tokenizer.decode(row[:n]) for row, n in zip(tokens, lens)]
        rows = [ex for ex in chunk[:real] for _ in range(num_samples)]
        scores = pool.score(chunk_texts, rows).total
        correct.append(scores.reshape(real, num_samples) > 0.5)
        lengths.append(np.asarray(lens).reshape(real, num_samples))
        for p in range(real):
            row_texts = chunk_texts[p * num_samples:(p + 1) * num_samples]
            texts.append(row_texts)
            answers.append([extract_answer(t) for t in row_texts])
    return {"correct": np.concatenate(correct), "answers": answers,
            "lengths": np.concatenate(lengths), "texts": texts}


def evaluate(rt: Runtime, params, sets: Mapping[str, Sequence[Mapping]] | None = None, *,
             eval_cfg: ml_collections.ConfigDict | None = None, label: str = "",
             progress: bool = True) -> dict[str, Any]:
    """Evaluates `params` on every named set for every seed of `eval_cfg`.

    Returns {"sets": {name: {metric: {"mean", "ci95", "values"}}}, "config": {...}}.
    """
    cfg = eval_cfg or rt.config.eval
    sets = eval_sets(rt.config) if sets is None else sets
    n = cfg.num_samples
    ks = sorted({1, n} | {k for k in (2, 4, 8, 16) if k <= n})
    report: dict[str, Any] = {"sets": {}, "config": {
        "num_samples": n, "seeds": list(cfg.seeds), "temperature": cfg.temperature,
        "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens}}
    verifier = task_verifier(rt.config)
    with RewardPool({verifier: 1.0}, num_workers=rt.config.rewards.num_workers,
                    timeout_s=rt.config.rewards.timeout_s) as pool, \
            ProgressBar(len(sets) * len(cfg.seeds), f"eval{label}", enabled=progress) as bar:
        for name, examples in sets.items():
            per_seed = []
            for seed in cfg.seeds:
                res = sample_and_verify(rt, params, examples, pool, seed=seed, num_samples=n,
                                        temperature=cfg.temperature, top_p=cfg.top_p,
                                        max_new_tokens=cfg.max_new_tokens,
                                        batch_prompts=cfg.batch_prompts)
                per_seed.append(evaluation.seed_metrics(res["correct"], res["answers"],
                                                        res["lengths"], ks))
                bar.update(1)
            report["sets"][name] = evaluation.summarize_seeds(per_seed)
    return report


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
