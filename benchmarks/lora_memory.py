r"""Memory of the compiled RL update, full fine-tuning against LoRA (XLA's own buffer plan).

    python benchmarks/lora_memory.py                          # arith_grpo's tiny model, XLA:CPU
    python benchmarks/lora_memory.py --preset small --rows 64 --length 256
    python benchmarks/lora_memory.py --topology v5e:2x4      # the update for a TPU slice

Nothing runs: the update of `rl.update.make_update_fn` (forward, backward, AdamW) is lowered
on `jax.ShapeDtypeStruct` inputs for one CPU device and compiled; the figures are
`compiled.memory_analysis()` (arguments, outputs, temporaries) per variant. With --topology
the update of configs/arith_grpo(_lora).py is compiled for that TPU slice (`runtime.plan`)
and XLA's buffer assignment (dumped to a temporary directory) also gives the temporaries it
placed in the core's VMEM (memory space 1), which memory_analysis() leaves out: on a model
this small, VMEM holds a large share of the update's activations, and how large depends on
every other buffer in the program.

Variants: full (every weight trained), lora (rank-8 adapters on every projection, as
configs/arith_grpo_lora.py), lora_int8 and lora_nf4 (the frozen base held quantized).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {"full": None, "lora": "none", "lora_int8": "int8", "lora_nf4": "nf4"}


def _config(preset: str, quant: str | None, rows: int, length: int, prompt: int):
    """arith_grpo's config with `preset`'s model, one CPU device, `rows` update rows."""
    import ml_collections

    from jaxrl_reason.config.files import sibling_config
    from jaxrl_reason.models.config import get_preset
    configs = Path(__file__).resolve().parents[1] / "configs"
    c = sibling_config(str(configs / "arith_grpo.py"), "arith_grpo_lora").get_config(None)
    c.model = ml_collections.ConfigDict({**get_preset(preset).__dict__, "lora": None,
                                         "vocab_size": 320 if preset == "tiny" else 0})
    if quant is not None:
        c.model.lora = ml_collections.ConfigDict({"rank": 8, "alpha": 16.0, "dropout": 0.0,
                                                  "targets": ("all-linear",),
                                                  "base_quant": quant})
    c.rl.batch_prompts, c.rl.num_generations = rows, 1
    c.rl.max_new_tokens, c.task.prompt_buckets = length, (prompt,)
    return c


def compile_update(config):
    """The compiled update of `config` for one CPU device (nothing allocated)."""
    import jax
    import jax.numpy as jnp

    from jaxrl_reason.models.params import abstract_params, param_shardings
    from jaxrl_reason.models.transformer import Transformer
    from jaxrl_reason.rl.update import make_update_fn
    from jaxrl_reason.runtime import sharding as shd
    from jaxrl_reason.runtime.build import model_config
    from jaxrl_reason.runtime.train_state import (TrainState, make_optimizer,
                                                  opt_state_shardings, trainable_params)

    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    rules = tuple((n, tuple(a) if isinstance(a, (list, tuple)) else a)
                  for n, a in config.sharding_rules)
    cfg = model_config(config.model, config.model.vocab_size or config.tokenizer.vocab_size)
    model, rep = Transformer(cfg), shd.replicated(mesh)

    def sds(shape, dtype, sharding=rep):
        return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)

    params = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s), abstract_params(cfg),
                          param_shardings(cfg, mesh, rules))
    optimizer = make_optimizer(1e-4, weight_decay=0.0, max_grad_norm=1.0)
    trainable = trainable_params(params)
    opt_state = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s),
                             jax.eval_shape(optimizer.init, trainable),
                             opt_state_shardings(optimizer, trainable))
    n, tp, length = config.rl.batch_prompts, config.task.prompt_buckets[0], config.rl.max_new_tokens
    batch = {"prompt_tokens": sds((n, tp), jnp.int32), "prompt_valid": sds((n, tp), bool),
             "completion_tokens": sds((n, length), jnp.int32),
             "mask": sds((n, length), jnp.float32), "advantages": sds((n,), jnp.float32),
             "num_sequences": sds((), jnp.float32), "num_tokens": sds((), jnp.float32),
             "beta": sds((), jnp.float32), "sampler_logp": sds((n, length), jnp.float32)}
    state = TrainState(step=sds((), jnp.int32), params=params, opt_state=opt_state)
    update = make_update_fn(model, optimizer, config.rl, mesh, rules, kernel_backend="reference")
    return update.lower(state, batch).compile()


_TEMP = re.compile(r"allocation \d+: size (\d+), (?:color (\d+), )?preallocated-temp")


def temp_by_memory_space(dump: str, since: float) -> dict[int, int]:
    """{memory space: bytes} of the preallocated temporaries of the newest update program
    XLA dumped to `dump` after time `since` (TPU: 0 = HBM, 1 = the core's VMEM); {} if none."""
    files = [f for f in Path(dump).glob("*jit_update*after_optimizations-buffer-assignment.txt")
             if f.stat().st_mtime >= since]
    if not files:
        return {}
    out = {}
    for m in _TEMP.finditer(max(files, key=lambda f: f.stat().st_mtime).read_text()):
        space = int(m.group(2) or 0)
        out[space] = out.get(space, 0) + int(m.group(1))
    return out


def plan_update(name: str, quant: str | None, topology: str):
    """memory_analysis-like figures of configs/<name>.py's update compiled for `topology`
    (`runtime.plan`; arith_grpo's own batch and lengths)."""
    from jaxrl_reason.cli import parse
    from jaxrl_reason.runtime import plan as planner
    config = "arith_grpo" if quant is None else "arith_grpo_lora"
    flags = [] if quant in (None, "none") else [f"--config.model.lora.base_quant={quant}"]
    _, fv = parse(["jaxrl-reason", "plan", "--config",
                   str(Path(__file__).resolve().parents[1] / "configs" / f"{config}.py"),
                   "--topology", topology, *flags])
    prog = planner.plan(fv.config, topology, programs=("update",), layer_cost=False)
    return prog["programs"][0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", help="models.config preset")
    parser.add_argument("--rows", type=int, default=128, help="update rows (B x G)")
    parser.add_argument("--length", type=int, default=96, help="completion tokens")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--topology", default="",
                        help="compile arith_grpo(_lora)'s update for this TPU topology "
                             "(e.g. v5e:2x4; libtpu) instead of the XLA:CPU update above; "
                             "also reports the temporaries XLA places in VMEM")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    dump = ""
    if args.topology:  # XLA's buffer assignment says which memory space holds what
        import tempfile
        dump = tempfile.mkdtemp(prefix="lora_memory_")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
                                   " --xla_dump_hlo_module_re=.*update.*").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    if args.topology:
        print(f"configs/arith_grpo(_lora).py's update for {args.topology}, per chip, MiB "
              f"(HBM: memory_analysis(); VMEM: XLA's buffer assignment, memory space 1)\n")
        print("| variant | arguments | HBM temporaries | VMEM temporaries |")
        print("|---|---|---|---|")
    else:
        print(f"{args.preset} model, {args.rows} rows x ({args.prompt} + {args.length}) "
              f"tokens, one XLA:CPU device; compiled update's memory_analysis(), MiB\n")
        print("| variant | arguments | outputs (not aliased) | temporaries |")
        print("|---|---|---|---|")
    rows = []
    for name in args.variants:
        if args.topology:
            since = time.time()
            prog = plan_update(name, VARIANTS[name], args.topology)
            spaces = temp_by_memory_space(dump, since)
            row = {"variant": name, "argument_bytes": prog.argument_bytes,
                   "temp_bytes": prog.temp_bytes, "vmem_temp_bytes": spaces.get(1, 0)}
            print(f"| {name} | {row['argument_bytes'] / 2**20:.2f} | "
                  f"{row['temp_bytes'] / 2**20:.2f} | {row['vmem_temp_bytes'] / 2**20:.2f} |",
                  flush=True)
        else:
            compiled = compile_update(_config(args.preset, VARIANTS[name], args.rows,
                                              args.length, args.prompt))
            mem = compiled.memory_analysis()
            row = {"variant": name, "argument_bytes": mem.argument_size_in_bytes,
                   "output_bytes": mem.output_size_in_bytes - mem.alias_size_in_bytes,
                   "temp_bytes": mem.temp_size_in_bytes}
            print(f"| {name} | {row['argument_bytes'] / 2**20:.2f} | "
                  f"{row['output_bytes'] / 2**20:.2f} | {row['temp_bytes'] / 2**20:.2f} |",
                  flush=True)
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
