r"""Training-step memory of the log-prob head: full [B, L, V] logits versus memory-lean kernels.

    python benchmarks/memory.py                    # XLA:CPU compile only, ~1-2 min on 2 cores
    python benchmarks/memory.py --backend tpu      # AOT for one TPU v5e chip (needs libtpu)
    python benchmarks/memory.py --vocab 32768 --length 1024 --json out.json

Nothing is allocated or run: each variant is `jax.jit(jax.grad(loss)).lower(...).compile()`
on `jax.ShapeDtypeStruct` inputs, and the figure is XLA's own buffer plan,
`compiled.memory_analysis().temp_size_in_bytes` (temporaries: everything except the
arguments and the outputs). The loss is a token-level policy-gradient loss with an entropy
bonus on the log-probs of the final hidden states h [B, L, D] under the unembedding
W [D, V]; its gradient w.r.t. h (what flows back into the transformer) and W is taken:

    loss = -sum(mask * (advantage * logp + 0.01 * entropy)) / sum(mask)

Variants (`jaxrl_reason.kernels.logprobs.token_logprobs`):
  full     the jnp reference (what `models.scoring.completion_logprobs` does today);
  chunked  `chunked_logprobs` (jnp + lax.fori_loop, custom_vjp);
  pallas   `pallas_logprobs` (only with --backend tpu: on CPU the kernels run in the
           interpreter, whose buffers say nothing about the kernel's).

Defaults: B = 8, D = 2048, h in bfloat16 and W in float32 (bf16 activations, f32 master
weights, as `Transformer.logits` casts W to h's dtype), V in {32k, 256k}, L in {1024, 4096}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _loss_fn(impl, args):
    import jax.numpy as jnp

    from jaxrl_reason.kernels import logprobs as lp

    def loss(hidden, w, targets, mask, advantages):
        logp, entropy = lp.token_logprobs(hidden, w, targets, impl=impl, temperature=1.0,
                                          seq_chunk=args.seq_chunk, vocab_chunk=args.vocab_chunk)
        per_token = advantages[:, None] * logp + 0.01 * entropy
        return -jnp.sum(mask * per_token) / jnp.maximum(jnp.sum(mask), 1.0)

    return loss


def _temp_bytes(impl, batch, length, vocab, args, sharding):
    """XLA's temporary bytes for the gradient step, or the compile error's first line."""
    import jax
    import jax.numpy as jnp

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)

    inputs = (spec((batch, length, args.dim), args.hidden_dtype),
              spec((args.dim, vocab), args.param_dtype), spec((batch, length), "int32"),
              spec((batch, length), "float32"), spec((batch,), "float32"))
    step = jax.jit(jax.grad(_loss_fn(impl, args), argnums=(0, 1)))
    try:
        return step.lower(*inputs).compile().memory_analysis().temp_size_in_bytes
    except Exception as e:  # noqa: BLE001 - e.g. RESOURCE_EXHAUSTED: does not fit the chip
        return str(e).strip().splitlines()[0][:100]


def _mib(value):
    return f"{value / 2**20:,.0f}" if isinstance(value, int) else f"n/a ({value})"


def _ratio(full, lean):
    if not (isinstance(full, int) and isinstance(lean, int)):
        return "n/a"
    return f"{full / lean:.1f}x" if lean else "inf (no temporaries)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cpu", "tpu"), default="cpu",
                        help="cpu: XLA:CPU; tpu: ahead-of-time for one chip of --topology")
    parser.add_argument("--topology", default="v5e:2x2", help="TPU topology (--backend tpu)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument("--length", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--hidden-dtype", default="bfloat16")
    parser.add_argument("--param-dtype", default="float32")
    parser.add_argument("--seq-chunk", type=int, default=128)
    parser.add_argument("--vocab-chunk", type=int, default=8192)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    sharding, impls = None, ["full", "chunked"]
    if args.backend == "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # AOT needs no chip
        from jax.experimental import topologies
        device = topologies.get_topology_desc(platform="tpu",
                                              topology_name=args.topology).devices[0]
        sharding, impls = jax.sharding.SingleDeviceSharding(device), impls + ["pallas"]

    print(f"backend={args.backend} B={args.batch} D={args.dim} h={args.hidden_dtype} "
          f"W={args.param_dtype} seq_chunk={args.seq_chunk} vocab_chunk={args.vocab_chunk} "
          f"(pallas: default BlockSizes); XLA temp_size_in_bytes of jit(grad(loss)), MiB\n")
    header = ["V", "L", "[B,L,V] f32 logits"] + impls + [f"full / {i}" for i in impls[1:]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows = []
    for vocab in args.vocab:
        for length in args.length:
            start = time.perf_counter()
            temps = {impl: _temp_bytes(impl, args.batch, length, vocab, args, sharding)
                     for impl in impls}
            ratios = [_ratio(temps["full"], temps[i]) for i in impls[1:]]
            logits = args.batch * length * vocab * 4
            print(f"| {vocab} | {length} | {_mib(logits)} | "
                  + " | ".join(_mib(temps[i]) for i in impls) + " | " + " | ".join(ratios)
                  + f" |   <!-- {time.perf_counter() - start:.0f} s -->", flush=True)
            rows.append(dict(vocab=vocab, length=length, logits_bytes=logits, **temps))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(config=vars(args), rows=rows), indent=1))


if __name__ == "__main__":
    main()
