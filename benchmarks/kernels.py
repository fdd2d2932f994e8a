r"""Pallas kernels vs their jnp references: median wall time per jitted call.

    python benchmarks/kernels.py                         # current backend (~5 s on 2 CPU cores)
    python benchmarks/kernels.py --repeats 50 --json out.json
    python benchmarks/kernels.py --interpret             # also time the interpreter (CPU)

Cases, each timed after a warm-up (compile) call, ``--repeats`` times, median reported:

  * ``policy_loss`` forward + backward (``jax.value_and_grad`` w.r.t. log-probs and entropy),
    "grpo" aggregation, k3 KL with beta, entropy bonus, dual clip, ~70% of tokens masked in,
    for ``[B, L]`` in ``--loss-shapes`` (float32 and bfloat16 log-probs);
  * ``group_advantages`` ("grpo"/"group" and "reinforce_pp"/"batch") for ``num_groups x G``
    in ``--adv-shapes``.

On TPU and GPU both backends run ("pallas" compiled by Mosaic on TPU, by Triton on GPU: the
``*_gpu.py`` versions) and the speed-up is printed. On CPU
only the reference is timed: the kernels would run in the Pallas interpreter, which checks
correctness and says nothing about speed (``--interpret`` times it anyway, labelled as such).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_reason.kernels import group_advantage as ga  # noqa: E402
from jaxrl_reason.kernels import group_advantage_gpu as ga_gpu  # noqa: E402
from jaxrl_reason.kernels import policy_loss as pl  # noqa: E402
from jaxrl_reason.kernels import policy_loss_gpu as pl_gpu  # noqa: E402
from jaxrl_reason.rl import advantages, losses  # noqa: E402

ON_GPU = jax.default_backend() == "gpu"


def _median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _loss_inputs(b: int, length: int, dtype):
    rng = np.random.default_rng(0)
    logp = -rng.uniform(0.01, 4.0, (b, length))
    arrays = {
        "logp": logp, "old_logp": logp + rng.normal(0, 0.3, (b, length)),
        "ref_logp": logp + rng.normal(0, 0.3, (b, length)),
        "entropy": rng.uniform(0, 3, (b, length)),
    }
    out = {k: jnp.asarray(v, dtype) for k, v in arrays.items()}
    out["advantages"] = jnp.asarray(rng.normal(size=b), jnp.float32)
    out["mask"] = jnp.asarray(rng.uniform(size=(b, length)) < 0.7)
    return out


def _loss_fn(impl: str, interpret: bool):
    options = dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.28, beta=0.04,
                   kl_estimator="k3", entropy_coef=0.01, clip_ratio_c=3.0)
    if impl == "pallas":
        loss = pl_gpu.policy_loss if ON_GPU else pl.policy_loss  # Triton on GPU
        options["interpret"] = interpret
    else:
        loss = losses.policy_loss

    @jax.jit
    def step(x):
        def f(logp, entropy):
            return loss(logp, x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                        entropy=entropy, **options)[0]
        return jax.value_and_grad(f, argnums=(0, 1))(x["logp"], x["entropy"])

    return step


def _adv_fn(impl: str, interpret: bool, group_size: int, estimator: str, scale: str):
    if impl == "pallas":
        kernels = ga_gpu if ON_GPU else ga  # Triton on GPU, Mosaic on TPU
        return jax.jit(lambda r: kernels.group_advantage(r, group_size, estimator=estimator,
                                                         scale=scale, interpret=interpret)[0])
    return jax.jit(lambda r: advantages.group_advantages(r, group_size, estimator=estimator,
                                                         scale=scale))


def _shape(text: str) -> tuple[int, int]:
    a, b = text.lower().split("x")
    return int(a), int(b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per case")
    parser.add_argument("--loss-shapes", type=_shape, nargs="+", default=None,
                        help="BxL of policy_loss (default: 64x1024 256x2048 on TPU, 16x512 "
                             "64x1024 elsewhere)")
    parser.add_argument("--adv-shapes", type=_shape, nargs="+", default=None,
                        help="num_groupsxG of group_advantages (default: 512x16 4096x8)")
    parser.add_argument("--interpret", action="store_true",
                        help="off TPU, also time the kernels in the Pallas interpreter")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)

    on_tpu = jax.default_backend() in ("tpu", "gpu")  # the kernels compile there
    impls = ["reference", "pallas"] if on_tpu or args.interpret else ["reference"]
    loss_shapes = args.loss_shapes or ([(64, 1024), (256, 2048)] if on_tpu
                                       else [(16, 512), (64, 1024)])
    adv_shapes = args.adv_shapes or [(512, 16), (4096, 8)]
    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}), "
          f"jax {jax.__version__}, median of {args.repeats} calls")
    if not on_tpu:
        print("not a TPU: " + ("'pallas' rows run the Pallas INTERPRETER, a correctness tool; "
                               "their times are not a speed measurement" if args.interpret
                               else "timing the jnp reference only (the kernels would run in "
                               "the Pallas interpreter, which is not a speed measurement)"))

    rows = []
    for (b, length), dtype in [(s, d) for s in loss_shapes for d in (jnp.float32, jnp.bfloat16)]:
        x = _loss_inputs(b, length, dtype)
        for impl in impls:
            ms = _median_ms(_loss_fn(impl, not on_tpu), (x,), args.repeats)
            rows.append({"case": "policy_loss fwd+bwd", "shape": f"{b}x{length}",
                         "dtype": jnp.dtype(dtype).name, "impl": impl, "ms": ms})
    for num_groups, group_size in adv_shapes:
        rewards = jnp.asarray(np.random.default_rng(0).integers(0, 3, num_groups * group_size),
                              jnp.float32)
        for estimator, scale in (("grpo", "group"), ("reinforce_pp", "batch")):
            for impl in impls:
                fn = _adv_fn(impl, not on_tpu, group_size, estimator, scale)
                rows.append({"case": f"group_advantages {estimator}/{scale}",
                             "shape": f"{num_groups}x{group_size}", "dtype": "float32",
                             "impl": impl, "ms": _median_ms(fn, (rewards,), args.repeats)})

    print(f"{'case':36s} {'shape':>10s} {'dtype':>9s} {'impl':>10s} {'ms':>10s} {'speed-up':>9s}")
    reference_ms = {}
    for row in rows:
        key = (row["case"], row["shape"], row["dtype"])
        if row["impl"] == "reference":
            reference_ms[key] = row["ms"]
            speedup = ""
        else:
            row["speedup"] = reference_ms[key] / row["ms"]
            speedup = f"{row['speedup']:.2f}x" + ("" if on_tpu else " (interp.)")
        print(f"{row['case']:36s} {row['shape']:>10s} {row['dtype']:>9s} {row['impl']:>10s} "
              f"{row['ms']:10.3f} {speedup:>9s}")
    if args.json:
        args.json.write_text(json.dumps({"backend": jax.default_backend(), "rows": rows},
                                        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
