"""The CLI commands as functions of parsed flags: train, sft, eval, sample.

`train` runs the R1 recipe end to end: tokenizer -> cold-start SFT -> RL -> evaluation of
both checkpoints, printing a before/after table and writing `<workdir>/eval.json`.

Multi-host: every process runs the command (the CLI has initialized `jax.distributed`);
all of them train, evaluate and save checkpoints together, and only process 0 prints and
writes the run's files (config.json, metrics, eval.json). The workdir may be a local path
or any `etils.epath` path such as gs://bucket/run (see `paths`).
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections

from jaxrl_reason import distributed, eval_runner, paths
from jaxrl_reason import sharding as shd
from jaxrl_reason.checkpointing import Checkpointer
from jaxrl_reason.data.files import read_examples
from jaxrl_reason.data.tasks import task_source
from jaxrl_reason.models.params import abstract_params, to_layout
from jaxrl_reason.reliability import (Preempted, check_prompt_lengths, check_workdir,
                                      stop_requested, tree_bytes)
from jaxrl_reason.metrics import MetricsWriter
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.run_state import load_params, phase_dir, resolve_checkpoint_dir
from jaxrl_reason.runtime import build_runtime
from jaxrl_reason.sampling.sampler import Sampler, left_pad
from jaxrl_reason.sft import run_sft
from jaxrl_reason.tokenizers import tokenizer_from_serialized
from jaxrl_reason.validation import check_config


def _workdir(fv, config) -> str:
    return fv.workdir or os.path.join("runs", config.name)


def _prepare(fv):
    """Validated config, workdir, runtime and metrics writer of a train/sft command."""
    config = fv.config
    check_config(config, jax.device_count())
    workdir = _workdir(fv, config)
    if not fv.resume and paths.as_path(workdir, "checkpoints").is_dir():
        raise ValueError(f"workdir {workdir!r} already holds checkpoints: pass --resume to "
                         f"continue that run or --workdir to start a new one")
    paths.as_path(workdir).mkdir(parents=True, exist_ok=True)
    rt = build_runtime(config, workdir)
    _check_before_compiling(rt, workdir)
    writer = MetricsWriter(workdir, tensorboard=config.log.tensorboard, console=False,
                           enabled=distributed.is_primary())
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
        # The layer layout is a knob of this run, not of the checkpoint: convert it.
        params = to_layout(rt.model_cfg, params)
        model_cfg = model_cfg.replace(scan_layers=rt.model_cfg.scan_layers)
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
    trainer = RLTrainer(rt, writer, init_params=params)
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
    from jaxrl_reason import plan as planner
    chip, devices = planner.topology_devices(fv.topology)
    check_config(fv.config, len(devices))
    report = planner.plan(fv.config, fv.topology)
    _say(planner.format_report(report))
    return 0


def _config_from_checkpoint(meta) -> ml_collections.ConfigDict:
    config = meta.get("config")
    if not config:
        raise ValueError("checkpoint metadata holds no config; pass --config")
    return ml_collections.ConfigDict(json.loads(config))


def eval(fv) -> int:  # noqa: A001 (the command's name)
    directory = resolve_checkpoint_dir(fv.checkpoint)
    with Checkpointer(directory) as ckpt:
        params_meta = ckpt.metadata()
    config = fv.config if fv.config is not None else _config_from_checkpoint(params_meta)
    # The checkpoint's own tokenizer: never train or write one next to a checkpoint.
    tokenizer = tokenizer_from_serialized(params_meta["tokenizer"])
    rt = build_runtime(config, directory, tokenizer=tokenizer)
    params, _, _, _ = load_params(directory, rt.mesh, rt.rules)
    sets = None
    if fv.data:
        source = read_examples(fv.data, fields=fv.data_preset)
        sets = {os.path.basename(fv.data): [source[i] for i in range(len(source))]}
    report = eval_runner.evaluate(rt, params, sets, progress=config.log.progress_bar)
    table = eval_runner.comparison_table({os.path.basename(directory): report},
                                         config.eval.num_samples)
    out = fv.out or paths.join(directory, "eval.json")
    _write_report(out, {"checkpoint": directory, "report": report, "table": table})
    _say(f"{table}\n\nreport: {out}")
    return 0


def _sample_source(fv, mesh, rules):
    """(params, ModelConfig, tokenizer) of `sample`: a run checkpoint or an HF directory."""
    if bool(fv.checkpoint) == bool(fv.model):
        raise ValueError("give exactly one of --checkpoint (a run) and --model (a Hugging "
                         "Face model directory)")
    if fv.checkpoint:
        if fv.chat:
            raise ValueError("--chat needs --model (a run's own tokenizer has no chat "
                             "template)")
        params, model_cfg, tokenizer, _ = load_params(fv.checkpoint, mesh, rules)
        return params, model_cfg, tokenizer
    from jaxrl_reason.models import hf
    from jaxrl_reason.tokenizers import load_tokenizer
    tokenizer = load_tokenizer(fv.model)  # first: a bad directory fails before any weights
    model_cfg, params = hf.load_hf_checkpoint(fv.model, mesh, rules, dtype=fv.dtype)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"{fv.model}: the tokenizer has {tokenizer.vocab_size} tokens but "
                         f"the model's embedding only {model_cfg.vocab_size} rows")
    return params, model_cfg, tokenizer


def sample(fv) -> int:
    mesh = shd.make_mesh({"data": -1})
    rules = shd.DEFAULT_RULES
    params, model_cfg, tokenizer = _sample_source(fv, mesh, rules)
    model = Transformer(model_cfg)
    sampler = Sampler(model, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=mesh,
                      rules=rules)
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
    return 0


def export(fv) -> int:
    """A run's checkpoint as a Hugging Face model directory (config.json, safetensors,
    tokenizer files) that transformers and other tools load."""
    from jaxrl_reason.models import hf
    mesh = shd.make_mesh({"data": -1})
    params, model_cfg, tokenizer, _ = load_params(fv.checkpoint, mesh, shd.DEFAULT_RULES)
    params = distributed.to_host(params)  # every process takes part in the gather
    if distributed.is_primary():
        files = hf.export_hf_checkpoint(model_cfg, params, fv.out, dtype=fv.dtype,
                                        max_shard_bytes=fv.max_shard_bytes)
        tokenizer.save_dir(fv.out)
        _say(f"wrote {len(files)} files to {fv.out}: " + ", ".join(
            sorted(os.path.basename(f) for f in files)))
    return 0
