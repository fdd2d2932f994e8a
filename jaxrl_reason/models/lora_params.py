"""LoRA params trees: adapters attached to a base model, a quantized base, merged weights.

A LoRA model's params are the base model's with, in each adapted projection, `lora_a`
[in..., r] and `lora_b` [r, out...] leaves (and, with `lora.base_quant`, the kernel stored
quantized; see `models.lora`). Either layout (layer_i or the scanned "layers", whose leaves
have a leading [n_layers] axis) is accepted everywhere.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason.models import lora as lora_lib
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.params import abstract_params, param_shardings


def _require_lora(cfg: ModelConfig) -> lora_lib.LoraConfig:
    if cfg.lora is None:
        raise ValueError("the model config has no lora block (model.lora)")
    return cfg.lora


def _layer_prefix(path: tuple) -> int:
    """1 when the leaf at `path` sits under the scanned "layers" (a leading layer axis)."""
    return 1 if path and path[0] == "layers" else 0


def _contract(path: tuple) -> int:
    """Input axes of the projection owning `path`: 2 for o_proj ([H, hd, D]), else 1."""
    return 2 if "o_proj" in path else 1


def _projections(tree: Mapping, path: tuple = ()):
    """(path, dict) of every projection dict ("*_proj" under attn/mlp) of a params tree."""
    for k, v in tree.items():
        if isinstance(v, Mapping):
            if k.endswith("_proj") and path and path[-1] in ("attn", "mlp"):
                yield path + (k,), v
            else:
                yield from _projections(v, path + (k,))


def _replace(tree: Mapping, path: tuple, value: Any) -> dict:
    out = dict(tree)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = _replace(tree[path[0]], path[1:], value)
    return out


def _get(tree: Mapping, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def init_adapters(cfg: ModelConfig, rng: jax.Array, mesh: Mesh,
                  rules: Iterable[tuple[str, Any]]) -> dict:
    """Fresh adapters of `cfg.lora` laid out on `mesh`: A ~ U(+-1/sqrt(fan_in)) (PEFT's
    default), B = 0, in `param_dtype`. A nested dict of only the adapter leaves."""
    _require_lora(cfg)
    abstract, _ = lora_lib.split_adapters(abstract_params(cfg))
    shardings, _ = lora_lib.split_adapters(param_shardings(cfg, mesh, rules))
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    names = [tuple(k.key for k in path) for path, _ in flat]

    def init(key):
        values = []
        for i, (name, (_, x)) in enumerate(zip(names, flat)):
            if name[-1] == "lora_b":
                values.append(jnp.zeros(x.shape, x.dtype))
                continue
            bound = 1.0 / np.sqrt(int(np.prod(x.shape[_layer_prefix(name):-1])))
            values.append(jax.random.uniform(jax.random.fold_in(key, i), x.shape, x.dtype,
                                             -bound, bound))
        return jax.tree.unflatten(treedef, values)

    return jax.jit(init, out_shardings=shardings)(rng)


def quantize_base(cfg: ModelConfig, params: Mapping, mesh: Mesh,
                  rules: Iterable[tuple[str, Any]]) -> dict:
    """`params` (float kernels, no adapters needed) with every projection kernel held as
    `cfg.lora.base_quant`, each quantized leaf laid out by its logical axes. Unchanged for
    "none". Kernels already quantized are kept."""
    quant = _require_lora(cfg).base_quant
    if quant == "none":
        return dict(params)
    shardings = param_shardings(cfg, mesh, rules)
    out = dict(params)
    for path, proj in list(_projections(params)):
        if "kernel" not in proj:
            continue
        prefix, contract = _layer_prefix(path), _contract(path)
        quantize = (lambda w: lora_lib.quantize_kernel(w, contract, quant)) if not prefix \
            else jax.vmap(lambda w: lora_lib.quantize_kernel(w, contract, quant))
        target = {n: _get(shardings, path + (n,)) for n in lora_lib.QUANT_KEYS[quant]}
        leaves = jax.jit(quantize, out_shardings=target)(proj["kernel"])
        new = {k: v for k, v in proj.items() if k != "kernel"}
        out = _replace(out, path, {**new, **leaves})
    return out


def attach_adapters(cfg: ModelConfig, base: Mapping, rng: jax.Array, mesh: Mesh,
                    rules: Iterable[tuple[str, Any]]) -> dict:
    """A LoRA model's params from a base model's (`cfg` without lora, same layout): the
    base quantized per `cfg.lora.base_quant` plus fresh adapters (`init_adapters`)."""
    _, base_only = lora_lib.split_adapters(base)
    return lora_lib.merge_trees(init_adapters(cfg, rng, mesh, rules),
                                quantize_base(cfg, base_only, mesh, rules))


def merged_params(cfg: ModelConfig, params: Mapping) -> dict:
    """Plain params (what `cfg.replace(lora=None)` expects): each projection's kernel is
    dequantized and gets scaling * A B added, in float32, cast to `param_dtype`."""
    lora = _require_lora(cfg)
    dtype = jnp.dtype(cfg.param_dtype)
    out = dict(params)
    for path, proj in list(_projections(params)):
        prefix = _layer_prefix(path)
        kernel = lora_lib.dequantize_kernel(proj, jnp.float32) if prefix == 0 else \
            jax.vmap(lambda p: lora_lib.dequantize_kernel(p, jnp.float32))(
                {k: v for k, v in proj.items() if k.startswith("kernel")})
        if "lora_a" in proj:
            delta = jax.vmap(_delta) if prefix else _delta
            kernel = kernel + lora.scaling * delta(proj["lora_a"], proj["lora_b"])
        keep = {k: v for k, v in proj.items()
                if not k.startswith("kernel") and k not in lora_lib.ADAPTER_KEYS}
        out = _replace(out, path, {**keep, "kernel": kernel.astype(dtype)})
    return out


def _delta(a: jax.Array, b: jax.Array) -> jax.Array:
    """A [in..., r] @ B [r, out...] -> float32 [in..., out...]."""
    return jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=([-1], [0]))


def for_training(cfg: ModelConfig, params: Mapping, rng: jax.Array, mesh: Mesh,
                 rules: Iterable[tuple[str, Any]]) -> Mapping:
    """The params a phase trains: with `cfg.lora`, a base without adapters gets them
    (`attach_adapters`); params that hold adapters, or any params without `cfg.lora`, are
    returned as they are."""
    if cfg.lora is None or lora_lib.has_adapters(params):
        return params
    return attach_adapters(cfg, params, rng, mesh, rules)


def base_fingerprint(params: Mapping) -> dict:
    """A cheap identity check of the frozen base of `params` (the adapters excluded): its
    number of scalars and, per leaf, the float32 sum and sum of squares, computed on the
    devices (two floats per leaf reach the host). JSON-serialisable."""
    _, base = lora_lib.split_adapters(params)
    flat = jax.tree_util.tree_flatten_with_path(base)[0]
    sums = jax.jit(lambda xs: [jnp.stack([jnp.sum(x.astype(jnp.float32)),
                                          jnp.sum(jnp.square(x.astype(jnp.float32)))])
                               for x in xs])([x for _, x in flat])
    return {"size": int(sum(x.size for _, x in flat)),
            "sums": [[float(v) for v in np.asarray(s)] for s in sums]}


def check_base_fingerprint(expected: Mapping, params: Mapping, where: str) -> None:
    """ValueError naming `where` when the base of `params` is not the one `expected`
    (a `base_fingerprint`) describes; sums compare to a relative 1e-4 (another mesh sums
    in another order)."""
    got = base_fingerprint(params)
    if got["size"] != expected["size"] or len(got["sums"]) != len(expected["sums"]):
        raise ValueError(f"{where}: the LoRA adapters were trained on a base of "
                         f"{expected['size']:,} parameters in {len(expected['sums'])} "
                         f"tensors, but the base given has {got['size']:,} in "
                         f"{len(got['sums'])}")
    a, b = np.asarray(got["sums"]), np.asarray(expected["sums"])
    if not np.allclose(a, b, rtol=1e-4, atol=1e-6):
        bad = int(np.argmax(np.abs(a - b).max(axis=1)))
        raise ValueError(f"{where}: the base model differs from the one the LoRA adapters "
                         f"were trained on (tensor {bad}: sums {a[bad].tolist()} vs "
                         f"{b[bad].tolist()}); point the run at the same base")


def check_rl_config(cfg: ModelConfig, rl: Mapping) -> None:
    """ValueError listing what an RL config asks of a LoRA policy that LoRA cannot do:
    `rl.ref_sync_every` (the reference is the base with the adapters removed: there is no
    separate copy to mix toward the policy). PPO's critic trains its own adapters on the
    same base (`rl/critic.py`). Nothing without `cfg.lora`."""
    if cfg.lora is None:
        return
    problems = []
    if int(rl.get("ref_sync_every", 0) or 0) > 0:
        problems.append(f"rl.ref_sync_every={rl.get('ref_sync_every')}: mixing the reference "
                        f"toward the policy is not supported with model.lora (the reference "
                        f"is the base with the adapters removed, not a copy); set it to 0")
    if problems:
        raise ValueError("LoRA: " + "; ".join(problems))
