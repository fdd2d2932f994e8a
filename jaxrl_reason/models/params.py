"""Parameter creation and placement: build the model, initialise it directly into its sharding.

Parameters are plain nested dicts of arrays (no flax boxes) so that every other part of the
system (sampler, trainer, orbax, checkpoint import) sees an ordinary pytree; the logical axis
names live in a parallel pytree of tuples returned by `param_logical_axes`.
"""

from __future__ import annotations

from typing import Any, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.transformer import CACHE_LOGICAL, Transformer


def _dummy_inputs():
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, tokens, jnp.ones((1, 1), bool)


def param_logical_axes(cfg: ModelConfig) -> Any:
    """Pytree (same structure as the params) of logical-axis tuples, one name per dimension."""
    boxed = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), *_dummy_inputs()))
    specs = nn.get_partition_spec(boxed)["params"]
    return jax.tree.map(lambda spec: tuple(spec), specs,
                        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def abstract_params(cfg: ModelConfig) -> Any:
    """Pytree of ShapeDtypeStruct for the params (no allocation)."""
    boxed = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), *_dummy_inputs()))
    return nn.meta.unbox(boxed)["params"]


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: Iterable[tuple[str, Any]]) -> Any:
    """Pytree of NamedSharding for the params under `rules` on `mesh`."""
    return shd.tree_shardings(mesh, param_logical_axes(cfg), abstract_params(cfg), rules)


def init_params(cfg: ModelConfig, rng: jax.Array, mesh: Mesh,
                rules: Iterable[tuple[str, Any]]) -> Any:
    """Randomly initialised params, created directly in their target sharding.

    Returns a nested dict of `param_dtype` arrays laid out on `mesh` by `rules`.
    """
    shardings = param_shardings(cfg, mesh, rules)

    def init(key):
        return nn.meta.unbox(Transformer(cfg).init(key, *_dummy_inputs()))["params"]

    return jax.jit(init, out_shardings=shardings)(rng)


def count_params(params: Any) -> int:
    """Total number of scalars in a params pytree."""
    return sum(int(x.size) for x in jax.tree.leaves(params))


def is_stacked(params: Any) -> bool:
    """True when `params` has the scanned layout (params["layers"]), False for layer_i."""
    return isinstance(params, dict) and "layers" in params


def stack_layers(cfg: ModelConfig, params: dict, *, consume: bool = False) -> dict:
    """layer_i layout -> scanned layout: params["layers"] leaves are [n_layers, ...].

    Each stacked leaf keeps its layers' sharding with a leading replicated axis. With
    consume=True the layer_i entries are popped from `params` and each leaf's per-layer
    arrays are dropped as soon as their stack exists, so device memory peaks at the params
    plus one leaf's stack (import of a model that fills the devices); otherwise `params` is
    left as it was. Other entries (embedding, norms, head) are kept as they are.
    """
    names = [f"layer_{i}" for i in range(cfg.n_layers)]
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params have no {missing[0]} (expected layer_0..layer_"
                         f"{cfg.n_layers - 1})")
    layers = [params.pop(n) if consume else params[n] for n in names]
    leaves, treedef = zip(*(jax.tree.flatten(layer) for layer in layers))
    if len(set(treedef)) != 1:
        raise ValueError("layer_i entries of the params differ in structure")
    leaves = [list(x) for x in leaves]
    del layers  # with consume, `leaves` now hold the only references to the arrays
    stacked = []
    for j in range(len(leaves[0])):
        column = [layer_leaves[j] for layer_leaves in leaves]
        for layer_leaves in leaves:
            layer_leaves[j] = None
        stacked.append(_stack_leaf(*column))
        del column
    out = {k: v for k, v in params.items() if not k.startswith("layer_")}
    out["layers"] = jax.tree.unflatten(treedef[0], stacked)
    return out


def _stack(*xs):
    return jnp.stack(xs)


