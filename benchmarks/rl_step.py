r"""Our GRPO step on the anchors' RL workload (../shared/anchors/spec.json "rl_step").

    python benchmarks/rl_step.py                  # bench-tiny, 1 warm-up + 4 timed steps, ~1 min
    python benchmarks/rl_step.py --json out.json
    python benchmarks/rl_step.py --quick          # "test" preset, tiny workload (tests)
    python benchmarks/rl_step.py --workload long_tail   # static / refill / partial, ~15 min

Workload: random-init bench-tiny (N(0, 0.02)); per step 8 prompts of 32 seeded random ids
(the anchors' 64-prompt dataset, 8 per step) x 8 generations, 128 new tokens, temperature 1,
no early stop; GRPO with group-scaled advantages, token-mean ("dapo") loss, k3 KL to a
frozen reference with beta = 0.04, clip 0.2, AdamW at 1e-6 with global-norm clipping 1.0, one
optimizer step per generation (TRL's settings in the anchor). The reward is a cheap
deterministic hash of each completion's ids, uniform in [0, 1) like the anchors' seeded
random reward; it is computed on the host and timed on its own ("score").

The step is RLTrainer.step's (jaxrl_reason/rl/trainer.py) built from the same pieces
(`Sampler`, `make_logprob_fn`, `make_update_fn`, `group_advantages`), timed in sequence so that
each part is measured alone (the trainer overlaps host scoring with the reference pass):
  sample     sampler call (prefill once per prompt, on-device decode loop) + host copy
  score      host reward of the 64 completions (the "verifier")
  reference  reference log-probs of the 64 rows (forward pass, frozen weights)
  train      advantages, upload, policy forward + backward + AdamW (one jitted, donated call)
Protocol: one warm-up step (it includes compilation), then the median of 4 steps.
"""
from __future__ import annotations

import argparse
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
from sampler import (COMPILE_S, peak_rss_mib, print_trace, profile_options,  # noqa: E402
                     prompt_ids, sampler_flops, trace_summary)
from configs import arith_grpo  # noqa: E402
from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd  # noqa: E402
from jaxrl_reason.rl import backends as kernel_dispatch  # noqa: E402
from jaxrl_reason.models.transformer import Transformer  # noqa: E402
from jaxrl_reason.rl.batches import Rollout  # noqa: E402
from jaxrl_reason.rl.partial import PartialRollouts, Pool, write_segment  # noqa: E402
from jaxrl_reason.rl.update import make_logprob_fn, make_update_fn  # noqa: E402
from jaxrl_reason.rl import packing  # noqa: E402
from jaxrl_reason.rl.update import make_packed_logprob_fn  # noqa: E402
from jaxrl_reason.sampling.sampler import Sampler, round_up  # noqa: E402
from jaxrl_reason.runtime.train_state import (  # noqa: E402
    create_train_state, learning_rate_schedule, make_optimizer)

WORKLOAD = {"n_prompts_per_step": 8, "num_generations": 8, "prompt_len": 32,
            "max_completion_length": 128, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
            "beta": 0.04, "learning_rate": 1e-6, "dataset_size": 64, "warmup_steps": 1,
            "timed_steps": 4}
QUICK = {**WORKLOAD, "n_prompts_per_step": 2, "num_generations": 4, "prompt_len": 8,
         "max_completion_length": 8, "dataset_size": 4, "timed_steps": 1}
# --workload long_tail: the rl_step batch (8 prompts x 8) over the spec's long_tail prompts
# and lengths (32 prompts x 8 rows, 4 steps' worth, then again); max 512 new tokens.
LONG_TAIL = {**WORKLOAD, "max_completion_length": 512, "dataset_size": 32, "timed_steps": 4,
             "max_num_seqs": 32, "refill_every": 8, "rollout_token_budget": 128,
             "max_rollout_age": 4, "tis_cap": 2.0, "pack_tokens": 768}
