r"""This machine's float32 matmul rate through JAX at a model's shapes, and FLOP counting.

    python benchmarks/roofline.py                         # bench-tiny and bench-small, ~20 s
    python benchmarks/roofline.py --presets test --tokens 128 --quick --json out.json

For a model and a token count T it times, jitted, every weight matmul of one forward pass
([T, d_model] x [d_model, heads * head_dim] for q, k, v and o, [T, d] x [d, mlp_hidden] for
gate and up, [T, mlp_hidden] x [mlp_hidden, d] for down, [T, d] x [d, vocab] for the head),
each repeated inside one jitted loop so that dispatch is not counted. The rate at the model's
shapes is the matmul FLOPs of one forward divided by the time of those matmuls: what the
weights' matmuls of that model could reach at that batch on this CPU, with nothing else to do.
A large square matmul gives the machine's peak for comparison.

Other benchmarks import `matmul_rate`, `forward_flops`, `train_flops` and `roofline_fraction`.
XLA's rate at a small model's shapes is not a hard ceiling (a whole program runs independent
matmuls side by side, and OpenBLAS multiplies ~2x faster here), so `roofline_fraction` also
reports the fraction of `machine_peak_rate()`, the best matmul rate measured on the machine.
FLOPs, as the issue counts them: 2 |theta| per token forward, 6 |theta| forward + backward,
plus attention 4 * layers * heads * head_dim * context per token forward (x3 with the
backward). `|theta|` includes the embedding table, which is a gather, not a matmul: the
`matmul_only` variants count 2 (|theta| - vocab * d_model) instead (what the CPU really
multiplies); both are reported.

Also here, for every benchmark: `machine_info()` (load average, CPU count, and the anchors'
numpy matmul probe, so figures taken at different times can be judged) and `time_calls` (the
anchors' protocol: warm-up calls, then the median of the timed ones).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_reason.runtime import cpu_devices  # noqa: E402
from jaxrl_reason.kernels import platform  # noqa: E402
from jaxrl_reason.models.config import ModelConfig, get_preset  # noqa: E402
from host_probe import matmul_gflops  # noqa: E402  (benchmarks/ is on the path)

SPEC_PATH = Path(os.environ.get("ANCHORS_DIR", "/work/shared/anchors")) / "spec.json"


# ----------------------------------------------------------------------------- machine + timing


def use_cpu_devices(value: int, rows: Sequence[int]) -> int:
    """Splits the CPU into `value` XLA devices before JAX starts (0 = one per core, as many
    as every count in `rows` splits over; see jaxrl_reason.runtime.cpu_devices) and returns how many
    devices the benchmark's mesh takes: that count, or, where the environment already chose
    (XLA_FLAGS, the tests' 8 fake devices), the most of those that `rows` split over."""
    fits = lambda n: all(r % n == 0 for r in rows)  # noqa: E731
    count = cpu_devices.resolve(value, cores=cpu_devices.usable_cores(), fits=fits)
    cpu_devices.apply(count)
    available = jax.device_count()
    if count <= available and fits(count):
        return count
    return cpu_devices.resolve(0, cores=min(count, available), fits=fits)


def machine_info(probe: bool = True) -> dict:
    """Load average (1, 5, 15 min), CPU count, backend, its device count and (optionally)
    the numpy probe."""
    info = {"loadavg": [round(x, 2) for x in os.getloadavg()], "nproc": os.cpu_count(),
            "backend": str(jax.devices()[0]), "devices": jax.device_count(),
            "jax": jax.__version__}
    if probe:
        info["cpu_probe_gflops"] = round(matmul_gflops(), 1)
    return info


def time_calls(fn: Callable[[], object], warmup: int, timed: int) -> dict:
    """Runs fn() warmup + timed times (fn must block until its result is ready).

    Returns {"first_call_s", "timed_s": [..], "median_s", "min_s"}.
    """
    times = []
    for _ in range(warmup + timed):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"first_call_s": times[0], "timed_s": times[warmup:],
            "median_s": statistics.median(times[warmup:]), "min_s": min(times[warmup:])}


def load_spec(path: str | os.PathLike | None = None) -> dict | None:
    """The anchors' spec.json, or None when it is not on this machine."""
    p = Path(path) if path else SPEC_PATH
    if not p.is_file():
        return None
    with open(p) as f:
        return json.load(f)


