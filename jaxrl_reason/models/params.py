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

from jaxrl_reason import sharding as shd
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


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype: Any = None) -> tuple:
    """Zeroed KV cache: n_layers dicts of k, v [batch, length, n_kv_heads, head_dim]."""
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    shape = (batch, length, cfg.n_kv_heads, cfg.head_dim)
    return tuple({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
                 for _ in range(cfg.n_layers))


def cache_shardings(cfg: ModelConfig, mesh: Mesh, rules: Iterable[tuple[str, Any]],
                    batch: int, length: int) -> tuple:
    """Shardings matching `init_cache(cfg, batch, length)`."""
    shape = (batch, length, cfg.n_kv_heads, cfg.head_dim)
    s = shd.named_sharding(mesh, CACHE_LOGICAL, tuple(rules), shape)
    return tuple({"k": s, "v": s} for _ in range(cfg.n_layers))
