r"""Throughput and latency of the `correctness` verifier inside `RewardPool`, today's beside
an older one, measured in the same run.

    python benchmarks/verifiers.py --json docs/verifier_speed.json    # ~5 min on 2 cores
    python benchmarks/verifiers.py --workers 1 2 4 --clean 512 --isolation off bwrap

Builds a fixed-seed set of realistic math completions (R1-style `<think>...</think>
<answer>...</answer>` or a `\boxed{}` ending after a few hundred to a few thousand characters
of reasoning, or a closing "The answer is \(...\)." that also goes to math-verify's own
extraction) with gold answers: integers and GSM8K `#### N` keys, fractions, decimals,
percentages, LaTeX expressions that need sympy, sets, intervals, tuples, matrices and
equations, about half of them wrong. Then, for each thread count W, in
`RewardPool({"correctness": 1.0}, num_workers=W)`, `--repeats` times and alternating
between the verifiers batch by batch (so a change of load on a shared machine hits both):

  * cold: answers/second on the clean set with the sympy pool's verdict cache emptied
    first, so that every distinct answer pays its worker job, as new model outputs do;
    p50/p99 latency of one `correctness` call in these batches (a timing wrapper registered
    as another reward);
  * cached: the same batch again right after (repeated answer/gold pairs, and the parent's
    own work: extraction, normalization, the exact number and word rules);
  * the wall time of a 256-item batch of which 5% are adversarial (power towers, a
    million-character completion, 10^4 nested braces, `(10^{9999})^{9999}`, which the
    syntax-tree builder refuses, and a sum of sines of 10^{59940}-sized integers, which it
    admits and which is cut at the deadline).

Today's verifier prepares each batch before its calls (`correctness_prefetch`, run by
`RewardPool`): the parent extracts and decides what it can, and the comparisons left go to
worker jobs of many comparisons each (one per sympy worker at once, whatever W), run first
by the W threads; its calls then mostly find their verdicts decided, so its per-call
latencies leave out those jobs. The prefetch tasks' count (a task runs one job or several at
once), their p99 wall time and the preparation time are reported beside; the batch's
answers/s counts all of it.

The older verifiers are those of `--old-rev` (by default the syntax-tree sympy verifier that
preceded math-verify; several revisions may be given), loaded from git next to today's by
`_old_verifier.py`. Isolation modes (`--isolation`): "bwrap" (the default: each zygote under
bubblewrap with its own uid, no capabilities, new pid/net/mount namespaces) and "off" (the
zygotes run as the trainer's own user). The older verifiers fork one job per comparison. Per
verifier and mode, the zygotes' start-up (cold) and the rate of raw sympy comparisons
(`SympyPool.compare` on distinct pairs from 2 threads, no string fast paths) are reported
too, and the ratios of today's throughput and p99 to the older one's; the JSON also keeps
the machine's load average at the start and the end of the run (others' jobs on a shared
machine slow every verifier; only ratios within one run compare). The verdicts are
checked against the labels below (today's conventions: a tuple is not a column vector; `i`
is a variable, as in latex2sympy), so a regression in correctness also shows up here; one
known miss of today's verifier is kept labelled as the mathematics says (`x<1 \text{ or }
x>2` is the union of two rays).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_probe import require_quiet  # noqa: E402  (benchmarks/ is on the path)

# (gold answer key, spellings a model might give that are correct, wrong spellings)
_CASES = [
    ("72", ["72", "72.0", "\\$72", "72 clips"], ["71", "720"]),
    ("#### 1,200", ["1200", "1,200", "\\$1{,}200"], ["120", "1210"]),
    ("18", ["18", "\\text{18 dollars}"], ["16"]),
    ("\\frac{3}{4}", ["\\dfrac{3}{4}", "0.75", "3/4", "\\frac34"], ["\\frac{4}{3}", "0.7"]),
    ("-\\frac{1}{2}", ["-0.5", "-\\tfrac12", "\\frac{-1}{2}"], ["\\frac12"]),
    ("2\\frac{1}{2}", ["2.5", "\\frac{5}{2}"], ["1"]),
    ("12.5\\%", ["12.5\\%", "0.125", "\\frac18"], ["1.25"]),
    ("1.5\\times10^{3}", ["1500", "1.5e3"], ["150"]),
    ("90^\\circ", ["90", "90^{\\circ}"], ["\\frac{\\pi}{2}", "45^\\circ"]),
    ("2\\sqrt{3}", ["\\sqrt{12}", "2 \\sqrt 3"], ["3\\sqrt{2}", "3.46"]),
    ("\\frac{\\sqrt{2}}{2}", ["\\frac{1}{\\sqrt{2}}", "\\sqrt{\\frac12}"], ["\\sqrt{2}"]),
    ("\\frac{\\pi}{3}", ["\\frac{1}{3}\\pi", "\\pi/3"], ["\\frac{\\pi}{6}"]),
    ("x^2+2x+1", ["(x+1)^2", "x^2 + 2x + 1"], ["(x-1)^2", "x^2+1"]),
    ("a^2+2ab+b^2", ["(a+b)^2"], ["(a-b)^2"]),
    ("\\frac{x+2}{7}", ["\\frac{x}{7}+\\frac{2}{7}"], ["\\frac{x+2}{8}"]),
    ("y = 2x + 1", ["2x+1", "y=1+2x"], ["2x-1"]),
    ("3x+4y=20", ["y=-\\frac{3}{4}x+5", "6x+8y=40"], ["3x+4y=21"]),
    ("\\{1, 2, 3\\}", ["\\{3,1,2\\}", "1, 2, 3", "3,2,1"], ["\\{1,2\\}", "1,2,4"]),
    ("1 \\pm \\sqrt{5}", ["1+\\sqrt{5}, 1-\\sqrt{5}"], ["1+\\sqrt{5}"]),
    ("(-\\infty, 3]", ["x \\le 3", "(-\\infty,3]"], ["(-\\infty, 3)", "x<3"]),
    ("[2, 5)", ["x \\in [2,5)", "2 \\le x < 5"], ["[2,5]", "(2,5)"]),
    ("(-\\infty,1)\\cup(2,\\infty)", ["x<1 \\text{ or } x>2", "(2,\\infty)\\cup(-\\infty,1)"],
     ["(-\\infty,1]\\cup(2,\\infty)"]),
    ("(3, \\frac{\\pi}{2})", ["\\left( 3, \\frac{\\pi}{2} \\right)"], ["(\\frac{\\pi}{2}, 3)"]),
    (r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", [r"\begin{bmatrix}1\\-2\end{bmatrix}"],
     ["(-2,1)", "(1,-2)"]),  # a tuple is not a column vector (math-verify's strict mode)
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
     ["\\left[\\begin{array}{cc}1 & 2 \\\\ 3 & 4\\end{array}\\right]"],
     ["\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}"]),
    ("\\text{(C)}", ["C", "(C)", "\\textbf{(C)}"], ["B"]),
    ("\\text{odd}", ["odd", "\\text{Odd}"], ["even"]),
    ("\\infty", ["\\infty"], ["-\\infty"]),
    ("\\frac{1}{3}", ["0.333333", "\\dfrac{1}{3}"], ["0.33"]),
    ("e^{i\\pi}", ["e^{\\pi i}"], ["1", "-1"]),  # `i` is a variable (latex2sympy's reading)
]

_ADVERSARIAL = [
    "\\boxed{9^{9^{9^{9}}}}",
    "x" * 10**6 + "\\boxed{5}",
    "\\boxed{" + "{" * 10**4 + "1" + "}" * 10**4 + "}",
    "<answer>(10^{9999})^{9999}</answer>",  # refused by the tree builder's power limit
    "<answer>\\sin((10^{999})^{60})+\\sin((10^{998})^{60})+\\sin((10^{997})^{60})</answer>",
    "\\boxed{" * 20_000,
    "<answer>\\binom{1000000}{500000}</answer>",
    "\\boxed{1000000!}",
    "the answer is " * 20_000,
]

_FILLER = [
    "First, compute ${a} \\times {b} = {c}$.",
    "Let $x$ be the unknown, so $x + {a} = {c}$ gives $x = {d}$.",
    "We check: \\[ \\frac{{{a}}}{{{b}}} + {a} = \\frac{{{e}}}{{{b}}}. \\]",
    "Wait, that is not right; recompute {a} + {b} = {f}.",
    "So the remaining amount is {c} - {a} = {g}.",
    "Hmm, let me double-check the arithmetic with a table of values.",
]


def _reasoning(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(4, 40)):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        parts.append(rng.choice(_FILLER).format(a=a, b=b, c=a * b, d=a * b - a, e=a * b + a,
                                                f=a + b, g=a * b - a))
    return " ".join(parts)


def _completion(rng: random.Random, answer: str) -> str:
    reasoning = _reasoning(rng)
    style = rng.random()
    if style < 0.5:
        return f"<think>\n{reasoning}\n</think>\n<answer>{answer}</answer>"
    if style < 0.9:
        return f"{reasoning}\n\nTherefore, the final answer is $\\boxed{{{answer}}}$."
    return f"<think>{reasoning}</think>\nThe answer is \\({answer}\\)."


def build_items(n: int, adversarial_frac: float, seed: int) -> list[tuple[str, dict, bool | None]]:
    """(completion, example, expected) triples; expected is None for adversarial items."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        if adversarial_frac and i % round(1 / adversarial_frac) == 0:
            text = _ADVERSARIAL[(i // 20) % len(_ADVERSARIAL)]
            items.append((text, {"prompt": "", "answer": "5"}, None))
            continue
        gold, right, wrong = rng.choice(_CASES)
        correct = rng.random() < 0.5
        pred = rng.choice(right if correct else wrong)
        items.append((_completion(rng, pred), {"prompt": "", "answer": gold}, correct))
    return items


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _raw_rate(sympy_pool, n: int, threads: int) -> float:
    """Sympy comparisons per second through `sympy_pool` from `threads` threads, on `n`
    distinct pairs of the worker's expression language (half equal, half not)."""
    pairs = [(f"(({i})/(7)) x + sqrt({i % 50 + 2})", f"x {i}/7 + sqrt({i % 50 + 2 + i % 2})")
             for i in range(n)]
    verdicts: list = []

    def run(part):
        for a, b in part:
            verdicts.append(sympy_pool.compare(a, b, timeout_s=30.0))

    workers = [threading.Thread(target=run, args=(pairs[k::threads],)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    rate = n / (time.perf_counter() - t0)
    if verdicts.count(True) != (n + 1) // 2 or verdicts.count(False) != n // 2:
        raise RuntimeError(f"raw sympy verdicts wrong: {verdicts.count(True)} equal of {n}")
    return rate


def _timed_pass(pool, items, latencies: list,
                jobs: list) -> tuple[float, list[float], object, list]:
    """(answers/s, per-call latencies in s, BatchRewards, prefetch timings) of one batch
    through `pool`."""
    latencies.clear()
    jobs.clear()
    t0 = time.perf_counter()
    result = pool.score([c for c, _, _ in items], [e for _, e, _ in items])
    return len(items) / (time.perf_counter() - t0), list(latencies), result, list(jobs)


def _mislabelled(result, name: str, items) -> int:
    """Verdicts of `result` that disagree with the labels of `items` (adversarial skipped)."""
    return sum(bool(s > 0.5) != want for s, (_, _, want) in
               zip(result.components[name], items) if want is not None)


def _run_workers(verifiers: dict, workers: int, args, clean, hostile) -> list[dict]:
    """One row per verifier at W threads. The verifiers alternate batch by batch, so that a
    change of load on a shared machine hits them alike. Per repeat and verifier: a cold
    pass (its sympy pool's verdict cache emptied first, so every answer pays its full cost,
    as new model outputs do) and a cached pass (the same batch again)."""
    from jaxrl_reason.rewards import RewardPool

    pools = {name: RewardPool({v["reward"]: 1.0}, num_workers=workers,
                              timeout_s=args.pool_timeout) for name, v in verifiers.items()}
    stats = {name: {"cold": [], "cached": [], "cold_lat": [], "cached_lat": [], "jobs": [],
                    "job_s": [], "prepare_s": []} for name in verifiers}
    try:
        for name, v in verifiers.items():  # warm-up: threads, imports, worker start-up
            pools[name].score([c for c, _, _ in clean[:32]], [e for _, e, _ in clean[:32]])
        for _ in range(args.repeats):
            for name, v in verifiers.items():
                v["sympy_pool"]._verdicts.clear()
                rate, lat, cold, jobs = _timed_pass(pools[name], clean, v["latencies"],
                                                    v["jobs"])
                stats[name]["cold"].append(rate)
                stats[name]["cold_lat"] += lat
                stats[name]["jobs"].append(sum(kind == "job" for kind, _ in jobs))
                stats[name]["job_s"] += [s for kind, s in jobs if kind == "job"]
                stats[name]["prepare_s"] += [s for kind, s in jobs if kind == "prepare"]
                rate, lat, cached, _ = _timed_pass(pools[name], clean, v["latencies"],
                                                   v["jobs"])
                stats[name]["cached"].append(rate)
                stats[name]["cached_lat"] += lat
                stats[name]["mislabelled"] = _mislabelled(cold, v["reward"], clean)
        rows = []
        for name, v in verifiers.items():
            t0 = time.perf_counter()
            bad = pools[name].score([c for c, _, _ in hostile], [e for _, e, _ in hostile])
            st = stats[name]
            rows.append({
                "verifier": name, "workers": workers,
                "answers_per_s": statistics.median(st["cold"]),
                "p50_ms": 1e3 * statistics.median(st["cold_lat"]),
                "p99_ms": 1e3 * _percentile(st["cold_lat"], 0.99),
                "cached_answers_per_s": statistics.median(st["cached"]),
                "cached_p99_ms": 1e3 * _percentile(st["cached_lat"], 0.99),
                "prefetch_tasks": statistics.median(st["jobs"]),
                "prefetch_task_p99_ms": 1e3 * _percentile(st["job_s"], 0.99)
                if st["job_s"] else None,
                "prefetch_prepare_ms": 1e3 * statistics.median(st["prepare_s"] or [0.0]),
                "mislabelled": st["mislabelled"],
                "adversarial_batch_s": time.perf_counter() - t0,
                "adversarial_reasons": dict(bad.reasons),
                "adversarial_mislabelled": _mislabelled(bad, v["reward"], hostile),
            })
    finally:
        for pool in pools.values():
            pool.close()
    return rows


def _ratios(rows: list[dict], current: str) -> list[dict]:
    """Per isolation mode, W and older verifier: current's throughput and p99 relative to
    it (throughput ratio > 0.5 and p99 ratio < 2 is within the 2x bound)."""
    out = []
    for r in rows:
        if r["verifier"] == current:
            continue
        ours = next(x for x in rows if x["verifier"] == current and
                    x["isolation"] == r["isolation"] and x["workers"] == r["workers"])
        out.append({"isolation": r["isolation"], "workers": r["workers"], "vs": r["verifier"],
                    "answers_per_s": ours["answers_per_s"] / r["answers_per_s"],
                    "p99": ours["p99_ms"] / r["p99_ms"],
                    "cached_answers_per_s": ours["cached_answers_per_s"]
                    / r["cached_answers_per_s"]})
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--clean", type=int, default=512, help="items in the clean batch")
    parser.add_argument("--repeats", type=int, default=3,
                        help="cold + cached batches per verifier and W (median)")
    parser.add_argument("--adversarial-batch", type=int, default=256)
    parser.add_argument("--adversarial-frac", type=float, default=0.05)
    parser.add_argument("--pool-timeout", type=float, default=60.0, help="RewardPool timeout_s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolation", nargs="+", default=["bwrap"],
                        choices=["off", "bwrap"], help="sympy worker isolation modes to run")
    parser.add_argument("--raw", type=int, default=400, help="pairs for the raw sympy rate")
    parser.add_argument("--old-rev", nargs="+", default=None,
                        help="git revision(s) of older verifiers run beside today's "
                             "(default: _old_verifier.DEFAULT_REV); 'none' skips them")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--allow-load", action="store_true",
                        help="run on a loaded machine (recorded; such figures are not "
                             "publishable)")
    args = parser.parse_args(argv)

    quiet = require_quiet(args.allow_load)
    load_before = os.getloadavg()
    start = time.perf_counter()
    from jaxrl_reason.rewards import _sympy_worker, get_reward
    import_s = time.perf_counter() - start
    from _old_verifier import DEFAULT_REV, load_old_verifier

    fns = {"current": (get_reward("correctness"), _sympy_worker)}
    revs = [r for r in args.old_rev or [DEFAULT_REV] if r != "none"]
    for rev in revs:
        old = load_old_verifier(rev)
        fns[f"old {rev}"] = (old.correctness, sys.modules[old.__package__ + "._sympy_worker"])
    verifiers = {name: {"reward": f"correctness_timed_{k}", "module": module, "latencies": [],
                        "jobs": []} for k, (name, (_, module)) in enumerate(fns.items())}
    for name, (fn, _) in fns.items():
        _register_timed(verifiers[name]["reward"], fn, verifiers[name]["latencies"],
                        verifiers[name]["jobs"])

    clean = build_items(args.clean, 0.0, args.seed)
    hostile = build_items(args.adversarial_batch, args.adversarial_frac, args.seed + 1)
    rows, modes = [], {}
    for mode in args.isolation:
        for name, v in verifiers.items():
            v["sympy_pool"] = v["module"].SympyPool(isolate=mode == "bwrap")
            v["module"]._POOL = v["sympy_pool"]  # what that verifier's get_pool() hands out
            start = time.perf_counter()
            ready = v["sympy_pool"].warm()
            modes[f"{name} / {mode}"] = {
                "startup_s": time.perf_counter() - start, "workers": ready,
                "raw_compare_per_s": _raw_rate(v["sympy_pool"], args.raw, threads=2)}
        try:
            for workers in args.workers:
                rows += [dict(isolation=mode, **row) for row in
                         _run_workers(verifiers, workers, args, clean, hostile)]
        finally:
            for v in verifiers.values():
                v["sympy_pool"].shutdown()
                v["module"]._POOL = None

    ratios = _ratios(rows, "current") if len(fns) > 1 else []
    _print(import_s, modes, rows, ratios, args, clean, hostile)
    print(f"load average (1, 5, 15 min) at the start {load_before}, at the end "
          f"{os.getloadavg()}")
    out = {"command": "python benchmarks/verifiers.py " + " ".join(sys.argv[1:] if argv is None
                                                                   else argv),
           "import_s": import_s, "old_revs": revs, "isolation": modes,
           "clean_items": len(clean), "repeats": args.repeats,
           "adversarial_items": sum(want is None for _, _, want in hostile), "rows": rows,
           "current_vs_old": ratios, "quiet_check": quiet,
           "load_average_1_5_15_min": {"start": load_before, "end": os.getloadavg()}}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


def _register_timed(name: str, fn, latencies: list, jobs: list) -> None:
    """Register reward `name`: `fn`, its wall time per call appended to `latencies`; when
    `fn` has a batch `prefetch` (today's verifier), the wall times of its preparation and of
    each of its worker-job tasks go to `jobs` (see `_timed_prefetch`)."""
    from jaxrl_reason.rewards import register_reward

    lock = threading.Lock()

    @register_reward(name, overwrite=True)
    def timed(completion, example):
        t0 = time.perf_counter()
        out = fn(completion, example)
        with lock:
            latencies.append(time.perf_counter() - t0)
        return out

    if hasattr(fn, "prefetch"):  # the batch preparation RewardPool runs before the calls
        timed.prefetch = _timed_prefetch(fn.prefetch, jobs, lock)


def _timed_prefetch(prefetch, jobs: list, lock):
    """`prefetch`, its preparation time and each task's wall time appended to `jobs` as
    ("prepare", s) and ("job", s)."""
    def run(completions, examples, **options):
        t0 = time.perf_counter()
        tasks = prefetch(completions, examples, **options)
        with lock:
            jobs.append(("prepare", time.perf_counter() - t0))
        return [functools.partial(_timed_task, task, jobs, lock) for task in tasks]

    return run


def _timed_task(task, jobs: list, lock) -> None:
    t0 = time.perf_counter()
    try:
        task()
    finally:
        with lock:
            jobs.append(("job", time.perf_counter() - t0))


def _print(import_s, modes, rows, ratios, args, clean, hostile) -> None:
    n_bad = sum(want is None for _, _, want in hostile)
    print(f"import {import_s:.2f} s")
    for mode, m in modes.items():
        print(f"{mode}: sympy start-up (cold, {m['workers']} workers) "
              f"{m['startup_s']:.2f} s; raw sympy comparisons {m['raw_compare_per_s']:.0f}/s "
              f"(2 threads, {args.raw} distinct pairs)")
    print(f"clean batch: {len(clean)} items, {args.repeats} x (cold + cached) per verifier; "
          f"adversarial batch: {len(hostile)} items, {n_bad} adversarial\n")
    print(f"| verifier | isolation | threads W | answers/s cold | p50 ms | p99 ms | "
          f"answers/s cached | p99 ms cached | wrong verdicts | "
          f"{len(hostile)}-batch w/ {n_bad} adversarial (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['verifier']} | {r['isolation']} | {r['workers']} | "
              f"{r['answers_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['cached_answers_per_s']:.0f} | {r['cached_p99_ms']:.1f} | "
              f"{r['mislabelled']} + {r['adversarial_mislabelled']} "
              f"| {r['adversarial_batch_s']:.2f} |")
    for r in rows:
        if r["prefetch_tasks"]:
            print(f"{r['verifier']} {r['isolation']} W={r['workers']} cold batch: "
                  f"{r['prefetch_tasks']:.0f} prefetch tasks (p99 {r['prefetch_task_p99_ms']:.0f} "
                  f"ms), preparation {r['prefetch_prepare_ms']:.0f} ms before the calls")
    for q in ratios:
        print(f"current / {q['vs']} ({q['isolation']}, W={q['workers']}): answers/s cold "
              f"x{q['answers_per_s']:.2f}, p99 x{q['p99']:.2f}, answers/s cached "
              f"x{q['cached_answers_per_s']:.2f}")
    for r in rows:
        print(f"{r['verifier']} {r['isolation']} W={r['workers']} adversarial-batch reasons: "
              f"{r['adversarial_reasons']}")


if __name__ == "__main__":
    main()
