"""Sizes real-model GRPO on real TPU slices from this CPU: writes benchmarks/tpu_plan.md.

    pip install -e '.[tpu]'
    python benchmarks/tpu_plan.py                 # all models x slices -> tpu_plan.{json,md}
    python benchmarks/tpu_plan.py --unrolled qwen2.5-7b v5e-8   # + the unrolled stack
    python benchmarks/tpu_plan.py --models qwen2.5-1.5b --slices v5e-1 --settings L B \
        --memory-only                             # LoRA and full fine-tuning on one v5e chip
    python benchmarks/tpu_plan.py --models qwen2.5-7b --slices v5e-4 --settings Q4 Q8 C E \
        --memory-only                             # QLoRA (nf4, int8 base) and full on v5e-4
    python benchmarks/tpu_plan.py --long-tail qwen2.5-7b v5e-8   # sampler time, static vs
                                  # slot refill, on long-tailed lengths (stored compiles only)

Workload (issue 7): GRPO, G = 8 samples of 8 prompts (64 rows), 1,024-token prompts and
4,096-token completions, beta = 0.04 (a reference model is resident), bf16 compute.
Shapes are the real models' (`jaxrl_reason.models.config` presets; random abstract weights,
nothing is downloaded). For each model and slice the settings are tried in order and the
first that fits is reported:

  A. float32 master weights and Adam state, FSDP over all chips, one row per chip per
     micro-batch, scanned layers, remat per block, 512-query attention chunks, chunked
     log-probs;
  B. as A with bfloat16 weights and Adam state (half the memory, no f32 masters);
  C. as B with the reference and the optimizer state in host memory outside the programs
     that read them (rl.offload_reference, rl.offload_optimizer);
  D. as C with 256-query attention chunks (half the float32 attention scores);
  E. as C with the chips as FSDP x tensor parallel 2 (MLP hidden units, heads and KV heads
     split over pairs of chips: each chip holds half of a row's per-layer activations).
LoRA settings (only the adapters trained; the frozen base is the reference, no copy):
  L. bf16 base and rank-16 adapters on every projection (q/k/v/o, gate/up/down; the
     real-model LoRA config's), bf16 Adam state for the adapters (nothing offloaded);
  Q8 / Q4. as L with the frozen projections held as int8 / nf4 (QLoRA);
  LS / Q4S. as L / Q4 with slot refill (rl.max_num_seqs = 32): the sampler's KV cache holds
     32 rows at a time instead of all 64;
  L2. as L with 2 prompts per step (16 rows): the sampler's KV cache for 16 rows.
Full fine-tuning (A-E) and LoRA (L, Q8, Q4) are reported side by side: per model, slice and
family, the first setting given that fits. --memory-only skips the 1- and 2-layer compiles
that give a scanned program's FLOPs and bytes (memory is the same; roofline columns n/a).

Every program is compiled at the model's real depth: with `scan_layers` the program holds
one block, so a compile takes about as long at 28 layers as at 2. `--unrolled MODEL SLICE`
adds the unrolled stack (`scan_layers=False`) for comparison; compiling 28 unrolled layers
takes many minutes per program on a CPU, so it is compiled at 2 and 4 layers and every
per-device figure is extrapolated linearly in the layer count (a per-layer term plus a
constant).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("qwen2.5-1.5b", "gemma2-2b", "qwen2.5-7b", "llama3-8b")
SLICES = {"v5e-8": "v5e:2x4", "v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4"}
# Smaller slices, sized on demand (--slices): one v5e chip and v5e-4 (LoRA / QLoRA rows).
SMALL_SLICES = {"v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2"}
ALL_SLICES = {**SLICES, **SMALL_SLICES}
# Each setting: model-block overrides and rl overrides; tried in order, first fit reported.
OFFLOAD = {"offload_reference": True, "offload_optimizer": True}
SLOTS = 32  # rl.max_num_seqs of the slot-refill settings: the KV cache holds 32 rows
LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0, "targets": ("all-linear",)}
SETTINGS = {
    "A": ({"param_dtype": "float32"}, {}),
    "B": ({"param_dtype": "bfloat16"}, {}),
    "C": ({"param_dtype": "bfloat16"}, OFFLOAD),
    "D": ({"param_dtype": "bfloat16", "attention_chunk": 256}, OFFLOAD),
    "E": ({"param_dtype": "bfloat16"}, {**OFFLOAD, "tensor": 2}),
    "L": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "none"}}, {}),
    "Q8": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "int8"}}, {}),
    "Q4": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "nf4"}}, {}),
    "LS": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "none"}},
           {"max_num_seqs": SLOTS}),
    "Q4S": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "nf4"}},
            {"max_num_seqs": SLOTS}),
    "L2": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "none"}},
           {"batch_prompts": 2}),
    # Long completions (benchmarks/tpu_plan_long.py): E and C with slot refill.
    "ES": ({"param_dtype": "bfloat16"}, {**OFFLOAD, "tensor": 2, "max_num_seqs": 16}),
    "CS": ({"param_dtype": "bfloat16"}, {**OFFLOAD, "max_num_seqs": SLOTS}),
    "LES": ({"param_dtype": "bfloat16", "lora": {**LORA, "base_quant": "none"}},
            {"tensor": 2, "max_num_seqs": 16}),
    # ES on padding-free packs (a row per pack at worst: rl.pack_tokens = prompt +
    # completion), micro-batched like ES; the setting context parallelism splits.
    "ESP": ({"param_dtype": "bfloat16"},
            {**OFFLOAD, "tensor": 2, "max_num_seqs": 16, "packing": True}),
    "CSP": ({"param_dtype": "bfloat16"}, {**OFFLOAD, "max_num_seqs": SLOTS, "packing": True}),
}
FAMILIES = {"A": "full", "B": "full", "C": "full", "D": "full", "E": "full",
            "L": "LoRA", "Q8": "QLoRA", "Q4": "QLoRA", "LS": "LoRA", "Q4S": "QLoRA",
            "L2": "LoRA", "ES": "full", "CS": "full", "LES": "LoRA",
            "ESP": "full", "CSP": "full"}
SETTING_NAMES = {"A": "f32 masters + Adam", "B": "bf16 weights + Adam",
                 "C": "bf16 + Adam, host offload",
                 "D": "bf16 + Adam, host offload, 256-query chunks",
                 "E": "bf16 + Adam, host offload, FSDP x tensor 2",
                 "L": "LoRA r16, bf16 base", "Q8": "QLoRA r16, int8 base",
                 "Q4": "QLoRA r16, nf4 base",
                 "LS": f"LoRA r16, bf16 base, {SLOTS} decode slots",
                 "Q4S": f"QLoRA r16, nf4 base, {SLOTS} decode slots",
                 "L2": "LoRA r16, bf16 base, 2 prompts x G = 8 per step",
                 "ES": "bf16 + Adam, host offload, FSDP x tensor 2, 16 decode slots",
                 "CS": f"bf16 + Adam, host offload, {SLOTS} decode slots",
                 "LES": "LoRA r16, bf16 base, FSDP x tensor 2, 16 decode slots",
                 "ESP": "bf16 + Adam, host offload, FSDP x tensor 2, 16 decode slots, "
                        "packed",
                 "CSP": f"bf16 + Adam, host offload, {SLOTS} decode slots, packed"}
ROWS_PROMPTS, G, PROMPT, COMPLETION = 8, 8, 1024, 4096
GiB = 2**30


def _config(model: str, topology: str, setting: str, layers: int | None, scan: bool = True,
            completion: int | None = None):
    import ml_collections

    from jaxrl_reason.cli import parse
    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.runtime.plan import topology_devices

    _, devices = topology_devices(topology)
    chips = len(devices)
    _, fv = parse(["jaxrl-reason", "plan", "--config", os.path.join(REPO, "configs",
                                                                      "arith_grpo.py"),
                   "--topology", topology])
    c = fv.config
    c.unlock()
    model_overrides, rl_overrides = SETTINGS[setting]
    model_overrides = dict(model_overrides)
    lora = model_overrides.pop("lora", None)
    overrides = {**dict(dtype="bfloat16", remat="block", attention_chunk=512,
                        logprobs_impl="chunked", scan_layers=scan), **model_overrides}
    if layers is not None:
        overrides["n_layers"] = layers
    cfg = get_preset(model, **overrides)
    c.model = ml_collections.ConfigDict(dataclasses.asdict(cfg))
    c.model.lora = ml_collections.ConfigDict(lora) if lora else None
    rl_overrides = dict(rl_overrides)
    tensor = rl_overrides.pop("tensor", 1)
    prompts = rl_overrides.pop("batch_prompts", ROWS_PROMPTS)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, chips // tensor, tensor
    c.task.prompt_buckets = (PROMPT,)
    c.rl.batch_prompts, c.rl.num_generations = prompts, G
    c.rl.max_new_tokens = completion or COMPLETION
    c.rl.beta = 0.04
    c.rl.micro_batches = max(1, prompts * G // (chips // tensor))  # a row per FSDP shard
    c.kernels.backend = "auto"                      # the Pallas kernels on TPU
    for key, value in rl_overrides.items():
        c.rl[key] = value
    if c.rl.get("packing", False):  # the longest row alone fills a pack
        c.rl.pack_tokens = PROMPT + c.rl.max_new_tokens
    return c, cfg


def run_one(model: str, slice_name: str, setting: str, layers: int | None,
            scan: bool = True, memory_only: bool = False) -> dict:
    """Compiles one setting (in this process) and returns its per-device figures."""
    from jaxrl_reason.runtime import plan as planner

    topology = ALL_SLICES[slice_name]
    config, cfg = _config(model, topology, setting, layers, scan)
    t0 = time.time()
    report = planner.plan(config, topology, layer_cost=not memory_only)
    progs = {p.name: {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
             for p in report["programs"]}
    return {"model": model, "slice": slice_name, "setting": setting, "scan": scan,
            "layers": cfg.n_layers, "params": report["params"], "programs": progs,
            "compile_s": time.time() - t0, "chip": dataclasses.asdict(report["chip"]),
            "devices": report["devices"], "memory_only": not report["layer_cost"]}


def _subprocess(model, slice_name, setting, layers, scan, memory_only=False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", model, slice_name, setting,
           str(layers if layers is not None else 0), "scan" if scan else "unrolled"]
    cmd += ["--memory-only"] if memory_only else []
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")


def extrapolate(a: dict, b: dict, layers: int, params: int) -> dict:
    """Per-device figures at `layers` from compiles at a["layers"] < b["layers"]."""
    la, lb = a["layers"], b["layers"]
    out = {"layers": layers, "params": params, "extrapolated_from": [la, lb],
           "model": a["model"], "slice": a["slice"], "setting": a["setting"],
           "scan": a["scan"], "compile_s": a["compile_s"] + b["compile_s"],
           "chip": a["chip"], "devices": a["devices"], "programs": {}}
    for name, pa in a["programs"].items():
        pb, prog = b["programs"][name], dict(pa)
        for key in ("argument_bytes", "output_bytes", "temp_bytes", "resident_bytes", "flops",
                    "hbm_bytes", "model_flops"):
            slope = (pb[key] - pa[key]) / (lb - la)
            prog[key] = max(0.0, pb[key] + slope * (layers - lb))
        out["programs"][name] = prog
    return out


def figures(result: dict) -> dict:
    """Fit, peak memory, roofline time and MFU per program (from the stored per-device data)."""
    from jaxrl_reason.runtime.plan import Chip, ProgramPlan, with_flops_floor

    chip = Chip(**result["chip"])
    rows = {}
    for name, p in result["programs"].items():
        prog = with_flops_floor(ProgramPlan(**p), result["devices"], "block")
        rows[name] = {"total_gib": prog.total_bytes / GiB,
                      "fits": prog.total_bytes <= chip.hbm_bytes,
                      "roofline_s": prog.roofline_s(chip),
                      "mfu": prog.mfu(chip, result["devices"])}
    return rows


def _fmt_setting(s: str) -> str:
    return SETTING_NAMES[s]


def markdown(results: list[dict], unrolled: list[dict],
             pending: list[tuple[str, str]] = ()) -> str:
    lines = [
        "# GRPO on real TPU slices, sized from a CPU",
        "",
        "Generated by `python benchmarks/tpu_plan.py` (jax[tpu] AOT compilation for the real "
        "topology; XLA's memory and cost analysis; roofline from the chips' published peaks in "
        "`jaxrl_reason/runtime/plan.py`). Workload: GRPO, 8 prompts x G = 8 (64 rows), 1,024-token "
        "prompts, 4,096-token completions, beta = 0.04 (reference resident), bf16 compute, "
        "FSDP over all chips, scanned layers, remat per block, 512-query attention chunks, "
        "chunked log-probs, the Pallas loss kernel, one row per chip per micro-batch, every "
        "program compiled at the model's full depth. v5p-8 is 4 chips (8 TensorCores); "
        "v5e-8 and v6e-8 are 8 chips.",
        "",
        "Memory is per chip and includes what stays resident while a program runs (optimizer "
        "state during sampling, the reference params). Step time = sampler + log-prob pass "
        "(reference) + update, each at its roofline (max of FLOPs / peak and bytes / HBM "
        "bandwidth); MFU = model FLOPs (2|θ| per token forward, 6|θ| for the update) over "
        "that time at peak.",
        "",
        "| model | slice | setting | fits | peak GiB / HBM | sampler s | log-prob s | "
        "update s | update MFU | step s (roofline) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = figures(r)
        hbm = r["chip"]["hbm_bytes"] / GiB
        peak = max(v["total_gib"] for v in f.values())
        fits = all(v["fits"] for v in f.values())
        step = sum(v["roofline_s"] for v in f.values())
        times = (f"{f['sampler']['roofline_s']:.1f} | {f['log-prob pass']['roofline_s']:.2f} | "
                 f"{f['update']['roofline_s']:.1f} | {100 * f['update']['mfu']:.0f}% | "
                 f"{step:.1f}")
        if r.get("memory_only"):
            times = "n/a | n/a | n/a | n/a | n/a"
        lines.append(
            f"| {r['model']} | {r['slice']} | {_fmt_setting(r['setting'])} | "
            f"{'yes' if fits else 'NO'} | {peak:.1f} / {hbm:.0f} | {times} | "
            f"{r['compile_s']:.0f} |")
    if unrolled:
        lines += ["", "Scanned vs unrolled layers (`model.scan_layers`), GiB per chip; the "
                  "unrolled figures are extrapolated from 2- and 4-layer compiles:", "",
                  "| model | slice | setting | program | scanned | unrolled | compile s "
                  "(scanned / unrolled 2+4 layers) |", "|---|---|---|---|---|---|---|"]
        by_key = {(r["model"], r["slice"], r["setting"]): r for r in results}
        for u in unrolled:
            r = by_key[(u["model"], u["slice"], u["setting"])]
            scanned = figures(r)
            for name, v in figures(u).items():
                lines.append(f"| {u['model']} | {u['slice']} | {_fmt_setting(u['setting'])} | "
                             f"{name} | {scanned[name]['total_gib']:.2f} | "
                             f"{v['total_gib']:.2f} | {r['compile_s']:.0f} / "
                             f"{u['compile_s']:.0f} |")
    if pending:
        lines += ["", "Not compiled yet (run `python benchmarks/tpu_plan.py --models ... "
                  "--slices ...`; finished compiles are cached in tpu_plan.json): "
                  + ", ".join(f"{m} on {s}" for m, s in pending) + "."]
    lines += ["", "Notes:", "",
              "- The sampler's figures are analytic (XLA counts the decode loop body once): "
              "weights read once per decoded token, so decode is bandwidth-bound; its MFU is "
              "low on every chip, as for any autoregressive decode at 64 rows.",
              "- The update's and log-prob pass's FLOPs/bytes are XLA's for one micro-batch "
              "times the number of micro-batches (an upper bound on time: the optimizer is "
              "counted that many times), so the MFU shown is a lower bound.",
              "- Remat per block recomputes the forward once: the update's MFU is at most "
              "6/8 = 75% of peak before attention FLOPs."]
    return "\n".join(lines) + "\n"


LONG_TAIL_INTRO = (
    "## Sampler time on long-tailed lengths: static batch vs slot refill\n\n"
    "`python benchmarks/tpu_plan.py --long-tail MODEL SLICE` (`plan.sampler_time`): the "
    f"{ROWS_PROMPTS} x {G} rows of a step stop at the anchors' long_tail lengths scaled so "
    f"that their longest possible row (512) is {COMPLETION:,} tokens (the first "
    f"{ROWS_PROMPTS * G} rows; {PROMPT:,}-token prompts). Under a KV-cache budget per chip, "
    "the static batch decodes as many rows at once as fit, each batch to its longest row; "
    "slot refill decodes min(slots, what fits) slots, longest rows queued first, refilled "
    "every 8 steps. A decode step's time is max(FLOPs / peak, bytes / bandwidth) over the "
    "slice, for 2|theta| FLOPs per computed row plus attention over the step's cache stage, "
    "and the weights (the chosen compile's sampler arguments) plus the computed rows' K and V "
    "read once; prefill left out. Analytic per step, as the plan's sampler row (XLA's cost "
    "analysis counts the decode loop's body once).\n\n")


def long_tail_lengths(rows: int, max_len: int) -> list[int]:
    """The anchors' long_tail lengths (spec.json; their longest possible row, 512, mapped
    to `max_len`), the first `rows`: the issue's length distribution at the plan's shapes."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import roofline
    from sampler import long_tail_lengths as spec_lengths, scale_lengths

    import numpy as np

    spec = roofline.load_spec()
    if spec is None or "long_tail" not in spec:
        raise SystemExit(f"--long-tail needs the anchors' spec.json ({roofline.SPEC_PATH})")
    lengths = spec_lengths(spec)
    top = spec["long_tail"]["lengths"]["max"]
    scaled = scale_lengths(np.append(lengths, top), max_len)[:-1]  # top -> max_len
    return scaled[:rows].tolist()


