"""Plots the RL reward/accuracy curves of one or more runs from their metrics.jsonl.

    python scripts/plot_rewards.py runs/arith_grpo --out docs/reward_curve.png
    python scripts/plot_rewards.py runs/a runs/b --labels a,b --out curves.png

Needs matplotlib (in the `dev` extra).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from jaxrl_reason.runtime.metrics import read_metrics


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (window clipped at the start)."""
    out = np.empty_like(values, dtype=float)
    for i in range(len(values)):
        out[i] = np.nanmean(values[max(0, i - window + 1): i + 1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run workdirs (or metrics.jsonl files)")
    parser.add_argument("--labels", default="", help="comma-separated legend labels")
    parser.add_argument("--out", required=True, help="output PNG path")
    parser.add_argument("--window", type=int, default=10, help="moving-average window")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels.split(",") if args.labels else [os.path.basename(r.rstrip("/"))
                                                         for r in args.runs]
    keys = [("reward/mean", "reward (correctness + 0.1 format)"),
            ("accuracy", "training accuracy (T=1 rollouts)"),
            ("completion/length_mean", "completion length (tokens)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6))
    for run, label in zip(args.runs, labels):
        rows = read_metrics(run, phase="rl")
        steps = np.array([r["step"] for r in rows])
        for ax, (key, title) in zip(axes, keys):
            values = np.array([r.get(key, np.nan) for r in rows], dtype=float)
            ax.plot(steps, values, alpha=0.25)
            ax.plot(steps, smooth(values, args.window), label=label, color=ax.lines[-1].get_color())
            ax.set_title(title)
            ax.set_xlabel("RL step")
    axes[0].legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
