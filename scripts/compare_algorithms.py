"""Runs several RL algorithm configs from one SFT checkpoint, a few seeds each, and reports
held-out pass@1 before/after, completion length and wall time (the README's algorithm table).

    python scripts/compare_algorithms.py --sft runs/arith_grpo/checkpoints/sft \
        --configs configs/arith_grpo.py configs/arith_dr_grpo.py configs/arith_dapo.py \
        --seeds 0 1 2 --steps 60 --out docs/algorithms.json --plot docs/algorithm_curves.png

Each (config, seed) trains `--steps` RL steps from the same SFT params (seed = the config's
`seed`: data order, sampling) and is evaluated on the held-out levels of the config's first
`task.eval_levels` set with `--eval_problems` problems x `--eval_samples` samples at T = 1,
sampling seed = the run's seed. The SFT checkpoint is evaluated the same way per seed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np

from jaxrl_reason.evaluation import runner as eval_runner
from jaxrl_reason.cli import parse
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.checkpoints.phases import load_params
from jaxrl_reason.runtime.build import build_runtime


def _config(path: str, seed: int, steps: int, problems: int, samples: int):
    _, fv = parse(["jaxrl-reason", "train", "--config", path, f"--config.seed={seed}",
                   f"--config.rl.steps={steps}", f"--config.eval.num_problems={problems}",
                   f"--config.eval.num_samples={samples}", "--config.log.progress_bar=False",
                   "--config.log.tensorboard=False"])
    config = fv.config
    config.unlock()
    config.task.eval_levels = (tuple(config.task.eval_levels[0]),)
    config.eval.seeds = (seed,)
    config.checkpoint.every_steps = 10**9  # only the final step is saved
    return config


def _evaluate(rt, params) -> dict:
    report = eval_runner.evaluate(rt, params, progress=False)
    (summary,) = report["sets"].values()
    return {"pass@1": summary["pass@1"]["mean"], "mean_length": summary["mean_length"]["mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sft", required=True, help="SFT checkpoint (run workdir or phase dir)")
    ap.add_argument("--configs", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval_problems", type=int, default=200)
    ap.add_argument("--eval_samples", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/compare_algorithms")
    ap.add_argument("--out", default="algorithms.json")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()

    results = json.load(open(args.out)) if os.path.isfile(args.out) else {"runs": []}
    done = {(r["config"], r["seed"]) for r in results["runs"]}
    sft_eval = results.setdefault("sft", {})
    for path in args.configs:
        name = os.path.splitext(os.path.basename(path))[0]
        for seed in args.seeds:
            if (name, seed) in done:
                continue
            config = _config(path, seed, args.steps, args.eval_problems, args.eval_samples)
            tokenizer = load_params(args.sft, *_mesh_and_rules(config))[2]
            workdir = os.path.join(args.workdir, f"{name}-s{seed}")
            rt = build_runtime(config, workdir, tokenizer=tokenizer)
            params, _, _, _ = load_params(args.sft, rt.mesh, rt.rules)
            if str(seed) not in sft_eval:
                sft_eval[str(seed)] = _evaluate(rt, params)
                print(f"[sft] seed {seed}: {sft_eval[str(seed)]}", flush=True)
            writer = MetricsWriter(workdir, tensorboard=False, console=False)
            t0 = time.time()
            trainer = RLTrainer(rt, writer, init_params=params)
            final = trainer.run(resume=False)
            seconds = time.time() - t0
            writer.close()
            after = _evaluate(rt, final)
            curve = [json.loads(line).get("reward/mean") for line in
                     open(os.path.join(workdir, "metrics.jsonl"))
                     if json.loads(line).get("phase") == "rl"]
            run = {"config": name, "seed": seed, "steps": args.steps, "rl_seconds": seconds,
                   "before": sft_eval[str(seed)], "after": after, "reward_curve": curve}
            results["runs"].append(run)
            print(f"[{name}] seed {seed}: {sft_eval[str(seed)]['pass@1']:.3f} -> "
                  f"{after['pass@1']:.3f}, {seconds:.0f} s", flush=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
            del trainer, final, params
    print(table(results))
    if args.plot:
        plot(results, args.plot)


def _mesh_and_rules(config):
    from jaxrl_reason.runtime import sharding as shd
    mesh = shd.make_mesh(dict(config.mesh))
    rules = tuple((n, tuple(a) if isinstance(a, (list, tuple)) else a)
                  for n, a in config.sharding_rules)
    return mesh, rules


def table(results) -> str:
    """Markdown table: config, pass@1 before -> after (mean ± 95% t-interval over seeds),
    mean length after, RL wall time per run."""
    from jaxrl_reason.evaluation.stats import mean_ci

    rows = ["| config | seeds | pass@1 before (%) | pass@1 after (%) | gain | length after | RL wall time |",
            "|---|---|---|---|---|---|---|"]
    names = list(dict.fromkeys(r["config"] for r in results["runs"]))
    for name in names:
        runs = [r for r in results["runs"] if r["config"] == name]
        before = [100 * r["before"]["pass@1"] for r in runs]
        after = [100 * r["after"]["pass@1"] for r in runs]
        gain = [a - b for a, b in zip(after, before)]
        fmt = lambda v: "{:.1f} ± {:.1f}".format(*mean_ci(v))  # noqa: E731
        rows.append(f"| {name} | {len(runs)} | {fmt(before)} | {fmt(after)} | {fmt(gain)} | "
                    f"{np.mean([r['after']['mean_length'] for r in runs]):.1f} | "
                    f"{np.mean([r['rl_seconds'] for r in runs]):.0f} s |")
    return "\n".join(rows)


def plot(results, path: str) -> None:
    """Reward curves (mean over seeds, 10-step moving average) of every config."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["config"] for r in results["runs"]):
        curves = [r["reward_curve"] for r in results["runs"] if r["config"] == name]
        n = min(len(c) for c in curves)
        mean = np.mean([c[:n] for c in curves], axis=0)
        k = min(10, n)
        smooth = np.convolve(mean, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, n + 1), smooth, label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward (10-step average)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
