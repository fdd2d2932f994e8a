"""Decoder-only transformer in flax (linen): RMSNorm, RoPE, grouped-query attention, gated MLP.

The switches of `ModelConfig` make it Llama 3 (RoPE scaling), Qwen2 (q/k/v bias), Qwen3 (q/k
norm), Gemma 2 (GeGLU, (1 + w) norms, post-norms, soft-capping, alternating sliding-window
layers) or Gemma 3 (q/k norm, 5 local : 1 global layers with their own RoPE base).

One module serves training (full sequences, no cache), prefill (writes the KV cache) and
decode (one token per row against the cache). Every parameter carries logical axis names
(see `jaxrl_reason.runtime.sharding`); the model knows nothing about meshes, training or RL.

Conventions for all entry points:
  tokens      int32 [B, T]
  positions   int32 [B, T]   RoPE positions (a left-padded row starts at position 0 at its
                             first real token)
  key_valid   bool  [B, S]   which key slots hold real tokens (S = T without a cache, the
                             cache length with one)
  cache       tuple of n_layers dicts {"k", "v"}: [B, n_kv_heads, S, head_dim] (head-major:
              a decode step reads each head's keys as one contiguous [S, head_dim] block);
              with `cfg.scan_layers` one dict of stacked [n_layers, B, n_kv_heads, S, head_dim]
  cache_index int32 []       slot of tokens[:, 0] in the cache (0 without a cache)
  segment_ids int32 [B, T]   optional, without a cache: packed rows, >= 1 per sequence, 0
                             for padding
  prompt_segment_ids int32 [B, T]  optional, with segment_ids: the other segment a token
                             attends to (a shared prompt; see `models.attention`)
Query t attends to key slot s iff s <= cache_index + t and key_valid[b, s] (and, in a
sliding-window layer, cache_index + t - s < sliding_window; with segment ids, only inside
its segment, or its prompt segment). `models.attention` computes it (`ModelConfig.attention_impl`: jnp reference,
splash on TPU, cuDNN on GPU).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_reason.models import attention
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.lora import DROPOUT_RNG, Projection
from jaxrl_reason.models.attention import (attention_mask, causal_query_blocks,  # noqa: F401
                                           scale_dim_of)
from jaxrl_reason.models.matmul import cpu_float32 as _cpu_float32
from jaxrl_reason.models.matmul import einsum_f32, narrow_transpose_matmul  # noqa: F401
from jaxrl_reason.runtime.sharding import (activation_context, constrain, context_parallel_size,
                                            unsharded_length)

Cache = tuple  # tuple[dict[str, jax.Array], ...], one entry per layer
CACHE_LOGICAL = ("batch", "kv_heads", "cache_length", "head_dim")
ACTIVATION_LOGICAL = ("batch", "length", "embed")  # the residual stream [B, T, D]


def _narrow_matmuls(dtype) -> bool:
    """Whether the model's matmuls take `narrow_transpose_matmul` (CPU float32), except
    under context parallelism: that backward flattens the [B, T] rows of a weight gradient,
    which the partitioner cannot keep split over batch and context at once (it gathered the
    whole sequence of every MLP activation instead)."""
    ctx = activation_context()
    return _cpu_float32(dtype) and (ctx is None or context_parallel_size(*ctx) == 1)


def _init(cfg: ModelConfig, logical: Sequence[str | None], std: float | None = None):
    return nn.with_logical_partitioning(
        nn.initializers.normal(cfg.init_std if std is None else std), tuple(logical))


def rope_frequencies(head_dim: int, theta: float, scaling: str | None = None,
                     factor: float = 1.0, low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0,
                     original_max_position: int = 8192) -> jax.Array:
    """RoPE inverse frequencies, float32 [head_dim // 2], as Hugging Face computes them.

    scaling: None; "linear" (divide by `factor`); "llama3" (Llama 3.1: wavelengths longer
    than original_max_position / low_freq_factor are divided by `factor`, shorter than
    original_max_position / high_freq_factor kept, a smooth interpolation in between).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim))
    if scaling == "linear":
        return inv_freq / factor
    if scaling == "llama3":
        wavelen = 2 * math.pi / inv_freq
        low_wavelen = original_max_position / low_freq_factor
        high_wavelen = original_max_position / high_freq_factor
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = ((original_max_position / wavelen - low_freq_factor)
                  / (high_freq_factor - low_freq_factor))
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    if scaling is not None:
        raise ValueError(f"unknown RoPE scaling {scaling!r}")
    return inv_freq


