"""Multi-stage pipelines: sft -> rl -> distill -> rl, each stage starting from the previous
stage's checkpoint, resumable at any stage.

    jaxrl-reason pipeline --config configs/r1_pipeline.py [--workdir DIR] [--until STAGE]

The config's `pipeline` block names the stages:

    pipeline.stages            ("sft", "rl", "distill", "rl_final"): stage names, run in order
    pipeline.stage.<name>.kind       "sft" | "rl" | "distill"
    pipeline.stage.<name>.overrides  config keys this stage changes, as a nested block
                                     ({"rl": {"steps": 50}}); every key must exist
    pipeline.init_checkpoint   "" or a checkpoint the first stage starts from (needed when the
                               first stage is not a cold-start sft)

What a stage does with the incoming params (None only for a first sft stage):
    sft      `sft.run_sft` on the stage config's task (from the incoming params, or a fresh
             init when it is the first stage)
    rl       `RLTrainer.run` from the incoming params (also the KL reference when beta > 0)
    distill  the incoming params are the teacher: `distill.sample_distill_data` writes its
             verified completions, `distill.train_student` SFTs the student (`distill.*`
             settings: a fresh or teacher-initialized, same or smaller model), whose params
             go on; later stages then train the student's model

Workdir layout:
    tokenizer.model, config.json    shared by every stage (one vocabulary for the lineage)
    stages/<name>/                  a stage's run directory: checkpoints/{sft,rl},
                                    metrics.jsonl, config.json, distill.jsonl, ...
    pipeline_state.json             finished stages (written atomically after each stage):
                                    kind, checkpoint, evaluation, wall time, stage info
    pipeline_table.json / .md       held-out accuracy and mean length after every stage

Resuming: rerunning the command with the same workdir skips every stage recorded in
pipeline_state.json; the first unfinished one loads the previous stage's checkpoint and
continues from its own newest checkpoint (the phases' `--resume` machinery), so a run killed
anywhere loses at most one checkpoint period. A stage counts as finished only once it is
evaluated, so an interruption during an evaluation redoes just that evaluation.

Every stage is evaluated with the base config's `eval` block on the same held-out sets, so
the table's rows compare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import ml_collections

from jaxrl_reason.recipes import distill
from jaxrl_reason.runtime import distributed
from jaxrl_reason.evaluation import runner as eval_runner
from jaxrl_reason.evaluation import pass_at_k as evaluation
from jaxrl_reason.runtime import paths
from jaxrl_reason.runtime import reliability
from jaxrl_reason.checkpoints import workdir_lock
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.models import lora as lora_lib
from jaxrl_reason.models.params import to_layout
from jaxrl_reason.runtime.reliability import Preempted, stop_requested
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.checkpoints.phases import load_params, resolve_checkpoint_dir
from jaxrl_reason.runtime.build import Runtime, build_runtime
from jaxrl_reason.recipes.sft import run_sft
from jaxrl_reason.tokenizers import tokenizer_from_serialized
from jaxrl_reason.config.validation import ConfigError, validate_config

STAGE_KINDS = ("sft", "rl", "distill")
STATE_FILE = "pipeline_state.json"
TABLE_FILE = "pipeline_table"  # .json and .md
# Config keys a stage may not override: the lineage's model comes from the checkpoints
# (a distill stage changes it), and the pipeline block describes every stage.
FIXED_KEYS = ("model", "pipeline", "name", "tokenizer", "hf_model")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One planned stage: its position, name, kind, effective config and run directory."""
    index: int
    name: str
    kind: str
    config: ml_collections.ConfigDict
    workdir: str

    def steps(self) -> int:
        """Optimizer steps this stage takes (RL steps, SFT steps, or the student's)."""
        if self.kind == "rl":
            return int(self.config.rl.steps)
        if self.kind == "distill":
            return int(distill.settings_from(self.config).student_steps
                       or self.config.sft.steps)
        return int(self.config.sft.steps)


# ----------------------------------------------------------------------------- planning


