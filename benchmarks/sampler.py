r"""Our sampler on the anchors' models and workload (../shared/anchors/spec.json).

    python benchmarks/sampler.py                          # bench-tiny and bench-small, ~2 min
    python benchmarks/sampler.py --models bench-small --cache-dtype bfloat16 --json out.json
    python benchmarks/sampler.py --scaling                # cost vs rows and vs length
    python benchmarks/sampler.py --profile /tmp/trace     # + a jax.profiler trace summary
    python benchmarks/sampler.py --quick                  # "test" preset, tiny workload (tests)
    python benchmarks/sampler.py --workload long_tail --models bench-tiny   # slot refill

Workload (the spec's "sampler"): 16 seeded random prompts of 32 tokens (the anchors' ids),
8 samples each = 128 rows, 128 new tokens, temperature 1, top-p 1, top-k off, random-init
weights (N(0, 0.02)), no early stop (the stop id is -1, which never occurs). Protocol as the
anchors: one warm-up call (it includes compilation), then the median of 3 timed calls;
tokens/s = rows x new tokens / median seconds.

Each result also carries: compile seconds (JAX's own compile events during the warm-up call),
XLA's buffer plan of the compiled program (`memory_analysis()`), the process's peak RSS, the
useful FLOPs per call (prefill of the 16 prompts + 127 decode steps of 128 rows over the
filled cache; see benchmarks/roofline.py) as a fraction of this machine's float32 matmul rate
through XLA at the model's decode shapes ([128, d] x [d, ...]) and of the best matmul rate
measured on the machine (XLA 1024^3 or numpy's probe), and the load average (the CPU is shared:
figures taken under load are provisional). The output line `RESULT_JSON {...}` is what
benchmarks/compare.sh reads.

`--workload long_tail` (the spec's "long_tail"): 32 prompts x 8 = 256 rows, each with its own
seeded stop length (the anchors' `common.long_tail_lengths`, given to the sampler as per-row
budgets; no stop id). It times slot refill (`--slots`, `--refill-every`) and our static batch
on the same lengths in one invocation, their timed calls alternating (the spec's warm-up and
timed call counts; median): useful tokens/s = sum(lengths) / median seconds, slot
occupancy = useful decode slot-steps / all decode slot-steps (each row's first token comes
from the prefill), and the KV-cache bytes of each (`Sampler.kv_cache_bytes`).
`--sweep-refill-every 1 4 8 16` first times one call per refill period. With `--quick`: the
"test" preset, 2 prompts x 4 samples, the first 8 lengths scaled to at most 16, 4 slots.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import roofline  # noqa: E402
from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd  # noqa: E402
from jaxrl_reason.models.transformer import Transformer  # noqa: E402
from jaxrl_reason.sampling import filters  # noqa: E402
from jaxrl_reason.sampling import refill as refill_mod  # noqa: E402
from jaxrl_reason.sampling.sampler import Sampler  # noqa: E402

WORKLOAD = {"n_prompts": 16, "samples_per_prompt": 8, "prompt_len": 32, "new_tokens": 128,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "warmup_calls": 1, "timed_calls": 3}
QUICK = {"n_prompts": 2, "samples_per_prompt": 2, "prompt_len": 8, "new_tokens": 8,
         "temperature": 1.0, "top_p": 1.0, "top_k": 0, "warmup_calls": 1, "timed_calls": 1}
SEED, PROMPT_ID_LOW = 0, 3  # the spec's seed and its first non-special token id

COMPILE_S: dict[str, float] = {}


def _on_event(event: str, secs: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
        name = event.rsplit("/", 1)[1]
        COMPILE_S[name] = COMPILE_S.get(name, 0.0) + secs


jax.monitoring.register_event_duration_secs_listener(_on_event)


def workload_from_spec(spec: dict | None, quick: bool) -> dict:
    """The spec's sampler workload (our defaults when spec.json is absent), or QUICK."""
    if quick:
        return dict(QUICK)
    w = dict(WORKLOAD)
    if spec is not None:
        w.update({k: spec["sampler"][k] for k in w if k in spec["sampler"]})
    return w


def prompt_ids(vocab_size: int, n_prompts: int, prompt_len: int, seed: int = SEED) -> np.ndarray:
    """The anchors' prompts: seeded ids in [3, vocab), int32 [n_prompts, prompt_len]."""
    rng = np.random.default_rng(seed)
    return rng.integers(PROMPT_ID_LOW, vocab_size, size=(n_prompts, prompt_len)).astype(np.int32)


