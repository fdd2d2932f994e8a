"""The report of benchmarks/learning_vs_trl.py (its `report` subcommand): every seed's
evaluations and step times gathered into one JSON and one plot.

Reads a finished workdir (benchmarks/learning_vs_trl.sh): plan.json, and per seed k
seed<k>/eval.json (pass@1 of the SFT start and of both sides' checkpoints),
seed<k>/ours/metrics.jsonl and eval.json (our step times, total RL time),
seed<k>/trl/timing.json (TRL's step times and log history), seed<k>/ours.timed.json and
trl.timed.json (each training run's threads, pinned cores, load average and matmul probe
before, during and after it: the `timed` subcommand). Writes the JSON report (curves of
pass@1 and wall time per step, mean, 95% t-interval and per-seed values over seeds; each
run's record) and a PNG of pass@1 against step and against wall time. Refuses to write
either (SystemExit, status 1) when a training run's load average passed
LOAD_LIMIT_PER_CORE per pinned core, unless it is a pipeline check, whose JSON records the
breach instead. Imports neither torch nor jax at the top.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from learning_vs_trl import LOAD_LIMIT_PER_CORE, load_violations, read_jsonl


def interval(values: Sequence[float]) -> dict[str, Any]:
    """{mean, low, high, n, values} of the 95% t-interval over seeds (low/high None for one
    seed; values: the seeds' own, in seed order)."""
    from jaxrl_reason.evaluation.stats import mean_ci

    mean, half = mean_ci(values)
    ok = math.isfinite(half)
    return {"mean": mean, "low": mean - half if ok else None,
            "high": mean + half if ok else None, "n": len(values),
            "values": [float(v) for v in values]}


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


def read_timed(seed_dir: str) -> dict[str, dict[str, Any]]:
    """{side: record} of a seed's two training runs (`timed` subcommand); ValueError naming
    the file when one is missing (a workdir from before the records, or a run that failed)."""
    runs = {}
    for side in ("ours", "trl"):
        path = os.path.join(seed_dir, f"{side}.timed.json")
        if not os.path.exists(path):
            raise ValueError(f"{path}: no record of the {side} training run (threads, load "
                             "average, probe); re-take it with benchmarks/learning_vs_trl.sh")
        with open(path) as f:
            runs[side] = json.load(f)
    return runs


def load_check(runs: Mapping[Any, Mapping[str, Mapping[str, Any]]], pipeline_check: bool,
               out: str) -> dict[str, Any]:
    """The report's `load_check` entry; SystemExit (status 1, naming the runs) when a
    training run's load average passed LOAD_LIMIT_PER_CORE per pinned core, unless this is a
    pipeline check (its JSON then records the breach: `enforced` false)."""
    bad = load_violations(runs)
    if bad and not pipeline_check:
        raise SystemExit(
            f"learning_vs_trl report: refusing to write {out}: the load average passed "
            f"{LOAD_LIMIT_PER_CORE} per pinned core during " + "; ".join(bad) + ". Wall times "
            "taken on a loaded machine say nothing about speed: re-take those runs on a quiet "
            "machine (delete seed<k>/<side>.done and rerun with RESUME=1).")
    return {"limit_per_core": LOAD_LIMIT_PER_CORE, "violations": bad,
            "enforced": not pipeline_check}


def cmd_report(a) -> None:
    """Gathers every seed's evals and timings into --out (JSON) and --plot (PNG)."""
    with open(os.path.join(a.workdir, "plan.json")) as f:
        plan = json.load(f)
    sides: dict[str, dict[int, dict[int, tuple[float, float]]]] = {"ours": {}, "trl": {}}
    totals: dict[str, list[float]] = {"ours": [], "trl": []}
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    trl_versions, batch_correct = None, {}
    for seed in plan["seeds"]:
        d = os.path.join(a.workdir, f"seed{seed}")
        runs[seed] = read_timed(d)
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
        runs[seed]["ours"]["train_s"] = totals["ours"][-1]
        runs[seed]["trl"]["train_s"] = trl["train_s"]
        runs[seed]["trl"]["torch_threads"] = trl["torch_threads"]
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
    checked = load_check(runs, a.pipeline_check, a.out)
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
           "runs": {"note": "per seed and side, the training run: train_s (ours: rl_s of its "
                             "eval.json; TRL: trainer.train), wall_s (the whole process), "
                             "threads per process and pinned cores, the 1-minute load average "
                             "before / every sample_s during / after it (load_peak the "
                             "highest), numpy matmul GFLOP/s before and after",
                    "by_seed": {str(seed): r for seed, r in runs.items()}},
           "load_check": checked,
           "load_average": {"plan": plan["load_average"]}}
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