def _stack_leaf(*xs):
    sharding = getattr(xs[0], "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = jax.sharding.PartitionSpec(None, *sharding.spec)
        target = jax.sharding.NamedSharding(sharding.mesh, spec)
        return jax.jit(_stack, out_shardings=target)(*xs)
    return jnp.stack(xs)


def unstack_layers(cfg: ModelConfig, params: dict) -> dict:
    """Scanned layout -> layer_i layout (the inverse of `stack_layers`, bit-exact)."""
    out = {k: v for k, v in params.items() if k != "layers"}
    leaves, treedef = jax.tree.flatten(params["layers"])
    per_layer = [_unstack_leaf(x) for x in leaves]  # each: n_layers slices
    for i in range(cfg.n_layers):
        out[f"layer_{i}"] = jax.tree.unflatten(treedef, [slices[i] for slices in per_layer])
    return out


def _unstack(x):
    return tuple(x[i] for i in range(x.shape[0]))


def _unstack_leaf(x) -> tuple:
    """The n_layers slices of a stacked leaf, in one program (each keeps x's sharding minus
    the leading axis)."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:])
        target = jax.sharding.NamedSharding(sharding.mesh, spec)
        return jax.jit(_unstack, out_shardings=(target,) * x.shape[0])(x)
    return tuple(x[i] for i in range(x.shape[0]))


def to_layout(cfg: ModelConfig, params: dict) -> dict:
    """`params` in the layout `cfg.scan_layers` asks for (converted when it is the other)."""
    if cfg.scan_layers and not is_stacked(params):
        return stack_layers(cfg, params)
    if not cfg.scan_layers and is_stacked(params):
        return unstack_layers(cfg, params)
    return params


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype: Any = None) -> Any:
    """Zeroed KV cache: n_layers dicts of k, v [batch, n_kv_heads, length, head_dim], or with
    `cfg.scan_layers` one dict of k, v [n_layers, batch, n_kv_heads, length, head_dim]."""
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    shape = _cache_shape(cfg, batch, length)
    if cfg.scan_layers:
        shape = (cfg.n_layers,) + shape
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    return tuple({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
                 for _ in range(cfg.n_layers))


def cache_shardings(cfg: ModelConfig, mesh: Mesh, rules: Iterable[tuple[str, Any]],
                    batch: int, length: int) -> Any:
    """Shardings matching `init_cache(cfg, batch, length)`."""
    shape = _cache_shape(cfg, batch, length)
    if cfg.scan_layers:
        s = shd.named_sharding(mesh, ("layers",) + CACHE_LOGICAL, tuple(rules),
                               (cfg.n_layers,) + shape)
        return {"k": s, "v": s}
    s = shd.named_sharding(mesh, CACHE_LOGICAL, tuple(rules), shape)
    return tuple({"k": s, "v": s} for _ in range(cfg.n_layers))


def _cache_shape(cfg: ModelConfig, batch: int, length: int) -> tuple[int, ...]:
    """One layer's k (or v) shape, in `CACHE_LOGICAL` order."""
    sizes = {"batch": batch, "kv_heads": cfg.n_kv_heads, "cache_length": length,
             "head_dim": cfg.head_dim}
    return tuple(sizes[name] for name in CACHE_LOGICAL)


def _batch_axis(x: jax.Array) -> int:
    return x.ndim - len(CACHE_LOGICAL)  # 0 per layer, 1 when stacked


def _length_axis(x: jax.Array) -> int:
    return _batch_axis(x) + CACHE_LOGICAL.index("cache_length")


def repeat_cache(cache: Any, repeats: int) -> Any:
    """Each batch row of the cache `repeats` times in a row (either layout)."""
    return jax.tree.map(lambda x: jnp.repeat(x, repeats, axis=_batch_axis(x)), cache)


def constrain_cache(cache: Any) -> Any:
    """The cache constrained to its logical axes under the active
    `sharding.activation_sharding` context (either layout); unchanged outside one."""
    return jax.tree.map(
        lambda x: shd.constrain(x, ("layers",) * _batch_axis(x) + CACHE_LOGICAL), cache)


def pad_cache(cache: Any, extra: int) -> Any:
    """The cache with `extra` zero slots appended to its length axis (either layout)."""
    def pad(x):
        widths = [(0, 0)] * x.ndim
        widths[_length_axis(x)] = (0, extra)
        return jnp.pad(x, widths)
    return jax.tree.map(pad, cache)


def cache_length(cache: Any) -> int:
    """S, the number of slots of the cache (either layout)."""
    x = jax.tree.leaves(cache)[0]
    return x.shape[_length_axis(x)]
