"""Context parallelism of attention: a sequence split over the `context` mesh axis.

`attention.attend` comes here for a call without a KV cache when the active
`sharding.activation_sharding` context splits the activations' `length` logical axis over
mesh axes of total size C > 1 that divides the sequence (`context_shards`). Each context
shard keeps its T / C queries and attends over the whole sequence's keys and values,
gathered along those axes under `shard_map` (all-gather attention), with the mask of the
unsplit sequence offset by the shard's first query: causality, key validity, segments,
shared-prompt segments, the sliding window and the softcap are those of C = 1. The
gradient of each gather is a reduce-scatter.

Splash takes the offset through its own query sharding (`q_seq_shards`, the kernel's mask
metadata split by `manual_sharding_spec`); shards that are not a multiple of its 128 tile,
the shared-prompt mask and cuDNN run the reference instead, with one logged reason.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_reason.models import attention as attn
from jaxrl_reason.runtime.sharding import activation_context, logical_to_spec, rule_axes


def context_shards(length: int):
    """(mesh, rules, mesh axes of "length") when the active `activation_sharding` context
    splits a sequence of `length` tokens over context shards (a `length` rule onto mesh
    axes of total size > 1 that divides `length`), else None (attention sees the whole
    sequence on every device)."""
    ctx = activation_context()
    if ctx is None:
        return None
    mesh, rules = ctx
    axes = tuple(a for a in rule_axes(rules, "length") if mesh.shape[a] > 1)
    shards = math.prod(mesh.shape[a] for a in axes)
    if shards == 1 or length % shards:
        return None
    return mesh, rules, axes


def context_parallel_attention(cfg, impl, q, k, v, key_valid, window, segment_ids,
                               prompt_segment_ids, mesh, rules, axes) -> jax.Array:
    """All-gather attention under context parallelism: each context shard keeps its block of
    T / C queries and attends over the whole sequence's keys and values, gathered along the
    context mesh `axes` (C shards in all) under `shard_map`. The mask is `attention_mask`'s
    with the shard's query offset (its index times T / C), so causality, key validity,
    segments (and shared-prompt segments), the sliding window and the softcap are those of
    the unsplit sequence. The gradient of the gather is a reduce-scatter of the keys' and
    values' gradients. Splash runs its kernel on the shard's queries (`_splash_context`);
    cuDNN and the reference run the jnp reference.

    q [B, T, K, G, hd], k, v [B, T, K, hd] (no cache: query t is key slot t), key_valid bool
    [B, T], window None / int / traced int32 [], segment_ids / prompt_segment_ids None or
    int32 [B, T]. Returns [B, T, K, G, hd] in q's dtype.
    """
    spec = lambda logical, x: logical_to_spec(logical, rules, x.shape, mesh)  # noqa: E731
    arrays = {"q": q, "k": k, "v": v, "key_valid": key_valid}
    if segment_ids is not None:
        arrays["segment_ids"] = segment_ids
    if prompt_segment_ids is not None:
        arrays["prompt_segment_ids"] = prompt_segment_ids
    specs = {name: spec(("batch", "length", "kv_heads") + (None,) * (x.ndim - 3)
                        if x.ndim > 2 else ("batch", "length"), x)
             for name, x in arrays.items()}
    traced = window is not None and not isinstance(window, int)
    if traced:
        arrays["window"], specs["window"] = window, P()
    reason = None
    if impl == "splash":
        reason = ("the shared-prompt mask (prompt_segment_ids) is not segment equality"
                  if prompt_segment_ids is not None else
                  _splash_context_reason(q.shape[1] // math.prod(mesh.shape[a] for a in axes)))
    elif impl == "cudnn":
        reason = "cuDNN's causal mask has no query offset for a context shard"
    if impl != "reference" and reason is not None:
        attn._note_fallback(impl, f"context parallelism: {reason}", cfg.attention_impl)
    if impl == "splash" and reason is None:
        return _splash_context(cfg, arrays, specs, window, mesh, axes)

    def local(a):
        gather = lambda x: jax.lax.all_gather(x, axes, axis=1, tiled=True)  # noqa: E731
        shard_len = a["q"].shape[1]
        offset = jax.lax.axis_index(axes) * shard_len
        seg = a.get("segment_ids")
        mask = attn.attention_mask(gather(a["key_valid"]), shard_len, offset,
                                   a.get("window", window), seg, a.get("prompt_segment_ids"),
                                   None if seg is None else gather(seg))
        return attn.reference_attention(cfg, a["q"], gather(a["k"]), gather(a["v"]), mask,
                                        None, a.get("window", window))

    return jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=specs["q"])(arrays)


def _splash_tile(length: int) -> int | None:
    """The largest splash tile (512, 256 or 128) that divides `length`, else None."""
    return next((b for b in (attn._SPLASH_BLOCK, 256, attn._LANES) if length % b == 0), None)


def _splash_context_reason(shard_len: int) -> str | None:
    """Why splash cannot run on context shards of `shard_len` queries (None when it can):
    its kernels tile each shard's queries, so a shard must be a multiple of 128."""
    if _splash_tile(shard_len) is None:
        return (f"a context shard's {shard_len} queries are not a multiple of {attn._LANES} "
                "(splash's tile)")
    return None


def _splash_context(cfg, arrays, specs, window, mesh, axes) -> jax.Array:
    """`context_parallel_attention` with splash: the kernel is built for the whole [T, T]
    mask with `q_seq_shards` = C (its mask metadata split by query rows, one slice per
    context shard, `manual_sharding_spec`), and each shard runs it on its T / C queries over
    the keys and values gathered along `axes`. arrays/specs: as there (q, k, v, key_valid,
    segment ids, a traced window). Returns [B, T, K, G, hd] in q's dtype."""
    q, length = arrays["q"], arrays["q"].shape[1]
    shards = math.prod(mesh.shape[a] for a in axes)
    arrays = dict(arrays)
    arrays["q"] = (q * jnp.asarray(attn.scale_dim_of(cfg) ** -0.5, q.dtype)).astype(q.dtype)
    q_ids, _ = attn._kernel_segments(arrays.pop("key_valid"), 0, length,
                                arrays.pop("segment_ids", None))
    arrays["ids"] = q_ids
    specs = dict(specs)
    specs["ids"] = specs.pop("key_valid")
    specs.pop("segment_ids", None)
    blocks = (_splash_tile(length // shards), _splash_tile(length))
    heads = q.shape[2] * q.shape[3]
    wins = ((cfg.sliding_window, None) if "window" in arrays else (window,))
    kernels = [attn._splash_kernel(cfg, heads, (length, length), blocks, 0, w, shards)
               for w in wins]
    row_sharding = jax.sharding.NamedSharding(mesh, P(None, axes))
    kernel_specs = [fn.manual_sharding_spec(row_sharding) for fn in kernels]

    def local(a, fns):
        kv_ids = jax.lax.all_gather(a["ids"], axes, axis=1, tiled=True)
        gather = lambda x: jax.lax.all_gather(x, axes, axis=1, tiled=True)  # noqa: E731
        k, v = gather(a["k"]), gather(a["v"])
        run = lambda fn: attn._splash_apply(fn, a["q"], k, v, a["ids"], kv_ids)  # noqa: E731
        if len(fns) == 1:
            return run(fns[0])
        return jax.lax.cond(a["window"] == cfg.sliding_window,
                            lambda: run(fns[0]), lambda: run(fns[1]))

    return jax.shard_map(local, mesh=mesh, in_specs=(specs, kernel_specs),
                         out_specs=specs["q"], check_vma=False)(arrays, kernels)