def long_tail(result: dict, budgets_gib, slots, refill_every: int = 8) -> list[dict]:
    """Sampler time of the long_tail lengths for the stored compile `result` (its model,
    slice and setting; weight bytes from its sampler's arguments): per KV-cache budget per
    chip, the static batch and slot refill with each of `slots` (`plan.sampler_time`)."""
    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.runtime.plan import Chip, sampler_time

    cfg, chip, n_dev = get_preset(result["model"]), Chip(**result["chip"]), result["devices"]
    sampler = result["programs"]["sampler"]
    lengths = long_tail_lengths(ROWS_PROMPTS * G, COMPLETION)
    common = dict(prompt_len=PROMPT, num_prompts=ROWS_PROMPTS, chip=chip, n_dev=n_dev,
                  weight_bytes=sampler["argument_bytes"] * n_dev)
    out = []
    for budget in budgets_gib:
        row = {"model": result["model"], "slice": result["slice"],
               "setting": result["setting"], "kv_budget_gib": budget,
               "mean_length": sum(lengths) / len(lengths), "max_length": max(lengths),
               "static": sampler_time(cfg, lengths, kv_budget_bytes=budget * GiB, **common)}
        for s in slots:
            row[f"refill_{s}"] = sampler_time(cfg, lengths, kv_budget_bytes=budget * GiB,
                                              slots=s, refill_every=refill_every, **common)
        out.append(row)
    return out


