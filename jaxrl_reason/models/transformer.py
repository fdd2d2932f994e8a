"""Decoder-only transformer in flax (linen): RMSNorm, RoPE, grouped-query attention, gated MLP.

One module serves training (full sequences, no cache), prefill (writes the KV cache) and
decode (one token per row against the cache). Every parameter carries logical axis names
(see `jaxrl_reason.sharding`); the model knows nothing about meshes, training or RL.

Conventions for all entry points:
  tokens      int32 [B, T]
  positions   int32 [B, T]   RoPE positions (a left-padded row starts at position 0 at its
                             first real token)
  key_valid   bool  [B, S]   which key slots hold real tokens (S = T without a cache, the
                             cache length with one)
  cache       tuple of n_layers dicts {"k", "v"}: [B, S, n_kv_heads, head_dim]
  cache_index int32 []       slot of tokens[:, 0] in the cache (0 without a cache)
Query t attends to key slot s iff s <= cache_index + t and key_valid[b, s].
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_reason.models.config import ModelConfig

Cache = tuple  # tuple[dict[str, jax.Array], ...], one entry per layer
CACHE_LOGICAL = ("batch", "cache_length", "kv_heads", "head_dim")
_MASK_VALUE = -1e30


def _init(cfg: ModelConfig, logical: Sequence[str | None], std: float | None = None):
    return nn.with_logical_partitioning(
        nn.initializers.normal(cfg.init_std if std is None else std), tuple(logical))


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, rotate-half convention (as Llama/Qwen/Gemma checkpoints use).

    Args:
      x: [B, T, H, D] queries or keys (D even).
      positions: int32 [B, T].
    Returns: [B, T, H, D], same dtype as x (computed in float32).
    """
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1]))
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, T, half]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`jnp.einsum` with a float32 result whose backward matmuls stay in the operands' dtype.

    With bf16 operands, a plain `preferred_element_type=float32` einsum makes both transposed
    matmuls of the backward pass mix the float32 cotangent with a bf16 operand, i.e. run in
    float32. Here the cotangent is cast to the operands' dtype first, so they run in bf16 like
    every other matmul of the model. float32 operands take the plain einsum.
    """
    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    return _einsum_f32_low_precision(spec, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum_f32_low_precision(spec, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(spec, a, b):
    return _einsum_f32_low_precision(spec, a, b), (a, b)


def _einsum_f32_bwd(spec, residuals, g):
    a, b = residuals
    g = g.astype(jnp.result_type(a, b))
    (grad_a,) = jax.linear_transpose(lambda x: jnp.einsum(spec, x, b), a)(g)
    (grad_b,) = jax.linear_transpose(lambda y: jnp.einsum(spec, a, y), b)(g)
    return grad_a, grad_b


_einsum_f32_low_precision.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)


def attention_mask(key_valid: jax.Array, num_queries: int, cache_index) -> jax.Array:
    """Causal + validity mask.

    Args:
      key_valid: bool [B, S].
      num_queries: T.
      cache_index: int32 scalar, slot of the first query.
    Returns: bool [B, T, S].
    """
    query_slot = cache_index + jnp.arange(num_queries)[:, None]
    causal = jnp.arange(key_valid.shape[1])[None, :] <= query_slot
    return causal[None] & key_valid[:, None, :]


class RMSNorm(nn.Module):
    """RMSNorm over the last axis, computed in float32. x: [..., D] -> [..., D]."""
    eps: float
    param_dtype: Any = jnp.float32
    logical: tuple = ("embed",)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, self.logical),
                           (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and an optional KV cache."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, key_valid, cache, cache_index):
        cfg = self.cfg
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        batch, length = x.shape[:2]
        groups = cfg.n_heads // cfg.n_kv_heads

        def proj(name, heads, head_logical):
            return nn.DenseGeneral(
                (heads, cfg.head_dim), axis=-1, use_bias=cfg.qkv_bias, dtype=dtype,
                param_dtype=pdtype, name=name,
                kernel_init=_init(cfg, ("embed", head_logical, "head_dim")),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                       (head_logical, "head_dim")))(x)

        q = proj("q_proj", cfg.n_heads, "heads")
        k = proj("k_proj", cfg.n_kv_heads, "kv_heads")
        v = proj("v_proj", cfg.n_kv_heads, "kv_heads")
        if cfg.qk_norm:
            q = RMSNorm(cfg.norm_eps, pdtype, ("head_dim",), name="q_norm")(q)
            k = RMSNorm(cfg.norm_eps, pdtype, ("head_dim",), name="k_norm")(k)
        q = rope(q, positions, cfg.rope_theta)
        k = rope(k, positions, cfg.rope_theta)

        new_cache = None
        if cache is not None:
            start = (0, cache_index, 0, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), start)
            v = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), start)
            new_cache = {"k": k, "v": v}
        mask = attention_mask(key_valid, length, cache_index)  # [B, T, S]

        q = q.reshape(batch, length, cfg.n_kv_heads, groups, cfg.head_dim)
        scores = einsum_f32("btkgd,bskd->bkgts", q, k.astype(dtype)) * (cfg.head_dim ** -0.5)
        scores = jnp.where(mask[:, None, None], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(dtype))
        out = out.reshape(batch, length, cfg.n_heads, cfg.head_dim)
        out = nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=dtype,
                              param_dtype=pdtype, name="o_proj",
                              kernel_init=_init(cfg, ("heads", "head_dim", "embed")))(out)
        return out, new_cache


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)). SwiGLU with silu, GeGLU with gelu_tanh."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        dense = lambda feats, logical, name: nn.Dense(  # noqa: E731
            feats, use_bias=False, dtype=dtype, param_dtype=pdtype, name=name,
            kernel_init=_init(cfg, logical))
        gate = dense(cfg.mlp_hidden, ("embed", "mlp"), "gate_proj")(x)
        up = dense(cfg.mlp_hidden, ("embed", "mlp"), "up_proj")(x)
        act = jax.nn.silu if cfg.activation == "silu" else (
            lambda z: jax.nn.gelu(z, approximate=True))
        return dense(cfg.d_model, ("mlp", "embed"), "down_proj")(act(gate) * up)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)); x + mlp(norm(x))."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, key_valid, cache, cache_index):
        cfg = self.cfg
        pdtype = jnp.dtype(cfg.param_dtype)
        h, new_cache = Attention(cfg, name="attn")(
            RMSNorm(cfg.norm_eps, pdtype, name="attn_norm")(x), positions, key_valid, cache,
            cache_index)
        x = x + h
        x = x + MLP(cfg, name="mlp")(RMSNorm(cfg.norm_eps, pdtype, name="mlp_norm")(x))
        return x, new_cache


# Block per `ModelConfig.remat`. Remat only changes what the backward pass keeps: the forward
# (training, prefill and decode alike) computes the same values. No argument is static:
# `cache` is a pytree (None without a cache), and `cache_index` is a traced int32 in the
# sampler's decode loop (a python 0 elsewhere, traced like any array), so neither could be
# hashed. prevent_cse stays True (the default) because the blocks run in a python loop, not
# under a scan that would already keep XLA from merging the recomputation with the forward.
_BLOCKS = {
    "none": Block,
    "block": nn.remat(Block),
    "save_dots": nn.remat(Block, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims),
}


class Transformer(nn.Module):
    """The decoder. `__call__` returns (logits f32 [B, T, V] or hidden [B, T, D], new cache)."""
    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        pdtype = jnp.dtype(cfg.param_dtype)
        self.embedding = self.param("embedding", _init(cfg, ("vocab", "embed")),
                                    (cfg.vocab_size, cfg.d_model), pdtype)
        block = _BLOCKS[cfg.remat]
        self.layers = [block(cfg, name=f"layer_{i}") for i in range(cfg.n_layers)]
        self.final_norm = RMSNorm(cfg.norm_eps, pdtype)
        if not cfg.tie_embeddings:
            self.lm_head = self.param("lm_head", _init(cfg, ("embed", "vocab")),
                                      (cfg.d_model, cfg.vocab_size), pdtype)

    def __call__(self, tokens, positions, key_valid, cache: Cache | None = None,
                 cache_index=0, return_hidden: bool = False):
        cfg = self.cfg
        x = jnp.take(self.embedding, tokens, axis=0).astype(jnp.dtype(cfg.dtype))
        if cfg.embed_scale:
            x = x * jnp.asarray(cfg.d_model ** 0.5, x.dtype)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, positions, key_valid, None if cache is None else cache[i],
                                   cache_index)
            new_cache.append(layer_cache)
        x = self.final_norm(x)
        out = x if return_hidden else self.logits(x)
        return out, (None if cache is None else tuple(new_cache))

    def unembedding(self) -> jax.Array:
        """The unembedding matrix [D, V] (transposed embedding when tied)."""
        return self.embedding.T if self.cfg.tie_embeddings else self.lm_head

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> float32 logits [..., V] (with Gemma-2 soft-capping if set)."""
        w = self.unembedding().astype(hidden.dtype)
        logits = einsum_f32("...d,dv->...v", hidden, w)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)
