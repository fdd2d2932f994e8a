r"""The RL step on the long-tail lengths: `python benchmarks/rl_step.py --workload long_tail`.

    python benchmarks/rl_step.py --workload long_tail                   # ~15 min
    python benchmarks/rl_step.py --workload long_tail --variants refill_partial --steps 10
    python benchmarks/rl_step.py --workload long_tail --variants packing

The rl_step batch (8 prompts x 8 rows a step, bench-tiny) over the spec's long_tail prompts
and seeded lengths (../shared/anchors/spec.json "long_tail": 32 prompts x 8 rows, max 512 new
tokens; no stop id, each row stops at its own length as a per-row budget). Variants:
  static          one static batch a step
  refill          slot refill (rl.max_num_seqs slots, refilled every rl.refill_every steps)
  refill_partial  refill + partial rollouts (rl.rollout_token_budget tokens a row a step; the
                  trainer's PartialRollouts with each row's seeded length as its stop, through
                  its `row_stops` hook; a step trains the groups that completed)
  packing         the reference pass and update alone, padded against rl.packing
Each variant: warm-up steps (for partial rollouts ceil(L / budget), so that its pool is full),
then the timed steps; "generated" lengths are those of the rows started in the timed steps,
"trained" those of the rows trained in them, KS the two-sample Kolmogorov-Smirnov statistic
between the two. One RESULT_JSON line with a "variants" dict.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import roofline  # noqa: E402
import rl_step  # noqa: E402
from rl_step import Step, rl_config  # noqa: E402
from sampler import COMPILE_S, peak_rss_mib  # noqa: E402
from jaxrl_reason import models  # noqa: E402
from jaxrl_reason.models.transformer import Transformer  # noqa: E402
from jaxrl_reason.rl import packing  # noqa: E402
from jaxrl_reason.rl.partial import PartialRollouts, Pool  # noqa: E402
from jaxrl_reason.rl.update import (make_logprob_fn, make_packed_logprob_fn,  # noqa: E402
                                    make_update_fn)
from jaxrl_reason.runtime import sharding as shd  # noqa: E402
from jaxrl_reason.runtime.train_state import (  # noqa: E402
    create_train_state, learning_rate_schedule, make_optimizer)
from jaxrl_reason.sampling.sampler import round_up  # noqa: E402

# --workload long_tail: the rl_step batch (8 prompts x 8) over the spec's long_tail prompts
# and lengths (32 prompts x 8 rows, 4 steps' worth, then again); max 512 new tokens.
LONG_TAIL = {**rl_step.WORKLOAD, "max_completion_length": 512, "dataset_size": 32,
             "timed_steps": 4, "max_num_seqs": 32, "refill_every": 8,
             "rollout_token_budget": 128, "max_rollout_age": 4, "tis_cap": 2.0,
             "pack_tokens": 768}
LONG_TAIL_QUICK = {**rl_step.QUICK, "max_completion_length": 16, "timed_steps": 2,
                   "max_num_seqs": 4, "refill_every": 4, "rollout_token_budget": 4,
                   "max_rollout_age": 4, "tis_cap": 2.0, "pack_tokens": 64}


VARIANTS = ("static", "refill", "refill_partial")


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup_x |F_a(x) - F_b(x)| of the empirical
    distributions of int lengths a [n] and b [m] (0: the same distribution)."""
    a, b = np.sort(np.asarray(a)), np.sort(np.asarray(b))
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"ks_statistic: both samples need values (got {len(a)} and {len(b)})")
    grid = np.union1d(a, b)
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def length_summary(lengths: np.ndarray) -> dict:
    """n, mean, p50, p90 and max of int lengths [n] (n = 0: only n)."""
    lengths = np.asarray(lengths)
    if len(lengths) == 0:
        return {"n": 0}
    return {"n": int(len(lengths)), "mean": round(float(lengths.mean()), 2),
            "p50": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
            "max": int(lengths.max())}