def check_preset_matches_spec(name: str, spec: dict | None) -> None:
    """Raises ValueError when preset `name` differs from the spec's model of that name."""
    if spec is None or name not in spec.get("models", {}):
        return
    m, cfg = spec["models"][name], get_preset(name)
    want = {"vocab_size": m["vocab_size"], "d_model": m["d_model"], "n_layers": m["n_layers"],
            "n_heads": m["n_q_heads"], "n_kv_heads": m["n_kv_heads"],
            "head_dim": m["head_dim"], "mlp_hidden": m["mlp_hidden"],
            "rope_theta": m["rope_theta"], "norm_eps": m["norm_eps"],
            "tie_embeddings": m["tie_embeddings"], "qkv_bias": m["bias"],
            "init_std": m["init_std"], "dtype": m["dtype"]}
    diff = {k: (getattr(cfg, k), v) for k, v in want.items() if getattr(cfg, k) != v}
    if diff:
        raise ValueError(f"preset {name!r} differs from spec.json (ours, spec): {diff}")


# ----------------------------------------------------------------------------- FLOPs


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token: |theta| minus the embedding table
    (a gather) when the head is untied; norms are counted (negligible)."""
    return cfg.num_params - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def attention_flops_per_token(cfg: ModelConfig, context: float) -> float:
    """Forward attention FLOPs of one token attending to `context` keys:
    4 * layers * heads * head_dim * context (QK^T and PV, 2 FLOPs per multiply-add)."""
    return 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * context


def forward_flops(cfg: ModelConfig, tokens: int, attended_keys: float,
                  matmul_only: bool = False) -> float:
    """FLOPs of `tokens` forward tokens that attend to `attended_keys` keys in total
    (the sum over tokens of each one's context).

    2 |theta| per token (2 matmul_params(cfg) with matmul_only) + attention.
    """
    n = matmul_params(cfg) if matmul_only else cfg.num_params
    return 2.0 * n * tokens + attention_flops_per_token(cfg, 1.0) * attended_keys


def train_flops(cfg: ModelConfig, tokens: int, attended_keys: float,
                matmul_only: bool = False) -> float:
    """Forward + backward FLOPs: 6 |theta| per token + 3x the forward attention."""
    n = matmul_params(cfg) if matmul_only else cfg.num_params
    return 6.0 * n * tokens + 3.0 * attention_flops_per_token(cfg, 1.0) * attended_keys


def causal_keys(prompt_len: int, length: int) -> float:
    """Sum of contexts for a causal pass over `length` tokens after `prompt_len` ones
    (token i sees prompt_len + i + 1 keys)."""
    return float(length * prompt_len + length * (length + 1) / 2)


# ----------------------------------------------------------------------------- matmul rate


def model_matmuls(cfg: ModelConfig, tokens: int) -> list[tuple[str, int, int, int, int]]:
    """(name, M, K, N, count per forward) of the weight matmuls of one forward pass."""
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_hidden
    L = cfg.n_layers
    return [("q_proj", tokens, d, h * hd, L), ("kv_proj", tokens, d, kv * hd, 2 * L),
            ("o_proj", tokens, h * hd, d, L), ("gate_up", tokens, d, f, 2 * L),
            ("down", tokens, f, d, L), ("lm_head", tokens, d, cfg.vocab_size, 1)]


def time_matmul(m: int, k: int, n: int, reps: int = 0, repeats: int = 5) -> float:
    """Seconds of one float32 [m, k] x [k, n] matmul through XLA, the median of `repeats`
    timings of a jitted loop of `reps` dependent matmuls (dispatch not counted); on CPU the
    faster of XLA's two dot libraries (YNNPACK, the default, and Eigen, which our "dense"
    programs use: `jaxrl_reason.kernels.platform.compiler_options`)."""
    if reps <= 0:  # aim at ~20 ms per timing on a ~100 GFLOP/s machine
        reps = int(min(1000, max(3, 2e9 / (2.0 * m * k * n))))
    key = jax.random.key(0)
    x = jax.random.normal(key, (m, k), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), (k, n), jnp.float32) * 0.01

    def loop(x, w):
        def body(_, carry):
            acc, s = carry
            y = (x + s) @ w  # s changes every iteration: XLA cannot hoist the matmul
            return acc + y, y[0, 0] * 1e-30
        return jax.lax.fori_loop(0, reps, body, (jnp.zeros((m, n), jnp.float32),
                                                 jnp.float32(0)))[0]

    best = float("inf")
    dense = platform.compiler_options("dense")
    for options in [None] + ([dense] if dense else []):
        fn = jax.jit(loop, compiler_options=options)
        jax.block_until_ready(fn(x, w))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x, w))
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times) / reps)
    return best


_RATE_CACHE: dict = {}


def matmul_rate(cfg: ModelConfig, tokens: int, repeats: int = 5) -> dict:
    """Float32 matmul FLOP/s of `cfg`'s forward weight matmuls at `tokens` rows.

    Returns {"flop_per_s": total matmul FLOPs / total matmul time, "tokens": T,
             "per_matmul": {name: GFLOP/s}}. Cached per (shapes, tokens) in the process.
    """
    key = (tuple(model_matmuls(cfg, tokens)), repeats)
    if key in _RATE_CACHE:
        return _RATE_CACHE[key]
    total_flops = total_s = 0.0
    per = {}
    for name, m, k, n, count in model_matmuls(cfg, tokens):
        s = time_matmul(m, k, n, repeats=repeats)
        flops = 2.0 * m * k * n
        per[name] = round(flops / s / 1e9, 1)
        total_flops += count * flops
        total_s += count * s
    out = {"flop_per_s": total_flops / total_s, "tokens": tokens, "per_matmul_gflops": per}
    _RATE_CACHE[key] = out
    return out


def peak_rate(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square float32 [n, n] x [n, n] matmul through XLA."""
    return 2.0 * n ** 3 / time_matmul(n, n, n, repeats=repeats)