def sampler_flops(cfg, w: dict, rows: int, matmul_only: bool = False) -> float:
    """Useful forward FLOPs of one call: the prefill of the P prompts (causal) and L - 1
    decode steps of `rows` rows, step s attending to prompt_len + s keys."""
    p, tp, new = w["n_prompts"], w["prompt_len"], w["new_tokens"]
    prefill = roofline.forward_flops(cfg, p * tp, p * roofline.causal_keys(0, tp), matmul_only)
    steps = new - 1
    keys = rows * (steps * tp + steps * (steps + 1) / 2)
    return prefill + roofline.forward_flops(cfg, rows * steps, keys, matmul_only)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def profile_options() -> jax.profiler.ProfileOptions:
    """Host tracer level 3: XLA:CPU then records one event per executed op (fusion, dot)."""
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 3
    options.python_tracer_level = 0
    return options


_CONTAINERS = ("while", "conditional", "call", "Pjit", "Execute", "ThunkExecutor", "PjRt",
               "$", "Allocate", "Handle", "Parse", "end: ")


def print_trace(events, label: str = "trace") -> None:
    """Prints `trace_summary`'s (op, ms, count) rows, one per line."""
    for name, ms, count in events:
        print(f"  {label}: {ms:10.2f} ms  x{count:<6d} {name}")


def trace_summary(trace_dir: str, top: int = 15) -> list[tuple[str, float, int]]:
    """(op kind, total ms, count) of the longest-running kinds of XLA ops in the newest
    perfetto trace under `trace_dir` (jax.profiler.trace(create_perfetto_trace=True)); loops,
    calls and host runtime events that contain other events are left out."""
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz"), key=os.path.getmtime)
    if not files:
        return []
    with gzip.open(files[-1]) as f:
        events = json.load(f).get("traceEvents", [])
    total, count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(_CONTAINERS):
            kind = re.sub(r"\.\d+$", "", e["name"])  # fusion.12 -> fusion: one line per kind
            total[kind] += e["dur"] / 1e3
            count[kind] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [(name, round(ms, 2), count[name]) for name, ms in ranked]


def build(name: str, cache_dtype: str | None, decode_stages: int, devices: int):
    """The preset's random-init params and a Sampler on a data-parallel mesh of the first
    `devices` devices (one per core by default: see --cpu-devices)."""
    cfg = models.get_preset(name)
    mesh = shd.make_mesh({"data": devices}, devices=jax.devices()[:devices])
    params = models.init_params(cfg, jax.random.key(SEED), mesh, shd.DEFAULT_RULES)
    sampler = Sampler(Transformer(cfg), eos_id=-1, pad_id=0,  # -1: no early stop
                      cache_dtype=None if cache_dtype in (None, "none") else jnp.dtype(cache_dtype),
                      decode_stages=decode_stages, mesh=mesh, rules=shd.DEFAULT_RULES)
    return cfg, params, sampler