def pad_groups(host: dict, groups: int, group_size: int) -> dict:
    """`host` (PartialRollouts.host: tokens, sampler_logp [k*G, L], lengths [k*G],
    prompt_tokens, prompt_valid [k, Tp]) padded to `groups` groups: the extra rows have
    length 0 (masked), the extra prompts repeat the first, so the update compiles once per
    length bucket instead of once per group count too."""
    k = len(host["prompt_tokens"])
    extra, rows = groups - k, (groups - k) * group_size
    if extra < 0:
        raise ValueError(f"pad_groups: {k} groups is more than the batch's {groups}")
    zeros = lambda a: np.zeros((rows,) + a.shape[1:], a.dtype)  # noqa: E731
    return {"tokens": np.concatenate([host["tokens"], zeros(host["tokens"])]),
            "sampler_logp": np.concatenate([host["sampler_logp"], zeros(host["sampler_logp"])]),
            "lengths": np.concatenate([host["lengths"], np.zeros(rows, np.int32)]),
            "prompt_tokens": np.concatenate([host["prompt_tokens"],
                                             np.repeat(host["prompt_tokens"][:1], extra, 0)]),
            "prompt_valid": np.concatenate([host["prompt_valid"],
                                            np.repeat(host["prompt_valid"][:1], extra, 0)])}


def seeded_lengths(examples: list) -> np.ndarray:
    """int32 [k * G]: the seeded lengths of k examples' rows, group by group."""
    return np.concatenate([np.asarray(e["lengths"], np.int32) for e in examples])


class SeededStops(PartialRollouts):
    """rl/partial.py's PartialRollouts whose rows stop at their own seeded length (the
    example's "lengths", as if each drew its stop id there) instead of a stop id, through
    its `row_stops` hook. `started` collects the lengths of the rows each step started."""

    def __init__(self, rt, rl):
        super().__init__(rt, rl)
        self.started: list[int] = []

    def row_stops(self, examples: list) -> np.ndarray:
        """int32 [len(examples) * G]: the rows' seeded lengths, group by group."""
        return seeded_lengths(examples)

    def start(self, params, examples: list, rng, step: int) -> Pool:
        self.started.extend(seeded_lengths(examples).tolist())
        return super().start(params, examples, rng, step)