_PEAK_CACHE: dict = {}


def machine_peak_rate(quick: bool = False) -> dict:
    """The best float32 matmul rate measured on this machine now: the larger of XLA's square
    [1024]^3 matmul and the anchors' numpy (OpenBLAS) [512]^3 probe, in FLOP/s. XLA's rate
    at a small model's shapes can be well below what the CPU does (on this 2-core VM ~75
    against OpenBLAS's ~150-180 GFLOP/s unloaded), and the sampler's program, whose
    independent matmuls XLA runs side by side, can exceed it; this is the stricter bound."""
    if quick not in _PEAK_CACHE:
        jax_rate = peak_rate(128 if quick else 1024, 1 if quick else 3)
        numpy_rate = matmul_gflops(128 if quick else 512, 2 if quick else 20) * 1e9
        _PEAK_CACHE[quick] = {"flop_per_s": max(jax_rate, numpy_rate),
                              "jax_square_gflops": round(jax_rate / 1e9, 1),
                              "numpy_probe_gflops": round(numpy_rate / 1e9, 1)}
    return _PEAK_CACHE[quick]


def roofline_fraction(achieved_flop_per_s: float, cfg: ModelConfig, tokens: int,
                      quick: bool = False) -> dict:
    """achieved / matmul_rate(cfg, tokens) ("fraction", the issue's roofline: XLA's rate at
    the model's shapes) and achieved / machine_peak_rate() ("fraction_of_peak"); rates in
    GFLOP/s."""
    rate = matmul_rate(cfg, tokens)["flop_per_s"]
    peak = machine_peak_rate(quick)
    return {"achieved_gflops": round(achieved_flop_per_s / 1e9, 2),
            "roofline_gflops": round(rate / 1e9, 2),
            "fraction": round(achieved_flop_per_s / rate, 4),
            "peak_gflops": round(peak["flop_per_s"] / 1e9, 1),
            "peak_parts": {k: v for k, v in peak.items() if k != "flop_per_s"},
            "fraction_of_peak": round(achieved_flop_per_s / peak["flop_per_s"], 4)}


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=["bench-tiny", "bench-small"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 128 * 160],
                    help="matmul rows: 128 = one decode step of 128 rows, 20480 = the RL "
                         "step's training batch (64 rows x 160 positions x 2 (prompt + completion)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat (tests)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else 5
    result = {"machine": machine_info(probe=not args.quick), "models": {}}
    result["peak_gflops_1024"] = round(peak_rate(128 if args.quick else 1024, repeats) / 1e9, 1)
    for name in args.presets:
        cfg = get_preset(name)
        for t in args.tokens:
            r = matmul_rate(cfg, t, repeats)
            result["models"][f"{name}@{t}"] = {
                "gflops": round(r["flop_per_s"] / 1e9, 1), **r["per_matmul_gflops"]}
            print(f"{name:12s} T={t:6d}  {r['flop_per_s'] / 1e9:7.1f} GFLOP/s  "
                  f"per matmul: {r['per_matmul_gflops']}", flush=True)
    print(f"square 1024 matmul: {result['peak_gflops_1024']} GFLOP/s; "
          f"machine: {result['machine']}")
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