def layer_rope_frequencies(cfg: ModelConfig, sliding: bool) -> jax.Array | None:
    """Inverse frequencies of a layer, or None for the plain `rope(x, positions, rope_theta)`.

    Sliding-window layers use `rope_local_theta` unscaled when it is set; every other layer
    uses rope_theta with `rope_scaling`.
    """
    if sliding and cfg.rope_local_theta is not None:
        return rope_frequencies(cfg.head_dim, cfg.rope_local_theta)
    if cfg.rope_scaling is None:
        return None
    return rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                            cfg.rope_scaling_factor, cfg.rope_low_freq_factor,
                            cfg.rope_high_freq_factor, cfg.rope_original_max_position)


def layer_attention_setup(cfg: ModelConfig, sliding) -> tuple[jax.Array | None, Any]:
    """(RoPE inverse frequencies, sliding window) of a layer for `rope` and `attention_mask`.

    sliding: a python bool (unrolled layers: a static choice), or a traced bool [] (the
    scanned stack, where one program serves every layer): then the frequencies are selected
    with `jnp.where` and the window is `where(sliding, cfg.sliding_window, huge)`, so a global
    layer's mask is the plain causal one.
    """
    if isinstance(sliding, bool):
        return (layer_rope_frequencies(cfg, sliding),
                cfg.sliding_window if sliding else None)
    def freqs(flag):
        inv = layer_rope_frequencies(cfg, flag)
        return rope_frequencies(cfg.head_dim, cfg.rope_theta) if inv is None else inv
    inv_freq = jnp.where(sliding, freqs(True), freqs(False))
    window = jnp.where(sliding, jnp.int32(cfg.sliding_window), jnp.int32(2 ** 30))
    return inv_freq, window


