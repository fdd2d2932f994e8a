"""The same GRPO run in TRL and here, side by side (driver: benchmarks/learning_vs_trl.sh).

Both sides start from one exported SFT checkpoint (a Hugging Face directory), train on the
same prompts in the same order, with the same reward and the same hyper-parameters, and
every saved checkpoint of both is scored by our evaluator on the same held-out problems.

Subcommands (each runs in one virtualenv; the driver calls them in order):

  plan        ours   hyper-parameter table (ours -> TRL), reward weights, prompt files
  completions ours   real completions of the SFT checkpoint (the reward-agreement fixture)
  timed       any    runs one training command (either side) with its thread settings and
                     records its wall time, load average and a matmul probe around it
  trl         TRL    GRPOTrainer on the prompt file; checkpoints at fixed steps; step times
  export-rl   ours   our RL checkpoints at those steps as Hugging Face directories
  eval        ours   held-out pass@1 of Hugging Face directories (our evaluator, HF import)
  report      ours   the JSON and the plot (pass@1 vs step and vs wall time;
                     learning_vs_trl_report.py)

This module imports neither torch nor jax at the top: the reward functions that TRL gets
(`trl_reward_funcs`) are importable from both virtualenvs and from the tests.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


# benchmarks/host_probe.py by its path: the tests import this script with benchmarks/ (whose
# kernels.py and memory.py shadow packages transformers imports) kept off sys.path.
_PROBE = importlib.util.spec_from_file_location(
    "host_probe", os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_probe.py"))
_probe_module = importlib.util.module_from_spec(_PROBE)
_PROBE.loader.exec_module(_probe_module)
matmul_gflops = _probe_module.matmul_gflops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_PATH = os.path.join(ROOT, "configs", "arith_grpo.py")
HELD_OUT_SET = 0  # index of the eval set reported: the held-out problems of the training levels
LOAD_LIMIT_PER_CORE = 1.5  # the report refuses a run whose load average passed this per core


# ------------------------------------------------------------------------------ rewards


def our_reward(name: str, options: Mapping[str, Any] | None = None) -> Callable[[str, dict], float]:
    """Our registered reward `name` bound to its `rewards.options` keywords:
    f(completion str, example dict) -> score float. Imports jaxrl_reason.rewards (no jax)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from jaxrl_reason.rewards import get_reward

    fn, opts = get_reward(name), dict(options or {})
    return lambda completion, example: float(fn(completion, example, **opts).score)


def trl_reward_funcs(weights: Mapping[str, float], options: Mapping[str, Mapping] | None = None
                     ) -> tuple[list[Callable], list[float]]:
    """TRL `reward_funcs` and `reward_weights` with our rewards' semantics.

    Each function has TRL's signature f(prompts, completions, answer, **kw) -> list[float]
    (completions are plain strings: the prompt file is not conversational) and scores with
    our verifier itself. TRL sums weight * score over the functions, as our reward pool does.
    Raises ValueError when a weight is not a finite number.
    """
    funcs, ws = [], []
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"reward weight of {name!r} must be a finite number, got {w!r}")
        score = our_reward(name, (options or {}).get(name))

        def func(prompts, completions, answer, _score=score, **kw):
            return [_score(c, {"prompt": p, "answer": a})
                    for p, c, a in zip(prompts, completions, answer)]

        func.__name__ = name  # TRL logs rewards/<name>/mean
        funcs.append(func)
        ws.append(float(w))
    return funcs, ws


def trl_total(funcs: Sequence[Callable], weights: Sequence[float], prompts: Sequence[str],
              completions: Sequence[str], answers: Sequence[str]):
    """The total reward float32 [N] as GRPOTrainer forms it: per-function scores [N, F]
    times the weights, summed over F in float32 (nansum)."""
    import numpy as np

    per_func = np.array([f(prompts, completions, answer=answers) for f in funcs],
                        dtype=np.float32).T
    return np.nansum(per_func * np.asarray(weights, np.float32)[None, :], axis=1)


