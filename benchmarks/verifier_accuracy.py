r"""Accuracy of the math verifier on the labelled regression suite, beside math-verify alone
and the previous verifier, measured in the same run.

    python benchmarks/verifier_accuracy.py --json docs/verifier_accuracy.json
    python benchmarks/verifier_accuracy.py --old-rev 6a983c8   # which older verifier

Cases: `tests/rewards/math_cases.jsonl`, one JSON object a line: `pred` (a completion or an
answer), `gold` (an answer key), `expected` (bool), `source` (repository@commit:path::test,
or our own examples), `provenance` ("upstream": a case of a public test suite, `expected`
its label there, unchanged; "ours": written by us) and optionally `options` (verifier
options the upstream test sets for that case: `float_rounding`, `strict`, `set_relation`)
`convention` (why the verdict is a convention we choose, with `convention_verdict`,
our verdict, beside the upstream label in `expected`) and `disputed` (on an upstream case
whose label we hold mathematically wrong: why; the label stays as upstream has it). The
cases fall in three groups, reported separately:

  * upstream: every upstream case without a convention, scored against its upstream label
    (the headline; disputed labels included, and also reported without them as
    "upstream_undisputed");
  * ours: the cases we wrote, scored against our labels;
  * conventions: listed with the upstream label, our convention's verdict and each
    verifier's verdict, never scored.

Each verifier judges every case:

  * ours: the `correctness` reward (`pred` as the completion, `gold` as the answer), default
    options updated with the case's `options`;
  * math-verify alone, as its README uses it: `verify(parse(gold), parse(pred))` with its
    default extraction (LaTeX and plain expressions), the case's `options` (as `verify`'s
    `float_rounding`, `strict`, `allow_set_relation_comp`) and its own signal timeouts, in
    this process's main thread (the cases are fixed public data, never model output);
  * old: the `correctness` reward of `--old-rev` (see `_old_verifier.py`), which takes no
    options.

Prints one table row per verifier and group and the conventions, and writes the per-case
verdicts with `--json`.
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


GROUPS = ("upstream", "ours", "conventions")
_MV_OPTION = {"float_rounding": "float_rounding", "strict": "strict",
              "set_relation": "allow_set_relation_comp"}


def load_cases(path: Path = CASES) -> list[dict]:
    """The cases of `path`; ValueError naming the line of a malformed one."""
    cases = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        case = json.loads(line)
        missing = {"pred", "gold", "expected", "source", "provenance"} - set(case)
        if missing or not isinstance(case["expected"], bool):
            raise ValueError(f"{path}:{i}: a case needs pred, gold, source, provenance and a "
                             f"bool expected (missing {sorted(missing)})")
        if case["provenance"] not in ("upstream", "ours"):
            raise ValueError(f"{path}:{i}: provenance must be 'upstream' or 'ours'")
        if set(case.get("options", {})) - set(_MV_OPTION):
            raise ValueError(f"{path}:{i}: options may only be {sorted(_MV_OPTION)}")
        if "convention" in case and not isinstance(case.get("convention_verdict"), bool):
            raise ValueError(f"{path}:{i}: a convention case needs a bool convention_verdict")
        if "disputed" in case and (case["provenance"] != "upstream" or "convention" in case):
            raise ValueError(f"{path}:{i}: only an upstream label may be disputed")
        cases.append(case)
    return cases


def group(case: dict) -> str:
    """The case's group: "conventions", else its provenance ("upstream" or "ours")."""
    return "conventions" if "convention" in case else case["provenance"]


def ours(pred: str, gold: str, options: dict | None = None) -> bool:
    """Today's `correctness` reward, default options updated with `options`."""
    from jaxrl_reason.rewards import get_reward

    return get_reward("correctness")(pred, {"answer": gold}, **(options or {})).score > 0.5


def math_verify_alone(pred: str, gold: str, options: dict | None = None) -> bool:
    """math-verify 0.9.0 with its defaults (LaTeX + plain-expression extraction), `options`
    passed to `verify`."""
    from math_verify import parse, verify

    kwargs = {_MV_OPTION[k]: v for k, v in (options or {}).items()}
    return bool(verify(parse(gold), parse(pred), **kwargs))