def long_tail_markdown(rows: list[dict]) -> str:
    """The sampler-time table of `long_tail` rows."""
    lines = ["| model | slice | KV budget GiB / chip | sampler | rows x batches or slots | "
             "decode steps | KV GiB / chip | roofline s | useful tok/s | occupancy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for key in [k for k in row if k == "static" or k.startswith("refill_")]:
            r = row[key]
            shape = (f"{r['rows_at_once']} x {r['batches']}" if key == "static"
                     else f"{r['slots']} slots")
            lines.append(f"| {row['model']} | {row['slice']} | {row['kv_budget_gib']:g} | "
                         f"{key.replace('_', ' ')} | {shape} | {r['decode_steps']:,} | "
                         f"{r['kv_cache_bytes'] / GiB:.2f} | {r['seconds']:.1f} | "
                         f"{r['useful_tok_s']:,.0f} | {100 * r['occupancy']:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=5, metavar=("MODEL", "SLICE", "SETTING", "LAYERS", "STACK"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--unrolled", nargs=2, metavar=("MODEL", "SLICE"), action="append",
                    default=[], help="also size the unrolled stack (setting chosen)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--slices", nargs="+", default=list(SLICES), choices=list(ALL_SLICES))
    ap.add_argument("--settings", nargs="+", default=["A", "B", "C", "D", "E"],
                    choices=list(SETTINGS),
                    help="settings to try, in order, per family (default: A-E)")
    ap.add_argument("--memory-only", action="store_true",
                    help="skip the FLOPs/bytes compiles of scanned layers (roofline n/a)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "tpu_plan"))
    ap.add_argument("--long-tail", nargs=2, metavar=("MODEL", "SLICE"), action="append",
                    default=[], help="the sampler's time on the long_tail lengths, static vs "
                                     "slot refill, per KV budget (from the stored compile)")
    ap.add_argument("--kv-budgets", nargs="+", type=float, default=[1.0, 2.0, 4.0],
                    help="--long-tail: KV-cache budgets, GiB per chip")
    ap.add_argument("--long-tail-slots", nargs="+", type=int, default=[16, 32, 64],
                    help="--long-tail: slot counts (rl.max_num_seqs) to size")
    args = ap.parse_args()
    if args.one:
        model, slice_name, setting, layers, stack = args.one
        result = run_one(model, slice_name, setting, int(layers) or None, stack == "scan",
                         args.memory_only)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from jaxrl_reason.models.config import get_preset
    path = args.out + ".json"

    def stored() -> list[dict]:
        return json.load(open(path))["compiles"] if os.path.isfile(path) else []

    def compiled(model, slice_name, setting, layers, scan=True):
        c = find(stored(), model, slice_name, setting, layers, scan)
        if c is not None:
            return c
        print(f"compiling {model} on {slice_name}, setting {setting}, {layers} layers, "
              f"{'scanned' if scan else 'unrolled'}", flush=True)
        c = _subprocess(model, slice_name, setting, layers, scan, args.memory_only)
        # Re-read before writing: another invocation (other models) may have added compiles.
        store = {"compiles": stored() + [c]}
        with open(path + ".tmp", "w") as f:
            json.dump(store, f, indent=1)
        os.replace(path + ".tmp", path)
        write_report()
        return c

    def write_report() -> None:
        """The md from every stored compile (all models and slices, this run's or not)."""
        compiles = stored()
        results, pending = chosen(compiles)
        unrolled = []
        for model, slice_name in args.unrolled:
            pick = next((r for r in results if (r["model"], r["slice"]) == (model, slice_name)),
                        None)
            if pick is None:
                continue
            small, big = (find(compiles, model, slice_name, pick["setting"], n, False)
                          for n in (2, 4))
            if small and big:
                unrolled.append(extrapolate(small, big, get_preset(model).n_layers,
                                            get_preset(model).num_params))
        text = markdown(results, unrolled, pending)
        lt = [r for model, slice_name in args.long_tail
              for pick in [next((c for c in results if (c["model"], c["slice"])
                                 == (model, slice_name) and FAMILIES[c["setting"]] == "full"),
                                None)] if pick
              for r in long_tail(pick, args.kv_budgets, args.long_tail_slots)]
        if lt:
            store = json.load(open(path))
            store["long_tail"] = lt
            with open(path + ".tmp", "w") as f:
                json.dump(store, f, indent=1)
            os.replace(path + ".tmp", path)
            text += "\n\n" + LONG_TAIL_INTRO + long_tail_markdown(lt) + "\n"
        long_records = (json.load(open(path)).get("long_context")
                        if os.path.isfile(path) else None)
        if long_records:  # benchmarks/tpu_plan_long.py's section, kept
            from tpu_plan_long import long_markdown
            text += "\n\n" + long_markdown(long_records)
        with open(args.out + ".md", "w") as f:
            f.write(text)

    if args.long_tail:  # from the stored compiles only: nothing is compiled
        write_report()
        text = open(args.out + ".md").read()
        print(text[text.index("## Sampler time on long-tailed"):])
        return
    for model in args.models:
        cfg = get_preset(model)
        for slice_name in args.slices:
            for family in dict.fromkeys(FAMILIES[s] for s in args.settings):
                for setting in (s for s in args.settings if FAMILIES[s] == family):
                    r = compiled(model, slice_name, setting, cfg.n_layers)
                    if all(v["fits"] for v in figures(r).values()):
                        break
    for model, slice_name in args.unrolled:
        pick = next(r for r in chosen(stored())[0] if (r["model"], r["slice"]) == (model,
                                                                                    slice_name))
        for n in (2, 4):
            compiled(model, slice_name, pick["setting"], n, scan=False)
    write_report()
    print(open(args.out + ".md").read())


def find(compiles: list[dict], model: str, slice_name: str, setting: str, layers: int,
         scan: bool) -> dict | None:
    """The stored compile of exactly these settings, or None."""
    key = (model, slice_name, setting, layers, scan)
    return next((c for c in compiles if (c["model"], c["slice"], c["setting"], c["layers"],
                                         c.get("scan", True)) == key), None)


def chosen(compiles: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """Per (model, slice, family), in MODELS x SLICES order, the full-depth scanned compile
    reported: the first setting (in SETTINGS order) that fits, else the last one tried (does
    not fit). Also the (model, slice) pairs of SLICES with no compile yet."""
    results, pending = [], []
    for model in MODELS:
        for slice_name in ALL_SLICES:
            tried = sorted((c for c in compiles if (c["model"], c["slice"]) == (model, slice_name)
                            and c.get("scan", True) and "extrapolated_from" not in c
                            and c["layers"] == _full_depth(model)),
                           key=lambda c: list(SETTINGS).index(c["setting"]))
            for family in dict.fromkeys(FAMILIES.values()):
                mine = [c for c in tried if FAMILIES[c["setting"]] == family]
                fitting = [c for c in mine if all(v["fits"] for v in figures(c).values())]
                if mine:
                    results.append(fitting[0] if fitting else mine[-1])
            if not tried and slice_name in SLICES:
                pending.append((model, slice_name))
    return results, pending


def _full_depth(model: str) -> int:
    from jaxrl_reason.models.config import get_preset
    return get_preset(model).n_layers


if __name__ == "__main__":
    main()
