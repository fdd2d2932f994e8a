r"""LoRA against full fine-tuning on the default arithmetic task, from one SFT checkpoint.

    python benchmarks/lora_vs_full.py --out docs/lora_vs_full.json
    python benchmarks/lora_vs_full.py --sft_checkpoint runs/x/checkpoints/sft   # reuse one
    python benchmarks/lora_vs_full.py --smoke --out /tmp/lvf.json              # seconds

One cold-start SFT (`jaxrl-reason sft --config configs/arith_grpo.py`, skipped with
--sft_checkpoint: a run workdir holding checkpoints/sft and tokenizer.model), then, one
process at a time, `jaxrl-reason train --resume` of configs/arith_grpo.py (full fine-tuning)
and configs/arith_grpo_lora.py (rank-8 adapters on every projection, the frozen SFT weights
as the base) in a workdir seeded with a copy of that SFT phase checkpoint and tokenizer: the
pipeline finds its SFT phase finished and goes on to evaluation, RL and evaluation. Both arms
get the same RL steps, seed, data order and evaluation problems and seeds; only the trainable
parameters (and LoRA's learning rate, the config's) differ. Repeat arms in --order
(full,lora,lora,full) to alternate which runs first.

Reported per arm, from its workdir's eval.json and metrics.jsonl and the process's rusage:
  - held-out pass@1 before and after RL (mean +- 95% t-interval over the eval seeds) and the
    gain, paired by eval seed (the same problems and sampling seeds before and after);
  - RL step time: the median over steps of the wall time between logged steps (sampling,
    scoring and update), and the median of the update alone (time/train_s);
  - the peak resident memory of the training process (ru_maxrss; XLA:CPU buffers live in
    host memory, so this covers the parameters, optimizer state and temporaries).
And LoRA minus full: the per-seed difference of the after-RL pass@1, with its t-interval.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARMS = {"full": "configs/arith_grpo.py", "lora": "configs/arith_grpo_lora.py"}
HELD_OUT = "levels 1-3 (held-out)"


def _run(argv: list[str], log: Path) -> dict:
    """Runs `argv` to completion with stdout/stderr in `log`; {wall_s, max_rss_gib}.
    RuntimeError naming the log when it fails."""
    start = time.perf_counter()
    with log.open("w") as out:
        env = {"JAX_PLATFORMS": "cpu", **os.environ}  # a CPU run: do not probe for a TPU
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}; see {log}")
    return {"wall_s": wall, "max_rss_gib": usage.ru_maxrss * 1024 / 2**30}  # KiB on Linux


def seed_workdir(sft_run: Path, workdir: Path) -> None:
    """A fresh `workdir` holding a copy of `sft_run`'s SFT phase checkpoint and tokenizer.
    ValueError when `workdir` exists (one run per workdir)."""
    if workdir.exists():
        raise ValueError(f"{workdir} exists; remove it or pick another --workdir")
    shutil.copytree(sft_run / "checkpoints" / "sft", workdir / "checkpoints" / "sft")
    shutil.copy2(sft_run / "tokenizer.model", workdir / "tokenizer.model")


def _cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from jaxrl_reason.cli import main; "
            "sys.exit(main())"]


def _config(path: str, smoke: bool) -> str:
    return path + (":smoke" if smoke else "")


def _pass1(report: dict, eval_set: str) -> list[float]:
    """Per-eval-seed pass@1 values of one evaluation report's `eval_set`."""
    sets = report["sets"]
    if eval_set not in sets:
        raise KeyError(f"eval set {eval_set!r} not in the report (sets: {sorted(sets)})")
    return [float(v) for v in sets[eval_set]["pass@1"]["values"]]


def _interval(values: list[float]) -> dict:
    """{mean, ci95, values} of per-seed values (Student t over the seeds)."""
    from jaxrl_reason.evaluation.stats import mean_ci
    mean, half = mean_ci(values)
    return {"mean": mean, "ci95": half, "values": values}