def run_model(name: str, w: dict, args) -> dict:
    """Times the sampler on preset `name` under workload `w`; returns the result dict."""
    roofline.check_preset_matches_spec(name, args.spec_data)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cfg, params, sampler = build(name, args.cache_dtype, args.decode_stages, args.devices)
    g, new = w["samples_per_prompt"], w["new_tokens"]
    prompts = prompt_ids(cfg.vocab_size, w["n_prompts"], w["prompt_len"])
    valid = np.ones_like(prompts, bool)
    rows = prompts.shape[0] * g
    calls = [0]

    def generate():
        calls[0] += 1
        out = sampler(params, prompts, valid, jax.random.key(calls[0]), num_samples=g,
                      max_new_tokens=new, temperature=w["temperature"], top_p=w["top_p"],
                      top_k=w["top_k"])
        lengths = np.asarray(out.lengths)  # a host copy: the call has finished
        assert (lengths == new).all(), "a row stopped early"

    COMPILE_S.clear()
    t = roofline.time_calls(generate, w["warmup_calls"], w["timed_calls"])
    compile_parts = dict(COMPILE_S)
    result = {
        "system": "jaxrl_reason.Sampler", "model": name, "n_params": cfg.num_params,
        "rows": rows, "new_tokens": new, "prompt_len": w["prompt_len"],
        "decode_tok_s": rows * new / t["median_s"], "decode_tok_s_best": rows * new / t["min_s"],
        "median_s": t["median_s"], "timed_s": t["timed_s"], "first_call_s": t["first_call_s"],
        "compile_s": sum(compile_parts.values()), "compile_s_parts": compile_parts,
        "cache_dtype": args.cache_dtype or str(jnp.dtype(cfg.dtype)),
        "decode_stages": args.decode_stages, "devices": args.devices,
    }
    if args.profile:
        with jax.profiler.trace(args.profile, create_perfetto_trace=True,
                                profiler_options=profile_options()):
            generate()
        result["trace_top_ms"] = trace_summary(args.profile)
    if not args.no_memory_analysis:
        lowered = sampler.lower(params, prompts, valid, jax.random.key(0), num_samples=g,
                                max_new_tokens=new, temperature=w["temperature"])
        mem = lowered.compile().memory_analysis()
        if mem is not None:
            result["xla_memory_mib"] = {
                k: round(getattr(mem, f"{k}_size_in_bytes") / 2 ** 20, 1)
                for k in ("argument", "output", "temp", "generated_code")}
    flops = sampler_flops(cfg, w, rows)
    flops_mm = sampler_flops(cfg, w, rows, matmul_only=True)
    frac = roofline.roofline_fraction(flops / t["median_s"], cfg, rows, args.quick)
    result.update({
        "gflop_per_call": round(flops / 1e9, 2),
        "achieved_gflops": frac["achieved_gflops"],
        "matmul_rate_gflops": frac["roofline_gflops"],
        "roofline_fraction": frac["fraction"],
        "peak_gflops": frac["peak_gflops"], "peak_parts": frac["peak_parts"],
        "fraction_of_peak": frac["fraction_of_peak"],
        "roofline_fraction_matmul_params": round(flops_mm / t["median_s"]
                                                 / (frac["roofline_gflops"] * 1e9), 4),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "loadavg_start": load_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    })
    return result


