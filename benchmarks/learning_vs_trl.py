"""The same GRPO run in TRL and here, side by side (driver: benchmarks/learning_vs_trl.sh).

Both sides start from one exported SFT checkpoint (a Hugging Face directory), train on the
same prompts in the same order, with the same reward and the same hyper-parameters, and
every saved checkpoint of both is scored by our evaluator on the same held-out problems.

Subcommands (each runs in one virtualenv; the driver calls them in order):

  plan        ours   hyper-parameter table (ours -> TRL), reward weights, prompt files
  completions ours   real completions of the SFT checkpoint (the reward-agreement fixture)
  trl         TRL    GRPOTrainer on the prompt file; checkpoints at fixed steps; step times
  export-rl   ours   our RL checkpoints at those steps as Hugging Face directories
  eval        ours   held-out pass@1 of Hugging Face directories (our evaluator, HF import)
  report      ours   the JSON and the plot (pass@1 vs step and vs wall time)

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
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_PATH = os.path.join(ROOT, "configs", "arith_grpo.py")
HELD_OUT_SET = 0  # index of the eval set reported: the held-out problems of the training levels


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

    torch.set_num_threads(a.threads)
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


def interval(values: Sequence[float]) -> dict[str, Any]:
    """{mean, low, high, n} of the 95% t-interval over seeds (low/high None for one seed)."""
    from jaxrl_reason.evaluation.stats import mean_ci

    mean, half = mean_ci(values)
    ok = math.isfinite(half)
    return {"mean": mean, "low": mean - half if ok else None,
            "high": mean + half if ok else None, "n": len(values)}


def ours_step_times(metrics_path: str) -> dict[int, float]:
    """{step: seconds from the start of our first RL step to the end of step} from a run's
    metrics.jsonl: rl rows carry the wall `time` at the step's end; the first step began
    its sampling, scoring and training times (`time/*_s`) before its end."""
    rows = [r for r in read_jsonl(metrics_path) if r.get("phase") == "rl"]
    if not rows:
        raise ValueError(f"{metrics_path}: no rl rows")
    start = rows[0]["time"] - sum(v for k, v in rows[0].items() if k.startswith("time/"))
    return {0: 0.0, **{int(r["step"]): r["time"] - start for r in rows}}


def time_to_reach(steps_s: Sequence[float], pass1: Sequence[float], target: float):
    """Seconds at which the piecewise-linear curve (steps_s, pass1) first reaches `target`
    (None when it never does). Both sequences in step order, same length."""
    for i, (t, p) in enumerate(zip(steps_s, pass1)):
        if p >= target:
            if i == 0:
                return t
            t0, p0 = steps_s[i - 1], pass1[i - 1]
            return t0 + (t - t0) * (target - p0) / (p - p0)
    return None


def side_curve(per_seed: Mapping[int, Mapping[int, tuple[float, float]]]) -> dict[str, Any]:
    """Curve of one side from {seed: {step: (pass@1, wall s)}}: steps present in every seed,
    pass@1 and wall-time intervals over seeds per step."""
    steps = sorted(set.intersection(*(set(d) for d in per_seed.values())))
    return {"steps": steps,
            "pass1": [interval([d[s][0] for d in per_seed.values()]) for s in steps],
            "wall_s": [interval([d[s][1] for d in per_seed.values()]) for s in steps]}


def cmd_report(a) -> None:
    """Gathers every seed's evals and timings into --out (JSON) and --plot (PNG)."""
    with open(os.path.join(a.workdir, "plan.json")) as f:
        plan = json.load(f)
    sides: dict[str, dict[int, dict[int, tuple[float, float]]]] = {"ours": {}, "trl": {}}
    totals: dict[str, list[float]] = {"ours": [], "trl": []}
    loads, trl_versions, batch_correct = [], None, {}
    for seed in plan["seeds"]:
        d = os.path.join(a.workdir, f"seed{seed}")
        with open(os.path.join(d, "eval.json")) as f:
            ev = json.load(f)["results"]
        p1 = {label: next(iter(r["sets"].values()))["mean"] for label, r in ev.items()}
        ours_t = ours_step_times(os.path.join(d, "ours", "metrics.jsonl"))
        with open(os.path.join(d, "trl", "timing.json")) as f:
            trl = json.load(f)
        trl_t = {int(k): v for k, v in trl["step_end_s"].items()}
        with open(os.path.join(d, "ours", "eval.json")) as f:
            totals["ours"].append(json.load(f)["timings"]["rl_s"])
        totals["trl"].append(trl["train_s"])
        loads.append(trl["load_average"])
        batch_correct[seed] = {
            "ours": [r["reward/correctness"] for r in read_jsonl(
                os.path.join(d, "ours", "metrics.jsonl")) if r.get("phase") == "rl"],
            "trl": [float(h["rewards/correctness/mean"]) for h in trl["log_history"]
                    if "rewards/correctness/mean" in h]}
        trl_versions = trl["versions"]
        for side, times in (("ours", ours_t), ("trl", trl_t)):
            sides[side][seed] = {0: (p1["sft"], 0.0)}
            for label, value in p1.items():
                if label.startswith(side + "_step_"):
                    step = int(label.rsplit("_", 1)[1])
                    sides[side][seed][step] = (value, times[step])
    curves = {side: side_curve(v) for side, v in sides.items()}
    final = {side: c["pass1"][-1] for side, c in curves.items()}
    ours_c = curves["ours"]
    reach = time_to_reach([w["mean"] for w in ours_c["wall_s"]],
                          [p["mean"] for p in ours_c["pass1"]], final["trl"]["mean"])
    out = {"label": a.label, "pipeline_check": a.pipeline_check,
           "steps": plan["steps"], "save_every": plan["save_every"], "seeds": plan["seeds"],
           "eval_set": "held-out problems of the training levels (first eval set)",
           "ours_final_pass1": final["ours"], "trl_final_pass1": final["trl"],
           "ours_s_to_trl_final": reach,
           "ours_total_s": interval(totals["ours"]), "trl_total_s": interval(totals["trl"]),
           "wall_time": "seconds from the start of the first RL step (ours: metrics.jsonl, "
                        "step 1's end minus its time/*_s; TRL: on_train_begin) to the end of "
                        "the step",
           "curves": curves,
           "train_batch_correctness": {"note": "per step, the sampled batch's mean correctness "
                                       "(same prompts on both sides)", "by_seed": batch_correct},
           "hyperparameters": plan["table"],
           "overrides": plan["overrides"], "reward_weights": plan["reward_weights"],
           "versions": {"ours": plan["versions_ours"], "trl": trl_versions},
           "load_average": {"plan": plan["load_average"], "after_trl_runs": loads}}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    plot(out, a.plot)
    print(f"[report] ours {final['ours']['mean']:.4f} trl {final['trl']['mean']:.4f} "
          f"-> {a.out}, {a.plot}")


def plot(report: Mapping[str, Any], path: str) -> None:
    """pass@1 against step and against wall time, both sides, mean and interval band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for side, colour in (("ours", "tab:blue"), ("trl", "tab:orange")):
        c = report["curves"][side]
        mean = [p["mean"] for p in c["pass1"]]
        low = [p["low"] if p["low"] is not None else p["mean"] for p in c["pass1"]]
        high = [p["high"] if p["high"] is not None else p["mean"] for p in c["pass1"]]
        for ax, xs in ((axes[0], c["steps"]), (axes[1], [w["mean"] for w in c["wall_s"]])):
            ax.plot(xs, mean, "o-", color=colour, label=f"{side} (n={c['pass1'][0]['n']})")
            ax.fill_between(xs, low, high, color=colour, alpha=0.2)
    axes[0].set_xlabel("RL step")
    axes[1].set_xlabel("wall time from the first RL step (s)")
    axes[0].set_ylabel("held-out pass@1")
    axes[0].legend()
    fig.suptitle(report["label"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
        ("--seed", {"type": int, **req}), ("--threads", {"type": int, "default": 2}))
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
