r"""Per-device memory of a training forward + backward under context parallelism.

    python benchmarks/context_memory.py                       # bench-tiny, T = 4096, cp 1/2/4
    python benchmarks/context_memory.py --attention-chunk 512   # query chunks of 512
    python benchmarks/context_memory.py --length 8192 --preset tiny --rows 4

Nothing runs: the gradient of a packed log-prob loss (the decoder over packs of `--length`
tokens with segment ids, then token log-probs) is lowered and compiled for the 8 fake CPU
devices on the mesh {data: 2, context: cp} (2 * cp devices; the same `--rows` packs per data
shard at every cp), and the figure is XLA's buffer plan, `memory_analysis()` per device:
temporaries (activations, scores, gradients in flight) and arguments. A context shard holds
T / cp of every activation and the [T / cp, T] scores of its queries; the gathered keys and
values are [T] per layer.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()


def compiled_memory(preset: str, length: int, rows: int, context: int,
                    segment_len: int, attention_chunk: int | None = None) -> dict:
    """Per-device bytes {"temp", "args"} of the compiled gradient at context size `context`.
    Rows are packs of `length` tokens cut into segments of `segment_len`; attention_chunk:
    `ModelConfig.attention_chunk` (None: the preset's)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.models.scoring import hidden_logprobs
    from jaxrl_reason.models.transformer import Transformer
    from jaxrl_reason.runtime import sharding as shd

    rules = shd.DEFAULT_RULES
    mesh = shd.make_mesh({"data": 2, "context": context}, jax.devices()[:2 * context])
    cfg = dataclasses.replace(get_preset(preset), attention_impl="reference",
                              dtype="float32")
    if attention_chunk:
        cfg = dataclasses.replace(cfg, attention_chunk=attention_chunk)
    model = Transformer(cfg)
    params = init_params(cfg, jax.random.key(0), mesh, rules)
    batch = 2 * rows
    segments = np.arange(length) // segment_len + 1
    host = {"tokens": np.zeros((batch, length), np.int32),
            "positions": np.tile(np.arange(length) % segment_len, (batch, 1)).astype(np.int32),
            "segments": np.tile(segments, (batch, 1)).astype(np.int32)}
    arrays = {k: shd.put_batch(mesh, rules, v) for k, v in host.items()}

    def loss(p, a):
        hidden, _ = model.apply({"params": p}, a["tokens"], a["positions"],
                                a["segments"] > 0, return_hidden=True,
                                segment_ids=a["segments"])
        logp, _ = hidden_logprobs(model, p, hidden, a["tokens"], with_entropy=False)
        return jnp.sum(logp)

    fn = jax.jit(shd.with_activation_sharding(jax.grad(loss), mesh, rules))
    stats = fn.lower(params, arrays).compile().memory_analysis()
    return {"temp": stats.temp_size_in_bytes, "args": stats.argument_size_in_bytes}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench-tiny")
    parser.add_argument("--length", type=int, default=4096, help="tokens per pack")
    parser.add_argument("--rows", type=int, default=1, help="packs per data shard")
    parser.add_argument("--segment", type=int, default=1024, help="tokens per segment")
    parser.add_argument("--context", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--attention-chunk", type=int, default=0,
                        help="model.attention_chunk (0: the preset's, none)")
    args = parser.parse_args(argv)
    for cp in args.context:
        if args.length % cp:
            raise SystemExit(f"--length {args.length} does not divide by context {cp}")
    print(f"{args.preset}, {args.rows} pack(s) of {args.length} tokens per data shard, "
          f"float32, attention_chunk {args.attention_chunk or None}; per-device bytes from "
          "memory_analysis()")
    base = None
    for cp in args.context:
        mem = compiled_memory(args.preset, args.length, args.rows, cp, args.segment,
                              args.attention_chunk or None)
        base = base or mem["temp"]
        print(f"cp={cp}: temporaries {mem['temp'] / 2**20:8.1f} MiB "
              f"({mem['temp'] / base:.2f}x cp={args.context[0]}), "
              f"arguments {mem['args'] / 2**20:6.1f} MiB")


if __name__ == "__main__":
    main()