# ------------------------------------------------------------------------ ours: config


def load_config(overrides: Mapping[str, Any] | None = None):
    """configs/arith_grpo.py with dotted-key `overrides` applied (KeyError names a bad key)."""
    spec = importlib.util.spec_from_file_location("learning_vs_trl_config", CONFIG_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in (overrides or {}).items():
        node, *path = key.split(".")
        parent = config
        for part in [node, *path][:-1]:
            if part not in parent:
                raise KeyError(f"config override {key!r}: no field {part!r}")
            parent = parent[part]
        if [node, *path][-1] not in parent:
            raise KeyError(f"config override {key!r}: no such field")
        parent[[node, *path][-1]] = value
    return config


def hyperparameter_table(config) -> list[dict[str, Any]]:
    """Rows {name, ours (key=value), trl (key=value), note} mapping our RL config to
    GRPOConfig. Values are python scalars; `trl` rows with key None have no TRL field."""
    rl = config.rl
    b, g = int(rl.batch_prompts), int(rl.num_generations)
    warm = int(rl.warmup_steps)
    sched = {"constant": "constant_with_warmup" if warm else "constant",
             "cosine": "cosine_with_min_lr"}[rl.lr_decay]
    rows = [
        ("G (samples per prompt)", "rl.num_generations", g, "num_generations", g, ""),
        ("prompts per step", "rl.batch_prompts", b, "per_device_train_batch_size", b * g,
         "TRL counts completions: B*G, one process, gradient_accumulation_steps=1"),
        ("learning rate", "rl.learning_rate", rl.learning_rate, "learning_rate",
         rl.learning_rate, ""),
        ("schedule", "rl.lr_decay", rl.lr_decay, "lr_scheduler_type", sched,
         "linear warm-up from 0 on both"),
        ("warm-up steps", "rl.warmup_steps", warm, "warmup_steps", warm, ""),
        ("Adam beta1", "(make_optimizer b1)", 0.9, "adam_beta1", 0.9, ""),
        ("Adam beta2", "(make_optimizer b2)", 0.95, "adam_beta2", 0.95,
         "TRL's default is 0.999; set to ours"),
        ("Adam epsilon", "(make_optimizer eps)", 1e-8, "adam_epsilon", 1e-8, ""),
        ("weight decay", "rl.weight_decay", rl.weight_decay, "weight_decay", rl.weight_decay,
         "AdamW, decoupled, on both"),
        ("gradient clipping", "rl.max_grad_norm", rl.max_grad_norm, "max_grad_norm",
         rl.max_grad_norm, "global norm"),
        ("beta (KL)", "rl.beta", rl.beta, "beta", rl.beta, ""),
        ("KL estimator", "rl.kl_estimator", rl.kl_estimator, None, "k3",
         "TRL's is k3, fixed; unused at beta=0"),
        ("epsilon (low)", "rl.epsilon_low", rl.epsilon_low, "epsilon", rl.epsilon_low, ""),
        ("epsilon_high", "rl.epsilon_high", rl.epsilon_high, "epsilon_high",
         rl.epsilon_high, ""),
        ("loss_type", "rl.loss_type", rl.loss_type, "loss_type", rl.loss_type,
         "per-sequence token mean, then mean over sequences"),
        ("scale_rewards", "rl.advantage_scale", rl.advantage_scale, "scale_rewards",
         rl.advantage_scale, "std: ours ddof=0 + 1e-6, TRL ddof=1 + 1e-4 (neither configurable)"),
        ("max_completion_length", "rl.max_new_tokens", rl.max_new_tokens,
         "max_completion_length", rl.max_new_tokens, "new tokens per completion"),
        ("temperature", "rl.temperature", rl.temperature, "temperature", rl.temperature, ""),
        ("top-p", "rl.top_p", rl.top_p, "top_p", rl.top_p, ""),
        ("top-k", "rl.top_k", rl.top_k, "top_k", rl.top_k, "0 = off on both"),
        ("iterations per batch", "rl.num_iterations", rl.num_iterations, "num_iterations",
         rl.num_iterations, ""),
        ("truncated completions", "rl.mask_truncated_completions",
         rl.mask_truncated_completions, "mask_truncated_completions",
         rl.mask_truncated_completions, ""),
        ("entropy bonus", "rl.entropy_coef", rl.entropy_coef, None, 0.0,
         "TRL has none; ours is 0"),
        ("zero-advantage rows", "rl.skip_zero_advantage_rows", rl.skip_zero_advantage_rows,
         None, "(computes them)", "skipping is exact at beta=0 (the loss is normalized by all "
         "B*G sequences); a speed-up, kept"),
        ("prompt order", "data iterator (seed)", "file order", "shuffle_dataset", False,
         "both read the prompt file's order"),
    ]
    return [{"name": n, "ours": f"{ok}={ov}", "trl": None if tk is None else f"{tk}={tv}",
             "ours_key": ok, "ours_value": ov, "trl_key": tk, "trl_value": tv, "note": note}
            for n, ok, ov, tk, tv, note in rows]


def check_supported(config) -> None:
    """ValueError naming the field when our config uses something the TRL side cannot match."""
    rl = config.rl
    wanted = {"rl.advantage_estimator": (rl.advantage_estimator, "grpo"),
              "rl.policy_loss_mode": (rl.policy_loss_mode, "ppo"),
              "rl.kl_in_reward": (rl.kl_in_reward, False),
              "rl.dynamic_sampling": (rl.dynamic_sampling, False),
              "rl.entropy_coef": (rl.entropy_coef, 0.0),
              "rl.tis_cap": (rl.tis_cap, 0.0), "rl.clip_ratio_c": (rl.clip_ratio_c, 0.0),
              "rl.kl_target": (rl.kl_target, 0.0), "rl.ref_sync_every": (rl.ref_sync_every, 0),
              "rl.micro_batches": (rl.micro_batches, 1)}
    bad = [f"{k}={v!r} (TRL side needs {w!r})" for k, (v, w) in wanted.items() if v != w]
    if rl.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo"):
        bad.append(f"rl.loss_type={rl.loss_type!r}")
    if bad:
        raise ValueError("learning_vs_trl: no TRL equivalent for " + ", ".join(bad))


def trl_args(config) -> dict[str, Any]:
    """GRPOConfig keyword arguments from the table (the fields TRL has)."""
    return {r["trl_key"]: r["trl_value"] for r in hyperparameter_table(config) if r["trl_key"]}


# ------------------------------------------------------------------------ ours: prompts


def training_prompts(config, steps: int) -> list[dict[str, Any]]:
    """The prompts our trainer draws for steps 1..`steps` with `config.seed`, in order: the
    same task source and iterator as `RLTrainer` (rl/trainer.py). Returns rows {step (1-based),
    id, prompt, answer, level}; `steps * rl.batch_prompts` of them."""
    from jaxrl_reason.data.pipeline import example_iterator
    from jaxrl_reason.data.tasks import task_source
    from jaxrl_reason.rl.trainer import TRAIN_SIZE

    source = task_source(config, "train", config.task.train_levels, TRAIN_SIZE,
                         seed=config.seed + 1)
    it = example_iterator(source, batch_size=config.rl.batch_prompts, seed=config.seed)
    rows = []
    for step in range(1, steps + 1):
        for ex in next(it):
            rows.append({"step": step, "id": ex["id"], "prompt": ex["prompt"],
                         "answer": ex["answer"], "level": ex.get("level")})
    return rows


def write_jsonl(path: str, rows: Sequence[Mapping]) -> None:
    """One JSON object per line."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def read_jsonl(path: str) -> list[dict]:
    """The JSON objects of a JSONL file; ValueError naming the line that is not one."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON ({e})") from None
    return rows