def merge_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                    where: str) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A copy of `config` with the nested `overrides` applied, and the problems found
    (unknown keys and fixed keys, each named as `<where>.<dotted key>`). Pure."""
    c = config.copy_and_resolve_references()
    problems: list[str] = []

    def apply(node, values, prefix):
        for key, value in values.items():
            dotted = f"{prefix}.{key}" if prefix else key
            if not prefix and key in FIXED_KEYS:
                problems.append(f"{where}.{dotted}: a stage cannot override {key!r}"
                                + (" (the model comes from the previous stage's checkpoint; "
                                   "a distill stage's distill.student_preset changes it)"
                                   if key == "model" else ""))
            elif key not in node:
                problems.append(f"{where}.{dotted}: no such config key")
            elif isinstance(node[key], ml_collections.ConfigDict) and isinstance(
                    value, (dict, ml_collections.ConfigDict)):
                apply(node[key], value, dotted)
            else:
                try:
                    node[key] = value.to_dict() if isinstance(
                        value, ml_collections.ConfigDict) else value
                except (TypeError, ValueError) as e:
                    problems.append(f"{where}.{dotted}: {e}")

    with c.unlocked():
        apply(c, _as_dict(overrides), "")
    return c, problems


def _as_dict(block) -> dict:
    if block is None:
        return {}
    return block.to_dict() if isinstance(block, ml_collections.ConfigDict) else dict(block)


def plan_stages(config: ml_collections.ConfigDict, workdir: str,
                num_devices: int) -> list[Stage]:
    """The stages of `config.pipeline`, each with its effective (validated, locked) config.

    Raises ConfigError listing every problem: a missing or empty pipeline block, unknown
    stage names or kinds, bad overrides, a first stage that needs `pipeline.init_checkpoint`,
    any stage config that `validation.validate_config` rejects, bad distill settings.
    """
    block = config.get("pipeline")
    if block is None:
        raise ConfigError(["pipeline: the config has no pipeline block (see "
                           "configs/r1_pipeline.py)"])
    names = block.get("stages", ())
    defined = block.get("stage") or ml_collections.ConfigDict()
    problems: list[str] = []
    if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
        return _raise([f"pipeline.stages: must be a non-empty list of stage names, got "
                       f"{names!r}"])
    if len(set(names)) != len(names):
        problems.append(f"pipeline.stages: names repeat in {list(names)}")
    stages = []
    for index, name in enumerate(names):
        where = f"pipeline.stage.{name}"
        if name not in defined:
            problems.append(f"pipeline.stages: {name!r} has no pipeline.stage.{name} block "
                            f"(defined: {sorted(defined.keys())})")
            continue
        spec = defined[name]
        kind = spec.get("kind")
        if kind not in STAGE_KINDS:
            problems.append(f"{where}.kind: must be one of {list(STAGE_KINDS)}, got {kind!r}")
            continue
        stage_config, found = merge_overrides(config, spec.get("overrides") or {},
                                              f"{where}.overrides")
        problems += found
        problems += [f"{where}: {p}" for p in validate_config(stage_config, num_devices)]
        if kind == "distill":
            try:
                distill.settings_from(stage_config)
            except ValueError as e:
                problems.append(f"{where}: {e}")
        stage_config.lock()
        stages.append(Stage(index=index, name=name, kind=kind, config=stage_config,
                            workdir=paths.join(workdir, "stages", name)))
    init = block.get("init_checkpoint", "")
    if stages and stages[0].kind != "sft" and not init:
        problems.append(f"pipeline.init_checkpoint: the first stage {stages[0].name!r} is "
                        f"{stages[0].kind!r}, which needs a checkpoint to start from")
    if init and not paths.as_path(init).is_dir():
        problems.append(f"pipeline.init_checkpoint: {init!r} does not exist")
    if problems:
        _raise(problems)
    return stages


def _raise(problems: list[str]):
    raise ConfigError(problems)


def fingerprint(config: ml_collections.ConfigDict) -> str:
    """A short hash of a stage config (to notice a finished stage whose config changed)."""
    return hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- state


def read_state(workdir: str) -> dict[str, Any]:
    """pipeline_state.json of `workdir` ({"stages": {name: entry}}), or an empty state."""
    target = paths.as_path(workdir, STATE_FILE)
    if not target.is_file():
        return {"stages": {}}
    try:
        state = json.loads(target.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{target}: not valid JSON ({e}); move it away to rerun every "
                         f"stage") from None
    if not isinstance(state, dict) or not isinstance(state.get("stages"), dict):
        raise ValueError(f"{target}: expected an object with a 'stages' object")
    return state


def write_state(workdir: str, state: Mapping[str, Any]) -> None:
    """Writes pipeline_state.json atomically (process 0)."""
    if distributed.is_primary():
        paths.write_text_atomic(paths.join(workdir, STATE_FILE),
                                json.dumps(state, indent=1, default=float))


def stage_table(stages: Sequence[Stage], state: Mapping[str, Any],
                num_samples: int) -> tuple[dict[str, Any], str]:
    """The per-stage results of the finished `stages`: (JSON object, markdown).

    JSON: {"stages": [{"index", "name", "kind", "steps", "seconds", "info", "sets":
    {set name: {"accuracy": {"mean", "ci95"}, "mean_length": {"mean", "ci95"}}}}]}.
    Markdown: one row per stage and eval set (`eval_runner.report_metrics` columns), then a
    row per stage with its steps, wall time and notes (a distill stage's kept fraction).
    """
    rows, summaries, notes = [], {}, []
    for stage in stages:
        entry = state["stages"].get(stage.name)
        if entry is None:
            continue
        sets = {}
        for set_name, summary in entry["eval"]["sets"].items():
            summaries[f"{stage.index + 1}. {stage.name} ({stage.kind}): {set_name}"] = summary
            sets[set_name] = {"accuracy": _mean_ci(summary["pass@1"]),
                              "mean_length": _mean_ci(summary["mean_length"])}
        info = entry.get("info", {})
        rows.append({"index": stage.index + 1, "name": stage.name, "kind": stage.kind,
                     "steps": entry.get("steps"), "seconds": entry.get("seconds"),
                     "info": info, "sets": sets})
        note = ""
        if "kept_fraction" in info:
            note = (f"kept {info['kept']} of {info['samples']} samples "
                    f"({100 * info['kept_fraction']:.1f}%), mean kept length "
                    f"{info['mean_length_kept']:.1f}")
        notes.append(f"| {stage.index + 1}. {stage.name} | {stage.kind} | {entry.get('steps')} "
                     f"| {entry.get('seconds', 0):.0f} | {note} |")
    if not rows:
        return {"stages": []}, ""
    table = evaluation.format_table(summaries, eval_runner.report_metrics(num_samples))
    timing = "\n".join(["| stage | kind | steps | wall (s) | notes |", "|---|---|---|---|---|",
                        *notes])
    return {"stages": rows}, f"{table}\n\n{timing}"


def _mean_ci(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """{"mean", "ci95"} of a seed summary; ci95 None when undefined (one seed)."""
    ci = summary.get("ci95")
    return {"mean": float(summary["mean"]),
            "ci95": float(ci) if ci is not None and math.isfinite(ci) else None}


# ----------------------------------------------------------------------------- stages


def stage_runtime(base: Runtime, stage: Stage, model_cfg) -> Runtime:
    """The runtime of `stage` for params of `model_cfg`: the base runtime's mesh, tokenizer
    and (when the model is the base's) its compiled sampler, with the stage's config and
    run directory; a new runtime on the same tokenizer when the model or the mesh differs."""
    config = stage.config
    if model_cfg is not None and model_cfg != base.model_cfg:
        config = config.copy_and_resolve_references()
        with config.unlocked():
            config.model = ml_collections.ConfigDict(dataclasses.asdict(model_cfg))
        config.lock()
    same_mesh = (config.mesh.to_dict() == base.config.mesh.to_dict()
                 and tuple(map(tuple, config.sharding_rules))
                 == tuple(map(tuple, base.config.sharding_rules)))
    if (model_cfg is None or model_cfg == base.model_cfg) and same_mesh:
        return dataclasses.replace(base, config=config, workdir=stage.workdir)
    return build_runtime(config, stage.workdir, tokenizer=base.tokenizer)


def run_stage(stage: Stage, rt: Runtime, params, writer: MetricsWriter,
              source: str | None = None):
    """Runs (or resumes) one stage from the incoming `params` (None: a fresh sft init).

    `source`: the checkpoint directory `params` are the output of (the previous stage's, or
    the pipeline's init_checkpoint); a LoRA stage's checkpoints name it as their frozen base.
    Returns (params, runtime, info): the stage's output params, the runtime that holds its
    model, and a dict of stage facts for the table (a distill stage's DistillStats and
    kept fraction). Raises Preempted when a stop signal arrived (a checkpoint was saved).
    """
    if stage.kind == "sft":
        return run_sft(rt, writer, params=params, resume=True, base_checkpoint=source), rt, {}
    if stage.kind == "rl":
        trainer = RLTrainer(rt, writer, init_params=params, base_checkpoint=source)
        return trainer.run(resume=True), rt, {}
    settings = distill.settings_from(stage.config)
    stats, reused = distill.sample_distill_data(
        rt, params, paths.join(stage.workdir, "distill.jsonl"), settings)
    if stop_requested():
        raise Preempted(stage.name, 0)
    student, student_rt = distill.train_student(
        stage.config, paths.join(stage.workdir, "distill.jsonl"), stage.workdir,
        tokenizer=rt.tokenizer, teacher_params=params, teacher_model=rt.model_cfg,
        settings=settings, writer=writer, teacher_checkpoint=source or "")
    info = {**stats.to_dict(), "kept_fraction": stats.kept / max(stats.samples, 1),
            "reused_data": reused, "student_model": dataclasses.asdict(student_rt.model_cfg),
            "student_lora": lora_lib.has_adapters(student)}
    return student, student_rt, info


def _load_stage_params(directory: str, rt: Runtime):
    """(params, ModelConfig) of a finished stage's checkpoint, laid out for `rt`."""
    params, model_cfg, tokenizer, _ = load_params(directory, rt.mesh, rt.rules)
    if tokenizer.serialized != rt.tokenizer.serialized:
        raise ValueError(f"{directory}: its tokenizer is not this pipeline's (a workdir "
                         f"reused by another config?)")
    return params, model_cfg


def checkpoint_runtime(config: ml_collections.ConfigDict, workdir: str, checkpoint: str):
    """(runtime, params, ModelConfig) to continue from `checkpoint` (a run workdir or phase
    directory) under `config`: the checkpoint's tokenizer, model and params (converted to
    the config's layer layout), on the config's mesh; with an empty `checkpoint`, the
    config's own runtime (its tokenizer trained or reused in `workdir`) and (None, None)."""
    if not checkpoint:
        return build_runtime(config, workdir), None, None
    with Checkpointer(resolve_checkpoint_dir(checkpoint)) as ckpt:
        meta = ckpt.metadata()
    rt = build_runtime(config, workdir, tokenizer=tokenizer_from_serialized(meta["tokenizer"]))
    params, model_cfg, _, _ = load_params(checkpoint, rt.mesh, rt.rules)
    model_cfg = model_cfg.replace(scan_layers=rt.model_cfg.scan_layers)
    return rt, to_layout(model_cfg, params), model_cfg


def run_pipeline(config: ml_collections.ConfigDict, workdir: str, *, until: str | None = None,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the stages of `config.pipeline` in `workdir`, skipping finished ones.

    Args:
      config: a run config with a `pipeline` block (validated here, every stage at once).
      workdir: the pipeline's directory (local or gs://...).
      until: stop after this stage (its name); None: run every stage.
      log: where progress lines go (process 0 prints them).
    Returns:
      {"stages": [...]} as written to pipeline_table.json (see `stage_table`), plus
      "table" (the markdown).
    Raises:
      ConfigError for a bad pipeline; Preempted when a stop signal arrived (checkpoints are
      saved; rerun to continue); ValueError for an unreadable state file.
    """
    stages = plan_stages(config, workdir, jax.device_count())
    names = [s.name for s in stages]
    if until is not None and until not in names:
        raise ValueError(f"--until {until!r} is not a stage of this pipeline ({names})")
    paths.as_path(workdir).mkdir(parents=True, exist_ok=True)
    workdir_lock.acquire(workdir)  # one run per workdir: fails naming the holder
    reliability.check_workdir(workdir, 0, 1)  # writable, stage checkpoints too, before work
    if distributed.is_primary():
        paths.write_text_atomic(paths.join(workdir, "config.json"),
                                config.to_json_best_effort(indent=1))
    base, params, model_cfg = checkpoint_runtime(config, workdir,
                                                 config.pipeline.get("init_checkpoint", ""))
    state = distributed.broadcast_from_primary(read_state(workdir))
    sets = eval_runner.eval_sets(config)
    done = [s for s in stages if s.name in state["stages"]]
    last = max((s.index for s in done), default=-1)
    if [s.index for s in done] != list(range(last + 1)):
        raise ValueError(f"{paths.join(workdir, STATE_FILE)} records stages "
                         f"{[s.name for s in done]}, not a prefix of {names}: the stage list "
                         f"changed; use a new --workdir")
    for stage in stages:
        entry = state["stages"].get(stage.name)
        if entry is not None:
            if entry.get("fingerprint") != fingerprint(stage.config):
                log(f"[pipeline] warning: stage {stage.name!r} finished with another config "
                    f"than the current one; it is kept (use a new --workdir to redo it)")
            log(f"[pipeline] {stage.index + 1}/{len(stages)} {stage.name} ({stage.kind}): "
                f"finished earlier, skipped")
            params = None  # loaded from its checkpoint when a later stage needs it
            if stage.name == until:
                break
            continue
        if params is None and stage.index > 0:  # resuming: the previous stage's output
            previous = state["stages"][stages[stage.index - 1].name]["checkpoint"]
            params, model_cfg = _load_stage_params(previous, base)
        rt = stage_runtime(base, stage, model_cfg)
        log(f"[pipeline] {stage.index + 1}/{len(stages)} {stage.name} ({stage.kind}): "
            f"{stage.steps()} steps, model {rt.model_cfg.num_params:,} params, "
            f"workdir {stage.workdir}")
        t0 = time.time()
        writer = MetricsWriter.from_config(stage.workdir, stage.config,
                                           enabled=distributed.is_primary())
        try:
            if distributed.is_primary():
                paths.write_text_atomic(paths.join(stage.workdir, "config.json"),
                                        stage.config.to_json_best_effort(indent=1))
            source = (stages[stage.index - 1].workdir if stage.index > 0
                      else config.pipeline.get("init_checkpoint", "")) or None
            params, rt, info = run_stage(stage, rt, params, writer, source)
        finally:
            writer.close()
        model_cfg = rt.model_cfg
        report = eval_runner.evaluate(distill.same_model_runtime(base, rt), params, sets,
                                      eval_cfg=config.eval, label=f"/{stage.name}",
                                      progress=config.log.progress_bar)
        state["stages"][stage.name] = {
            "index": stage.index, "kind": stage.kind, "checkpoint": stage.workdir,
            "steps": stage.steps(), "seconds": time.time() - t0, "info": info,
            "fingerprint": fingerprint(stage.config), "eval": report}
        write_state(workdir, state)
        table_json, table_md = stage_table(stages, state, config.eval.num_samples)
        _write_table(workdir, table_json, table_md)
        summary = ", ".join(f"{name}: pass@1 {100 * s['pass@1']['mean']:.1f}%, length "
                            f"{s['mean_length']['mean']:.1f}"
                            for name, s in report["sets"].items())
        log(f"[pipeline] {stage.name} done in {time.time() - t0:.0f} s; {summary}")
        if stage.name == until:
            break
        if stop_requested():
            raise Preempted(f"pipeline after {stage.name}", 0)
    table_json, table_md = stage_table(stages, state, config.eval.num_samples)
    _write_table(workdir, table_json, table_md)
    return {**table_json, "table": table_md}


def _write_table(workdir: str, table_json: Mapping[str, Any], table_md: str) -> None:
    if distributed.is_primary() and table_json["stages"]:
        paths.write_text_atomic(paths.join(workdir, TABLE_FILE + ".json"),
                                json.dumps(table_json, indent=1, default=float))
        paths.write_text_atomic(paths.join(workdir, TABLE_FILE + ".md"), table_md + "\n")
