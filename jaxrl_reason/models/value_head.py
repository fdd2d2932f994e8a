"""The value model (critic) of PPO: the decoder's trunk with a scalar head instead of logits.

`ValueModel(cfg)` runs the same `Transformer` blocks as the policy (so policy or SFT params
initialise it) and maps each final hidden state to one float32 value:

    params = {"trunk": <Transformer params of cfg, without "lm_head">,
              "head":  {"kernel": [D, 1] (logical ("embed", None)), "bias": [1] ((None,))}}

The trunk is built with `tie_embeddings=True` (`trunk_config`): it reads the input embedding
table and never unembeds, so an untied policy's `lm_head` [D, V] is dropped rather than kept
as dead weight in the critic and its optimizer state. Like `params.py`, the functions below
return plain dicts of arrays; the logical axes live in a parallel pytree.
"""

from __future__ import annotations

from typing import Any, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.transformer import Transformer

HEAD_LOGICAL = {"kernel": ("embed", None), "bias": (None,)}


def trunk_config(cfg: ModelConfig) -> ModelConfig:
    """The config of the value trunk: `cfg` with tied embeddings (no `lm_head` param)."""
    return cfg.replace(tie_embeddings=True)


class ValueModel(nn.Module):
    """Transformer trunk + linear head [D] -> 1.

    `__call__(tokens int32 [B, T], positions int32 [B, T], key_valid bool [B, T])` returns
    float32 [B, T]: the value read from the final (normed) hidden state at every position,
    i.e. the value of the state made of the tokens up to and including that position.

    Attributes:
      cfg: the policy's ModelConfig (its `tie_embeddings` is ignored, see `trunk_config`).
      head_init_std: std of the head kernel's normal init; 0.0 (default) initialises it to
        zeros, so every value starts at exactly 0 (the bias is always zero-initialised).
    """
    cfg: ModelConfig
    head_init_std: float = 0.0

    def setup(self):
        kernel_init = (nn.initializers.zeros if self.head_init_std == 0.0
                       else nn.initializers.normal(self.head_init_std))
        self.trunk = Transformer(trunk_config(self.cfg))
        self.head = nn.Dense(
            1, dtype=jnp.float32, param_dtype=jnp.dtype(self.cfg.param_dtype),
            kernel_init=nn.with_logical_partitioning(kernel_init, HEAD_LOGICAL["kernel"]),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, HEAD_LOGICAL["bias"]))

    def __call__(self, tokens, positions, key_valid):
        hidden, _ = self.trunk(tokens, positions, key_valid, return_hidden=True)
        return self.head(hidden.astype(jnp.float32))[..., 0]


def _dummy_inputs():
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, tokens, jnp.ones((1, 1), bool)


def _boxed(cfg: ModelConfig):
    return jax.eval_shape(lambda: ValueModel(cfg).init(jax.random.key(0), *_dummy_inputs()))


def value_param_logical_axes(cfg: ModelConfig) -> Any:
    """Pytree (same structure as the value params) of logical-axis tuples."""
    specs = nn.get_partition_spec(_boxed(cfg))["params"]
    return jax.tree.map(lambda spec: tuple(spec), specs,
                        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def abstract_value_params(cfg: ModelConfig) -> Any:
    """Pytree of ShapeDtypeStruct for the value params (no allocation)."""
    return nn.meta.unbox(_boxed(cfg))["params"]


def value_param_shardings(cfg: ModelConfig, mesh: Mesh,
                          rules: Iterable[tuple[str, Any]]) -> Any:
    """Pytree of NamedSharding for the value params under `rules` on `mesh`."""
    return shd.tree_shardings(mesh, value_param_logical_axes(cfg), abstract_value_params(cfg),
                              rules)
