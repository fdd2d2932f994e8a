"""The CLI commands as functions of parsed flags: train, sft, eval, sample.

`train` runs the R1 recipe end to end: tokenizer -> cold-start SFT -> RL -> evaluation of
both checkpoints, printing a before/after table and writing `<workdir>/eval.json`.
`distill`, `reward-model` and `pipeline` are thin fronts of `jaxrl_reason.recipes.distill`,
`jaxrl_reason.recipes.reward_model` and `jaxrl_reason.recipes.r1_pipeline`.
`eval` reports every metric over several sampling seeds (mean, standard deviation, 95%
interval); `compare` tests two checkpoints against each other (`eval_runner.compare`).

Multi-host: every process runs the command (the CLI has initialized `jax.distributed`);
all of them train, evaluate and save checkpoints together, and only process 0 prints and
writes the run's files (config.json, metrics, eval.json). The workdir may be a local path
or any `etils.epath` path such as gs://bucket/run (see `paths`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import ml_collections

from jaxrl_reason.evaluation import compare as comparison
from jaxrl_reason.runtime import distributed
from jaxrl_reason.evaluation import runner as eval_runner
from jaxrl_reason.runtime import paths
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.data.tasks import task_source
from jaxrl_reason.models.params import abstract_params, to_layout
from jaxrl_reason.runtime.reliability import (Preempted, check_prompt_lengths, check_workdir,
                                      stop_requested, tree_bytes)
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.checkpoints.phases import load_params, phase_dir, resolve_checkpoint_dir
from jaxrl_reason.runtime.build import build_runtime, with_tools
from jaxrl_reason.sampling.sampler import Sampler, left_pad
from jaxrl_reason.sampling.tool_loop import ToolSampler
from jaxrl_reason.recipes.sft import run_sft
from jaxrl_reason.config.validation import check_config
from jaxrl_reason.recipes import distill as distillation
from jaxrl_reason.recipes import r1_pipeline as pipelines
from jaxrl_reason.recipes import reward_model as rm
from jaxrl_reason.checkpoints import workdir_lock
from jaxrl_reason.data import preferences


def _workdir(fv, config, suffix: str = "") -> str:
    """--workdir, or `runs/<config.name><suffix>` under the current directory (absolute)."""
    return fv.workdir or paths.absolute(os.path.join("runs", config.name + suffix))


def _prepare(fv):
    """Validated config, workdir, runtime and metrics writer of a train/sft command."""
    config = fv.config
    check_config(config, jax.device_count())
    workdir = _workdir(fv, config)
    workdir_lock.acquire(workdir)  # one run per workdir: fails naming the holder
    if not fv.resume and paths.as_path(workdir, "checkpoints").is_dir():
        raise ValueError(f"workdir {workdir!r} already holds checkpoints: pass --resume to "
                         f"continue that run or --workdir to start a new one")
    paths.as_path(workdir).mkdir(parents=True, exist_ok=True)
    rt = build_runtime(config, workdir)
    _check_before_compiling(rt, workdir)
    writer = MetricsWriter.from_config(workdir, config, enabled=distributed.is_primary())
    if distributed.is_primary():
        paths.write_text_atomic(paths.join(workdir, "config.json"),
                                config.to_json_best_effort(indent=1))
    return config, workdir, rt, writer


def _check_before_compiling(rt, workdir: str) -> None:
    """Disk room and writability of the workdir, and prompt lengths vs the buckets, before
    any compilation (hours of training must not end in a full disk or a too-long prompt)."""
    config = rt.config
    params_bytes = tree_bytes(abstract_params(rt.model_cfg))
    copies = 3 + (config.rl.beta > 0) + 3 * (config.rl.advantage_estimator == "gae")
    check_workdir(workdir, copies * params_bytes, config.checkpoint.max_to_keep)
    sets = {"training data": task_source(config, "train", config.task.train_levels, 512,
                                         seed=config.seed)}
    sets.update(eval_runner.eval_sets(config))
    check_prompt_lengths(rt.encode_prompt, sets, config.task.prompt_buckets)


def _say(text: str) -> None:
    if distributed.is_primary():
        print(text, flush=True)


def _write_report(path: str, report: dict) -> None:
    """The JSON report at `path` (local or gs://...), written atomically by process 0."""
    if distributed.is_primary():
        paths.write_text_atomic(path, json.dumps(report, indent=1, default=float))


def _read_reports(path: str) -> dict:
    """The "reports" of an earlier eval.json, or {} when there is none."""
    target = paths.as_path(path)
    return json.loads(target.read_text()).get("reports", {}) if target.is_file() else {}


def sft(fv) -> int:
    config, workdir, rt, writer = _prepare(fv)
    _say(f"[sft] {rt.model_cfg.num_params:,} params, mesh {dict(rt.mesh.shape)}, "
         f"workdir {workdir}")
    run_sft(rt, writer, resume=fv.resume)
    writer.close()
    _say(f"[sft] done: {phase_dir(workdir, 'sft')}")
    return 0


def train(fv) -> int:
    if fv.init_checkpoint:
        resolve_checkpoint_dir(fv.init_checkpoint)  # fail before the workdir is created
    config, workdir, rt, writer = _prepare(fv)
    _say(f"[train] {config.name}: {rt.model_cfg.num_params:,} params, tokenizer "
         f"{rt.tokenizer.vocab_size} pieces, mesh {dict(rt.mesh.shape)}, workdir {workdir}"
         + (f", {jax.process_count()} processes" if jax.process_count() > 1 else ""))
    t_start = time.time()
    timings = {}

    # 1. Cold start (or a given checkpoint).
    t0 = time.time()
    if fv.init_checkpoint:
        params, model_cfg, _, _ = load_params(fv.init_checkpoint, rt.mesh, rt.rules)
        # The layer layout and the attention kernel are knobs of this run, not of the
        # checkpoint: convert the layout. A run with LoRA may start from a checkpoint without
        # adapters (its SFT model): the trainer attaches fresh adapters to that base.
        params = to_layout(rt.model_cfg, params)
        model_cfg = model_cfg.replace(scan_layers=rt.model_cfg.scan_layers,
                                      attention_impl=rt.model_cfg.attention_impl)
        if model_cfg.lora is None:
            model_cfg = model_cfg.replace(lora=rt.model_cfg.lora)
        if model_cfg != rt.model_cfg:
            raise ValueError(f"--init_checkpoint {fv.init_checkpoint!r} holds a model "
                             f"{model_cfg} that differs from the config's {rt.model_cfg}")
        start_name = "init"
    elif config.get("hf_model"):  # R1-Zero style: RL straight from the given model
        from jaxrl_reason.models import hf
        _, params = hf.load_hf_checkpoint(config.hf_model, rt.mesh, rt.rules,
                                          dtype=rt.model_cfg.param_dtype,
                                          compute_dtype=rt.model_cfg.dtype,
                                          scan_layers=rt.model_cfg.scan_layers)
        start_name = "base"
    else:
        params = run_sft(rt, writer, resume=fv.resume)
        start_name = "sft"
    timings["sft_s"] = time.time() - t0
    if stop_requested():
        raise Preempted("sft", config.sft.steps)

    # 2. Evaluate the starting point, 3. RL, 4. evaluate the result.
    reports_path = paths.join(workdir, "eval.json")
    # Process 0's file decides for every process (they must evaluate the same things).
    reports = distributed.broadcast_from_primary(
        _read_reports(reports_path) if fv.resume and distributed.is_primary() else {})
    t0 = time.time()
    if start_name not in reports:
        reports[start_name] = eval_runner.evaluate(rt, params, label=f"/{start_name}",
                                                   progress=config.log.progress_bar)
        _write_report(reports_path, {"reports": reports})  # a resume does not redo it
    timings["eval_before_s"] = time.time() - t0
    if stop_requested():
        raise Preempted("evaluation", 0)

    t0 = time.time()
    trainer = RLTrainer(rt, writer, init_params=params,
                        base_checkpoint=fv.init_checkpoint or None)
    params = trainer.run(resume=fv.resume)
    timings["rl_s"] = time.time() - t0

    t0 = time.time()
    reports["rl"] = eval_runner.evaluate(rt, params, label="/rl",
                                         progress=config.log.progress_bar)
    timings["eval_after_s"] = time.time() - t0
    timings["total_s"] = time.time() - t_start
    writer.close()

    table = eval_runner.comparison_table(reports, config.eval.num_samples)
    _write_report(reports_path, {"reports": reports, "timings": timings, "table": table})
    _say(f"\n{table}\n\ntimings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    _say(f"report: {reports_path}; metrics: {paths.join(workdir, 'metrics.jsonl')}")
    return 0


def plan(fv) -> int:
    """Compiles the config's RL step for a TPU slice and prints memory, FLOPs, roofline."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # describe the TPU, run nothing on it
    from jaxrl_reason.runtime import plan as planner
    chip, devices = planner.topology_devices(fv.topology)
    check_config(fv.config, len(devices))
    if fv.kv_budget_gib is not None and not fv.kv_budget_gib > 0:
        raise ValueError(f"--kv_budget_gib={fv.kv_budget_gib}: must be > 0 (GiB per chip)")
    budget = None if fv.kv_budget_gib is None else fv.kv_budget_gib * planner.GiB
    report = planner.plan(fv.config, fv.topology, choose_context=fv.choose_context,
                          kv_budget_bytes=budget)
    _say(planner.format_report(report))
    return 0


def _eval_overrides(fv) -> dict:
    """`--seeds` / `--num_samples` / `--num_problems` of eval and compare, checked."""
    return {"seeds": eval_runner.parse_seeds(fv.seeds) if fv.seeds is not None else None,
            "num_samples": fv.num_samples, "num_problems": fv.num_problems}


def _eval_data(fv, num_problems: int | None):
    """The `--data` set ({file name: examples}, the first `num_problems`), or None."""
    return eval_runner.file_sets(fv.data, fv.data_preset, num_problems) if fv.data else None


def eval(fv) -> int:  # noqa: A001 (the command's name)
    overrides = _eval_overrides(fv)
    loaded = eval_runner.load_checkpoint(fv.checkpoint, fv.config, overrides)
    rt, params, directory = loaded.rt, loaded.params, loaded.directory
    config = rt.config
    sets = _eval_data(fv, fv.num_problems)
    report = eval_runner.evaluate(rt, params, sets, progress=config.log.progress_bar)
    table = eval_runner.comparison_table({os.path.basename(directory): report},
                                         config.eval.num_samples, show_std=True)
    out = fv.out or paths.join(directory, "eval.json")
    _write_report(out, {"checkpoint": directory, "step": loaded.step, "skipped_steps":
                        {str(k): v for k, v in loaded.skipped.items()}, "report": report,
                        "table": table})
    _say(f"{table}\n\nmean ± 95% t-interval (sd: standard deviation) over "
         f"{len(config.eval.seeds)} sampling seeds {list(config.eval.seeds)}\ncheckpoint: "
         f"{directory}, step {loaded.step}\nreport: {out}")
    return 0


def compare(fv) -> int:
    """Evaluates checkpoints A and B on the same problems and seeds; a paired bootstrap over
    problems and seeds tests B - A; pass@k for k = 1..n of both, plotted when matplotlib is
    installed."""
    overrides = _eval_overrides(fv)
    rt_a, params_a, dir_a = eval_runner.load_for_eval(fv.a, fv.config, overrides)
    rt_b, params_b, dir_b = eval_runner.load_for_eval(fv.b, fv.config, overrides,
                                                      reuse=rt_a)
    if fv.resamples < 1:
        raise ValueError(f"--resamples must be >= 1, got {fv.resamples}")
    labels = ("A", "B")
    result = eval_runner.compare(rt_a, params_a, rt_b, params_b,
                                 _eval_data(fv, fv.num_problems),
                                 num_resamples=fv.resamples, labels=labels,
                                 progress=rt_a.config.log.progress_bar)
    table = eval_runner.comparison_table(result["reports"], rt_a.config.eval.num_samples,
                                         show_std=True)
    tests = comparison.format_comparison(result["tests"], labels)
    out = fv.out or paths.join(dir_b, "compare.json")
    plot = None
    if distributed.is_primary() and not paths.is_remote(out):
        plot = eval_runner.plot_pass_at_k(result, os.path.splitext(out)[0] + "_pass_at_k.png")
    _write_report(out, {"a": dir_a, "b": dir_b, **result, "table": table, "tests_table": tests,
                        "plot": plot})
    _say(f"A = {dir_a}\nB = {dir_b}\n\n{table}\n\npaired bootstrap over problems and seeds "
         f"({fv.resamples} resamples), B - A:\n{tests}\n\npass@k, k = 1..n:\n"
         f"{eval_runner.format_pass_at_k(result)}\n\nreport: {out}\nplot: "
         f"{plot or 'skipped (matplotlib is not installed, or a remote --out)'}")
    return 0


def _sample_source(fv, mesh, rules):
    """(params, ModelConfig, tokenizer, run config or None) of `sample`: a run checkpoint
    (with the config it was trained with, when stored) or an HF directory."""
    if bool(fv.checkpoint) == bool(fv.model):
        raise ValueError("give exactly one of --checkpoint (a run) and --model (a Hugging "
                         "Face model directory)")
    if fv.checkpoint:
        if fv.chat:
            raise ValueError("--chat needs --model (a run's own tokenizer has no chat "
                             "template)")
        params, model_cfg, tokenizer, meta = load_params(fv.checkpoint, mesh, rules)
        stored = meta.get("config")
        config = ml_collections.ConfigDict(json.loads(stored)) if stored else None
        return params, model_cfg, tokenizer, config
    from jaxrl_reason.models import hf
    from jaxrl_reason.tokenizers import load_tokenizer
    tokenizer = load_tokenizer(fv.model)  # first: a bad directory fails before any weights
    model_cfg, params = hf.load_hf_checkpoint(fv.model, mesh, rules, dtype=fv.dtype)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"{fv.model}: the tokenizer has {tokenizer.vocab_size} tokens but "
                         f"the model's embedding only {model_cfg.vocab_size} rows")
    return params, model_cfg, tokenizer, None


def sample(fv) -> int:
    """Completions of one prompt; a checkpoint trained with tools (config.tools) runs them
    (the result blocks are printed in place) unless --notools."""
    mesh = shd.make_mesh({"data": -1})
    rules = shd.DEFAULT_RULES
    params, model_cfg, tokenizer, config = _sample_source(fv, mesh, rules)
    model = Transformer(model_cfg)
    sampler = Sampler(model, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=mesh,
                      rules=rules)
    if config is not None and fv.tools:
        sampler = with_tools(sampler, config, tokenizer)
    if fv.chat:
        from jaxrl_reason.tokenizers import apply_chat_template
        text = apply_chat_template(tokenizer, [{"role": "user", "content": fv.prompt}])
        ids = tokenizer.encode(text, add_bos=False)  # the template writes any bos it wants
    else:
        ids = tokenizer.encode(fv.prompt, add_bos=tokenizer.add_bos_token)
    tokens, valid = left_pad([ids], len(ids), tokenizer.pad_id)
    put = lambda x: shd.put_replicated(mesh, x)  # noqa: E731
    out = sampler(params, put(tokens), put(valid), jax.random.key(fv.seed),
                  num_samples=fv.num_samples, max_new_tokens=fv.max_new_tokens,
                  temperature=0.0 if fv.greedy else fv.temperature)
    toks, lens = distributed.to_host((out.tokens, out.lengths))
    for row, n in zip(toks, lens):
        _say(tokenizer.decode(row[:n]))
    if isinstance(sampler, ToolSampler):
        calls = distributed.to_host(out.tool_calls)  # every process takes part
        if distributed.is_primary():
            print(f"[sample] tools {', '.join(config.tools.names)}: {int(calls.sum())} "
                  f"call(s) answered", file=sys.stderr)
    return 0


def files_under(directory: str) -> dict[str, tuple[int, int]]:
    """{path relative to `directory`: (st_mtime_ns, st_ino)} of every file below it ({} when
    it does not exist): a snapshot that `written_since` compares against."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, directory)] = (st.st_mtime_ns, st.st_ino)
    return out


def written_since(directory: str, before: dict[str, tuple[int, int]]) -> list[str]:
    """Sorted relative paths of the files below `directory` that are new, modified or
    replaced since the `files_under` snapshot `before`."""
    return sorted(path for path, stamp in files_under(directory).items()
                  if before.get(path) != stamp)


def export(fv) -> int:
    """A run's checkpoint as a Hugging Face model directory (config.json, safetensors,
    tokenizer files) that transformers and other tools load; a LoRA run's as the merged
    model, its base and the adapter in PEFT's format (`models.lora_export`)."""
    from jaxrl_reason.models import hf
    from jaxrl_reason.models.lora import has_adapters
    from jaxrl_reason.tokenizers.hf import write_transformers_files
    mesh = shd.make_mesh({"data": -1})
    params, model_cfg, tokenizer, _ = load_params(fv.checkpoint, mesh, shd.DEFAULT_RULES)
    params = distributed.to_host(params)  # every process takes part in the gather
    before = files_under(fv.out)  # the message lists every file this export writes
    if model_cfg.lora is not None and not has_adapters(params):
        model_cfg = model_cfg.replace(lora=None)  # a LoRA run's full fine-tuning phase
    if distributed.is_primary() and model_cfg.lora is not None:
        # LoRA: <out>/merged and <out>/base (HF layout), <out>/adapter (PEFT's format)
        from jaxrl_reason.models.lora_export import export_lora
        export_lora(model_cfg, params, fv.out, dtype=fv.dtype,
                    max_shard_bytes=fv.max_shard_bytes)
        for sub in ("merged", "base", "adapter"):
            tokenizer.save_dir(os.path.join(fv.out, sub))
            write_transformers_files(tokenizer, os.path.join(fv.out, sub))
    elif distributed.is_primary():
        hf.export_hf_checkpoint(model_cfg, params, fv.out, dtype=fv.dtype,
                                max_shard_bytes=fv.max_shard_bytes)
        tokenizer.save_dir(fv.out)
        # A SentencePiece model also as tokenizer.json: transformers' AutoTokenizer then
        # loads it without sentencepiece, with the same ids.
        write_transformers_files(tokenizer, fv.out)
    if distributed.is_primary():
        files = written_since(fv.out, before)
        _say(f"wrote {len(files)} files to {fv.out}: " + ", ".join(files))
    return 0


def distill(fv) -> int:
    """Rejection-samples a teacher checkpoint, SFTs a student on its verified completions and
    evaluates both on the held-out sets (`distill.run_distill`). Rerunning with the same
    workdir skips the finished parts."""
    rt, params, directory = eval_runner.load_for_eval(fv.checkpoint, fv.config)
    config = rt.config
    check_config(config, jax.device_count())
    settings = distillation.settings_from(
        config, num_prompts=fv.num_prompts, num_samples=fv.num_samples, keep=fv.keep,
        max_new_tokens=fv.max_new_tokens, temperature=fv.temperature,
        verifiers=fv.verifiers, verify=fv.verify, drop_truncated=fv.drop_truncated,
        student_preset=fv.student_preset, student_init=fv.student_init,
        student_steps=fv.student_steps, student_learning_rate=fv.student_learning_rate,
        seed=fv.seed)
    workdir = _workdir(fv, config, "_distill")
    workdir_lock.acquire(workdir)
    check_workdir(workdir, 0, 1)  # writable, its checkpoint directories too, before sampling
    _say(f"[distill] teacher {directory}: {rt.model_cfg.num_params:,} params; "
         f"{settings.num_prompts} prompts x {settings.num_samples} samples, keep "
         f"{settings.keep}; workdir {workdir}")
    report = distillation.run_distill(rt, params, workdir, settings,
                                      teacher_checkpoint=directory)
    d = report["distill"]
    verified = f"{d['correct']} verified" if settings.verify else "not verified"
    _say(f"\n{report['table']}\n\nkept {d['kept']} of {d['samples']} samples "
         f"({100 * d['kept_fraction']:.1f}%; {verified}) from {d['prompts']} "
         f"prompts{' (reused)' if d['reused'] else ''}\nreport: "
         f"{paths.join(workdir, 'distill.json')}; data: {paths.join(workdir, 'distill.jsonl')}"
         f"; student: {phase_dir(workdir, 'sft')}")
    return 0


def reward_model(fv) -> int:
    """Trains a Bradley-Terry reward model on preference pairs, reports its pairwise
    accuracy on held-out pairs and saves it where `rewards.reward_model_dir` can name it."""
    config = fv.config
    check_config(config, jax.device_count())
    workdir = _workdir(fv, config, "_reward_model")
    workdir_lock.acquire(workdir)
    check_workdir(workdir, 0, 1)  # writable before any training
    out_dir = paths.join(workdir, rm.CHECKPOINT_KIND)
    if paths.as_path(out_dir).is_dir():
        raise ValueError(f"{out_dir} already holds a reward model: pass another --workdir")
    pairs = preferences.read_preference_pairs(fv.data)
    if fv.eval_data:
        train_pairs, held = pairs, preferences.read_preference_pairs(fv.eval_data)
    else:
        train_pairs, held = preferences.split_pairs(pairs, fv.eval_fraction, seed=config.seed)
    train_cfg = rm.train_config_from(
        config, steps=fv.steps, batch_size=fv.batch_size, learning_rate=fv.learning_rate,
        max_response_length=fv.max_response_length)
    rt, init_params, model_cfg = pipelines.checkpoint_runtime(config, workdir,
                                                              fv.init_checkpoint or "")
    model_cfg = model_cfg or rt.model_cfg
    _say(f"[reward-model] {model_cfg.num_params:,} params, {len(train_pairs)} training and "
         f"{len(held)} held-out pairs, {train_cfg.steps} steps; workdir {workdir}")
    writer = MetricsWriter.from_config(workdir, config, enabled=distributed.is_primary())
    t0 = time.time()
    try:
        params, history = rm.train_reward_model(
            model_cfg, rt.tokenizer, train_pairs, mesh=rt.mesh, rules=rt.rules,
            train_cfg=train_cfg, init_params=init_params, eval_pairs=held,
            log=lambda step, m: writer.write(step, m, phase="reward_model"))
    finally:
        writer.close()
    held_out = {k[len("eval/"):]: v for k, v in history[-1].items() if k.startswith("eval/")}
    report = {"held_out": held_out, "train": {k: history[-1][k] for k in ("loss", "accuracy")},
              "pairs": {"train": len(train_pairs), "held_out": len(held)},
              "data": fv.data, "eval_data": fv.eval_data or "", "seconds": time.time() - t0,
              "train_config": dataclasses.asdict(train_cfg),
              "init_checkpoint": fv.init_checkpoint or ""}
    rm.save_reward_model(out_dir, params, model_cfg, rt.tokenizer, step=train_cfg.steps,
                         metadata={"eval": held_out, **report})
    report_path = paths.join(workdir, "reward_model.json")
    _write_report(report_path, report)
    _say(f"[reward-model] held-out pairwise accuracy {100 * held_out['accuracy']:.1f}% on "
         f"{len(held)} pairs (chance 50%), mean margin {held_out['margin']:.3f}"
         + "".join(f", {k[len('accuracy/'):]} {100 * v:.1f}%" for k, v in held_out.items()
                   if k.startswith("accuracy/"))
         + f"; final training loss {history[-1]['loss']:.4f}, {time.time() - t0:.0f} s\nsaved: "
         f"{out_dir}\nreport: {report_path}\nuse it: --config.rewards.reward_model_dir="
         f"{workdir} --config.rewards.reward_model_weight=W")
    return 0


def pipeline(fv) -> int:
    """Runs the config's stages (`pipeline.run_pipeline`); a rerun skips finished stages."""
    config = fv.config
    workdir = _workdir(fv, config)
    try:
        result = pipelines.run_pipeline(config, workdir, until=fv.until, log=_say)
    except Preempted as e:
        _say(f"[pipeline] stopped by a signal in {e.phase!r} after step {e.step}; the "
             f"checkpoints are saved: rerun the same command to continue")
        return 0
    _say(f"\n{result['table']}\n\ntable: "
         f"{paths.join(workdir, pipelines.TABLE_FILE + '.md')}; state: "
         f"{paths.join(workdir, pipelines.STATE_FILE)}")
    return 0