def rope(x: jax.Array, positions: jax.Array, theta: float,
         inv_freq: jax.Array | None = None) -> jax.Array:
    """Rotary embedding, rotate-half convention (as Llama/Qwen/Gemma checkpoints use).

    Args:
      x: [B, T, H, D] queries or keys (D even).
      positions: int32 [B, T].
      theta: RoPE base (ignored when inv_freq is given).
      inv_freq: optional float32 [D // 2] frequencies (`rope_frequencies`, for scaled RoPE).
    Returns: [B, T, H, D], same dtype as x (computed in float32).
    """
    half = x.shape[-1] // 2
    if inv_freq is None:
        freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1]))
    else:
        freqs = inv_freq.astype(jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, T, half]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the last axis, computed in float32. x: [..., D] -> [..., D].

    plus_one: multiply by (1 + scale) with scale initialised to 0 (Gemma's convention).
    """
    eps: float
    param_dtype: Any = jnp.float32
    logical: tuple = ("embed",)
    plus_one: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = self.param("scale", nn.with_logical_partitioning(init, self.logical),
                           (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale32 = scale.astype(jnp.float32)
        return (y * (1.0 + scale32 if self.plus_one else scale32)).astype(x.dtype)


def _norm(cfg: ModelConfig, name: str, logical: tuple = ("embed",)) -> RMSNorm:
    return RMSNorm(cfg.norm_eps, jnp.dtype(cfg.param_dtype), logical, cfg.norm_plus_one,
                   name=name)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and an optional KV cache.

    sliding: this layer attends within `cfg.sliding_window` slots (and uses the local RoPE).
    `__call__`'s `layer_sliding`, when given, overrides it with a traced bool [] (the scanned
    stack's per-layer flag; see `layer_attention_setup`). The attention itself, and which
    implementation computes it, is `attention.attend`'s (segment_ids: int32 [B, T] or None).
    """
    cfg: ModelConfig
    sliding: bool = False

    @nn.compact
    def __call__(self, x, positions, key_valid, cache, cache_index, layer_sliding=None,
                 first_slot: int | None = None, segment_ids=None, prompt_segment_ids=None):
        cfg = self.cfg
        sliding = self.sliding if layer_sliding is None else layer_sliding
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        batch, length = x.shape[:2]
        groups = cfg.n_heads // cfg.n_kv_heads

        def proj(name, heads, head_logical):
            if cfg.lora is not None:
                return projection(cfg, f"attn.{name}", (heads, cfg.head_dim), 1,
                                  ("embed", head_logical, "head_dim"), cfg.qkv_bias,
                                  (head_logical, "head_dim"))(x)
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
            q = _norm(cfg, "q_norm", ("head_dim",))(q)
            k = _norm(cfg, "k_norm", ("head_dim",))(k)
        inv_freq, window = layer_attention_setup(cfg, sliding)
        q = rope(q, positions, cfg.rope_theta, inv_freq)
        k = rope(k, positions, cfg.rope_theta, inv_freq)

        new_cache = None
        if cache is not None:
            start = (0, 0, cache_index, 0)
            head_major = lambda x, c: jnp.swapaxes(x, 1, 2).astype(c.dtype)  # noqa: E731
            k = jax.lax.dynamic_update_slice(cache["k"], head_major(k, cache["k"]), start)
            v = jax.lax.dynamic_update_slice(cache["v"], head_major(v, cache["v"]), start)
            new_cache = {"k": k, "v": v}
        q = q.reshape(batch, length, cfg.n_kv_heads, groups, cfg.head_dim)
        out = attention.attend(cfg, q, k.astype(dtype), v.astype(dtype), key_valid,
                               cache_index, window, head_major=cache is not None,
                               first_slot=first_slot, segment_ids=segment_ids,
                               prompt_segment_ids=prompt_segment_ids)
        out = out.reshape(batch, length, cfg.n_heads, cfg.head_dim)
        if cfg.lora is not None:
            out = projection(cfg, "attn.o_proj", (cfg.d_model,), 2,
                             ("heads", "head_dim", "embed"), False)(out)
        else:
            out = nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=dtype,
                                  param_dtype=pdtype, name="o_proj",
                                  kernel_init=_init(cfg, ("heads", "head_dim", "embed")))(out)
        return out, new_cache


def cpu_dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                          preferred_element_type=None):
    """`lax.dot_general` for a Dense layer ([..., K] x [K, N]) through
    `narrow_transpose_matmul` (the weight gradient transposes the narrower operand); other
    contractions go to lax. For flax's `nn.Dense(dot_general=...)` on CPU."""
    (lhs_c, rhs_c), batch = dimension_numbers
    if (batch != ((), ()) or tuple(lhs_c) != (lhs.ndim - 1,) or tuple(rhs_c) != (0,)
            or rhs.ndim != 2 or precision is not None or preferred_element_type is not None):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type)
    return narrow_transpose_matmul(lhs, rhs)