def scaling(name: str, args) -> list[dict]:
    """Seconds per call (one warm-up, then one timed call) over rows and over new tokens."""
    cfg, params, sampler = build(name, args.cache_dtype, args.decode_stages, args.devices)
    grid = ([(4, 8), (8, 8), (4, 16)] if args.quick else
            [(r, 128) for r in (32, 64, 128, 256)] + [(128, n) for n in (64, 256, 512)])
    prompts_all = prompt_ids(cfg.vocab_size, 32, 8 if args.quick else 32)
    out = []
    for rows, new in grid:
        g = 8 if rows >= 8 else rows
        prompts = prompts_all[:rows // g]
        valid = np.ones_like(prompts, bool)

        def generate():
            out_ = sampler(params, prompts, valid, jax.random.key(1), num_samples=g,
                           max_new_tokens=new)
            np.asarray(out_.tokens)

        t = roofline.time_calls(generate, 1, 1)
        row = {"rows": rows, "new_tokens": new, "s": round(t["median_s"], 3),
               "us_per_token": round(1e6 * t["median_s"] / (rows * new), 1),
               "loadavg": round(os.getloadavg()[0], 2)}
        print(f"SCALING {name} rows={rows:4d} new={new:4d}  {row['s']:8.3f} s  "
              f"{row['us_per_token']:7.1f} us/token  load {row['loadavg']}", flush=True)
        out.append(row)
    return out


def long_tail_lengths(spec: dict) -> np.ndarray:
    """The anchors' per-row stop lengths (their `common.long_tail_lengths`), int32 [rows]."""
    sys.path.insert(0, str(roofline.SPEC_PATH.parent))
    import common  # the anchors' helpers (stdlib + numpy)
    return common.long_tail_lengths(spec).astype(np.int32)


def scale_lengths(lengths: np.ndarray, max_len: int, rows: int | None = None) -> np.ndarray:
    """The first `rows` (default all) of int `lengths` [n] rescaled so that the longest of
    all n becomes `max_len`: int32 [rows] in [1, max_len] (the long-tail shape
    at another length, as the --quick preset and the TPU plan use)."""
    lengths = np.asarray(lengths)
    if lengths.size == 0 or max_len < 1:
        raise ValueError(f"scale_lengths: need rows and max_len >= 1 (got {lengths.size} rows,"
                         f" max_len {max_len})")
    scaled = np.rint(lengths[:rows] * (max_len / float(lengths.max())))
    return np.clip(scaled, 1, max_len).astype(np.int32)


def long_tail_workload(spec: dict | None, quick: bool) -> tuple[dict, np.ndarray]:
    """The spec's long_tail workload and its lengths int32 [rows]; with `quick`, 2 prompts x
    4 samples of 8 tokens and those rows' lengths scaled to at most 16 (behaviour only)."""
    if spec is None or "long_tail" not in spec:
        raise SystemExit(f"--workload long_tail needs the anchors' spec.json with a long_tail "
                         f"workload ({roofline.SPEC_PATH} or --spec)")
    w, lengths = dict(spec["long_tail"]), long_tail_lengths(spec)
    if quick:
        w.update(n_prompts=2, samples_per_prompt=4, rows=8, prompt_len=8, max_new_tokens=16,
                 warmup_calls=1, timed_calls=1)
        lengths = scale_lengths(lengths, 16, 8)
    return w, lengths


def replay_point(lengths, slots: int, every: int, min_slots: int, shards: int) -> dict:
    """`refill.replay`'s row-order schedule of int `lengths` [N] at `slots` slots: decode
    steps, slot-steps and occupancy, with and without shrinking (ints and floats)."""
    out = {"slots": slots}
    for key, levels in (("shrink", refill_mod.slot_levels(slots, shards, min_slots)),
                        ("no_shrink", None)):
        schedule = refill_mod.replay(lengths, slots, every, levels)
        slot_steps = sum(s[0] for s in schedule)
        out[key] = {"decode_steps": len(schedule), "slot_steps": slot_steps,
                    "occupancy": round((int(np.sum(lengths)) - len(lengths)) / slot_steps, 4)}
    return out


def long_tail(name: str, args) -> dict:
    """Slot refill against our static batch on the long-tail lengths, one invocation.

    Every row stops the way an RL row stops: by emitting the spec's stop id, at its seeded
    length (`filters.stop_schedule` on the logits inside the decode step); every row has the
    same budget (max_new_tokens), so the queue is in row order, as in `RLTrainer`. A third
    system, labelled "budgets known in advance", gives each row its length as its budget
    (rows queued longest first): what a user who sets per-row budgets gets."""
    spec = args.spec_data
    roofline.check_preset_matches_spec(name, spec)
    w, lengths = long_tail_workload(spec, args.quick)
    g, max_len = w["samples_per_prompt"], w["max_new_tokens"]
    stop = int(spec["special_tokens"]["eos"])
    cfg, params, base = build(name, args.cache_dtype, args.decode_stages, args.devices)
    prompts = prompt_ids(cfg.vocab_size, w["n_prompts"], w["prompt_len"])
    valid = np.ones_like(prompts, bool)
    rows, useful = len(lengths), int(lengths.sum())
    slots = args.slots
    sampling = {k: w[k] for k in ("temperature", "top_p", "top_k")}
    mesh, rules = base.mesh, base.rules

    def make(refill: bool, budgets: bool, every: int = args.refill_every) -> Sampler:
        # With budgets: no stop id (-1 never occurs), each row ends at its budget.
        return Sampler(Transformer(cfg), eos_id=-1 if budgets else stop, pad_id=0, mesh=mesh,
                       rules=rules,
                       cache_dtype=None if args.cache_dtype in (None, "none")
                       else jnp.dtype(args.cache_dtype),
                       decode_stages=args.decode_stages, max_num_seqs=slots if refill else 0,
                       refill_every=every, min_slots=args.min_slots,
                       logits_processor=None if budgets else filters.stop_schedule(lengths, stop))

    systems = {"refill": make(True, False), "static": make(False, False),
               "refill_budgets": make(True, True)}
    if args.no_budgets_row:
        del systems["refill_budgets"]
    seeds = [0]

    def call(key):
        """One timed call of system `key` (it blocks on the output); seconds."""
        sampler = systems[key]
        seeds[0] += 1
        budget = lengths if key == "refill_budgets" else max_len
        t0 = time.perf_counter()
        out = sampler(params, prompts, valid, jax.random.key(seeds[0]), num_samples=g,
                      max_new_tokens=budget, max_len=max_len, **sampling)
        got = np.asarray(out.lengths)
        seconds = time.perf_counter() - t0
        assert (got == lengths).all(), f"{key}: a row missed its length"
        if key != "refill_budgets":
            assert not np.asarray(out.truncated).any(), f"{key}: a row ended without its stop id"
        return seconds

    load_start = [round(x, 2) for x in os.getloadavg()]
    sweep = []
    for every in args.sweep_refill_every or ():
        systems["sweep"] = make(True, False, every)
        call("sweep")  # compile
        seconds = call("sweep")
        sweep.append({"refill_every": every, "s": round(seconds, 3),
                      "useful_tok_s": round(useful / seconds, 1),
                      "decode_steps": int(systems["sweep"].last_decode_steps),
                      "slot_steps": int(systems["sweep"].last_slot_steps)})
        print(f"SWEEP refill_every={every:3d}: {sweep[-1]}", flush=True)
        del systems["sweep"]
    first = {k: call(k) for k in systems}  # warm-up (compiles)
    for _ in range(w["warmup_calls"] - 1):
        for k in systems:
            call(k)
    # Alternate the timed calls: the shared machine's load drifts, and alternating spreads
    # the drift over the systems instead of favouring the one timed last.
    times = {k: [] for k in systems}
    for _ in range(w["timed_calls"]):
        for k in systems:
            times[k].append(call(k))
    median = {k: statistics.median(v) for k, v in times.items()}
    decode_work = useful - rows  # decode slot-steps a row needs: its length - 1
    refill, static = systems["refill"], systems["static"]
    slot_steps = int(refill.last_slot_steps)
    result = {
        "system": "jaxrl_reason.Sampler", "workload": "long_tail", "model": name,
        "stops": "eos", "queue": "row_order", "rows": rows, "useful_tokens": useful,
        "max_new_tokens": max_len, "slots": slots,
        "slots_rule": args.slots_rule,
        "slot_levels": list(refill_mod.slot_levels(slots, refill_mod.batch_shards(mesh, rules),
                                                   args.min_slots or slots)),
        "refill_every": args.refill_every,
        "useful_tok_s": useful / median["refill"],
        "static_useful_tok_s": useful / median["static"],
        "speedup_vs_static": median["static"] / median["refill"],
        "slot_occupancy": decode_work / slot_steps,
        "static_slot_occupancy": decode_work / (rows * (int(lengths.max()) - 1)),
        "decode_steps": int(refill.last_decode_steps), "slot_steps": slot_steps,
        "kv_cache_bytes": refill.kv_cache_bytes(w["n_prompts"], w["prompt_len"], g, max_len),
        "static_kv_cache_bytes": static.kv_cache_bytes(w["n_prompts"], w["prompt_len"], g,
                                                       max_len),
        "median_s": median["refill"], "static_median_s": median["static"],
        "timed_s": times["refill"], "static_timed_s": times["static"],
        "first_call_s": first["refill"], "static_first_call_s": first["static"],
        "refill_every_sweep": sweep,
        # The same schedule replayed on the host (refill.replay) at other slot counts: how
        # much the slot rule matters, without timing anything.
        "replay_by_slots": [replay_point(lengths, n, args.refill_every, args.min_slots,
                                         refill_mod.batch_shards(mesh, rules))
                            for n in sorted({max(1, slots // 2), slots, min(rows, 2 * slots)})],
    }
    if "refill_budgets" in systems:
        known = systems["refill_budgets"]
        result["budgets_known_in_advance"] = {
            "queue": "longest_first", "useful_tok_s": useful / median["refill_budgets"],
            "speedup_vs_static": median["static"] / median["refill_budgets"],
            "slot_occupancy": decode_work / int(known.last_slot_steps),
            "decode_steps": int(known.last_decode_steps),
            "slot_steps": int(known.last_slot_steps), "median_s": median["refill_budgets"],
            "timed_s": times["refill_budgets"], "first_call_s": first["refill_budgets"]}
    result.update({
        "devices": args.devices, "cache_dtype": args.cache_dtype or str(jnp.dtype(cfg.dtype)),
        "peak_rss_mib": round(peak_rss_mib(), 1), "loadavg_start": load_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()]})
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None,
                    help="presets (default bench-tiny bench-small; 'test' with --quick)")
    ap.add_argument("--cache-dtype", default=None, help="KV-cache dtype, e.g. bfloat16")
    ap.add_argument("--decode-stages", type=int, default=4,
                    help="decode stages with a growing cache (1 = whole buffer every step)")
    ap.add_argument("--cpu-devices", type=int, default=0,
                    help="XLA devices to split the CPU into, rows split over them (0 = one "
                         "per core; 1 = one device)")
    ap.add_argument("--scaling", action="store_true",
                    help="also time 32..256 rows and 64..512 new tokens (first model)")
    ap.add_argument("--profile", help="trace one call into this directory and summarize it")
    ap.add_argument("--no-memory-analysis", action="store_true",
                    help="skip the extra AOT compile for XLA's buffer plan")
    ap.add_argument("--spec", default=None, help="anchors' spec.json (default: shared path)")
    ap.add_argument("--quick", action="store_true", help="'test' preset, tiny workload")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--workload", choices=("sampler", "long_tail"), default="sampler",
                    help="the spec's fixed-length sampler workload, or long_tail (slot "
                         "refill against the static batch on per-row lengths)")
    ap.add_argument("--slots", type=int, default=0,
                    help="long_tail: slots of the refill sampler (rl.max_num_seqs); 0 = "
                         "rows // 4, a rule of the batch size alone (not of the lengths)")
    ap.add_argument("--refill-every", type=int, default=8,
                    help="long_tail: decode steps between refills (the sampler's default)")
    ap.add_argument("--min-slots", type=int, default=4,
                    help="long_tail: fewest slots the tail shrinks to (the sampler's "
                         "default; 0 = never shrink)")
    ap.add_argument("--no-budgets-row", action="store_true",
                    help="long_tail: skip the labelled system with per-row budgets known "
                         "in advance")
    ap.add_argument("--sweep-refill-every", type=int, nargs="*",
                    help="long_tail: first time one call for each of these refill periods")
    args = ap.parse_args(argv)
    args.spec_data = roofline.load_spec(args.spec)
    if args.workload == "long_tail":
        return main_long_tail(args)
    names = args.models or (["test"] if args.quick else ["bench-tiny", "bench-small"])
    w = workload_from_spec(args.spec_data, args.quick)
    rows = [w["n_prompts"] * w["samples_per_prompt"]]
    if args.scaling:
        rows += [4, 8] if args.quick else [32, 64, 128, 256]
    args.devices = roofline.use_cpu_devices(args.cpu_devices, rows)
    machine = roofline.machine_info(probe=not args.quick)
    print(f"machine: {machine}; workload: {w}", flush=True)
    results = {"machine": machine, "workload": w, "runs": {}}
    for name in names:
        r = run_model(name, w, args)
        results["runs"][name] = r
        print(f"{name}: {r['decode_tok_s']:.0f} tok/s (median of {w['timed_calls']}, "
              f"best {r['decode_tok_s_best']:.0f}), first call {r['first_call_s']:.1f} s, "
              f"compile {r['compile_s']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB, "
              f"XLA buffers {r.get('xla_memory_mib')}, {r['achieved_gflops']} GFLOP/s = "
              f"{100 * r['roofline_fraction']:.0f}% of the {r['matmul_rate_gflops']} GFLOP/s "
              f"matmul rate at its shapes ({100 * r['roofline_fraction_matmul_params']:.0f}% "
              f"counting matmul params only), {100 * r['fraction_of_peak']:.0f}% of the "
              f"machine's best {r['peak_gflops']} GFLOP/s {r['peak_parts']}, load "
              f"{r['loadavg_start']} -> {r['loadavg_end']}",
              flush=True)
        print_trace(r.get("trace_top_ms", []))
        print("RESULT_JSON " + json.dumps(r), flush=True)
    if args.scaling:
        results["scaling"] = scaling(names[0], args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main_long_tail(args) -> int:
    """--workload long_tail: one RESULT_JSON line per model."""
    w, _ = long_tail_workload(args.spec_data, args.quick)
    args.slots_rule = "--slots" if args.slots else "rows // 4"
    args.slots = min(args.slots or 4, 4) if args.quick else args.slots or max(1, w["rows"] // 4)
    args.devices = roofline.use_cpu_devices(args.cpu_devices, [w["rows"], args.slots])
    results = {"machine": roofline.machine_info(probe=False), "runs": {}}
    for name in args.models or (["test"] if args.quick else ["bench-tiny"]):
        r = long_tail(name, args)
        results["runs"][name] = r
        print(f"{name} long_tail (stops by EOS, row-order queue): refill ({r['slots']} "
              f"slots shrinking through {r['slot_levels']}, refill every "
              f"{r['refill_every']}) {r['useful_tok_s']:.0f} useful tok/s, static batch "
              f"{r['static_useful_tok_s']:.0f} ({r['speedup_vs_static']:.2f}x); occupancy "
              f"{100 * r['slot_occupancy']:.1f}% vs {100 * r['static_slot_occupancy']:.1f}%; "
              f"KV cache {r['kv_cache_bytes'] / 2**20:.1f} MiB vs "
              f"{r['static_kv_cache_bytes'] / 2**20:.1f} MiB; load {r['loadavg_start']} -> "
              f"{r['loadavg_end']}", flush=True)
        print("RESULT_JSON " + json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
