"""The student of rejection-sampling distillation (`recipes/distill.py`): its run config,
whether it trains LoRA adapters, and its SFT (our cold-start SFT, `sft.run_sft`).

  student_config   the teacher's config turned into the student's SFT run on a JSONL file
  distill_student  SFT a student on a distilled data set; (params, runtime)
  student_lora     whether the student trains LoRA adapters (and why not, when not)
  train_student    `distill_student` for a `distill.DistillSettings`, resumable; with
                   settings.student_packing its SFT runs on padding-free packs
  budget           the teacher's token budget
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Mapping

import jax
import ml_collections

from jaxrl_reason.config.validation import check_config
from jaxrl_reason.models.config import ModelConfig, get_preset
from jaxrl_reason.recipes.sft import run_sft
from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime.build import Runtime, build_runtime
from jaxrl_reason.runtime.metrics import MetricsWriter

if TYPE_CHECKING:
    from jaxrl_reason.recipes.distill import DistillSettings

_log = logging.getLogger(__name__)


def student_config(config: ml_collections.ConfigDict, data_path: str, *,
                   model: ModelConfig | Mapping[str, Any] | None = None,
                   sft: Mapping[str, Any] | None = None, num_examples: int | None = None,
                   lora: bool | None = None) -> ml_collections.ConfigDict:
    """The run config that SFTs a student on a distilled JSONL file.

    A copy of `config` (the teacher's) with a "file" task reading `data_path` as written
    (generic fields, ids from "id", no template, no length targets, no eval files), the
    student's `model` (a ModelConfig, whose vocab_size is replaced by 0 = the tokenizer's
    size, or a mapping of the config's `model` fields; None: the teacher's), `sft`
    overrides (e.g. {"steps": 100, "batch_size": 16}; unknown keys are a ValueError) and
    `sft.num_examples` = `num_examples` (default: every record, counted in the file) and
    `sft.lora` = `lora` when not None (with `model.lora`: SFT trains only the adapters).
    Returns a locked ConfigDict.
    """
    c = config.copy_and_resolve_references()
    with c.unlocked():
        c.name = f"{config.get('name', 'run')}_student"
        t = c.task
        t.name, t.train_file, t.format = "file", os.fspath(data_path), "jsonl"
        t.preset, t.prompt_field, t.answer_field, t.id_field = "generic", "", "", "id"
        t.on_error, t.template, t.length_targets = "raise", "", (0, 0)
        t.train_levels, t.eval_levels = (), ()
        t.eval_files = ml_collections.ConfigDict()
        if model is not None:
            fields = dataclasses.asdict(model) if isinstance(model, ModelConfig) else dict(model)
            if isinstance(model, ModelConfig):
                fields["vocab_size"] = 0  # the tokenizer's size (presets carry a placeholder)
            c.model = ml_collections.ConfigDict(fields)
        for key, value in dict(sft or {}).items():
            if key not in c.sft:
                raise ValueError(f"student sft override {key!r} is not an sft field "
                                 f"(fields: {sorted(c.sft.keys())})")
            c.sft[key] = value
        if num_examples is None:
            with open(data_path, "rb") as f:
                num_examples = sum(1 for line in f if line.strip())
        c.sft.num_examples = max(int(num_examples), 1)
        if lora is not None:
            c.sft.lora = bool(lora)
    c.lock()
    return c


def distill_student(config: ml_collections.ConfigDict, data_path: str, workdir: str, *,
                    tokenizer, model: ModelConfig | Mapping[str, Any] | None = None,
                    sft: Mapping[str, Any] | None = None, init_params: Any = None,
                    writer: MetricsWriter | None = None, resume: bool = True,
                    lora: bool | None = None,
                    base_checkpoint: str | None = None) -> tuple[Any, Runtime]:
    """SFTs a student on a distilled data set with our cold-start SFT (`sft.run_sft`).

    Args:
      config: the teacher's run config (mesh, rules, buckets, checkpoint and log settings).
      data_path: a `write_sft_jsonl` file.
      workdir: the student's run directory (checkpoints under `checkpoints/sft`, loadable
        with `run_state.load_params`; metrics.jsonl).
      tokenizer: the teacher's tokenizer (the records are the teacher's texts; the student
        shares its vocabulary).
      model, sft: the student's model and SFT overrides (see `student_config`).
      init_params: the student's starting params (None: random init from config.seed).
      writer: metrics writer (default: `<workdir>/metrics.jsonl`, no tensorboard).
      resume: continue from the newest complete SFT checkpoint in `workdir`.
      lora: the student's `sft.lora` (None: the config's): with `model.lora`, only adapters
        train and the checkpoints hold them and a fingerprinted reference to the base.
      base_checkpoint: the checkpoint `init_params` came from, named as that base.
    Returns:
      (params, runtime) of the student.
    Raises:
      ConfigError (a ValueError) listing config problems; ValueError when the file has no
      usable record.
    """
    c = student_config(config, data_path, model=model, sft=sft, lora=lora)
    check_config(c, jax.device_count())
    rt = build_runtime(c, workdir, tokenizer=tokenizer)
    own_writer = writer is None
    if own_writer:
        writer = MetricsWriter(workdir, tensorboard=False, console=False,
                               enabled=distributed.is_primary())
    try:
        params = run_sft(rt, writer, params=init_params, resume=resume,
                         base_checkpoint=base_checkpoint)
    finally:
        if own_writer:
            writer.close()
    return params, rt


def budget(config: ml_collections.ConfigDict, settings: DistillSettings) -> int:
    """The teacher's token budget: settings.max_new_tokens, else config.rl.max_new_tokens."""
    return settings.max_new_tokens or int(config.rl.max_new_tokens)