def projection(cfg: ModelConfig, qualified: str, features: tuple, contract: int,
               kernel_logical: tuple, use_bias: bool, bias_logical: tuple = ()) -> Projection:
    """The `lora.Projection` named after `qualified` ("attn.q_proj", ...) for a model with
    `cfg.lora`: adapted when a LoRA target matches it, its kernel quantized per
    `cfg.lora.base_quant`. Same params layout and values as the flax Dense it replaces."""
    dtype = jnp.dtype(cfg.dtype)
    dot = (cpu_dense_dot_general if _narrow_matmuls(dtype) and len(features) == 1
           and contract == 1 else None)
    return Projection(features=tuple(features), contract=contract, use_bias=use_bias,
                      dtype=dtype, param_dtype=jnp.dtype(cfg.param_dtype),
                      kernel_init=nn.initializers.normal(cfg.init_std),
                      kernel_logical=tuple(kernel_logical), bias_logical=tuple(bias_logical),
                      lora=cfg.lora, adapted=cfg.lora.targeted(qualified), dot_general=dot,
                      name=qualified.split(".")[1])


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)). SwiGLU with silu, GeGLU with gelu_tanh."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        dot = cpu_dense_dot_general if _narrow_matmuls(dtype) else None
        if cfg.lora is not None:
            dense = lambda feats, logical, name: projection(  # noqa: E731
                cfg, f"mlp.{name}", (feats,), 1, logical, False)
        else:
            dense = lambda feats, logical, name: nn.Dense(  # noqa: E731
                feats, use_bias=False, dtype=dtype, param_dtype=pdtype, name=name,
                kernel_init=_init(cfg, logical), dot_general=dot)
        hidden = ("batch", "length", "mlp")
        gate = constrain(dense(cfg.mlp_hidden, ("embed", "mlp"), "gate_proj")(x), hidden)
        up = constrain(dense(cfg.mlp_hidden, ("embed", "mlp"), "up_proj")(x), hidden)
        act = jax.nn.silu if cfg.activation == "silu" else (
            lambda z: jax.nn.gelu(z, approximate=True))
        return dense(cfg.d_model, ("mlp", "embed"), "down_proj")(act(gate) * up)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)); x + mlp(norm(x)).

    With `cfg.post_norms` (Gemma 2/3): x + post_norm(attn(norm(x))); same for the MLP.
    The call has `nn.scan`'s shape, (carry, per-layer inputs, broadcast inputs...) ->
    (carry, per-layer outputs): x is the carry and `layer_in` = (cache or None, sliding or
    None) the per-layer part (None: `self.sliding`), so one module serves both the unrolled
    and the scanned stack.
    """
    cfg: ModelConfig
    sliding: bool = False

    @nn.compact
    def __call__(self, x, layer_in, positions, key_valid, cache_index, first_slot=None,
                 segment_ids=None, prompt_segment_ids=None):
        cfg = self.cfg
        cache, layer_sliding = layer_in
        h, new_cache = Attention(cfg, self.sliding, name="attn")(
            _norm(cfg, "attn_norm")(x), positions, key_valid, cache, cache_index,
            layer_sliding, first_slot, segment_ids, prompt_segment_ids)
        if cfg.post_norms:
            h = _norm(cfg, "post_attn_norm")(h)
        x = constrain(x + h, ACTIVATION_LOGICAL)
        h = MLP(cfg, name="mlp")(_norm(cfg, "mlp_norm")(x))
        if cfg.post_norms:
            h = _norm(cfg, "post_mlp_norm")(h)
        return constrain(x + h, ACTIVATION_LOGICAL), new_cache


# Block per `ModelConfig.remat`. Remat only changes what the backward pass keeps: the forward
# (training, prefill and decode alike) computes the same values. `cache` is a pytree (None
# without a cache) and `cache_index` is a traced int32 in the sampler's decode loop, so neither
# can be static; `first_slot` (a python int or None, the static copy of cache_index when there
# is one: it lets attention skip the key blocks a causal query block never sees) is, argument
# 6 counting self. In the unrolled stack prevent_cse stays True (the default): the blocks run
# in a python loop, where XLA could otherwise merge the recomputation with the forward. Under a
# scan the loop already keeps them apart, and prevent_cse=False lets XLA optimize the body.
_SAVE_DOTS = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims


def _block_class(remat: str, scanned: bool):
    if remat == "none":
        return Block
    policy = _SAVE_DOTS if remat == "save_dots" else None
    return nn.remat(Block, policy=policy, prevent_cse=not scanned, static_argnums=(6,))


def _scanned_stack(cfg: ModelConfig):
    """The n_layers blocks as ONE `nn.scan` over stacked params [n_layers, ...] (logical axis
    "layers", never sharded): the program holds one block, so XLA compiles it once and, with
    FSDP, gathers one layer's weights at a time, in the forward and again in the backward."""
    return nn.scan(_block_class(cfg.remat, scanned=True),
                   variable_axes={"params": 0},
                   split_rngs={"params": True, DROPOUT_RNG: True},  # a mask per layer
                   in_axes=(0,) + (nn.broadcast,) * 6,
                   length=cfg.n_layers, metadata_params={nn.PARTITION_NAME: "layers"})


