"""Long completions on real TPU slices, sized from this CPU: 16k- and 32k-token GRPO with
context parallelism; adds a section to benchmarks/tpu_plan.md.

    python benchmarks/tpu_plan_long.py qwen2.5-7b v5e-8 ESP 16384 --contexts 1 2 4
    python benchmarks/tpu_plan_long.py qwen2.5-7b v5p-8 CSP 32768 --contexts 1 2 4

The workload is `tpu_plan.py`'s (GRPO, 8 prompts x G = 8, 1,024-token prompts, beta = 0.04,
bf16 compute, scanned layers, remat per block, 512-query attention chunks, chunked
log-probs, the Pallas loss kernel) with COMPLETION-token completions, a setting of
`tpu_plan.SETTINGS`, and every program compiled at the model's full depth (scanned layers:
one block in the program, so a 28-layer compile costs about what a 2-layer one does).

The training passes (log-prob pass, update) are compiled at each context size of
`--contexts` (`plan.with_context`: the chips come from mesh.fsdp, the weights stay sharded
over fsdp x context, rl.micro_batches grows by the same factor), and at 2x, 4x, ... beyond
them while none fits; the smallest size that fits is chosen, as `jaxrl-reason plan` chooses
it (`plan.plan(choose_context=True)`), and the sampler is compiled on that mesh. Memory only
(`layer_cost=False`): FLOPs are the model's count. Each compile runs in its own process and
is stored in benchmarks/tpu_plan.json (`long_context`) as soon as it ends.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpu_plan  # noqa: E402

GiB = 2**30
TRAINING = ("log-prob pass", "update")


def run_one(model: str, slice_name: str, setting: str, completion: int, context: int,
            programs: tuple[str, ...]) -> dict:
    """Compiles `programs` (in this process) at `context` and returns per-chip figures."""
    from jaxrl_reason.runtime import plan as planner

    topology = tpu_plan.ALL_SLICES[slice_name]
    config, cfg = tpu_plan._config(model, topology, setting, None, True, completion)
    devices = len(planner.topology_devices(topology)[1])
    if context > 1:
        config = planner.with_context(config, context, devices)
        if config is None:
            raise SystemExit(f"{slice_name}: no mesh with context {context}")
    t0 = time.time()
    report = planner.plan(config, topology, programs=programs, layer_cost=False,
                          choose_context=False)
    return {"model": model, "slice": slice_name, "setting": setting,
            "completion": completion, "context": context, "layers": cfg.n_layers,
            "kind": "training" if programs == TRAINING else "sampler",
            "mesh": report["mesh"], "micro_batches": int(config.rl.micro_batches),
            "max_num_seqs": int(config.rl.get("max_num_seqs", 0)),
            "params": report["params"], "compile_s": time.time() - t0,
            "chip": dataclasses.asdict(report["chip"]), "devices": report["devices"],
            "programs": {p.name: {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
                         for p in report["programs"]}}


def _subprocess(*args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=7200,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")


def fits(record: dict) -> bool:
    """Every program of a stored compile within the chip's HBM (total per chip)."""
    return all(total_bytes(p) <= record["chip"]["hbm_bytes"]
               for p in record["programs"].values())


def total_bytes(p: dict) -> float:
    return p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"] + p["resident_bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("model", nargs="?")
    ap.add_argument("slice", nargs="?", choices=list(tpu_plan.ALL_SLICES))
    ap.add_argument("setting", nargs="?", choices=list(tpu_plan.SETTINGS))
    ap.add_argument("completion", nargs="?", type=int)
    ap.add_argument("--contexts", nargs="+", type=int, default=[1],
                    help="context sizes compiled for the record (the smallest that fits is "
                         "chosen; larger ones are tried while none fits)")
    ap.add_argument("--out", default=os.path.join(tpu_plan.REPO, "benchmarks", "tpu_plan"))
    args = ap.parse_args()
    if args.one:
        model, slice_name, setting, completion, context, kind = args.one
        result = run_one(model, slice_name, setting, int(completion), int(context),
                         TRAINING if kind == "training" else ("sampler",))
        print("RESULT " + json.dumps(result), flush=True)
        return
    if args.completion is None:
        ap.error("give MODEL SLICE SETTING COMPLETION")
    path = args.out + ".json"
    key = (args.model, args.slice, args.setting, args.completion)

    def stored() -> dict:
        return json.load(open(path)) if os.path.isfile(path) else {"compiles": []}

    def compiled(context: int, kind: str) -> dict:
        for r in stored().get("long_context", []):
            if (r["model"], r["slice"], r["setting"], r["completion"]) == key and \
                    (r["context"], r["kind"]) == (context, kind):
                return r
        print(f"compiling {' '.join(map(str, key))}: {kind} at context {context}", flush=True)
        r = _subprocess(*key, context, kind)
        store = stored()  # re-read: another invocation may have written meanwhile
        store["long_context"] = store.get("long_context", []) + [r]
        with open(path + ".tmp", "w") as f:
            json.dump(store, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"  {'fits' if fits(r) else 'does NOT fit'}: " + ", ".join(
            f"{n} {total_bytes(p) / GiB:.2f} GiB (temps {p['temp_bytes'] / GiB:.2f})"
            for n, p in r["programs"].items()) + f"; {r['compile_s']:.0f} s", flush=True)
        return r

    chosen, context = None, 1
    wanted = set(args.contexts)
    while context <= max(wanted) or chosen is None:
        if context in wanted or chosen is None:
            try:
                r = compiled(context, "training")
            except RuntimeError as e:
                if "no mesh with context" not in str(e):
                    raise
                break  # the slice has no more chips to shard the sequence over
            if chosen is None and fits(r):
                chosen = context
        context *= 2
    if chosen is None:
        print("the training passes fit at no context size tried", flush=True)
    else:
        compiled(chosen, "sampler")
    section = long_markdown(stored()["long_context"])
    md = args.out + ".md"
    text = open(md).read() if os.path.isfile(md) else ""
    if LONG_HEADING in text:  # replace the section, keep what follows it
        head, rest = text.split(LONG_HEADING, 1)
        tail = rest[rest.index("\n## "):] if "\n## " in rest else ""
        text = head.rstrip() + "\n\n" + section + tail
    else:
        text = text.rstrip() + "\n\n\n" + section
    with open(md, "w") as f:
        f.write(text)
    print(section)


