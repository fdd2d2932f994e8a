"""Renders the README's results table from the eval.json that `jaxrl-reason train` writes,
or from several runs that differ only in their training seed.

    python scripts/results_table.py runs/arith_grpo/eval.json                 # print it
    python scripts/results_table.py docs/default_run_eval.json --write README.md
    python scripts/results_table.py docs/default_run_eval.json --check README.md
    # several training seeds: mean ± t-interval over the runs; --save keeps them in one file
    python scripts/results_table.py runs/arith_grpo_seed{0,1,2}/eval.json \
        --save docs/default_run_seeds.json
    python scripts/results_table.py docs/default_run_seeds.json --check README.md

The table sits in README.md between the lines `<!-- results:begin -->` and
`<!-- results:end -->`. `--write` replaces what is between them; `--check` exits 1 when it
differs from what the JSON gives (and says which line), so a hand-edited number cannot stay.

Input: the file `jaxrl-reason train` writes at `<workdir>/eval.json`,
`{"reports": {checkpoint: {"sets": {set: {metric: {"mean", "ci95", ...}}}, "config":
{"num_samples", "seeds", "temperature", ...}}}, "timings": {...}}`; checkpoints are named
`sft`, `init`, `base` (the starting point) and `rl`. Metrics are fractions (pass@1, maj@k,
pass@k) or token counts (mean_length). With several runs (or a file `--save` wrote,
`{"command", "runs": [{"seed", "source", "eval"}]}`), a cell is the mean over the runs of
each run's mean (over its sampling seeds) ± the half-width of the 95% Student-t interval
over the runs (`jaxrl_reason.evaluation.stats.mean_ci`; one run alone needs the standard
library only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
DEFAULT_COMMAND = "jaxrl-reason train --config configs/arith_grpo.py"
SEEDS_COMMAND = DEFAULT_COMMAND + " --config.seed=S --workdir runs/arith_grpo_seedS"
CHECKPOINT_LABELS = {"sft": "SFT", "init": "init checkpoint", "base": "base model",
                     "rl": "RL"}
TIMING_LABELS = (("sft_s", "SFT"), ("eval_before_s", "evaluation before"),
                 ("rl_s", "RL"), ("eval_after_s", "evaluation after"))


class ResultsError(ValueError):
    """Bad input: the message names the file and the key or line at fault."""


def _get(mapping: Any, key: str, where: str) -> Any:
    """mapping[key], or a ResultsError naming `where` (a path such as `reports.sft`)."""
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise ResultsError(f"{where}: missing key {key!r}")
    return mapping[key]


def load_eval(path: str) -> dict:
    """The parsed eval.json of a train run; ResultsError if it is not one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ResultsError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not JSON: {e}") from None
    reports = _get(data, "reports", path)
    if not isinstance(reports, Mapping) or not reports:
        raise ResultsError(f"{path}: 'reports' holds no checkpoint (is this the eval.json "
                           f"of `jaxrl-reason train`?)")
    return data


def num_samples(data: Mapping, where: str) -> int:
    """k, the samples per problem of every report (they must agree)."""
    ks = {name: _get(_get(rep, "config", f"{where}: reports.{name}"), "num_samples",
                     f"{where}: reports.{name}.config")
          for name, rep in data["reports"].items()}
    if len(set(ks.values())) != 1:
        raise ResultsError(f"{where}: checkpoints were evaluated with different numbers of "
                           f"samples per problem: {ks}")
    return int(next(iter(ks.values())))


def format_cell(summary: Mapping, scale: float, where: str) -> str:
    """'mean ± ci95' of one metric's summary over seeds, times `scale`, one decimal."""
    mean = _get(summary, "mean", where)
    ci = _get(summary, "ci95", where)
    return f"{scale * float(mean):.1f} ± {scale * float(ci):.1f}"


