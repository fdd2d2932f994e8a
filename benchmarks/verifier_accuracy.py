r"""Accuracy of the math verifier on the labelled regression suite, beside math-verify alone
and the previous verifier, measured in the same run.

    python benchmarks/verifier_accuracy.py --json verifier_accuracy.json
    python benchmarks/verifier_accuracy.py --old-rev 6a983c8   # which older verifier

Cases: `tests/rewards/math_cases.jsonl`, one JSON object a line: `pred` (a completion or an
answer), `gold` (an answer key), `expected` (bool), `source` (repository@commit:path::test,
or the issue's examples) and optionally `convention` (why the verdict depends on a
convention; such cases are scored apart). Each verifier judges every case:

  * ours: the `correctness` reward (`pred` as the completion, `gold` as the answer), default
    options;
  * math-verify alone, as its README uses it: `verify(parse(gold), parse(pred))` with its
    default extraction (LaTeX and plain expressions) and its own signal timeouts, in this
    process's main thread (the cases are fixed public data, never model output);
  * old: the `correctness` reward of `--old-rev` (see `_old_verifier.py`).

Prints one table row per verifier (accuracy on the main list and on the convention list)
and writes the per-case verdicts with `--json`.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CASES = ROOT / "tests" / "rewards" / "math_cases.jsonl"


def load_cases(path: Path = CASES) -> list[dict]:
    """The cases of `path`; ValueError naming the line of a malformed one."""
    cases = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        case = json.loads(line)
        missing = {"pred", "gold", "expected", "source"} - set(case)
        if missing or not isinstance(case["expected"], bool):
            raise ValueError(f"{path}:{i}: a case needs pred, gold, source and a bool "
                             f"expected (missing {sorted(missing)})")
        cases.append(case)
    return cases


def ours(pred: str, gold: str) -> bool:
    """Today's `correctness` reward."""
    from jaxrl_reason.rewards import get_reward

    return get_reward("correctness")(pred, {"answer": gold}).score > 0.5


def math_verify_alone(pred: str, gold: str) -> bool:
    """math-verify 0.9.0 with its defaults (LaTeX + plain-expression extraction)."""
    from math_verify import parse, verify

    return bool(verify(parse(gold), parse(pred)))


def old_verifier(rev: str):
    """The `correctness` reward of revision `rev` as a (pred, gold) -> bool function."""
    from _old_verifier import load_old_verifier

    old = load_old_verifier(rev)
    return lambda pred, gold: old.correctness(pred, {"answer": gold}).score > 0.5


def score(verdicts: list[bool], cases: list[dict]) -> dict:
    """{"n", "correct", "accuracy"} of `verdicts` against the cases' labels."""
    right = sum(v == c["expected"] for v, c in zip(verdicts, cases))
    return {"n": len(cases), "correct": right,
            "accuracy": right / len(cases) if cases else float("nan")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--old-rev", default=None, help="git revision of the old verifier "
                        "(default: _old_verifier.DEFAULT_REV)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from _old_verifier import DEFAULT_REV

    rev = args.old_rev or DEFAULT_REV
    cases = load_cases(args.cases)
    main_cases = [c for c in cases if not c.get("convention")]
    conv_cases = [c for c in cases if c.get("convention")]
    verifiers = {"ours": ours, "math-verify alone": math_verify_alone,
                 f"old ({rev})": old_verifier(rev)}
    results, verdicts = {}, {}
    for name, fn in verifiers.items():
        start = time.perf_counter()
        got = {}
        for group, items in (("main", main_cases), ("conventions", conv_cases)):
            got[group] = []
            for c in items:
                try:
                    got[group].append(bool(fn(c["pred"], c["gold"])))
                except Exception:  # a verifier that raises has no verdict: counted wrong
                    got[group].append(not c["expected"])
        results[name] = {"main": score(got["main"], main_cases),
                         "conventions": score(got["conventions"], conv_cases),
                         "seconds": time.perf_counter() - start}
        verdicts[name] = got
    print(f"{len(main_cases)} cases + {len(conv_cases)} convention-dependent "
          f"({args.cases.relative_to(ROOT) if args.cases.is_relative_to(ROOT) else args.cases})")
    print("| verifier | accuracy | convention cases | s |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        m, c = r["main"], r["conventions"]
        print(f"| {name} | {m['accuracy']:.1%} ({m['correct']}/{m['n']}) | "
              f"{c['correct']}/{c['n']} | {r['seconds']:.1f} |")
    command = "python benchmarks/verifier_accuracy.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    out = {"command": command.strip(), "cases": str(args.cases.relative_to(ROOT)
                                                   if args.cases.is_relative_to(ROOT)
                                                   else args.cases),
           "old_rev": rev, "results": results,
           "per_case": [{**c, **{name: verdicts[name][group][i] for name in verifiers}}
                        for group, items in (("main", main_cases), ("conventions", conv_cases))
                        for i, c in enumerate(items)]}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return out


if __name__ == "__main__":
    main()