def student_lora(teacher_model: ModelConfig, settings: DistillSettings,
                 sft_lora: bool) -> tuple[bool, str]:
    """(whether the student trains LoRA adapters, why it does not although the teacher's
    model has `model.lora`: a message, "" otherwise).

    With student_init "teacher" the student is the teacher's frozen base plus adapters (the
    teacher's, or fresh ones). A new student (student_init "random" or a student_preset) is
    trained fully: adapters on a random base learn nothing useful; `sft.lora` still asks
    for adapters on the random base of the teacher's model, as in SFT.
    """
    if teacher_model.lora is None:
        return False, ""
    if settings.student_preset:
        return False, (f"distill: model.lora is set, but distill.student_preset="
                       f"{settings.student_preset!r} makes a new model without adapters: the "
                       f"student is trained fully (every parameter); use student_init=teacher "
                       f"to train adapters on the teacher's frozen base")
    if settings.student_init == "teacher" or sft_lora:
        return True, ""
    return False, ("distill: model.lora is set, but student_init=random makes a new student "
                   "and adapters on a random base learn nothing useful: the student is "
                   "trained fully (every parameter); use student_init=teacher to train "
                   "adapters on the teacher's frozen base")


def train_student(config: ml_collections.ConfigDict, data_path: str, workdir: str, *,
                  tokenizer, teacher_params, teacher_model: ModelConfig,
                  settings: DistillSettings, writer: MetricsWriter | None = None,
                  teacher_checkpoint: str = "") -> tuple[Any, Runtime]:
    """SFTs the student of `settings` on `data_path` in `workdir` (`distill_student`),
    resuming from its checkpoints: a finished student is loaded, not retrained.

    With student_init "teacher" the teacher's params become the student's starting point
    (and are donated to its first update). With `model.lora` that student trains only
    adapters (`student_lora`; a fully trained one is announced as a warning) and its
    checkpoints name `teacher_checkpoint` (the directory `teacher_params` were loaded from)
    as their frozen base. The student's completion budget covers the teacher's (`budget` +
    16 tokens for re-tokenization). With `settings.student_packing` its SFT runs on packs
    (`sft.packing`, `sft.pack_tokens` raised to hold its longest row). Returns (params,
    runtime).
    Raises ValueError when a LoRA student of the teacher has no `teacher_checkpoint`.
    """
    lora, note = student_lora(teacher_model, settings, bool(config.sft.get("lora", False)))
    if note and distributed.is_primary():
        _log.warning(note)
    from_teacher = settings.student_init == "teacher"
    if lora and from_teacher and not teacher_checkpoint:
        raise ValueError("distill: a LoRA student of the teacher (model.lora, student_init="
                         "teacher) needs the teacher's checkpoint directory, which its "
                         "checkpoints name as their frozen base; pass teacher_checkpoint")
    model = get_preset(settings.student_preset) if settings.student_preset else teacher_model
    sft: dict[str, Any] = {"max_completion_length": max(int(config.sft.max_completion_length),
                                                        budget(config, settings) + 16)}
    if settings.student_steps:
        sft["steps"] = settings.student_steps
        sft["warmup_steps"] = min(int(config.sft.warmup_steps), settings.student_steps // 10)
    if settings.student_learning_rate:
        sft["learning_rate"] = settings.student_learning_rate
    if settings.student_packing:  # packs that hold the student's longest row
        longest = max(config.task.prompt_buckets) + sft["max_completion_length"] - 1
        context = max(1, int(config.mesh.get("context", 1)))  # packs split over it
        tokens = -(-max(int(config.sft.pack_tokens), longest) // context) * context
        sft.update(packing=True, pack_tokens=tokens)
    init = teacher_params if from_teacher else None
    return distill_student(config, data_path, workdir, tokenizer=tokenizer, model=model,
                           sft=sft, init_params=init, writer=writer, resume=True, lora=lora,
                           base_checkpoint=teacher_checkpoint if from_teacher else None)