LONG_TAIL_QUICK = {**QUICK, "max_completion_length": 16, "timed_steps": 2, "max_num_seqs": 4,
                   "refill_every": 4, "rollout_token_budget": 4, "max_rollout_age": 4,
                   "tis_cap": 2.0, "pack_tokens": 64}


def rl_config(w: dict):
    """The arith_grpo config's `rl` block set to the anchors' GRPO (TRL's settings)."""
    rl = arith_grpo.get_config().rl
    rl.batch_prompts = w["n_prompts_per_step"]
    rl.num_generations = w["num_generations"]
    rl.max_new_tokens = w["max_completion_length"]
    rl.temperature, rl.top_p, rl.top_k = w["temperature"], w["top_p"], w["top_k"]
    rl.learning_rate, rl.warmup_steps, rl.lr_decay = w["learning_rate"], 0, "constant"
    rl.beta, rl.kl_estimator = w["beta"], "k3"
    rl.loss_type = "dapo"                 # token-mean, as TRL's loss_type="dapo"
    rl.advantage_estimator, rl.advantage_scale = "grpo", "group"
    rl.epsilon_low = rl.epsilon_high = 0.2
    rl.max_grad_norm, rl.weight_decay = 1.0, 0.0
    rl.num_iterations, rl.micro_batches = 1, 1
    for key in ("tis_cap", "max_num_seqs", "refill_every", "rollout_token_budget",
                "max_rollout_age"):  # the long_tail workload's knobs
        if key in w:
            rl[key] = w[key]
    return rl


