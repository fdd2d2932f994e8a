"""How an evaluation report is shown: the markdown table of its metrics, its accuracy curves
as text and as a PNG (matplotlib, optional), `compare`'s pass@k curves, and the JSON file
written atomically. Pure functions of the report dictionaries `runner` builds."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_reason.evaluation import pass_at_k as evaluation

REPORT_METRICS = ("pass@1", "maj@{n}", "best_of@{n}", "pass@{n}", "mean_length")


def _plot_panels(path: str, panels: Mapping[str, tuple[Sequence[int], Mapping[str, Any]]], *,
                 xlabel: str, ylabel: str, ticks=None) -> str | None:
    """One panel per set: each series' mean (x100) against k on a log2 axis with its 95%
    interval shaded, saved as a PNG at `path`. `panels`: {set: (ks, {label: {"mean": [K],
    "ci95": [K]}})}; `ticks(ks)` gives the x ticks (default: every k). Returns the path, or
    None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (name, (ks, series)) in zip(axes[0], panels.items()):
        ks = np.asarray(ks)
        for label, values in series.items():
            mean = 100 * np.asarray(values["mean"], float)
            half = 100 * np.nan_to_num(np.asarray(values["ci95"], float))
            ax.plot(ks, mean, marker="o", markersize=3, label=label)
            ax.fill_between(ks, mean - half, mean + half, alpha=0.2)
        ax.set_xscale("log", base=2)
        shown = ks if ticks is None else ticks(ks)
        ax.set_xticks(shown, [str(k) for k in shown])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_curves(report: Mapping[str, Any], path: str) -> str | None:
    """Draws each set's accuracy curves (pass@k, maj@k, best_of@k against k, log2 axis,
    95% intervals shaded) into one PNG at `path`; returns the path, or None when matplotlib
    is not installed or the report has no curves."""
    curves = report.get("curves") or {}
    if not curves:
        return None
    panels = {name: (curve["k"], {m: curve[m] for m in ("pass@k", "maj@k", "best_of@k")
                                  if m in curve})
              for name, curve in curves.items()}
    return _plot_panels(path, panels, xlabel="samples per problem (k)",
                        ylabel="accuracy (%)")


def format_curves(report: Mapping[str, Any]) -> str:
    """The curves as text, one line per set and metric: 'set  maj@k  k=1: 41.0  k=2: ...'."""
    lines = []
    for name, curve in (report.get("curves") or {}).items():
        for metric, values in curve.items():
            if metric == "k":
                continue
            cells = "  ".join(f"k={k}: {100 * m:.1f}" for k, m in zip(curve["k"], values["mean"]))
            lines.append(f"{name}  {metric}  {cells}")
    return "\n".join(lines)


def report_metrics(num_samples: int) -> list[str]:
    """The metric columns of the printed table for n samples per problem."""
    cols = [m.format(n=num_samples) for m in REPORT_METRICS]
    return list(dict.fromkeys(c for c in cols if num_samples > 1 or "@1" in c or "@" not in c))


def comparison_table(reports: Mapping[str, Mapping[str, Any]], num_samples: int,
                     show_std: bool = False) -> str:
    """One markdown table: rows '<checkpoint>: <set>', columns `report_metrics`; with
    `show_std` each cell also gives the standard deviation over seeds."""
    rows = {f"{ckpt}: {name}": summary for ckpt, rep in reports.items()
            for name, summary in rep["sets"].items()}
    return evaluation.format_table(rows, report_metrics(num_samples), show_std=show_std)


def write_report(path: str, reports: Mapping[str, Any]) -> None:
    """Writes the JSON report (atomically: temp file + rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(reports, f, indent=1, default=float)
    os.replace(tmp, path)


def format_pass_at_k(result: Mapping[str, Any]) -> str:
    """`compare`'s pass@k curves as text: one line per set and checkpoint,
    'set  A  k=1: 49.9  k=2: 58.1 ...' (percent, means over seeds)."""
    lines = []
    for name, curve in result["pass_at_k"].items():
        for label in result["labels"]:
            cells = "  ".join(f"k={k}: {100 * m:.1f}"
                              for k, m in zip(curve["k"], curve[label]["mean"]))
            lines.append(f"{name}  {label}  {cells}")
    return "\n".join(lines)


def plot_pass_at_k(result: Mapping[str, Any], path: str) -> str | None:
    """Draws `compare`'s pass@k curves (k = 1..n, log2 axis, 95% intervals over seeds
    shaded), both checkpoints on one panel per set, into a PNG at `path`; returns the path,
    or None when matplotlib is not installed (the numbers are in the JSON report)."""
    panels = {name: (curve["k"], {label: curve[label] for label in result["labels"]})
              for name, curve in result["pass_at_k"].items()}
    return _plot_panels(path, panels, xlabel="k (samples per problem)", ylabel="pass@k (%)",
                        ticks=lambda ks: evaluation.curve_ks(int(ks[-1])))