def versions() -> dict[str, str]:
    """Versions of the packages of whichever virtualenv runs this."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("jax", "flax", "optax", "torch", "transformers", "trl", "accelerate",
                 "datasets", "tokenizers", "math-verify"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cmd_plan(a) -> None:
    """plan.json (table, TRL args, rewards, overrides) and prompts_seed<k>.jsonl per seed."""
    config = load_config(json.loads(a.overrides))
    check_supported(config)
    os.makedirs(a.workdir, exist_ok=True)
    from jaxrl_reason.tokenizers import load_tokenizer

    tok = load_tokenizer(a.model)
    for seed in a.seeds:
        config.seed = seed
        rows = training_prompts(config, a.steps)
        for r in rows:  # the ids our trainer feeds the model (Runtime.encode_prompt)
            r["prompt_ids"] = tok.encode(r["prompt"], add_bos=tok.add_bos_token)
        write_jsonl(os.path.join(a.workdir, f"prompts_seed{seed}.jsonl"), rows)
    opts = {k: dict(v) for k, v in config.rewards.options.to_dict().items()}
    plan = {"steps": a.steps, "save_every": a.save_every, "seeds": list(a.seeds),
            "overrides": json.loads(a.overrides), "table": hyperparameter_table(config),
            "trl_args": trl_args(config), "reward_weights": dict(config.rewards.weights),
            "reward_options": {k: opts[k] for k in config.rewards.weights if k in opts},
            "versions_ours": versions(), "load_average": os.getloadavg(),
            "cpu_affinity": sorted(os.sched_getaffinity(0))}
    with open(os.path.join(a.workdir, "plan.json"), "w") as f:
        json.dump(plan, f, indent=2)
    with open(os.path.join(a.workdir, "ours_flags.txt"), "w") as f:  # the same for `train`
        f.write(" ".join(f"--config.{k}={v}" for k, v in plan["overrides"].items()))
    print(f"[plan] {len(a.seeds)} prompt file(s) of {a.steps} steps in {a.workdir}")


# ---------------------------------------------------------- threads, load and the clock


def thread_count(env: Mapping[str, str] | None = None, cores: int | None = None) -> int:
    """Threads per process, the anchors' convention (anchors/common.py `torch_threads`):
    ANCHOR_THREADS, else one per core this process may run on (`cores`, default
    len(os.sched_getaffinity(0)); `taskset -c 1` gives 1). ValueError on a bad setting."""
    env = os.environ if env is None else env
    value = env.get("ANCHOR_THREADS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"ANCHOR_THREADS must be a positive integer, got {value!r}")
        return int(value)
    return cores if cores is not None else len(os.sched_getaffinity(0))


def child_env(side: str, threads: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of one side's training process, `threads` threads per process.

    Both: OMP_NUM_THREADS=threads. TRL: ANCHOR_THREADS=threads (the `trl` subcommand's
    torch.set_num_threads). Ours: XLA:CPU's Eigen pool off
    (`--xla_cpu_multi_thread_eigen=false`: each device's ops on one thread); the train
    command's `cpu_devices` auto makes one device per pinned core, so that both sides run
    one thread per pinned core."""
    if side not in ("ours", "trl"):
        raise ValueError(f"side must be 'ours' or 'trl', got {side!r}")
    out = dict(env)
    out["OMP_NUM_THREADS"] = str(threads)
    if side == "trl":
        out["ANCHOR_THREADS"] = str(threads)
        return out
    flags = out.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        out["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    return out


def load_peak(record: Mapping[str, Any]) -> float:
    """The highest 1-minute load average of a `timed` record: before, during, after."""
    return max([record["load_before"][0], record["load_after"][0],
                *(load for _, load in record.get("load_samples", []))])


def load_violations(runs: Mapping[Any, Mapping[str, Mapping[str, Any]]],
                    limit_per_core: float = LOAD_LIMIT_PER_CORE) -> list[str]:
    """Messages for the training runs whose 1-minute load average passed `limit_per_core`
    times their pinned cores at some point: `runs` is {seed: {side: `timed` record}}."""
    bad = []
    for seed, sides in runs.items():
        for side, record in sides.items():
            cores = len(record["cpu_affinity"])
            peak = load_peak(record)
            if peak > limit_per_core * cores:
                bad.append(f"seed {seed} {side}: load average {peak:.2f} on {cores} pinned "
                           f"core(s), limit {limit_per_core * cores:.2f}")
    return bad


def cmd_timed(a) -> None:
    """Runs the command after `--` as one side's training run: `threads` threads per process
    (child_env), and a record of its wall time, the 1-minute load average before, every
    --sample_s seconds during and after it, and the matmul probe before and after, written
    to --record only when the command succeeds (its exit status is passed on)."""
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        raise SystemExit("timed: no command after --")
    threads = thread_count()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the probe's BLAS, before numpy loads
    env = child_env(a.side, threads, os.environ)
    record: dict[str, Any] = {
        "side": a.side, "seed": a.seed, "command": command, "threads": threads,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "env": {k: env[k] for k in ("OMP_NUM_THREADS", "ANCHOR_THREADS", "XLA_FLAGS",
                                    "JAX_NUM_CPU_DEVICES") if k in env},
        "probe_gflops_before": matmul_gflops(), "load_before": list(os.getloadavg())}
    samples, t0 = [], time.time()
    proc = subprocess.Popen(command, env=env)
    while True:
        try:
            code = proc.wait(timeout=a.sample_s)
            break
        except subprocess.TimeoutExpired:
            samples.append([round(time.time() - t0, 1), os.getloadavg()[0]])
    record["wall_s"] = time.time() - t0
    record["load_samples"] = samples
    record["load_after"] = list(os.getloadavg())
    record["probe_gflops_after"] = matmul_gflops()
    if code != 0:
        raise SystemExit(code)
    record["load_peak"] = load_peak(record)
    with open(a.record, "w") as f:
        json.dump(record, f, indent=2)
    print(f"[timed] seed {a.seed} {a.side}: {record['wall_s']:.0f}s, {threads} thread(s) on "
          f"cores {record['cpu_affinity']}, peak load {record['load_peak']:.2f}, probe "
          f"{record['probe_gflops_before']:.1f} -> {record['probe_gflops_after']:.1f} GFLOP/s")


# -------------------------------------------------------------------- TRL side (torch)


def cmd_trl(a) -> None:
    """GRPOTrainer from the exported SFT directory on one seed's prompt file."""
    # benchmarks/ holds kernels.py, memory.py, ...: names transformers imports as packages.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads if a.threads is not None else thread_count())
    with open(os.path.join(a.workdir, "plan.json")) as f:
        plan = json.load(f)
    rows = read_jsonl(os.path.join(a.workdir, f"prompts_seed{a.seed}.jsonl"))
    tok = AutoTokenizer.from_pretrained(a.model)
    # GRPOTrainer tokenizes plain-text prompts with the tokenizer's special tokens (our bos).
    for r in rows:
        if tok(r["prompt"])["input_ids"] != r["prompt_ids"]:
            raise ValueError(f"{a.model}: transformers' tokenizer encodes prompt {r['id']!r} as "
                             f"{tok(r['prompt'])['input_ids']}, ours as {r['prompt_ids']}")
    ds = Dataset.from_dict({"prompt": [r["prompt"] for r in rows],
                            "answer": [r["answer"] for r in rows]})
    funcs, weights = trl_reward_funcs(plan["reward_weights"], plan["reward_options"])
    steps_end: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            steps_end[0] = time.time()

        def on_step_end(self, args, state, control, **kw):
            steps_end[state.global_step] = time.time()

    out = a.out
    targs = dict(plan["trl_args"])
    args = GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, activation_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32}, gradient_accumulation_steps=1,
        max_steps=plan["steps"], save_strategy="steps", save_steps=plan["save_every"],
        save_only_model=True, logging_steps=1, report_to="none", seed=a.seed,
        dataloader_num_workers=0, disable_tqdm=True, reward_weights=weights, **targs)
    trainer = GRPOTrainer(model=a.model, reward_funcs=funcs, args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Clock()])
    t0 = time.time()
    trainer.train()
    total = time.time() - t0
    record = {"side": "trl", "seed": a.seed, "train_s": total,
              "step_end_s": {str(k): v - steps_end[0] for k, v in sorted(steps_end.items())},
              "log_history": trainer.state.log_history, "versions": versions(),
              "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
              "cpu_affinity": sorted(os.sched_getaffinity(0))}
    with open(os.path.join(out, "timing.json"), "w") as f:
        json.dump(record, f, indent=2, default=str)
    print(f"[trl] seed {a.seed}: {plan['steps']} steps in {total:.0f}s -> {out}")