class LongTailStep(Step):
    """One RL step on the long-tail lengths, `variant` one of VARIANTS: "static" (a static
    batch, rows stopping at their lengths as per-row budgets), "refill" (slot refill,
    rl.max_num_seqs slots) or "refill_partial" (refill + partial rollouts,
    rl.rollout_token_budget tokens a row a step; the trainer's PartialRollouts). It is also
    the `rt` PartialRollouts reads (sampler, mesh, rules, encode_prompts, put_prompts)."""

    def __init__(self, preset: str, w: dict, lengths: np.ndarray, variant: str,
                 devices: int = 1):
        if variant not in VARIANTS:
            raise ValueError(f"LongTailStep: variant {variant!r} is not one of {VARIANTS}")
        g = w["num_generations"]
        if len(lengths) != w["dataset_size"] * g:
            raise ValueError(f"LongTailStep: {len(lengths)} lengths for "
                             f"{w['dataset_size']} prompts x {g} rows")
        w = {**w, "max_num_seqs": 0 if variant == "static" else w["max_num_seqs"],
             "rollout_token_budget": w["rollout_token_budget"] if variant == "refill_partial"
             else 0}
        super().__init__(preset, w, devices, w["max_num_seqs"], w["refill_every"])
        self.variant = variant
        self.examples = [{"id": i, "lengths": lengths[i * g:(i + 1) * g].tolist()}
                         for i in range(w["dataset_size"])]
        self.partial = SeededStops(self, self.rl) if variant == "refill_partial" else None
        self.step_no = 0

    def encode_prompts(self, examples) -> tuple[np.ndarray, np.ndarray]:
        """Prompt ids int32 [k, Tp] of `examples` (the benchmark's seeded prompts), valid."""
        tokens = self.prompts[[e["id"] for e in examples]]
        return tokens, np.ones_like(tokens, bool)

    def put_prompts(self, array: np.ndarray):
        """As Runtime.put_prompts: batch-sharded when it splits evenly, else replicated."""
        if len(array) % shd.data_parallel_size(self.mesh, self.rules) == 0:
            return self.put(array)
        return shd.put_replicated(self.mesh, array)

    def next_examples(self) -> list:
        b = self.w["n_prompts_per_step"]
        start = (self.count * b) % len(self.examples)
        self.count += 1
        return self.examples[start:start + b]

    def __call__(self) -> dict:
        rl, w, times = self.rl, self.w, {}
        b, g = w["n_prompts_per_step"], w["num_generations"]
        self.rng, key = jax.random.split(self.rng)
        compile0 = sum(COMPILE_S.values())
        t0 = time.perf_counter()  # ---- sample
        extra = {}
        if self.partial is None:
            examples = self.next_examples()
            started = seeded_lengths(examples)
            prompts, valid = self.encode_prompts(examples)
            out = self.sampler(self.state.params, prompts, valid, key, num_samples=g,
                               max_new_tokens=started, max_len=rl.max_new_tokens,
                               temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
            host = jax.device_get({"tokens": out.tokens, "lengths": out.lengths,
                                   "sampler_logp": out.logprobs})
            host.update(prompt_tokens=prompts, prompt_valid=valid)
            length = min(round_up(int(host["lengths"].max()), rl.train_length_bucket),
                         rl.max_new_tokens)
        else:
            self.partial.started = []
            examples = self.next_examples() if self.partial.wants_examples() else []
            self.step_no += 1  # the trainer's step_count + 1
            trained, host, extra = self.partial.collect(self.state.params, examples, key,
                                                        self.step_no)
            started = np.asarray(self.partial.started, np.int32)
            length = host["length"]
            if trained:
                host = pad_groups(host, b, g)
        times["sample_s"] = time.perf_counter() - t0
        real = int(np.count_nonzero(host["lengths"]))
        if real:
            self.learn(host["prompt_tokens"], host["prompt_valid"], host, length, real, times)
        times["step_s"] = sum(times.values())
        times["compile_s"] = sum(COMPILE_S.values()) - compile0
        times["trained_lengths"] = host["lengths"][host["lengths"] > 0].tolist()
        times["started_lengths"] = np.asarray(started).tolist()
        times["length"] = int(length)
        times["partial"] = {k.split("/")[1]: v for k, v in extra.items()
                            if k.split("/")[1] in ("rows_continued", "rows_dropped",
                                                   "groups_pending", "oldest_age",
                                                   "stale_token_share")}
        return times


def run_variant(name: str, w: dict, lengths: np.ndarray, variant: str, devices: int) -> dict:
    """Warm-up then timed steps of one variant; its result dict (RESULT_JSON "variants")."""
    step = LongTailStep(name, w, lengths, variant, devices)
    warmup = w["warmup_steps"]
    if variant == "refill_partial":  # until the first groups can have had all their segments
        budget = w["rollout_token_budget"]
        warmup = max(warmup, -(-w["max_completion_length"] // budget))
    steps = [step() for _ in range(warmup + w["timed_steps"])]
    timed = steps[warmup:]
    med = lambda k: statistics.median(s[k] for s in timed)  # noqa: E731
    trained = np.concatenate([np.asarray(s["trained_lengths"], np.int32) for s in timed])
    started = np.concatenate([np.asarray(s["started_lengths"], np.int32) for s in timed])
    seconds = sum(s["step_s"] for s in timed)
    compile_s = sum(s["compile_s"] for s in timed)
    result = {
        "warmup_steps": warmup, "timed_steps": len(timed),
        "step_s_median": med("step_s"),
        "step_s_median_no_compile": statistics.median(s["step_s"] - s["compile_s"]
                                                      for s in timed),
        "step_s_all": [round(s["step_s"], 3) for s in steps],
        "compile_s_timed": round(compile_s, 3),
        "split_s_median": {k: statistics.median(s.get(k + "_s", 0.0) for s in timed)
                           for k in ("sample", "score", "reference", "train")},
        "trained_rows": int(len(trained)), "trained_tokens": int(trained.sum()),
        "trained_tok_s": float(trained.sum()) / max(seconds - compile_s, 1e-9),
        "train_length_per_step": [s["length"] for s in timed],
        "trained_length": length_summary(trained),
        "generated_length": length_summary(started),
        "ks_trained_vs_generated": (ks_statistic(trained, started)
                                    if len(trained) and len(started) else None),
        "kv_cache_bytes": step.sampler.kv_cache_bytes(
            w["n_prompts_per_step"], w["prompt_len"], w["num_generations"],
            w["max_completion_length"]),
    }
    if variant == "refill_partial":
        result["partial"] = {k: [s["partial"].get(k) for s in timed]
                             for k in ("rows_continued", "rows_dropped", "groups_pending",
                                       "oldest_age", "stale_token_share")}
        result["rollout_token_budget"] = w["rollout_token_budget"]
        result["max_rollout_age"] = w["max_rollout_age"]
    if variant != "static":
        result["slots"], result["refill_every"] = w["max_num_seqs"], w["refill_every"]
    return result


def packed_vs_padded(name: str, w: dict, lengths: np.ndarray, devices: int,
                     pack_tokens: int, repeats: int = 3) -> dict:
    """Reference pass plus update on the long-tail rows (each step's b * g of `lengths`,
    seeded random ids), padded (RLTrainer's layout: the step's length bucket, a prompt per
    group) against packed (rl.packing, `pack_tokens` per pack). Every shape is compiled
    first; then per step the median of `repeats` calls (padded and packed alternating). Returns packed_s / padded_s (the
    median over steps), the per-step medians, XLA's FLOPs per useful token (the compiled
    programs' cost analysis over the sum of lengths) and the programs each compiled."""
    b, g, tp = w["n_prompts_per_step"], w["num_generations"], w["prompt_len"]
    rl, cfg = rl_config(w), models.get_preset(name)
    mesh, rules = shd.make_mesh({"data": devices}, devices=jax.devices()[:devices]), shd.DEFAULT_RULES
    model = Transformer(cfg)
    params = models.init_params(cfg, jax.random.key(0), mesh, rules)
    opt = make_optimizer(learning_rate_schedule(rl.learning_rate, 0, 1000, "constant"),
                         weight_decay=0.0, max_grad_norm=rl.max_grad_norm)
    packer = packing.Packer(pack_tokens, b * g, tp + rl.max_new_tokens - 1, devices,
                            packing.shares_prompts(cfg))
    logprob = {"padded": make_logprob_fn(model, rl.temperature, 1, mesh, rules),
               "packed": make_packed_logprob_fn(model, rl.temperature, packer.share_prompts,
                                                mesh, rules)}
    update = {"padded": make_update_fn(model, opt, rl, mesh, rules, "reference"),
              "packed": make_update_fn(model, opt, rl, mesh, rules, "reference", packed=True,
                                       share_prompts=packer.share_prompts)}
    states = {k: create_train_state(jax.tree.map(jnp.copy, params), opt) for k in update}
    put = lambda x: shd.put_batch(mesh, rules, np.asarray(x))  # noqa: E731
    rng = np.random.default_rng(0)
    steps = []
    for start in range(0, len(lengths) - b * g + 1, b * g):
        n = np.asarray(lengths[start:start + b * g])
        prompts = rng.integers(3, cfg.vocab_size, (b, tp)).astype(np.int32)
        tokens = rng.integers(3, cfg.vocab_size, (b * g, rl.max_new_tokens)).astype(np.int32)
        step = {"useful": int(n.sum())}
        for kind in ("padded", "packed"):  # packed rows: the whole budget, as RLTrainer
            length = (min(round_up(int(n.max()), rl.train_length_bucket), rl.max_new_tokens)
                      if kind == "padded" else rl.max_new_tokens)
            mask = put((np.arange(length)[None, :] < n[:, None]).astype(np.float32))
            batch = {"advantages": put(rng.normal(size=b * g).astype(np.float32)),
                     "num_sequences": np.float32(b * g), "num_tokens": np.float32(n.sum()),
                     "beta": np.float32(rl.beta), "mask": mask, "loss_mask": mask,
                     "sampler_logp": mask * 0, "ref_logp": mask * 0}
            if kind == "padded":
                args = (put(prompts), put(np.ones_like(prompts, bool)),
                        put(tokens[:, :length]), mask)
                batch.update(zip(("prompt_tokens", "prompt_valid", "completion_tokens"), args))
            else:
                packs = packer(prompts, np.ones_like(prompts, bool), tokens, n)
                args = ({k: put(x) for k, x in packs.arrays().items()},)
                batch.update(args[0])
                step["packs"] = (packs.num_packs, int(packs.tokens.shape[0]))
            step[kind] = (args, batch, tuple(np.shape(args[-1]["pack_tokens"] if kind ==
                                                      "packed" else args[2])))
        steps.append(step)

    def run(kind, args, batch):
        t0 = time.perf_counter()
        ref = logprob[kind](params, *args)
        states[kind], metrics = update[kind](states[kind], {**batch, "ref_logp": ref})
        jax.block_until_ready(metrics)
        return time.perf_counter() - t0

    def flops(fn, *args):  # XLA's count on the lowered program (no second compile)
        analysis = fn.lower(*args).cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        return float(analysis.get("flops", 0.0))

    out = {"pack_tokens": pack_tokens, "pack_buckets": list(packer.buckets),
           "packs_needed_per_step": [s["packs"][0] for s in steps],
           "packs_per_step": [s["packs"][1] for s in steps]}
    for kind in ("padded", "packed"):  # compile every shape first
        for s in steps:
            run(kind, *s[kind][:2])
    times = {kind: [[] for _ in steps] for kind in ("padded", "packed")}
    for i, s in enumerate(steps):  # alternating, so that both see the same machine load
        for _ in range(repeats):
            for kind in ("padded", "packed"):
                times[kind][i].append(run(kind, *s[kind][:2]))
    for kind in ("padded", "packed"):
        per_step = [statistics.median(t) for t in times[kind]]
        per_token = [(flops(logprob[kind], params, *s[kind][0])
                      + flops(update[kind], states[kind], s[kind][1])) / s["useful"]
                     for s in steps]
        out[f"{kind}_s"] = round(statistics.median(per_step), 4)
        out[f"{kind}_s_per_step"] = [round(t, 4) for t in per_step]
        out[f"{kind}_flops_per_useful_token"] = round(statistics.median(per_token))
        out[f"{kind}_programs"] = 2 * len({s[kind][2] for s in steps})  # log-prob + update
    out["speedup"] = round(out["padded_s"] / out["packed_s"], 2)
    return out


def main_long_tail(args, spec: dict | None) -> int:
    """--workload long_tail: the three variants one after the other; one RESULT_JSON line."""
    from sampler import long_tail_workload  # the spec's long_tail prompts and lengths

    lt, lengths = long_tail_workload(spec, args.quick)
    name = args.model or ("test" if args.quick else "bench-tiny")
    roofline.check_preset_matches_spec(name, spec)
    w = dict(LONG_TAIL_QUICK if args.quick else LONG_TAIL)
    w.update(dataset_size=lt["n_prompts"], num_generations=lt["samples_per_prompt"],
             prompt_len=lt["prompt_len"], max_completion_length=lt["max_new_tokens"])
    if args.quick:
        w.update(n_prompts_per_step=1, dataset_size=2)
        lengths = lengths[:2 * lt["samples_per_prompt"]]
    if args.steps:
        w["timed_steps"] = args.steps
    b, g = w["n_prompts_per_step"], w["num_generations"]
    devices = roofline.use_cpu_devices(args.cpu_devices, [b, b * g, w["max_num_seqs"]])
    machine = roofline.machine_info(probe=False)
    print(f"machine: {machine}; workload: {w}", flush=True)
    result = {"system": "jaxrl_reason RL step", "workload": "long_tail", "model": name,
              "rows_per_step": b * g, "max_new_tokens": w["max_completion_length"],
              "devices": devices, "variants": {},
              "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    chosen = args.variants or VARIANTS + ("packing",)
    for variant in [v for v in chosen if v in VARIANTS]:
        r = run_variant(name, w, lengths, variant, devices)
        result["variants"][variant] = r
        print(f"{variant}: step {r['step_s_median']:.2f} s median ({r['step_s_median_no_compile']:.2f} s "
              f"without compiles), {r['trained_tok_s']:.0f} trained tok/s, KS(trained, "
              f"generated) {r['ks_trained_vs_generated']}; trained {r['trained_length']}, "
              f"generated {r['generated_length']}; load {os.getloadavg()[0]:.2f}", flush=True)
    if "packing" in chosen:  # reference pass + update, padded against rl.packing
        rows = w["n_prompts_per_step"] * w["num_generations"] * w["timed_steps"]
        pk = packed_vs_padded(name, w, lengths[:rows], devices, w["pack_tokens"])
        result.update(packed_s=pk["packed_s"], padded_s=pk["padded_s"], packing=pk)
        print(f"packing: reference + update {pk['padded_s']:.3f} s padded, "
              f"{pk['packed_s']:.3f} s packed ({pk['speedup']}x); {pk}", flush=True)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    print("RESULT_JSON " + json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "workload": w, "result": result}, f, indent=1)
    return 0