def _step_times(metrics: Path) -> dict:
    """Median RL step wall time (between consecutive logged steps) and update time, in s.
    The first step (compilation) is left out."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rl = sorted((r for r in rows if r.get("phase") == "rl" and "time/train_s" in r),
                key=lambda r: r["step"])
    if len(rl) < 3:
        raise ValueError(f"{metrics}: fewer than 3 RL steps logged")
    gaps = [b["time"] - a["time"] for a, b in zip(rl[1:], rl[2:]) if b["step"] == a["step"] + 1]
    return {"step_s_median": statistics.median(gaps),
            "update_s_median": statistics.median(r["time/train_s"] for r in rl[1:]),
            "sample_s_median": statistics.median(r["time/sample_s"] for r in rl[1:]),
            "steps": len(rl)}


def arm_result(workdir: Path, eval_set: str) -> dict:
    """The figures of one finished `train --init_checkpoint` workdir."""
    reports = json.loads((workdir / "eval.json").read_text())
    before, after = (_pass1(reports["reports"][k], eval_set) for k in ("sft", "rl"))
    gain = [b - a for a, b in zip(before, after)]
    return {"pass@1_before": _interval(before), "pass@1_after": _interval(after),
            "pass@1_gain": _interval(gain), **_step_times(workdir / "metrics.jsonl"),
            "rl_s": reports["timings"]["rl_s"], "table": reports["table"]}


def summary(arms: dict) -> dict:
    """Per arm: pass@1 (first run) and the mean over its runs of the timings and memory."""
    out = {}
    for arm, runs in arms.items():
        first = runs[0]
        out[arm] = {k: first[k] for k in ("pass@1_before", "pass@1_after", "pass@1_gain")}
        for key in ("step_s_median", "update_s_median", "sample_s_median", "rl_s",
                    "max_rss_gib"):
            out[arm][key] = statistics.mean(r[key] for r in runs)
        out[arm]["runs"] = len(runs)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="runs/lora_vs_full",
                        help="parent of the sft/, full/ and lora/ run directories")
    parser.add_argument("--sft_checkpoint", default="",
                        help="reuse the SFT of this run workdir of configs/arith_grpo.py "
                             "(checkpoints/sft, tokenizer.model) instead of running one")
    parser.add_argument("--order", default="full,lora",
                        help="arms in the order they run (comma-separated; repeats allowed, "
                             "e.g. full,lora,lora,full)")
    parser.add_argument("--smoke", action="store_true", help="the configs' :smoke variants")
    parser.add_argument("--override", action="append", default=[],
                        help="extra --config.X=Y flag for both arms (repeatable)")
    parser.add_argument("--out", default="docs/lora_vs_full.json")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    unknown = sorted(set(order) - set(ARMS))
    if unknown:
        raise SystemExit(f"--order: unknown arms {unknown}; known: {sorted(ARMS)}")
    root = Path(args.workdir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    result = {"command": "python " + " ".join(["benchmarks/lora_vs_full.py"] + sys.argv[1:]),
              "load_average_start": os.getloadavg(), "cpu_count": os.cpu_count(), "arms": {}}

    sft = Path(args.sft_checkpoint).resolve() if args.sft_checkpoint else root / "sft"
    if not args.sft_checkpoint:
        result["sft"] = _run(_cli() + ["sft", "--config", _config(ARMS["full"], args.smoke),
                                       "--workdir", str(sft)], root / "sft.log")
    for need in ("checkpoints/sft", "tokenizer.model"):
        if not (sft / need).exists():
            raise SystemExit(f"--sft_checkpoint {sft}: no {need} (give the SFT run's workdir)")
    result["sft_checkpoint"] = str(sft / "checkpoints" / "sft")

    for i, arm in enumerate(order):
        workdir = root / f"{arm}{i}"
        seed_workdir(sft, workdir)
        flags = ["train", "--config", _config(ARMS[arm], args.smoke), "--workdir",
                 str(workdir), "--resume", "--config.log.progress_bar=False",
                 *[f"--config.{o}" for o in args.override]]
        print(f"[lora_vs_full] {arm}: {' '.join(flags)}", flush=True)
        proc = _run(_cli() + flags, root / f"{arm}{i}.log")
        result["arms"].setdefault(arm, []).append(
            {**proc, **arm_result(workdir, HELD_OUT), "workdir": str(workdir)})
        print(f"[lora_vs_full] {arm}: gain "
              f"{result['arms'][arm][-1]['pass@1_gain']['mean']:+.4f}, "
              f"{proc['wall_s']:.0f} s", flush=True)

    result["summary"] = summary(result["arms"])
    if "full" in result["arms"] and "lora" in result["arms"]:
        full, lora = result["arms"]["full"][0], result["arms"]["lora"][0]
        diff = [b - a for a, b in zip(full["pass@1_after"]["values"],
                                      lora["pass@1_after"]["values"])]
        result["lora_minus_full_pass@1_after"] = _interval(diff)
    result["load_average_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "arms"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