# ------------------------------------------------------------------ ours: checkpoints


def _hf_runtime(config, model_dir: str):
    """(Runtime, params) of a Hugging Face directory through our import (config.hf_model)."""
    from jaxrl_reason.models import hf
    from jaxrl_reason.runtime.build import build_runtime

    config.hf_model = os.path.abspath(model_dir)
    rt = build_runtime(config, os.path.dirname(config.hf_model))
    _, params = hf.load_hf_checkpoint(config.hf_model, rt.mesh, rt.rules,
                                      dtype=rt.model_cfg.param_dtype,
                                      compute_dtype=rt.model_cfg.dtype,
                                      scan_layers=rt.model_cfg.scan_layers)
    return rt, params


def cmd_completions(a) -> None:
    """Real completions of a model directory on the first prompts of a prompt file, at each
    temperature of --temperatures: rows {prompt, answer, completion, temperature}."""
    import jax
    import numpy as np

    from jaxrl_reason.runtime import sharding as shd

    config = load_config(json.loads(a.overrides))
    rt, params = _hf_runtime(config, a.model)
    rows = read_jsonl(a.prompts)[:a.num_prompts]
    out = []
    for t_index, temperature in enumerate(a.temperatures):
        for start in range(0, len(rows), a.batch):
            batch = rows[start:start + a.batch]
            tokens, valid = rt.encode_prompts(batch)
            put = lambda x: shd.put_replicated(rt.mesh, x)  # noqa: E731
            res = rt.sampler(params, put(tokens), put(valid),
                             jax.random.key(1000 * t_index + start),
                             num_samples=a.samples, max_new_tokens=config.rl.max_new_tokens,
                             temperature=temperature)
            toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
            for i, (row, n) in enumerate(zip(toks, lens)):
                ex = batch[i // a.samples]  # rows are group-major: G samples per prompt
                out.append({"prompt": ex["prompt"], "answer": ex["answer"],
                            "temperature": temperature,
                            "completion": rt.tokenizer.decode(row[:n])})
    with open(a.out, "w") as f:
        json.dump({"label": "real completions of the exported SFT checkpoint "
                   "(learning_vs_trl reward agreement)", "completions": out}, f, indent=0)
    print(f"[completions] {len(out)} -> {a.out}")


def cmd_export_rl(a) -> None:
    """Our RL checkpoints at every saved step as Hugging Face directories <out>/step_<k>."""
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    from jaxrl_reason.checkpoints.phases import load_params, resolve_checkpoint_dir
    from jaxrl_reason.models.hf import export_hf_checkpoint
    from jaxrl_reason.runtime import sharding as shd
    from jaxrl_reason.tokenizers.hf import write_transformers_files

    directory = resolve_checkpoint_dir(os.path.join(a.workdir, "checkpoints", "rl"))
    with Checkpointer(directory) as ckpt:
        steps = sorted(ckpt.all_steps())
    mesh = shd.make_mesh({"data": -1})
    for step in steps:
        params, model_cfg, tokenizer, _ = load_params(directory, mesh, shd.DEFAULT_RULES,
                                                      step=step)
        out = os.path.join(a.out, f"step_{step}")
        export_hf_checkpoint(model_cfg, params, out)
        tokenizer.save_dir(out)
        write_transformers_files(tokenizer, out)
    print(f"[export-rl] steps {steps} -> {a.out}")


def cmd_eval(a) -> None:
    """Held-out pass@1 of Hugging Face directories with our evaluator (one runtime, so one
    compiled sampler for all of them); writes {label: {set: {mean, ci95, values}}}."""
    from jaxrl_reason.evaluation import runner
    from jaxrl_reason.models import hf

    config = runner.with_eval_overrides(load_config(json.loads(a.overrides)),
                                        seeds=a.eval_seeds, num_samples=a.num_samples,
                                        num_problems=a.num_problems)
    results, rt = {}, None
    for spec in a.models:
        label, _, path = spec.partition("=")
        if rt is None:
            rt, params = _hf_runtime(config, path)
        else:
            _, params = hf.load_hf_checkpoint(os.path.abspath(path), rt.mesh, rt.rules,
                                              dtype=rt.model_cfg.param_dtype,
                                              compute_dtype=rt.model_cfg.dtype,
                                              scan_layers=rt.model_cfg.scan_layers)
        t0 = time.time()
        report = runner.evaluate(rt, params, progress=False)
        results[label] = {"path": path, "eval_s": time.time() - t0,
                          "sets": {name: report["sets"][name]["pass@1"]
                                   for name in report["sets"]}}
        first = next(iter(results[label]["sets"].values()))
        print(f"[eval] {label}: pass@1 {first['mean']:.4f} ({time.time() - t0:.0f}s)")
    with open(a.out, "w") as f:
        json.dump({"config": {"eval": config.eval.to_dict()}, "results": results}, f,
                  indent=2, default=list)


# ------------------------------------------------------------------------------ report


def cmd_report(a) -> None:
    """Gathers every seed's evals and timings into --out (JSON) and --plot (PNG): see
    learning_vs_trl_report.py (imported here, since it imports this module)."""
    import learning_vs_trl_report

    learning_vs_trl_report.cmd_report(a)


# ------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name, fn, *flags):
        s = sub.add_parser(name)
        s.set_defaults(fn=fn)
        s.add_argument("--overrides", default="{}", help="JSON {dotted.config.key: value}")
        for flag, kw in flags:
            s.add_argument(flag, **kw)

    req = {"required": True}
    add("plan", cmd_plan, ("--workdir", req), ("--model", req),
        ("--steps", {"type": int, **req}),
        ("--save_every", {"type": int, **req}),
        ("--seeds", {"type": int, "nargs": "+", **req}))
    add("completions", cmd_completions, ("--model", req), ("--prompts", req), ("--out", req),
        ("--num_prompts", {"type": int, "default": 128}),
        ("--samples", {"type": int, "default": 8}), ("--batch", {"type": int, "default": 16}),
        ("--temperatures", {"type": float, "nargs": "+", "default": [1.0]}))
    add("trl", cmd_trl, ("--workdir", req), ("--model", req), ("--out", req),
        ("--seed", {"type": int, **req}),
        ("--threads", {"type": int, "default": None,
                       "help": "torch threads (default: ANCHOR_THREADS, else one per core "
                               "this process may run on)"}))
    add("timed", cmd_timed, ("--side", {"choices": ["ours", "trl"], **req}),
        ("--seed", {"type": int, **req}), ("--record", req),
        ("--sample_s", {"type": float, "default": 30.0}),
        ("command", {"nargs": argparse.REMAINDER}))
    add("export-rl", cmd_export_rl, ("--workdir", req), ("--out", req))
    add("eval", cmd_eval, ("--models", {"nargs": "+", **req}), ("--out", req),
        ("--eval_seeds", {"type": int, "nargs": "+", "default": None}),
        ("--num_samples", {"type": int, "default": None}),
        ("--num_problems", {"type": int, "default": None}))
    add("report", cmd_report, ("--workdir", req), ("--out", req), ("--plot", req),
        ("--label", req), ("--pipeline_check", {"action": "store_true"}))
    a = p.parse_args(argv)
    a.fn(a)


if __name__ == "__main__":
    main()