LONG_HEADING = "## Long completions: 16k and 32k tokens, context parallelism"


def long_markdown(records: list[dict]) -> str:
    """The long-completion section of tpu_plan.md from the stored `long_context` records."""
    keys = list(dict.fromkeys((r["model"], r["slice"], r["setting"], r["completion"])
                              for r in records))
    lines = [LONG_HEADING, "",
             "`python benchmarks/tpu_plan_long.py MODEL SLICE SETTING COMPLETION --contexts "
             "...` (from `benchmarks/tpu_plan.json`, `long_context`): GRPO, 8 prompts x G = 8, "
             "1,024-token prompts, COMPLETION-token completions, beta = 0.04, bf16 compute, "
             "every program compiled at full depth (scanned layers), memory per chip "
             "(arguments + outputs + temporaries + what stays resident). The training passes "
             "are compiled at each context size; the smallest that fits is chosen and the "
             "sampler compiled on that mesh (its rows split over data x context). Micro-batches "
             "hold one row (padded settings) or one pack (packed settings: at worst a row "
             "per pack) per data-parallel shard. Context parallelism splits packs "
             "(`rl.packing`), so the padded settings compile at context 1 only; at context "
             "c the data-parallel shards are c times fewer, the micro-batches c times more, "
             "and each pack is split over c chips.", "",
             "| model | slice | setting | completion | context chosen | mesh | "
             "micro-batches | sampler GiB | log-prob GiB | update GiB | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    sweep = []
    for key in keys:
        mine = [r for r in records if (r["model"], r["slice"], r["setting"],
                                       r["completion"]) == key]
        train = sorted((r for r in mine if r["kind"] == "training"),
                       key=lambda r: r["context"])
        sweep += train
        fitting = [r for r in train if fits(r)]
        pick = fitting[0] if fitting else train[-1]
        sampler = next((r for r in mine if r["kind"] == "sampler"
                        and r["context"] == pick["context"]), None)
        hbm = pick["chip"]["hbm_bytes"] / GiB
        s_gib = (f"{total_bytes(sampler['programs']['sampler']) / GiB:.1f}" if sampler
                 else "not compiled")
        ok = bool(fitting) and sampler is not None and fits(sampler)
        lines.append(
            f"| {key[0]} | {key[1]} | {tpu_plan.SETTING_NAMES[key[2]]} | {key[3]:,} | "
            f"{pick['context'] if fitting else 'none fits'} | {pick['mesh']} | "
            f"{pick['micro_batches']} | {s_gib} | "
            f"{total_bytes(pick['programs']['log-prob pass']) / GiB:.1f} | "
            f"{total_bytes(pick['programs']['update']) / GiB:.1f} | "
            f"{'yes' if ok else 'NO'} (HBM {hbm:.0f}) |")
    lines += ["", "Per-chip activation memory (XLA's temporaries, `memory_analysis()`) and "
              "total of the training passes against the context size:", "",
              "| model | slice | setting | completion | context | mesh | micro-batches | "
              "log-prob temps GiB | log-prob total GiB | update temps GiB | update total GiB "
              "| compile s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sweep:
        lp, up = r["programs"]["log-prob pass"], r["programs"]["update"]
        lines.append(f"| {r['model']} | {r['slice']} | {tpu_plan.SETTING_NAMES[r['setting']]} | "
                     f"{r['completion']:,} | {r['context']} | "
                     f"{r['mesh']} | {r['micro_batches']} | {lp['temp_bytes'] / GiB:.2f} | "
                     f"{total_bytes(lp) / GiB:.2f} | {up['temp_bytes'] / GiB:.2f} | "
                     f"{total_bytes(up) / GiB:.2f} | {r['compile_s']:.0f} |")
    notes = [p.get("note", "") for r in records for p in r["programs"].values()]
    if any("XLA could not fit" in n for n in notes):
        lines += ["", "A program XLA refused for lack of HBM shows the temporaries its error "
                  "names (a lower bound on what it needs)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