def table_lines(data: Mapping, where: str) -> list[str]:
    """The markdown table: a row per (checkpoint, eval set), columns pass@1, maj@k, pass@k
    (%) and mean length (tokens)."""
    k = num_samples(data, where)
    columns = (("pass@1", 100.0, "pass@1 (%)"), (f"maj@{k}", 100.0, f"maj@{k} (%)"),
               (f"pass@{k}", 100.0, f"pass@{k} (%)"),
               ("mean_length", 1.0, "mean length (tokens)"))
    lines = ["| checkpoint: eval set | " + " | ".join(c[2] for c in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for name, report in data["reports"].items():
        sets = _get(report, "sets", f"{where}: reports.{name}")
        label = CHECKPOINT_LABELS.get(name, name)
        for set_name, metrics in sets.items():
            cells = [format_cell(_get(metrics, key, f"{where}: reports.{name}.sets."
                                                     f"{set_name}"),
                                 scale, f"{where}: reports.{name}.sets.{set_name}.{key}")
                     for key, scale, _ in columns]
            lines.append(f"| {label}: {set_name} | " + " | ".join(cells) + " |")
    return lines


def caption_lines(data: Mapping, json_path: str, command: str, seed: int) -> list[str]:
    """What produced the table and where its numbers live; the sampling settings; the wall
    time when the JSON has it."""
    k = num_samples(data, json_path)
    config = next(iter(data["reports"].values()))["config"]
    seeds = config.get("seeds", [])
    temperature = config.get("temperature")
    lines = [f"Produced by `{command}` (seed {seed}); the numbers are in `{json_path}`. "
             f"{k} samples per problem"
             + (f" at temperature {temperature}" if temperature is not None else "")
             + f"; mean ± 95% t-interval over {len(seeds)} sampling seeds."]
    timings = data.get("timings") or {}
    if "total_s" in timings:
        parts = ", ".join(f"{label} {float(timings[key]):.0f} s"
                          for key, label in TIMING_LABELS if key in timings)
        lines.append(f"Wall time {float(timings['total_s']) / 60:.1f} min ({parts}).")
    return lines


def run_seed(json_path: str, given: int | None) -> int:
    """The training seed the caption states: `given` (--seed), else `seed` of the run's
    config.json beside the JSON (what `jaxrl-reason train` writes), else 0 (the configs'
    default). A --seed that contradicts config.json is an error."""
    config_path = os.path.join(os.path.dirname(os.path.abspath(json_path)), "config.json")
    stored = None
    if os.path.isfile(config_path):
        try:
            with open(config_path) as f:
                stored = json.load(f).get("seed")
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            raise ResultsError(f"{config_path}: cannot read the run's seed: {e}") from None
    if given is not None and stored is not None and int(stored) != given:
        raise ResultsError(f"--seed {given} contradicts seed {stored} in {config_path}")
    return given if given is not None else int(stored) if stored is not None else 0


def render_block(data: Mapping, json_path: str, command: str = DEFAULT_COMMAND,
                 seed: int = 0) -> str:
    """The text between the markers (no markers), ending in a newline."""
    lines = caption_lines(data, json_path, command, seed) + [""]
    return "\n".join(lines + table_lines(data, json_path)) + "\n"


def load_runs(paths: Sequence[str], seeds: Sequence[int] | None = None) -> list[dict]:
    """[{"seed", "source", "eval"}] of the given files: eval.json files of train runs (each
    seed from `seeds`, else from `run_seed`) or one file `--save` wrote. ResultsError when
    seeds repeat or the runs were evaluated differently."""
    if len(paths) == 1:
        data = _read_json(paths[0])
        if isinstance(data, Mapping) and "runs" in data:
            runs = _get(data, "runs", paths[0])
            if not isinstance(runs, list) or not runs:
                raise ResultsError(f"{paths[0]}: 'runs' must be a non-empty list")
            out = [{"seed": int(_get(r, "seed", f"{paths[0]}: runs[{i}]")),
                    "source": str(_get(r, "source", f"{paths[0]}: runs[{i}]")),
                    "eval": _get(r, "eval", f"{paths[0]}: runs[{i}]")}
                   for i, r in enumerate(runs)]
            for i, r in enumerate(out):
                _get(r["eval"], "reports", f"{paths[0]}: runs[{i}].eval")
            _check_alike(out, paths[0])
            return out
    if seeds is not None and len(seeds) != len(paths):
        raise ResultsError(f"--seed gives {len(seeds)} seeds for {len(paths)} files")
    out = [{"seed": run_seed(p, None if seeds is None else seeds[i]), "source": p,
            "eval": load_eval(p)} for i, p in enumerate(paths)]
    _check_alike(out, ", ".join(paths))
    return out


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ResultsError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not JSON: {e}") from None


def _check_alike(runs: list[dict], where: str) -> None:
    """The runs differ in their seed only: distinct seeds, the same checkpoints and sets,
    samples per problem, sampling seeds and temperature."""
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ResultsError(f"{where}: training seeds repeat ({seeds}); each run must have "
                           f"its own config.seed")
    first = runs[0]

    def shape(run: dict) -> tuple:
        reports = run["eval"]["reports"]
        config = {name: _get(rep, "config", f"{run['source']}: reports.{name}")
                  for name, rep in reports.items()}
        return ([(name, list(_get(rep, "sets", f"{run['source']}: reports.{name}")))
                 for name, rep in reports.items()],
                [(c.get("num_samples"), list(c.get("seeds", [])), c.get("temperature"))
                 for c in config.values()])
    for run in runs[1:]:
        if shape(run) != shape(first):
            raise ResultsError(f"{run['source']}: evaluated other checkpoints, sets or "
                               f"sampling settings than {first['source']}")


def combine_runs(runs: list[dict]) -> dict:
    """One eval.json-shaped dict from runs of `load_runs`: each metric's "mean" the mean over
    the runs of their means, "ci95" the half-width of its t-interval over the runs (NaN for
    one run), "values" the runs' means in run order."""
    from jaxrl_reason.evaluation.stats import mean_ci

    first = runs[0]["eval"]
    reports = {}
    for name, report in first["reports"].items():
        sets = {}
        for set_name, metrics in report["sets"].items():
            sets[set_name] = {}
            for key in metrics:
                values = [float(_get(_get(r["eval"]["reports"][name]["sets"][set_name], key,
                                          f"{r['source']}: reports.{name}.sets.{set_name}"),
                                     "mean", f"{r['source']}: reports.{name}.sets.{set_name}"
                                             f".{key}")) for r in runs]
                mean, half = mean_ci(values)
                sets[set_name][key] = {"mean": mean, "ci95": half, "values": values}
        reports[name] = {"sets": sets, "config": report["config"]}
    return {"reports": reports}


def render_runs_block(runs: list[dict], json_path: str, command: str = SEEDS_COMMAND) -> str:
    """The block of several training seeds: caption, each seed's pass@1 on every
    checkpoint's first set, and the table of means ± t-intervals over the seeds."""
    data = combine_runs(runs)
    k = num_samples(data, json_path)
    config = next(iter(data["reports"].values()))["config"]
    seeds = ", ".join(str(r["seed"]) for r in runs)
    temperature = config.get("temperature")
    lines = [f"Produced by `{command}` for S = {seeds}, one training run each; the numbers "
             f"are in `{json_path}`. {k} samples per problem"
             + (f" at temperature {temperature}" if temperature is not None else "")
             + f"; a cell is the mean over the {len(runs)} training seeds of each run's mean "
             f"over {len(config.get('seeds', []))} sampling seeds, ± the 95% t-interval over "
             f"the training seeds."]
    spread = []
    for name, report in data["reports"].items():
        set_name, metrics = next(iter(report["sets"].items()))
        values = ", ".join(f"{100 * v:.1f}" for v in metrics["pass@1"]["values"])
        spread.append(f"{CHECKPOINT_LABELS.get(name, name)} {values}")
    lines.append(f"pass@1 (%) on {first_sets(data)[0]} by training seed: "
                 + "; ".join(spread) + ".")
    return "\n".join(lines + [""] + table_lines(data, json_path)) + "\n"


def first_sets(data: Mapping) -> list[str]:
    """The eval set names of the first checkpoint, in order."""
    return list(next(iter(data["reports"].values()))["sets"])


def save_runs(runs: list[dict], path: str, command: str) -> None:
    """Write the runs (seed, source, whole eval.json) to one file `load_runs` reads."""
    with open(path, "w") as f:
        json.dump({"command": command, "runs": runs}, f, indent=1, sort_keys=True)
        f.write("\n")


def split_document(text: str, where: str) -> tuple[str, str, str]:
    """(before and including BEGIN's line, the block, END's line and after)."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < 0:
        missing = BEGIN if begin < 0 else END
        raise ResultsError(f"{where}: no {missing!r} line: put the results table between "
                           f"{BEGIN} and {END}")
    if text.count(BEGIN) > 1 or text.count(END) > 1:
        raise ResultsError(f"{where}: the markers {BEGIN} / {END} must appear once each")
    if end < begin:
        raise ResultsError(f"{where}: {END} comes before {BEGIN}")
    head_end = text.index("\n", begin) + 1
    return text[:head_end], text[head_end:end], text[end:]


def first_difference(expected: str, found: str) -> str:
    """A one-line description of the first line where two blocks differ."""
    want, got = expected.splitlines(), found.splitlines()
    for i in range(max(len(want), len(got))):
        a = want[i] if i < len(want) else "<nothing>"
        b = got[i] if i < len(got) else "<nothing>"
        if a != b:
            return f"line {i + 1} of the block: expected {a!r}, found {b!r}"
    return "trailing whitespace differs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("eval_json", nargs="+", help="eval.json written by `jaxrl-reason "
                        "train` (several: runs that differ in their training seed), or a "
                        "file --save wrote")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="MD", help="replace the table between the markers")
    mode.add_argument("--check", metavar="MD", help="exit 1 if the table between the "
                      "markers differs from what the JSON gives")
    parser.add_argument("--command", default=None,
                        help="the command that wrote the JSON, as the caption states it")
    parser.add_argument("--seed", type=int, nargs="+", default=None, help="the runs' "
                        "config.seed, one per file (default: from config.json beside each "
                        "JSON, else 0)")
    parser.add_argument("--save", metavar="JSON", help="with several runs: also write them "
                        "to one file (what the README's block then names)")
    args = parser.parse_args(argv)
    try:
        paths = args.eval_json
        first = _read_json(paths[0]) if len(paths) == 1 else None
        single = len(paths) == 1 and not (isinstance(first, Mapping) and "runs" in first)
        if single:
            if args.save:
                raise ResultsError("--save needs several runs")
            if args.seed is not None and len(args.seed) != 1:
                raise ResultsError(f"--seed gives {len(args.seed)} seeds for one file")
            source = paths[0]
            block = render_block(load_eval(source), source, args.command or DEFAULT_COMMAND,
                                 run_seed(source, None if args.seed is None else args.seed[0]))
        else:
            runs = load_runs(paths, args.seed)
            command = args.command or SEEDS_COMMAND
            if args.save:
                save_runs(runs, args.save, command)
            source = args.save or paths[0]
            if len(paths) > 1 and not args.save and (args.write or args.check):
                raise ResultsError("several runs: --save them to one file and name that file "
                                   "in --write/--check's block")
            block = render_runs_block(runs, source, command)
        if not (args.write or args.check):
            sys.stdout.write(block)
            return 0
        target = args.write or args.check
        try:
            with open(target) as f:
                text = f.read()
        except OSError as e:
            raise ResultsError(f"{target}: cannot read: {e.strerror}") from None
        head, found, tail = split_document(text, target)
        if args.check:
            if found != block:
                print(f"{target}: the results table differs from {source} "
                      f"({first_difference(block, found)}); regenerate it with "
                      f"`python scripts/results_table.py {source} --write {target}`",
                      file=sys.stderr)
                return 1
            print(f"{target}: the results table matches {source}")
            return 0
        with open(target, "w") as f:
            f.write(head + block + tail)
        print(f"{target}: results table written from {source}")
        return 0
    except ResultsError as e:
        print(f"results_table: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