def hash_rewards(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """f32 [N] in [0, 1): a multiplicative hash of each completion's ids (host numpy)."""
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    weights = (np.arange(1, tokens.shape[1] + 1, dtype=np.uint64) * np.uint64(2654435761))
    h = (np.where(mask, tokens, 0).astype(np.uint64) * weights).sum(axis=1)
    h = (h * np.uint64(2246822519)) % np.uint64(2 ** 32)
    return (h.astype(np.float64) / 2.0 ** 32).astype(np.float32)


class Step:
    """One GRPO step of RLTrainer.step, split into timed parts."""

    def __init__(self, preset: str, w: dict, devices: int = 1, max_num_seqs: int = 0,
                 refill_every: int = 8):
        self.w, self.rl = w, rl_config(w)
        self.cfg = models.get_preset(preset)
        self.mesh = shd.make_mesh({"data": devices}, devices=jax.devices()[:devices])
        self.rules = shd.DEFAULT_RULES
        self.model = Transformer(self.cfg)
        params = models.init_params(self.cfg, jax.random.key(0), self.mesh, self.rules)
        self.ref_params = jax.tree.map(jnp.copy, params)
        rl = self.rl
        self.optimizer = make_optimizer(
            learning_rate_schedule(rl.learning_rate, rl.warmup_steps, 1000, rl.lr_decay),
            weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm)
        self.state = create_train_state(params, self.optimizer)
        self.sampler = Sampler(self.model, eos_id=-1, pad_id=0,  # -1: no early stop
                               mesh=self.mesh, rules=self.rules, max_num_seqs=max_num_seqs,
                               refill_every=refill_every)
        self.logprob_fn = make_logprob_fn(self.model, rl.temperature, rl.micro_batches,
                                          self.mesh, self.rules)
        self.update_fn = make_update_fn(self.model, self.optimizer, rl, self.mesh, self.rules,
                                        "reference")
        self.prompts = prompt_ids(self.cfg.vocab_size, w["dataset_size"], w["prompt_len"])
        self.rng = jax.random.key(1)
        self.count = 0

    def put(self, x):
        return shd.put_batch(self.mesh, self.rules, np.asarray(x))

    def __call__(self) -> dict[str, float]:
        rl, w, times = self.rl, self.w, {}
        b, g = w["n_prompts_per_step"], w["num_generations"]
        start = (self.count * b) % w["dataset_size"]
        prompts = self.prompts[start:start + b]
        valid = np.ones_like(prompts, bool)
        self.count += 1
        self.rng, key = jax.random.split(self.rng)

        t0 = time.perf_counter()  # ---- sample
        out = self.sampler(self.state.params, prompts, valid, key, num_samples=g,
                           max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
                           top_p=rl.top_p, top_k=rl.top_k)
        host = jax.device_get({"tokens": out.tokens, "lengths": out.lengths,
                               "sampler_logp": out.logprobs})
        length = min(round_up(int(host["lengths"].max()), rl.train_length_bucket),
                     rl.max_new_tokens)
        times["sample_s"] = time.perf_counter() - t0
        metrics = self.learn(prompts, valid, host, length, b * g, times)
        times["step_s"] = sum(times.values())
        times["completion_len_mean"] = float(host["lengths"].mean())
        times["length"] = length
        times.update({k: metrics[k] for k in ("loss", "kl", "grad_norm") if k in metrics})
        return times

    def learn(self, prompts: np.ndarray, valid: np.ndarray, host: dict, length: int,
              real_rows: int, times: dict) -> dict[str, float]:
        """The score, reference and train parts of a step on host rows: tokens int32 [N, >=
        length], lengths int32 [N], sampler_logp f32 [N, >= length], prompts int32 [N/G, Tp]
        and valid bool [N/G, Tp]; rows past `real_rows` are padding (length 0: masked out).
        Adds score_s, reference_s and train_s to `times`; returns the update's metrics."""
        rl, g = self.rl, self.w["num_generations"]
        t0 = time.perf_counter()  # ---- score (host verifier)
        rewards = hash_rewards(host["tokens"], host["lengths"])
        times["score_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # ---- reference log-probs
        mask = self.put((np.arange(length)[None, :] < host["lengths"][:, None])
                        .astype(np.float32))
        # RLTrainer.rollout's layout: a prompt per group, run once by the log-prob passes.
        rollout = Rollout(prompt_tokens=self.put(prompts), prompt_valid=self.put(valid),
                          completion_tokens=self.put(host["tokens"][:, :length]),
                          mask=mask, loss_mask=mask)  # no tool results: the same tokens
        ref_logp = jax.block_until_ready(self.logprob_fn(self.ref_params,
                                                         *rollout.scoring_args()))
        times["reference_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # ---- advantages + update
        advantages = kernel_dispatch.group_advantages(
            jnp.asarray(rewards), g, estimator=rl.advantage_estimator,
            scale=rl.advantage_scale, backend="reference")
        batch = {**vars(rollout), "advantages": self.put(np.asarray(advantages)),
                 "num_sequences": np.float32(real_rows),
                 "num_tokens": np.float32(max(1, mask.sum())), "beta": np.float32(rl.beta),
                 "sampler_logp": self.put(host["sampler_logp"][:, :length]),
                 "ref_logp": ref_logp}
        self.state, metrics = self.update_fn(self.state, batch)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        times["train_s"] = time.perf_counter() - t0
        return metrics

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="preset (default bench-tiny; test w/ --quick)")
    ap.add_argument("--spec", default=None, help="anchors' spec.json (default: shared path)")
    ap.add_argument("--quick", action="store_true", help="'test' preset, tiny workload")
    ap.add_argument("--cpu-devices", type=int, default=0,
                    help="XLA devices to split the CPU into, rows split over them (0 = one "
                         "per core; 1 = one device)")
    ap.add_argument("--profile", help="trace one more step into this directory and summarize "
                                      "the XLA ops of its training part")
    ap.add_argument("--json", help="write the result to this file")
    ap.add_argument("--workload", choices=("rl_step", "long_tail"), default="rl_step",
                    help="the spec's rl_step, or long_tail: static vs slot refill vs refill "
                         "+ partial rollouts on the long-tail lengths")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS + ("packing",),
                    help="long_tail: only these variants (packing: reference pass + update, "
                         "padded against rl.packing)")
    ap.add_argument("--steps", type=int, help="long_tail: timed steps per variant")
    args = ap.parse_args(argv)
    spec = roofline.load_spec(args.spec)
    if args.workload == "long_tail":
        return main_long_tail(args, spec)
    name = args.model or ("test" if args.quick else "bench-tiny")
    roofline.check_preset_matches_spec(name, spec)
    w = dict(QUICK if args.quick else WORKLOAD)
    if spec is not None and not args.quick:
        w.update({k: spec["rl_step"][k] for k in w if k in spec["rl_step"]})
    b, g = w["n_prompts_per_step"], w["num_generations"]
    devices = roofline.use_cpu_devices(args.cpu_devices, [b, b * g])  # prompts and rows
    machine = roofline.machine_info(probe=not args.quick)
    print(f"machine: {machine}; workload: {w}", flush=True)
    load_start = [round(x, 2) for x in os.getloadavg()]

    step = Step(name, w, devices)
    COMPILE_S.clear()
    steps = [step() for _ in range(w["warmup_steps"] + w["timed_steps"])]
    compile_s = sum(COMPILE_S.values())
    timed = steps[w["warmup_steps"]:]
    med = lambda k: statistics.median(s[k] for s in timed)  # noqa: E731
    cfg = step.cfg
    rows, new, tp = b * g, w["max_completion_length"], w["prompt_len"]
    length = timed[-1]["length"]
    sample_flops = sampler_flops(cfg, {"n_prompts": b, "prompt_len": tp, "new_tokens": new},
                                 rows)
    # The scoring passes run each group's prompt once (b x tp tokens), then every row's
    # completion[:-1] against its prompt's cache: the FLOPs counted are those executed.
    scored = b * tp + rows * (length - 1)
    keys = b * roofline.causal_keys(0, tp) + rows * roofline.causal_keys(tp, length - 1)
    ref_flops = roofline.forward_flops(cfg, scored, keys)
    train_flops = roofline.train_flops(cfg, scored, keys)
    decode_rate = roofline.matmul_rate(cfg, rows)["flop_per_s"]
    train_rate = roofline.matmul_rate(cfg, scored)["flop_per_s"]
    result = {
        "system": "jaxrl_reason GRPO step", "model": name, "n_params": cfg.num_params,
        "completions_per_step": rows, "devices": devices, "new_tokens": new,
        "scored_tokens": scored,
        "scored_tokens_per_row_layout": rows * (tp + length - 1),
        "step_s_median": med("step_s"), "step_s_min": min(s["step_s"] for s in timed),
        "step_s_all": [s["step_s"] for s in steps],
        "split_s_median": {k: med(k + "_s") for k in ("sample", "score", "reference", "train")},
        "gen_tok_s_step": rows * new / med("step_s"),
        "gen_tok_s_sample_only": rows * new / med("sample_s"),
        "completion_len_mean": [s["completion_len_mean"] for s in steps],
        "compile_s": compile_s,
        "roofline_fraction": {
            "sample": round(sample_flops / med("sample_s") / decode_rate, 4),
            "reference": round(ref_flops / med("reference_s") / train_rate, 4),
            "train": round(train_flops / med("train_s") / train_rate, 4)},
        "matmul_rate_gflops": {"decode": round(decode_rate / 1e9, 1),
                               "train": round(train_rate / 1e9, 1)},
        "loss": [s.get("loss") for s in steps], "kl": [s.get("kl") for s in steps],
        "grad_norm": [s.get("grad_norm") for s in steps],
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "loadavg_start": load_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    if args.profile:  # only the update: sample and reference run untraced
        update_fn = step.update_fn

        def traced_update(*a):
            with jax.profiler.trace(args.profile, create_perfetto_trace=True,
                                    profiler_options=profile_options()):
                out = update_fn(*a)
                jax.block_until_ready(out)
            return out

        step.update_fn = traced_update
        step()
        step.update_fn = update_fn
        result["train_trace_top_ms"] = trace_summary(args.profile)
    split = result["split_s_median"]
    print(f"{name}: GRPO step {result['step_s_median']:.2f} s median of {len(timed)} "
          f"(sample {split['sample']:.2f}, score {split['score'] * 1e3:.1f} ms, reference "
          f"{split['reference']:.2f}, train {split['train']:.2f}); first step "
          f"{steps[0]['step_s']:.1f} s, compile {compile_s:.1f} s; roofline fractions "
          f"{result['roofline_fraction']}; load {load_start} -> {result['loadavg_end']}",
          flush=True)
    print_trace(result.get("train_trace_top_ms", []), "train trace")
    print("RESULT_JSON " + json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "workload": w, "result": result}, f, indent=1)
    return 0


# ---------------------------------------------------------------- --workload long_tail

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


class CappedPartial(PartialRollouts):
    """rl/partial.py's PartialRollouts whose rows stop at their own seeded length (the
    example's "lengths", as if each drew its stop id there) instead of a stop id: each
    segment's per-row budget is min(S, that length - tokens so far), and a row is done once
    it has its length. `started` collects the lengths of the rows each step started."""

    def __init__(self, rt, rl):
        super().__init__(rt, rl)
        self.started: list[int] = []

    def _targets(self, examples) -> np.ndarray:
        return np.concatenate([np.asarray(e["lengths"], np.int32) for e in examples])

    def _mark_done(self) -> None:
        if self.pool.examples:
            self.pool.eos |= self.pool.lengths >= self._targets(self.pool.examples)

    def continue_rows(self, params, step: int) -> int:
        rows = np.flatnonzero(~self.pool.done(self.max_len))
        if len(rows) == 0:
            return 0
        dp = shd.data_parallel_size(self.rt.mesh, self.rt.rules)
        size = dp
        while size < len(rows):  # a power of two times dp, as PartialRollouts pads
            size *= 2
        padded = np.concatenate([rows, np.full(size - len(rows), rows[0])])
        prompts, valid = self.rt.encode_prompts(self.pool.examples)
        p = padded // self.group
        budgets = np.minimum(self.segment, self._targets(self.pool.examples)[padded]
                             - self.pool.lengths[padded])
        rl = self.rl
        out = self.continuation(
            params, prompts[p], valid[p], self.pool.tokens[padded],
            self.pool.lengths[padded], self.pool.keys[padded], budgets.astype(np.int32),
            segment=self.segment, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
        host = jax.device_get(vars(out))
        write_segment(self.pool, rows, {k: v[:len(rows)] for k, v in host.items()}, step)
        self._mark_done()
        return len(rows)

    def start(self, params, examples: list, rng, step: int) -> Pool:
        rt, rl, g = self.rt, self.rl, self.group
        targets = self._targets(examples)
        self.started.extend(targets.tolist())
        prompt_tokens, prompt_valid = rt.encode_prompts(examples)
        out = rt.sampler(params, rt.put_prompts(prompt_tokens), rt.put_prompts(prompt_valid),
                         rng, num_samples=g, max_new_tokens=np.minimum(self.segment, targets),
                         max_len=self.segment, temperature=rl.temperature, top_p=rl.top_p,
                         top_k=rl.top_k)
        host = jax.device_get({"tokens": out.tokens, "logprobs": out.logprobs,
                               "lengths": out.lengths, "truncated": out.truncated})
        pool = self.new_pool(examples, rng, host, step)
        pool.eos |= pool.lengths >= targets
        return pool


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
        self.partial = CappedPartial(self, self.rl) if variant == "refill_partial" else None
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
            started = self.partial_targets(examples)
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

    @staticmethod
    def partial_targets(examples) -> np.ndarray:
        """int32 [k*G]: the rows' seeded lengths, group by group."""
        return np.concatenate([np.asarray(e["lengths"], np.int32) for e in examples])


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


if __name__ == "__main__":
    sys.exit(main())
