r"""Our GRPO step on the anchors' RL workload (../shared/anchors/spec.json "rl_step").

    python benchmarks/rl_step.py                  # bench-tiny, 1 warm-up + 4 timed steps, ~1 min
    python benchmarks/rl_step.py --json out.json
    python benchmarks/rl_step.py --quick          # "test" preset, tiny workload (tests)
    python benchmarks/rl_step.py --workload long_tail   # static / refill / partial, ~15 min
                                                        # (benchmarks/rl_step_long_tail.py)

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
from jaxrl_reason.rl.update import make_logprob_fn, make_update_fn  # noqa: E402
from jaxrl_reason.sampling.sampler import Sampler, round_up  # noqa: E402
from jaxrl_reason.runtime.train_state import (  # noqa: E402
    create_train_state, learning_rate_schedule, make_optimizer)

WORKLOAD = {"n_prompts_per_step": 8, "num_generations": 8, "prompt_len": 32,
            "max_completion_length": 128, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
            "beta": 0.04, "learning_rate": 1e-6, "dataset_size": 64, "warmup_steps": 1,
            "timed_steps": 4}
QUICK = {**WORKLOAD, "n_prompts_per_step": 2, "num_generations": 4, "prompt_len": 8,
         "max_completion_length": 8, "dataset_size": 4, "timed_steps": 1}
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
    import rl_step_long_tail as long_tail  # it builds on this module's Step

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
    ap.add_argument("--variants", nargs="+", choices=long_tail.VARIANTS + ("packing",),
                    help="long_tail: only these variants (packing: reference pass + update, "
                         "padded against rl.packing)")
    ap.add_argument("--steps", type=int, help="long_tail: timed steps per variant")
    args = ap.parse_args(argv)
    spec = roofline.load_spec(args.spec)
    if args.workload == "long_tail":
        return long_tail.main_long_tail(args, spec)
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


if __name__ == "__main__":
    sys.exit(main())