class Transformer(nn.Module):
    """The decoder. `__call__` returns (logits f32 [B, T, V] or hidden [B, T, D], new cache)."""
    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        pdtype = jnp.dtype(cfg.param_dtype)
        self.embedding = self.param("embedding", _init(cfg, ("vocab", "embed")),
                                    (cfg.vocab_size, cfg.d_model), pdtype)
        if cfg.scan_layers:
            flags = {cfg.layer_is_sliding(i) for i in range(cfg.n_layers)}
            self.layers = _scanned_stack(cfg)(cfg, flags == {True}, name="layers")
        else:
            block = _block_class(cfg.remat, scanned=False)
            self.layers = [block(cfg, cfg.layer_is_sliding(i), name=f"layer_{i}")
                           for i in range(cfg.n_layers)]
        self.final_norm = RMSNorm(cfg.norm_eps, pdtype, plus_one=cfg.norm_plus_one)
        if not cfg.tie_embeddings:
            self.lm_head = self.param("lm_head", _init(cfg, ("embed", "vocab")),
                                      (cfg.d_model, cfg.vocab_size), pdtype)

    def __call__(self, tokens, positions, key_valid, cache: Cache | None = None,
                 cache_index=0, return_hidden: bool = False, segment_ids=None,
                 prompt_segment_ids=None):
        """segment_ids: optional int32 [B, T] without a cache (packed rows: attention stays
        inside a segment; see `attention`); prompt_segment_ids: optional int32 [B, T], the
        segment each token also attends to (packs sharing a group's prompt). Under a mesh
        with a `context` axis the sequence of a call without a cache is split over it (see
        `sharding`); a call with a cache keeps its sequence whole."""
        if cache is not None:  # prefill/decode: no context parallelism (sampling unchanged)
            with unsharded_length():
                return self._forward(tokens, positions, key_valid, cache, cache_index,
                                     return_hidden, segment_ids, prompt_segment_ids)
        return self._forward(tokens, positions, key_valid, cache, cache_index, return_hidden,
                             segment_ids, prompt_segment_ids)

    def _forward(self, tokens, positions, key_valid, cache, cache_index, return_hidden,
                 segment_ids, prompt_segment_ids):
        """`__call__`'s body (its arguments, in its order)."""
        cfg = self.cfg
        x = jnp.take(self.embedding, tokens, axis=0).astype(jnp.dtype(cfg.dtype))
        if cfg.embed_scale:
            x = x * jnp.asarray(cfg.d_model ** 0.5, x.dtype)
        x = constrain(x, ACTIVATION_LOGICAL)
        first_slot = cache_index if isinstance(cache_index, int) else None
        if cfg.scan_layers:
            x, new_cache = self.layers(x, (cache, self._layer_sliding_flags()), positions,
                                       key_valid, cache_index, first_slot, segment_ids,
                                       prompt_segment_ids)
        else:
            new_cache = []
            for i, layer in enumerate(self.layers):
                x, layer_cache = layer(x, (None if cache is None else cache[i], None),
                                       positions, key_valid, cache_index, first_slot,
                                       segment_ids, prompt_segment_ids)
                new_cache.append(layer_cache)
            new_cache = None if cache is None else tuple(new_cache)
        x = self.final_norm(x)
        out = x if return_hidden else self.logits(x)
        return out, new_cache

    def _layer_sliding_flags(self) -> jax.Array | None:
        """bool [n_layers] for the scanned stack when its layers differ (Gemma 2/3), else
        None (every block then uses its static `sliding`, the same for all)."""
        flags = [self.cfg.layer_is_sliding(i) for i in range(self.cfg.n_layers)]
        if len(set(flags)) == 1:
            return None
        return jnp.asarray(flags)

    def unembedding(self) -> jax.Array:
        """The unembedding matrix [D, V] (transposed embedding when tied)."""
        return self.embedding.T if self.cfg.tie_embeddings else self.lm_head

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> float32 logits [..., V] (with Gemma-2 soft-capping if set)."""
        w = self.unembedding().astype(hidden.dtype)
        if _narrow_matmuls(hidden.dtype):
            logits = narrow_transpose_matmul(hidden, w)
        else:
            logits = einsum_f32("...d,dv->...v", hidden, w)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)
