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

Verdicts do not depend on the machine's load: the reward pool charges each answer its own
CPU time (`rewards.timeout_s`), and only a wall-clock backstop (`rewards.backstop_factor`
times that) abandons an answer that gets no CPU at all, as *unscored*, never as wrong.
Every answer without a verdict (unscored, or at its CPU limit) is scored again with limits
`eval.retry_limit_factor` times longer; those still unscored (voting's answer equivalence
included) are reported per set in the report's "unscored" and the evaluation raises
`UnscoredError` when they exceed `eval.max_unscored_share` of all answers (default 0: any).

Seeds: every metric is reported as its mean over `eval.seeds` with the standard deviation
and a 95% t-interval (`jaxrl-reason eval --seeds 5` overrides the config's seeds).
`compare` evaluates two checkpoints on the same problems and seeds and tests their difference
with a paired bootstrap over problems and seeds, and gives pass@k for every k = 1..n of both
(`plot_pass_at_k` draws them).

The statistics themselves (unbiased pass@k, maj@k, best-of-k, t-intervals, the bootstrap)
live in `jaxrl_reason.evaluation.pass_at_k` and `jaxrl_reason.evaluation.compare`, which are
pure numpy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from jaxrl_reason.evaluation import compare as comparison
from jaxrl_reason.evaluation import pass_at_k as evaluation
from jaxrl_reason.runtime.progress import ProgressBar
from jaxrl_reason.rewards.math import equivalence_verdict, extract_answer
from jaxrl_reason.rewards.pool import (
    DEFAULT_BACKSTOP_FACTOR,
    BatchRewards,
    RewardPool,
    config_options,
)
from jaxrl_reason.data.tasks import eval_sources, task_verifier
from jaxrl_reason.runtime.build import Runtime
# The report's tables, text curves and plots (re-exported: callers use runner.plot_curves).
from jaxrl_reason.evaluation.report import (  # noqa: F401
    REPORT_METRICS,
    comparison_table,
    format_curves,
    format_pass_at_k,
    plot_curves,
    plot_pass_at_k,
    report_metrics,
    write_report,
)

DEFAULTS = {"vote_subsets": 64, "best_of_verifier": "format_strict", "answer_equivalence": True,
            "plot": False, "retry_limit_factor": 4.0, "max_unscored_share": 0.0}
EQUIVALENCE_TIMEOUT_S = 5.0  # CPU seconds of one answer-equivalence comparison (voting)


class UnscoredError(RuntimeError):
    """More answers than `eval.max_unscored_share` allows were left without a verdict even
    after the retry; `report` holds the evaluation (its "unscored" counts per set)."""

    def __init__(self, message: str, report: Mapping[str, Any]):
        super().__init__(message)
        self.report = report


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
    each file of `task.eval_files` for a file task, or each domain's held-out set for a
    mixture ("countdown: levels 1-2 (held-out)")."""
    sources = eval_sources(config, config.eval.num_problems, config.eval.data_seed,
                           level_set_name)
    return {name: [source[i] for i in range(len(source))] for name, source in sources.items()}


def file_sets(path: str, preset: str = "generic",
              num_problems: int | None = None) -> dict[str, list[dict]]:
    """The evaluation set of a JSONL/parquet file (`eval --data`): {file name: its first
    `num_problems` examples (all when None)}. Each example names the file task's verifier
    ("verifier": "correctness") unless it has one, so a mixture checkpoint, whose verifier
    dispatches per row, judges it as a file task would."""
    from jaxrl_reason.data.files import read_examples
    from jaxrl_reason.data.tasks import get_task

    source = read_examples(path, fields=preset)
    size = len(source) if num_problems is None else min(num_problems, len(source))
    verifier = get_task("file").verifier
    return {os.path.basename(path): [{"verifier": verifier, **source[i]} for i in range(size)]}


def _padded_chunks(examples: Sequence[Mapping], size: int):
    """Chunks of exactly `size` examples (the last padded by repetition) + real counts."""
    for start in range(0, len(examples), size):
        chunk = list(examples[start:start + size])
        real = len(chunk)
        chunk += [chunk[-1]] * (size - real)
        yield chunk, real


def _score_retrying(pool: RewardPool, retry_pool: RewardPool | None, texts: list[str],
                    rows: list[Mapping], names: Sequence[str] | None
                    ) -> tuple[BatchRewards, int, np.ndarray]:
    """`pool.score(texts, rows)`, then the rows whose components `names` (default: all) got
    no verdict (unscored, or at their CPU limit) scored again by `retry_pool` (longer
    limits). Returns (the merged rewards, rows retried, bool [N] rows still unscored)."""
    batch = pool.score(texts, rows)
    names = list(names) if names else list(batch.components)
    undecided = np.zeros(len(texts), bool)
    for name in names:
        undecided |= batch.unscored.get(name, False) | batch.timed_out.get(name, False)
    index = np.flatnonzero(undecided)
    if retry_pool is not None and index.size:
        again = retry_pool.score([texts[i] for i in index], [rows[i] for i in index])

        def merged(first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray]):
            out = {name: np.array(values) for name, values in first.items()}
            for name, values in out.items():
                if name in second:
                    values[index] = second[name]
            return out

        total = np.array(batch.total)
        total[index] = again.total
        batch = dataclasses.replace(
            batch, total=total, components=merged(batch.components, again.components),
            unscored=merged(batch.unscored, again.unscored),
            timed_out=merged(batch.timed_out, again.timed_out),
            reasons=batch.reasons + again.reasons, seconds=batch.seconds + again.seconds)
    still = np.zeros(len(texts), bool)
    for name in names:
        still |= batch.unscored.get(name, False)
    return batch, int(index.size), still


def _equivalence(options: Mapping[str, Any] | None, retry_factor: float, counts: dict):
    """`math.is_equivalent` with `options` for voting, its undecided comparisons retried
    with a `retry_factor` times longer limit; comparisons still unscored are counted in
    `counts["unscored"]` (and vote apart)."""
    options = dict(options or {})

    def equivalent(a: str, b: str) -> bool:
        verdict = equivalence_verdict(a, b, EQUIVALENCE_TIMEOUT_S, **options)
        if verdict in ("timeout", "unscored"):
            verdict = equivalence_verdict(a, b, EQUIVALENCE_TIMEOUT_S * retry_factor,
                                          **options)
        counts["unscored"] += verdict == "unscored"
        return verdict == "equal"

    return equivalent


def sample_and_verify(rt: Runtime, params, examples: Sequence[Mapping], pool: RewardPool, *,
                      seed: int, num_samples: int, temperature: float, top_p: float,
                      max_new_tokens: int, batch_prompts: int, verifier: str | None = None,
                      filter_verifier: str | None = None,
                      answer_equivalence: bool = False,
                      equivalence_options: Mapping[str, Any] | None = None,
                      retry_pool: RewardPool | None = None,
                      retry_limit_factor: float = DEFAULTS["retry_limit_factor"]
                      ) -> dict[str, Any]:
    """Samples `num_samples` completions per example and verifies them.

    `verifier` names the pool component deciding correctness (default: the pool's total);
    `filter_verifier` a component whose scores are returned for best-of-k;
    `equivalence_options` the math verifier's options for `answer_equivalence`
    (`rewards.options.correctness`); `retry_pool` (a pool with limits `retry_limit_factor`
    times longer) scores again the answers left without a verdict.
    Returns: correct bool [P, n], answers (P x n list of str | None; with
    `answer_equivalence`, equivalent answers of a problem share one string), lengths int
    [P, n], texts (P x n list of str), scores f32 [P, n] (filter_verifier's; None without),
    unscored (answers, and voting comparisons, still without a verdict after the retry),
    retried (answers scored a second time).
    """
    correct, answers, lengths, texts, scores = [], [], [], [], []
    rng = jax.random.key(seed)
    counts = {"unscored": 0, "retried": 0}
    equivalent = (_equivalence(equivalence_options, retry_limit_factor, counts)
                  if answer_equivalence else None)
    names = None if verifier is None else [verifier] + (
        [filter_verifier] if filter_verifier is not None else [])
    for i, (chunk, real) in enumerate(_padded_chunks(examples, batch_prompts)):
        pt, pv = rt.encode_prompts(chunk)
        out = rt.sampler(params, rt.put_prompts(pt), rt.put_prompts(pv),
                         jax.random.fold_in(rng, i), num_samples=num_samples,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        tokens, lens = jax.device_get((out.tokens, out.lengths))
        tokens, lens = tokens[:real * num_samples], lens[:real * num_samples]
        chunk_texts = [rt.tokenizer.decode(row[:n]) for row, n in zip(tokens, lens)]
        rows = [ex for ex in chunk[:real] for _ in range(num_samples)]
        batch, retried, still = _score_retrying(pool, retry_pool, chunk_texts, rows, names)
        counts["retried"] += retried
        counts["unscored"] += int(still.sum())
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
            "scores": np.concatenate(scores) if scores else None,
            "unscored": counts["unscored"], "retried": counts["retried"]}


def evaluate(rt: Runtime, params, sets: Mapping[str, Sequence[Mapping]] | None = None, *,
             eval_cfg: ml_collections.ConfigDict | None = None, label: str = "",
             progress: bool = True) -> dict[str, Any]:
    """Evaluates `params` on every named set for every seed of `eval_cfg`.

    Returns {"sets": {name: {metric: {"mean", "std", "ci95", "values"}}},
             "curves": {name: {"k": [1, 2, ..., n], "pass@k" | "maj@k" | "best_of@k":
                               {"mean": [...], "ci95": [...]}}},
             "config": {...}}.
    """
    return evaluate_samples(rt, params, sets, eval_cfg=eval_cfg, label=label,
                            progress=progress)[0]


def evaluate_samples(rt: Runtime, params, sets: Mapping[str, Sequence[Mapping]] | None = None,
                     *, eval_cfg: ml_collections.ConfigDict | None = None, label: str = "",
                     progress: bool = True, verifier: str | None = None
                     ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`evaluate`, also returning every verdict: (report, {set name: correct bool [S, P, n]})
    with S = len(eval_cfg.seeds) in seed order, P problems in set order, n samples.

    `verifier` names the reward deciding correctness (default: the task's, from rt.config;
    `compare` passes checkpoint A's so that both checkpoints are judged alike).
    """
    cfg = eval_cfg or rt.config.eval
    sets = eval_sets(rt.config) if sets is None else sets
    n = cfg.num_samples
    ks = sorted({1, n} | {k for k in (2, 4, 8, 16) if k <= n})
    subsets = int(eval_option(cfg, "vote_subsets"))
    verifier = verifier or task_verifier(rt.config)
    filter_verifier = eval_option(cfg, "best_of_verifier") or None
    equivalence = bool(eval_option(cfg, "answer_equivalence"))
    retry_factor = float(eval_option(cfg, "retry_limit_factor"))
    max_share = float(eval_option(cfg, "max_unscored_share"))
    report: dict[str, Any] = {"sets": {}, "curves": {}, "config": {
        "num_samples": n, "seeds": list(cfg.seeds), "temperature": cfg.temperature,
        "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "vote_subsets": subsets,
        "best_of_verifier": filter_verifier, "answer_equivalence": equivalence,
        "max_unscored_share": max_share}, "unscored": {}}
    weights = {verifier: 1.0}
    if filter_verifier is not None and filter_verifier != verifier:
        weights[filter_verifier] = 0.0
    verdicts: dict[str, np.ndarray] = {}
    options = config_options(rt.config)  # the same verifier options as training
    limits = {"num_workers": rt.config.rewards.num_workers, "options": options,
              "timeout_s": rt.config.rewards.timeout_s,
              "backstop_factor": rt.config.rewards.get("backstop_factor",
                                                       DEFAULT_BACKSTOP_FACTOR)}
    answers_total = unscored_total = 0
    with RewardPool(weights, **limits) as pool, \
            RewardPool(weights, **{**limits, "timeout_s": limits["timeout_s"] * retry_factor},
                       limit_scale=retry_factor) as retry_pool, \
            ProgressBar(len(sets) * len(cfg.seeds), f"eval{label}", enabled=progress) as bar:
        for name, examples in sets.items():
            per_seed, curves, correct = [], [], []
            unscored = retried = 0
            for seed in cfg.seeds:
                res = sample_and_verify(rt, params, examples, pool, seed=seed, num_samples=n,
                                        temperature=cfg.temperature, top_p=cfg.top_p,
                                        max_new_tokens=cfg.max_new_tokens,
                                        batch_prompts=cfg.batch_prompts, verifier=verifier,
                                        filter_verifier=filter_verifier,
                                        answer_equivalence=equivalence,
                                        equivalence_options=options.get("correctness"),
                                        retry_pool=retry_pool,
                                        retry_limit_factor=retry_factor)
                per_seed.append(evaluation.seed_metrics(
                    res["correct"], res["answers"], res["lengths"], ks, scores=res["scores"],
                    num_subsets=subsets, seed=seed))
                curves.append(evaluation.accuracy_curve(
                    res["correct"], res["answers"], res["scores"], num_subsets=subsets,
                    seed=seed))
                correct.append(res["correct"])
                unscored += res["unscored"]
                retried += res["retried"]
                bar.update(1)
            report["sets"][name] = evaluation.summarize_seeds(per_seed)
            report["curves"][name] = evaluation.summarize_curves(curves)
            report["unscored"][name] = unscored
            verdicts[name] = np.stack(correct)
            answers_total += int(verdicts[name].size)
            unscored_total += unscored
            if retried and jax.process_index() == 0:  # the load's doing: not in the report
                print(f"[eval{label}] {name}: {retried} answer(s) without a verdict scored "
                      f"again with {retry_factor:g}x limits; {unscored} still unscored",
                      file=sys.stderr, flush=True)
    if unscored_total > max_share * answers_total:
        raise UnscoredError(
            f"evaluation{label}: {unscored_total} of {answers_total} answers (or voting "
            f"comparisons) have no verdict even with {retry_factor:g}x limits, more than "
            f"eval.max_unscored_share={max_share:g} allows (per set: {report['unscored']}); "
            "the machine gave them no CPU within rewards.backstop_factor x "
            "rewards.timeout_s: raise those, or eval.max_unscored_share", report)
    return report, verdicts


# ----------------------------------------------------------------------------- eval options


def parse_seeds(text: str) -> tuple[int, ...]:
    """The sampling seeds of `--seeds`: "N" = seeds 0..N-1; "a,b,c" = those seeds (one
    given seed: "7,"). ValueError for anything else (non-integers, negatives, repeats, N < 1).
    """
    text = str(text).strip()
    if not text:
        raise ValueError("--seeds: give a count N (seeds 0..N-1) or a list such as 0,1,2")
    parts = [p.strip() for p in text.split(",")]
    is_list = len(parts) > 1
    parts = [p for p in parts if p] if is_list else parts
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--seeds: expected a count N or a comma-separated list of integers, "
                         f"got {text!r}") from None
    if not is_list:
        if values[0] < 1:
            raise ValueError(f"--seeds: the number of seeds must be >= 1, got {values[0]}")
        return tuple(range(values[0]))
    if not values or any(v < 0 for v in values):
        raise ValueError(f"--seeds: seeds must be integers >= 0, got {text!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"--seeds: seeds repeat in {text!r} (a repeated seed draws the very "
                         "same samples and would shrink the interval falsely)")
    return tuple(values)


def with_eval_overrides(config: ml_collections.ConfigDict, *,
                        seeds: Sequence[int] | None = None, num_samples: int | None = None,
                        num_problems: int | None = None) -> ml_collections.ConfigDict:
    """An unlocked copy of `config` with `eval.seeds` / `eval.num_samples` /
    `eval.num_problems` replaced where given (None keeps the config's); ValueError for a
    count below 1."""
    for name, value in (("num_samples", num_samples), ("num_problems", num_problems)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"--{name}: must be an integer >= 1, got {value!r}")
    out = ml_collections.ConfigDict(config.to_dict())
    if seeds is not None:
        out.eval.seeds = tuple(int(s) for s in seeds)
    if num_samples is not None:
        out.eval.num_samples = int(num_samples)
    if num_problems is not None:
        out.eval.num_problems = int(num_problems)
    return out


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    """What `load_checkpoint` read: the runtime, the params and where they came from.

    Attributes:
      rt: the Runtime (the checkpoint's tokenizer, the given or stored config).
      params: the params pytree, laid out on `rt.mesh`.
      directory: the phase checkpoint directory (`run_state.resolve_checkpoint_dir`).
      step: the checkpoint step the params and metadata come from.
      skipped: {step: [problem, ...]} of damaged newer steps skipped to reach `step`.
    """

    rt: Runtime
    params: Any
    directory: str
    step: int
    skipped: dict[int, list[str]]


def load_checkpoint(path: str, config: ml_collections.ConfigDict | None = None,
                    overrides: Mapping[str, Any] | None = None,
                    reuse: Runtime | None = None) -> LoadedCheckpoint:
    """The newest usable step of a run workdir or phase checkpoint, for evaluation.

    The runtime uses the checkpoint's own tokenizer and, unless `config` is given, the
    config stored in the checkpoint; `overrides` are `with_eval_overrides` keywords. With
    `reuse`, that runtime is returned when the checkpoint has the same tokenizer and model
    (the SFT and RL checkpoints of one run), so its compiled sampler serves both. Metadata
    and params come from one step: the newest whose metadata and arrays verify; damaged
    newer steps are reported on stderr (process 0) and listed in `skipped`.
    Raises FileNotFoundError / ValueError naming the path (CheckpointCorruptError when
    every step is damaged).
    """
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    from jaxrl_reason.checkpoints.manifest import CheckpointCorruptError
    from jaxrl_reason.checkpoints.phases import resolve_checkpoint_dir

    directory = resolve_checkpoint_dir(path)
    with Checkpointer(directory) as ckpt:
        steps = ckpt.all_steps()[::-1]
    skipped: dict[int, list[str]] = {}
    for i, step in enumerate(steps):
        try:
            rt, params = _load_step(directory, step, config, overrides, reuse)
        except CheckpointCorruptError as e:
            skipped.update(e.problems)
            if jax.process_index() == 0:
                nxt = f"falling back to step {steps[i + 1]}" if i + 1 < len(steps) else \
                    "no older step left"
                print(f"[checkpoint] {directory}: step {step} is damaged (left in place): "
                      f"{'; '.join(e.problems.get(step, [str(e)])[:3])}; {nxt}",
                      file=sys.stderr, flush=True)
            continue
        return LoadedCheckpoint(rt, params, directory, step, skipped)
    raise CheckpointCorruptError(
        f"no usable checkpoint in {directory}: all {len(skipped)} complete steps are damaged "
        f"({sorted(skipped)})", directory, skipped)


def _load_step(directory: str, step: int, config, overrides, reuse):
    """(Runtime, params) of one checkpoint step; CheckpointCorruptError when it is damaged."""
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    from jaxrl_reason.checkpoints.phases import load_params
    from jaxrl_reason.runtime.build import build_runtime
    from jaxrl_reason.tokenizers import tokenizer_from_serialized

    with Checkpointer(directory) as ckpt:
        meta = ckpt.metadata(step)
    if config is None:
        stored = meta.get("config")
        if not stored:
            raise ValueError(f"checkpoint {directory} holds no config; pass --config")
        config = ml_collections.ConfigDict(json.loads(stored))
    config = with_eval_overrides(config, **dict(overrides or {}))
    # The checkpoint's own tokenizer: never train or write one next to a checkpoint.
    tokenizer = tokenizer_from_serialized(meta["tokenizer"])
    rt = reuse
    if rt is None or rt.tokenizer.serialized != tokenizer.serialized:
        rt = build_runtime(config, directory, tokenizer=tokenizer)
    params, model_cfg, _, _ = load_params(directory, rt.mesh, rt.rules, step=step)
    if rt is reuse and model_cfg != rt.model_cfg:  # another architecture: its own runtime
        rt = build_runtime(config, directory, tokenizer=tokenizer)
        params, _, _, _ = load_params(directory, rt.mesh, rt.rules, step=step)
    return rt, params


def load_for_eval(path: str, config: ml_collections.ConfigDict | None = None,
                  overrides: Mapping[str, Any] | None = None, reuse: Runtime | None = None):
    """(Runtime, params, checkpoint directory) of `load_checkpoint` (which also says the
    step used)."""
    loaded = load_checkpoint(path, config, overrides, reuse)
    return loaded.rt, loaded.params, loaded.directory


# ----------------------------------------------------------------------------- compare


def compare(rt_a: Runtime, params_a, rt_b: Runtime, params_b,
            sets: Mapping[str, Sequence[Mapping]] | None = None, *,
            eval_cfg: ml_collections.ConfigDict | None = None, num_resamples: int = 10_000,
            bootstrap_seed: int = 0, labels: Sequence[str] = ("A", "B"),
            progress: bool = True) -> dict[str, Any]:
    """Evaluates checkpoints A and B on the same problems and seeds and tests the difference.

    Both are sampled with `eval_cfg` (default A's `config.eval`) on `sets` (default A's
    held-out sets) and judged by A's task verifier. For every set and every k in
    {1, 2, 4, ..., n} the per-problem unbiased pass@k [P, S] of A and of B go through
    `comparison.paired_bootstrap` (B - A; problems and seeds resampled, paired).

    Returns {"labels": [A, B], "config": A's eval report config,
             "reports": {A: evaluate-style report, B: ...},
             "tests": {set: {"pass@k": paired_bootstrap(...) output}},
             "pass_at_k": {set: {"k": [1..n], A: {"mean", "ci95"}, B: {...}}}}.
    """
    cfg = eval_cfg or rt_a.config.eval
    sets = eval_sets(rt_a.config) if sets is None else sets
    verifier = task_verifier(rt_a.config)
    label_a, label_b = labels
    if label_a == label_b:
        raise ValueError(f"compare: the two labels must differ, got {labels!r}")
    report_a, correct_a = evaluate_samples(rt_a, params_a, sets, eval_cfg=cfg,
                                           label=f"/{label_a}", progress=progress,
                                           verifier=verifier)
    report_b, correct_b = evaluate_samples(rt_b, params_b, sets, eval_cfg=cfg,
                                           label=f"/{label_b}", progress=progress,
                                           verifier=verifier)
    n = cfg.num_samples
    ks = evaluation.curve_ks(n)
    tests, curves = {}, {}
    for name in sets:
        tests[name] = {
            f"pass@{k}": comparison.paired_bootstrap(
                comparison.problem_scores(correct_a[name], k),
                comparison.problem_scores(correct_b[name], k),
                num_resamples=num_resamples, seed=bootstrap_seed)
            for k in ks}
        curve_a = comparison.pass_at_k_curves(correct_a[name])
        curve_b = comparison.pass_at_k_curves(correct_b[name])
        curves[name] = {"k": curve_a["k"],
                        label_a: {"mean": curve_a["mean"], "ci95": curve_a["ci95"]},
                        label_b: {"mean": curve_b["mean"], "ci95": curve_b["ci95"]}}
    return {"labels": [label_a, label_b], "config": report_a["config"],
            "reports": {label_a: report_a, label_b: report_b}, "tests": tests,
            "pass_at_k": curves}
