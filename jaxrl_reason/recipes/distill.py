"""Rejection-sampling distillation: sample from a teacher, keep verified completions, SFT a student.

DeepSeek-R1's third stage (and its distillation into small dense models): sample N
completions per prompt from a checkpoint, keep those the task's verifier accepts, and
fine-tune a (possibly smaller) student on them. With `keep="shortest"` only the shortest
correct completion of each prompt is kept (long2short, Kimi k1.5's shortest rejection
sampling), which trains a student to reason in fewer tokens.

    records, stats = rejection_sample(rt, teacher_params, examples, num_samples=8,
                                      max_new_tokens=128, keep="shortest")
    write_sft_jsonl("runs/x/distill.jsonl", records)
    params, student_rt = distill_student(rt.config, "runs/x/distill.jsonl", "runs/x/student",
                                         tokenizer=rt.tokenizer, model=get_preset("test"))

The written file is a generic {prompt, answer} JSONL with a "completion" per record: the
format `data.files.read_examples` reads and the "file" task trains SFT on
(`read_sft_jsonl`); `student_config` is the run config that does so. The student's part
(`student_config`, `distill_student`, `student_lora`, `train_student`) lives in
`recipes/distill_student.py` and is re-exported here.

`jaxrl-reason distill` and a pipeline's distill stage run the same parts resumably from a
`DistillSettings` (a config's `distill` block, then flags): `sample_distill_data` (the
JSONL's presence marks it done), `train_student` (resumes from the student's checkpoints),
and `run_distill`, which also evaluates teacher and student on the held-out sets:

    settings = settings_from(config, num_samples=4, keep="shortest")
    report = run_distill(rt, teacher_params, "runs/x_distill", settings)  # distill.json

Departures from DeepSeek-R1, on purpose:
- Only rule-verified data: R1 also kept non-reasoning SFT data and judged some prompts
  with a generative reward model (DeepSeek-V3); here a completion is kept when every
  named verifier scores it > 0.5 (default: the task's verifier).
- R1 filtered out mixed-language, long-paragraph and code-block chains of thought; here
  a completion that hit the token budget (no EOS) is dropped by default
  (`drop_truncated`), and exact duplicates of a kept completion of the same prompt are
  dropped (`dedupe`), nothing else.
- The student's SFT is our cold-start SFT (`sft.run_sft`): completion-only loss, the
  teacher's tokenizer, prompts as the teacher saw them (templates and L1 length targets
  already applied, so the student config turns both off).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import paths
from jaxrl_reason.data.files import FileSource, read_examples
from jaxrl_reason.data.tasks import task_source, task_verifier
from jaxrl_reason.models import lora as lora_lib
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.rewards.pool import RewardPool, config_options, import_reward_modules
from jaxrl_reason.runtime.build import Runtime
from jaxrl_reason.recipes.distill_student import (  # noqa: F401  (the student's part)
    budget, distill_student, student_config, student_lora, train_student)

KEEP = ("all", "shortest")
_SET_FIELDS = ("id", "prompt", "answer", "completion", "source_id", "sample", "length")
_DROPPED_FIELDS = ("solution",)  # a file example's worked solution would rebuild a target


@dataclasses.dataclass(frozen=True)
class DistillStats:
    """What rejection sampling produced.

    Attributes:
      prompts: prompts sampled; samples: completions sampled (prompts * num_samples).
      correct: completions every verifier accepted (truncated ones included);
      kept: records written (after `drop_truncated`, `dedupe` and `keep`).
      acceptance_rate: correct / samples.
      prompts_kept: prompts with at least one kept record.
      truncated: completions that hit the token budget without EOS.
      mean_length_all / _correct / _kept: mean completion length in tokens (with EOS) over
        all samples / the correct ones / the kept ones (0.0 when there are none).
      seconds: wall time of sampling and verification.
    """
    prompts: int
    samples: int
    correct: int
    kept: int
    acceptance_rate: float
    prompts_kept: int
    truncated: int
    mean_length_all: float
    mean_length_correct: float
    mean_length_kept: float
    seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else 0.0


# ----------------------------------------------------------------------------- selection


def select_completions(examples: Sequence[Mapping[str, Any]], completions: Sequence[str],
                       lengths: Sequence[int], correct: Sequence[bool], *, num_samples: int,
                       keep: str = "all", truncated: Sequence[bool] | None = None,
                       drop_truncated: bool = True, dedupe: bool = True) -> list[dict]:
    """The SFT records of the verified completions (pure host code, no device).

    Args:
      examples: P examples (dicts with "id", "prompt", "answer").
      completions: P * num_samples texts, group-major (row r = example r // num_samples).
      lengths: int [P * n] token lengths; correct: bool [P * n] verifier verdicts;
      truncated: bool [P * n] or None (none truncated).
      keep: "all" (every accepted completion) or "shortest" (the shortest accepted one per
        prompt, fewest tokens, the first sample on a tie).
      drop_truncated: leave out completions that hit the token budget.
      dedupe: leave out a completion identical to one already kept for the same prompt.
    Returns:
      Records in prompt order: {"id": "<example id>-s<j>", "prompt", "answer",
      "completion", "source_id", "sample": j, "length"}, plus the example's other scalar
      fields (e.g. "level"; not its own "completion" or "solution").
    """
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, got {keep!r}")
    n = num_samples
    total = len(examples) * n
    for name, seq in (("completions", completions), ("lengths", lengths),
                      ("correct", correct)):
        if len(seq) != total:
            raise ValueError(f"{name} has {len(seq)} rows, expected {len(examples)} examples "
                             f"x {n} samples = {total}")
    truncated = np.zeros(total, bool) if truncated is None else np.asarray(truncated, bool)
    lengths, correct = np.asarray(lengths), np.asarray(correct, bool)
    records = []
    for p, example in enumerate(examples):
        rows = [r for r in range(p * n, (p + 1) * n)
                if correct[r] and not (drop_truncated and truncated[r])]
        if keep == "shortest" and rows:
            rows = [min(rows, key=lambda r: (int(lengths[r]), r))]
        seen = set()
        extra = {k: v for k, v in example.items()
                 if k not in _SET_FIELDS + _DROPPED_FIELDS
                 and isinstance(v, (str, int, float, bool))}
        for r in rows:
            if dedupe and completions[r] in seen:
                continue
            seen.add(completions[r])
            source_id = str(example.get("id", p))
            records.append({**extra, "id": f"{source_id}-s{r - p * n}",
                            "prompt": example["prompt"], "answer": str(example["answer"]),
                            "completion": completions[r], "source_id": source_id,
                            "sample": r - p * n, "length": int(lengths[r])})
    return records


def verify_completions(completions: Sequence[str], examples: Sequence[Mapping[str, Any]],
                       verifiers: Sequence[str], *, num_workers: int = 2,
                       timeout_s: float = 5.0,
                       options: Mapping[str, Mapping] | None = None) -> np.ndarray:
    """bool [N]: every reward named in `verifiers` scores completion i (against
    `examples[i]`) above 0.5. Runs on a host thread pool; a verifier that raises or times
    out rejects. `options`: reward name -> keyword options (the run's `rewards.options`)."""
    if not verifiers:
        raise ValueError("verify_completions needs at least one verifier name")
    with RewardPool({name: 1.0 for name in verifiers}, options=options,
                    num_workers=num_workers, timeout_s=timeout_s) as pool:
        result = pool.score(list(completions), list(examples))
    ok = np.ones(len(completions), bool)
    for name in verifiers:
        ok &= np.asarray(result.components[name]) > 0.5
    return ok


# ----------------------------------------------------------------------------- sampling


def rejection_sample(rt: Runtime, params, examples: Sequence[Mapping[str, Any]], *,
                     num_samples: int, max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                     batch_prompts: int = 16, keep: str = "all",
                     verifiers: Sequence[str] | None = None, verify: bool = True,
                     drop_truncated: bool = True,
                     dedupe: bool = True) -> tuple[list[dict], DistillStats]:
    """Samples `num_samples` completions per example with `rt.sampler` and keeps the verified.

    Args:
      rt: the teacher's runtime (sampler, tokenizer, mesh, prompt buckets of its config).
      params: the teacher's params (on `rt.mesh`).
      examples: problems with "prompt" and "answer" (e.g. `task_source(...)` items).
      num_samples, max_new_tokens, temperature, top_p, top_k: sampling (static G and L).
      seed: sampling seed (chunk i uses fold_in(key(seed), i)).
      batch_prompts: prompts per sampler call (the last chunk is padded by repetition, so
        every call has one shape).
      keep, drop_truncated, dedupe: see `select_completions`.
      verifiers: reward names that must all accept; None: the task's verifier.
      verify: False accepts every sample unverified (sequence-level knowledge distillation,
        Kim & Rush 2016: SFT on the teacher's samples; "correct" then counts all of them).
    Returns:
      (records, stats): `select_completions` records and a DistillStats. On multi-host every
      process returns the same (process 0's verdicts).
    """
    verifiers = tuple(verifiers or (task_verifier(rt.config),))
    t0 = time.time()
    rng = jax.random.key(seed)
    texts, lengths, truncated = [], [], []
    for i, start in enumerate(range(0, len(examples), batch_prompts)):
        chunk = list(examples[start:start + batch_prompts])
        real = len(chunk)
        chunk += [chunk[-1]] * (batch_prompts - real)
        pt, pv = rt.encode_prompts(chunk)
        out = rt.sampler(params, rt.put_prompts(pt), rt.put_prompts(pv),
                         jax.random.fold_in(rng, i), num_samples=num_samples,
                         max_new_tokens=max_new_tokens, temperature=temperature,
                         top_p=top_p, top_k=top_k)
        tokens, lens, trunc = jax.device_get((out.tokens, out.lengths, out.truncated))
        rows = real * num_samples
        texts += [rt.tokenizer.decode(row[:n]) for row, n in zip(tokens[:rows], lens[:rows])]
        lengths.append(np.asarray(lens[:rows]))
        truncated.append(np.asarray(trunc[:rows]))
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    truncated = np.concatenate(truncated) if truncated else np.zeros(0, bool)
    rows = [ex for ex in examples for _ in range(num_samples)]
    if verify:
        correct = distributed.broadcast_from_primary(verify_completions(
            texts, rows, verifiers, num_workers=rt.config.rewards.num_workers,
            timeout_s=rt.config.rewards.timeout_s, options=config_options(rt.config)))
    else:
        correct = np.ones(len(texts), bool)
    records = select_completions(examples, texts, lengths, correct, num_samples=num_samples,
                                 keep=keep, truncated=truncated,
                                 drop_truncated=drop_truncated, dedupe=dedupe)
    kept_lengths = np.asarray([r["length"] for r in records])
    stats = DistillStats(
        prompts=len(examples), samples=len(texts), correct=int(correct.sum()),
        kept=len(records), acceptance_rate=float(correct.mean()) if len(texts) else 0.0,
        prompts_kept=len({r["source_id"] for r in records}), truncated=int(truncated.sum()),
        mean_length_all=_mean(lengths), mean_length_correct=_mean(lengths[correct]),
        mean_length_kept=_mean(kept_lengths), seconds=time.time() - t0)
    return records, stats


# ----------------------------------------------------------------------------- files


def write_sft_jsonl(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]) -> int:
    """Writes SFT records as JSONL (one object per line; atomically: temp file + rename).
    Only process 0 writes on multi-host. Returns the number of records."""
    path = os.fspath(path)
    if distributed.is_primary():
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(dict(record), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    distributed.sync("distill_written")
    return len(records)


def read_sft_jsonl(path: str | os.PathLike) -> FileSource:
    """The records of `write_sft_jsonl` as examples, read by `data.files.read_examples`
    (generic preset, ids from the "id" field): "id", "prompt", "answer", "completion", ...
    Raises ValueError naming `file:line` for a malformed record, or when there is none."""
    return read_examples(path, format="jsonl", fields="generic", id_field="id")


# ----------------------------------------------------------------------------- runs


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """What `jaxrl-reason distill` and a pipeline's distill stage do (a config's optional
    `distill` block holds the same fields).

    Attributes:
      num_prompts: training prompts of the task sampled from the teacher.
      num_samples: completions per prompt.
      keep: "all" (every verified completion) or "shortest" (one per prompt, long2short).
      max_new_tokens: the teacher's token budget; 0 = config.rl.max_new_tokens.
      temperature, top_p: the teacher's sampling.
      batch_prompts: prompts per sampler call.
      seed: sampling seed (the prompts are the task's training split, drawn with
        config.seed + 2).
      verifiers: reward names that must all accept a completion; () = the task's verifier.
      verify: False keeps every sample unverified (sequence-level distillation).
      drop_truncated, dedupe: see `select_completions`.
      student_preset: the student's model preset ("" = the teacher's model).
      student_init: "random" (a fresh student, as R1 distills into new models) or "teacher"
        (start from the teacher's weights: rejection-sampling fine-tuning of one model, R1's
        third stage).
      student_steps: the student's SFT steps; 0 = config.sft.steps.
      student_learning_rate: its peak SFT rate; 0 = config.sft.learning_rate.
      student_packing: the student's SFT on padding-free packs (`sft.packing`, with
        `sft.pack_tokens` raised to hold its longest row; docs/packing.md).
    """
    num_prompts: int = 256
    num_samples: int = 8
    keep: str = "all"
    max_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    batch_prompts: int = 16
    seed: int = 0
    verifiers: tuple[str, ...] = ()
    verify: bool = True
    drop_truncated: bool = True
    dedupe: bool = True
    student_preset: str = ""
    student_init: str = "random"
    student_steps: int = 0
    student_learning_rate: float = 0.0
    student_packing: bool = False


STUDENT_INITS = ("random", "teacher")


def settings_from(config: ml_collections.ConfigDict, **overrides: Any) -> DistillSettings:
    """DistillSettings from the defaults, `config.distill` (when the config has that block)
    and `overrides` whose value is not None, in that order. Raises ValueError listing every
    unknown field and bad value."""
    fields = {f.name for f in dataclasses.fields(DistillSettings)}
    values: dict[str, Any] = {}
    block = config.get("distill") or {}
    values.update(dict(block.to_dict() if hasattr(block, "to_dict") else block))
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"distill: unknown setting(s) {unknown}; known: {sorted(fields)}")
    if isinstance(values.get("verifiers"), str):
        values["verifiers"] = tuple(v for v in values["verifiers"].split(",") if v)
    values["verifiers"] = tuple(values.get("verifiers", ()))
    s = DistillSettings(**values)
    problems = []
    for name in ("num_prompts", "num_samples", "batch_prompts"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            problems.append(f"distill.{name}: must be a positive integer, got {value!r}")
    for name in ("max_new_tokens", "student_steps"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"distill.{name}: must be an integer >= 0, got {value!r}")
    if s.keep not in KEEP:
        problems.append(f"distill.keep: must be one of {list(KEEP)}, got {s.keep!r}")
    if s.student_init not in STUDENT_INITS:
        problems.append(f"distill.student_init: must be one of {list(STUDENT_INITS)}, got "
                        f"{s.student_init!r}")
    if s.student_preset and s.student_init == "teacher":
        problems.append("distill.student_preset: a student initialized from the teacher has "
                        "the teacher's model; leave the preset empty or use student_init=random")
    if s.student_preset:
        try:
            get_preset(s.student_preset)
        except ValueError as e:
            problems.append(f"distill.student_preset: {e}")
    if not isinstance(s.student_packing, bool):
        problems.append(f"distill.student_packing: must be True or False, got "
                        f"{s.student_packing!r}")
    if not 0.0 < s.temperature <= 10.0:
        problems.append(f"distill.temperature: must be in (0, 10], got {s.temperature!r}")
    if not 0.0 < s.top_p <= 1.0:
        problems.append(f"distill.top_p: must be in (0, 1], got {s.top_p!r}")
    if not 0.0 <= s.student_learning_rate <= 1.0:
        problems.append(f"distill.student_learning_rate: must be in [0, 1], got "
                        f"{s.student_learning_rate!r}")
    if problems:
        raise ValueError("invalid distill settings:\n  - " + "\n  - ".join(problems))
    return s


def distill_prompts(config: ml_collections.ConfigDict, settings: DistillSettings) -> list[dict]:
    """The first `settings.num_prompts` examples of the task's training split (seed
    config.seed + 2; a file task may have fewer)."""
    source = task_source(config, "train", config.task.train_levels, settings.num_prompts,
                         seed=config.seed + 2)
    return [source[i] for i in range(min(settings.num_prompts, len(source)))]


def stats_path(data_path: str) -> str:
    """Where the DistillStats of a distilled JSONL are kept: <stem>_stats.json beside it."""
    return os.path.splitext(data_path)[0] + "_stats.json"


def sample_distill_data(rt: Runtime, params, data_path: str,
                        settings: DistillSettings) -> tuple[DistillStats, bool]:
    """Rejection-samples the teacher (`rt`, `params`) into `data_path`, resumably.

    When `data_path` and its stats file exist (an earlier run finished this part), nothing
    is sampled. Otherwise the stats are written first and the JSONL last (atomically), so
    the JSONL's presence marks a finished part.
    Returns (stats, reused): reused is True when the earlier data was kept.
    Raises ValueError when no completion was kept (the stats are still written).
    """
    stats_file = stats_path(data_path)
    if os.path.isfile(data_path) and os.path.isfile(stats_file):
        with open(stats_file) as f:
            return DistillStats(**json.load(f)), True
    import_reward_modules(tuple(rt.config.rewards.get("modules", ())))  # user verifiers
    records, stats = rejection_sample(
        rt, params, distill_prompts(rt.config, settings), num_samples=settings.num_samples,
        max_new_tokens=budget(rt.config, settings), temperature=settings.temperature,
        top_p=settings.top_p, seed=settings.seed, batch_prompts=settings.batch_prompts,
        keep=settings.keep, verifiers=settings.verifiers or None, verify=settings.verify,
        drop_truncated=settings.drop_truncated, dedupe=settings.dedupe)
    if distributed.is_primary():
        paths.write_text_atomic(stats_file, json.dumps(stats.to_dict(), indent=1))
    if not records:
        raise ValueError(
            f"rejection sampling kept no completion: {stats.correct} of {stats.samples} "
            f"samples verified ({', '.join(settings.verifiers) or task_verifier(rt.config)}), "
            f"{stats.truncated} hit the {budget(rt.config, settings)}-token budget; sample "
            f"more (num_samples, num_prompts), raise max_new_tokens or use a stronger teacher")
    write_sft_jsonl(data_path, records)
    return stats, False


def same_model_runtime(rt: Runtime, other: Runtime) -> Runtime:
    """`rt` (its config, task and eval settings) running `other`'s model and sampler, or
    `rt` itself when the models are equal (so its compiled sampler is reused)."""
    if other.model_cfg == rt.model_cfg:
        return rt
    return dataclasses.replace(rt, model_cfg=other.model_cfg, model=other.model,
                               sampler=other.sampler)


def summarize(report: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{set name: {"accuracy": pass@1 mean, "mean_length": tokens}} of an
    `eval_runner.evaluate` report."""
    return {name: {"accuracy": float(s["pass@1"]["mean"]),
                   "mean_length": float(s["mean_length"]["mean"])}
            for name, s in report["sets"].items()}


def run_distill(rt: Runtime, teacher_params, workdir: str, settings: DistillSettings, *,
                teacher_checkpoint: str = "") -> dict[str, Any]:
    """`jaxrl-reason distill`: sample -> filter -> SFT a student -> evaluate both.

    Every part resumes: `<workdir>/distill.jsonl` present -> no sampling; a finished
    student checkpoint (`<workdir>/checkpoints/sft`) -> no training; evaluations already in
    `<workdir>/distill.json` -> not redone. The teacher and the student are evaluated on
    the held-out sets of `rt.config` (as `jaxrl-reason eval` does).
    Returns the report written to `<workdir>/distill.json`: "distill" (DistillStats and
    "kept_fraction" = kept / samples), "reports" {"teacher", "student"} (evaluation
    reports), "summary" (accuracy and mean length per set), "table" (markdown), "settings",
    "student_lora" (True when the student trained LoRA adapters, see `student_lora`).
    """
    # evaluation sits above distillation's pieces
    from jaxrl_reason.evaluation import runner as eval_runner
    report_path = paths.join(workdir, "distill.json")
    target = paths.as_path(report_path)
    earlier = json.loads(target.read_text()) if target.is_file() else {}
    reports = distributed.broadcast_from_primary(earlier.get("reports", {}))
    report: dict[str, Any] = {"teacher_checkpoint": teacher_checkpoint,
                              "settings": dataclasses.asdict(settings), "reports": reports}

    def save():
        if distributed.is_primary():
            paths.write_text_atomic(report_path, json.dumps(report, indent=1, default=float))

    progress = rt.config.log.progress_bar
    if "teacher" not in reports:  # before the student: a student_init=teacher run donates
        reports["teacher"] = eval_runner.evaluate(rt, teacher_params, label="/teacher",
                                                  progress=progress)
        save()
    data_path = paths.join(workdir, "distill.jsonl")
    stats, reused = sample_distill_data(rt, teacher_params, data_path, settings)
    report["distill"] = {**stats.to_dict(), "reused": reused,
                         "kept_fraction": stats.kept / max(stats.samples, 1)}
    save()
    params, student_rt = train_student(rt.config, data_path, workdir, tokenizer=rt.tokenizer,
                                       teacher_params=teacher_params,
                                       teacher_model=rt.model_cfg, settings=settings,
                                       teacher_checkpoint=teacher_checkpoint)
    report["student_model"] = dataclasses.asdict(student_rt.model_cfg)
    report["student_lora"] = lora_lib.has_adapters(params)
    if "student" not in reports:
        reports["student"] = eval_runner.evaluate(same_model_runtime(rt, student_rt), params,
                                                  label="/student", progress=progress)
    report["summary"] = {"kept_fraction": report["distill"]["kept_fraction"],
                         **{name: summarize(r) for name, r in reports.items()}}
    report["table"] = eval_runner.comparison_table(reports, rt.config.eval.num_samples)
    save()
    return report