def old_verifier(rev: str):
    """The `correctness` reward of revision `rev` as a (pred, gold, options) -> bool
    function (it has no options: they are ignored)."""
    from _old_verifier import load_old_verifier

    old = load_old_verifier(rev)
    return lambda pred, gold, options=None: old.correctness(pred, {"answer": gold}).score > 0.5


def score(verdicts: list[bool], cases: list[dict]) -> dict:
    """{"n", "correct", "accuracy"} of `verdicts` against the cases' labels."""
    right = sum(v == c["expected"] for v, c in zip(verdicts, cases))
    return {"n": len(cases), "correct": right,
            "accuracy": right / len(cases) if cases else float("nan")}


def _judge(fn, case: dict) -> bool | None:
    """`fn`'s verdict on `case`; None when it raised (no verdict: wrong when scored)."""
    try:
        return bool(fn(case["pred"], case["gold"], case.get("options")))
    except Exception:
        return None


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


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
    grouped = {g: [c for c in cases if group(c) == g] for g in GROUPS}
    verifiers = {"ours": ours, "math-verify alone": math_verify_alone,
                 f"old ({rev})": old_verifier(rev)}
    results, verdicts = {}, {}
    for name, fn in verifiers.items():
        start = time.perf_counter()
        verdicts[name] = {g: [_judge(fn, c) for c in items] for g, items in grouped.items()}
        results[name] = {g: score(verdicts[name][g], grouped[g]) for g in ("upstream", "ours")}
        kept = [(v, c) for v, c in zip(verdicts[name]["upstream"], grouped["upstream"])
                if "disputed" not in c]
        results[name]["upstream_undisputed"] = score([v for v, _ in kept], [c for _, c in kept])
        results[name]["seconds"] = time.perf_counter() - start
    where = args.cases.relative_to(ROOT) if args.cases.is_relative_to(ROOT) else args.cases
    print(f"{where}: {len(grouped['upstream'])} upstream-labelled cases, "
          f"{len(grouped['ours'])} of ours, {len(grouped['conventions'])} conventions "
          f"(listed, not scored)")
    print("| verifier | upstream labels | without disputed labels | our cases | s |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        cells = [f"{x['accuracy']:.1%} ({x['correct']}/{x['n']})"
                 for x in (r["upstream"], r["upstream_undisputed"], r["ours"])]
        print(f"| {name} | {' | '.join(cells)} | {r['seconds']:.1f} |")
    disputed = [{"pred": c["pred"], "gold": c["gold"], "source": c["source"],
                 "disputed": c["disputed"], "upstream_label": c["expected"],
                 **{name: verdicts[name]["upstream"][i] for name in verifiers}}
                for i, c in enumerate(grouped["upstream"]) if "disputed" in c]
    print("\nDisputed upstream labels (scored as labelled): upstream label / ours / math-verify")
    for c in disputed:
        print(f"  {_short(c['pred'])!r} ~ {_short(c['gold'], 20)!r}: {c['upstream_label']} / "
              f"{c['ours']} / {c['math-verify alone']}  ({c['disputed']})")
    conventions = [{"pred": c["pred"], "gold": c["gold"], "source": c["source"],
                    "convention": c["convention"], "upstream_label": c["expected"],
                    "convention_verdict": c["convention_verdict"],
                    **{name: verdicts[name]["conventions"][i] for name in verifiers}}
                   for i, c in enumerate(grouped["conventions"])]
    print("\nConventions (not scored): upstream label / our convention / ours / math-verify")
    for c in conventions:
        print(f"  {_short(c['pred'])!r} ~ {_short(c['gold'], 20)!r}: {c['upstream_label']} / "
              f"{c['convention_verdict']} / {c['ours']} / {c['math-verify alone']}"
              f"  ({c['convention']})")
    command = "python benchmarks/verifier_accuracy.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    out = {"command": command.strip(), "cases": str(where), "old_rev": rev,
           "results": results, "conventions": conventions, "disputed": disputed,
           "per_case": [{**c, "group": g, **{name: verdicts[name][g][i] for name in verifiers}}
                        for g in GROUPS for i, c in enumerate(grouped[g])]}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return out


if __name__ == "__main__":
    main()
