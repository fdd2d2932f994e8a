"""Softmax attention of the decoder, and which implementation computes it.

`attend` is the one entry the `Attention` layer calls, after its projections and RoPE.
`ModelConfig.attention_impl` chooses the implementation:

  "reference"  jnp: scores and softmax in float32, in causal query blocks on CPU float32,
               one query chunk at a time with `attention_chunk`. Every case, every platform.
  "splash"     the splash attention kernel that JAX ships
               (`jax.experimental.pallas.ops.tpu.splash_attention`): Mosaic on TPU, the Pallas
               interpreter elsewhere (tests only). Causal, the sliding window of Gemma 2/3
               (`LocalMask`), the logit softcap, segment ids.
  "cudnn"      `jax.nn.dot_product_attention(implementation="cudnn")` on GPU: bf16/fp16,
               head_dim a multiple of 8 and at most 128 (256 from compute capability 9.0).
  "auto"       splash on TPU, cuDNN on GPU, the reference elsewhere.

A decode step (one query against the KV cache) always runs the reference. Where the chosen
kernel does not apply otherwise (a traced cache index, a softcap under cuDNN, ...), the
reference runs and one line per (implementation, reason) goes to this
module's logger: WARNING when the kernel was asked for by name, INFO under "auto".
`fallback_reason` gives that reason without running anything.

Masking, for every implementation: query t (cache slot cache_index + t) attends to key slot s
iff s <= cache_index + t, key_valid[b, s], in a sliding-window layer
cache_index + t - s < window, and, with segment ids, segment_ids[b, t] == segment_ids[b, s].
Segment ids (int32 [B, T], no cache) are >= 1 for real tokens, 0 for padding; tokens of one
segment form one sequence (padding-free packing). With `prompt_segment_ids` too (int32
[B, T], the packs of `rl.packing` that share a group's prompt among its completions), query
t also attends to the keys of segment prompt_segment_ids[b, t]: segment_ids[b, s] is
segment_ids[b, t] or prompt_segment_ids[b, t]. Only the reference computes that mask (the
kernels know segment equality only: they fall back, logged once), and not in a
sliding-window layer (the window counts slots). Outputs at padding positions (key_valid
False or segment 0) are unspecified: callers mask them.

Context parallelism: under an `activation_sharding` context whose rules split the
activations' `length` over mesh axes (the `context` axis, `runtime.sharding`), a call
without a cache whose length divides by those axes runs
`context_parallel.context_parallel_attention`: each shard's queries over the whole
sequence's keys and values, gathered along them.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import platform
from jaxrl_reason.models.config import ATTENTION_IMPLS
from jaxrl_reason.models.matmul import cpu_float32, einsum_f32, narrow_transpose_matmul
from jaxrl_reason.runtime.sharding import activation_context, logical_to_spec

_MASK_VALUE = -1e30
_SPLASH_BLOCK = 512       # query and key tile of the splash kernels (a multiple of 128)
_LANES = 128              # splash tiles are multiples of this; sequences are padded to them
logger = logging.getLogger(__name__)
_NOTED: set[tuple[str, str]] = set()


def attention_mask(key_valid: jax.Array, num_queries: int, cache_index,
                   window: int | None = None, segment_ids: jax.Array | None = None,
                   prompt_segment_ids: jax.Array | None = None,
                   kv_segment_ids: jax.Array | None = None) -> jax.Array:
    """Causal + validity (+ sliding-window) (+ same-segment) mask.

    Args:
      key_valid: bool [B, S].
      num_queries: T.
      cache_index: int32 scalar, slot of the first query.
      window: if set, a query sees only the keys of the last `window` slots, itself
        included (query_slot - key_slot < window).
      segment_ids: optional int32 [B, T] with S == T (no cache): a query sees only the keys
        of its own segment.
      prompt_segment_ids: optional int32 [B, T], with segment_ids: a query also sees the
        keys of segment prompt_segment_ids[b, t] (its group's shared prompt).
      kv_segment_ids: optional int32 [B, S], the keys' segments when they are not the
        queries' (a context shard's queries over the whole sequence's keys); default
        segment_ids.
    Returns: bool [B, T, S].
    """
    query_slot = cache_index + jnp.arange(num_queries)[:, None]
    key_slot = jnp.arange(key_valid.shape[1])[None, :]
    allowed = key_slot <= query_slot
    if window is not None:
        allowed = allowed & (query_slot - key_slot < window)
    mask = allowed[None] & key_valid[:, None, :]
    if segment_ids is not None:
        keys = segment_ids if kv_segment_ids is None else kv_segment_ids
        same = segment_ids[:, :, None] == keys[:, None, :]
        if prompt_segment_ids is not None:
            same = same | (prompt_segment_ids[:, :, None] == keys[:, None, :])
        mask = mask & same
    return mask


def scale_dim_of(cfg) -> float:
    """The d of the 1 / sqrt(d) score scale: head_dim, or Gemma's query_pre_attn_scalar."""
    return cfg.head_dim if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar


# ----------------------------------------------------------------------------- reference


def _attend(cfg, q, k, v, mask):
    """Softmax attention of q [B, T, K, G, hd] over k, v [B, S, K, hd] with mask bool
    [B, T, S] (True = may attend); scores and softmax in float32. Returns [B, T, K, G, hd]
    in q's dtype."""
    narrow = cpu_float32(q.dtype)
    if narrow:  # [B, K, G*T, hd] x [B, K, hd, S]: see narrow_transpose_matmul
        batch, length, kv_heads, groups, head_dim = q.shape
        heads_q = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(batch, kv_heads, -1, head_dim)
        scores = narrow_transpose_matmul(heads_q, jnp.transpose(k, (0, 2, 3, 1)))
        scores = scores.reshape(batch, kv_heads, groups, length, -1)
    else:
        scores = einsum_f32("btkgd,bskd->bkgts", q, k)
    scores = scores * (scale_dim_of(cfg) ** -0.5)
    if cfg.attn_logit_softcap is not None:
        cap = cfg.attn_logit_softcap
        scores = cap * jnp.tanh(scores / cap)
    scores = jnp.where(mask[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    if narrow:
        out = narrow_transpose_matmul(probs.reshape(batch, kv_heads, groups * length, -1),
                                      jnp.swapaxes(v, 1, 2))          # [B, K, G*T, hd]
        return jnp.transpose(out.reshape(batch, kv_heads, groups, length, head_dim),
                             (0, 3, 1, 2, 4))
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def _attend_one_query(cfg, q, k, v, mask):
    """`_attend` for T = 1 (a decode step) over the head-major cache: q [B, 1, K, G, hd],
    k, v [B, K, S, hd], mask bool [B, 1, S]. Returns [B, 1, K, G, hd] in q's dtype.

    Float32 multiply-and-reduce rather than dot_general (same math; only the summation order
    differs): on XLA:CPU the dot_general form copies the cache into another layout at every
    step, while this form streams each head's contiguous [S, hd] block once for the scores
    and once for the values (2.2x faster than over a [B, S, K, hd] cache at bench-tiny's
    decode shapes).
    """
    f32 = jnp.float32
    q32 = q[:, 0].astype(f32)                                               # [B, K, G, hd]
    scores = jnp.sum(q32[:, :, :, None] * k.astype(f32)[:, :, None], axis=-1)  # [B, K, G, S]
    scores = scores * (scale_dim_of(cfg) ** -0.5)
    if cfg.attn_logit_softcap is not None:
        cap = cfg.attn_logit_softcap
        scores = cap * jnp.tanh(scores / cap)
    scores = jnp.where(mask[:, None], scores, _MASK_VALUE)  # mask [B, 1, 1, S]
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype).astype(f32)
    out = jnp.sum(probs[..., None] * v.astype(f32)[:, :, None], axis=3)     # [B, K, G, hd]
    return out[:, None].astype(q.dtype)


def causal_query_blocks(num_queries: int, num_keys: int, first_slot: int, block: int,
                        window: int | None = None) -> list[tuple[int, int, int, int]]:
    """Static (query start, query end, key start, key end) of each block of `block` queries:
    query t sits at slot first_slot + t, so a block's last query sees no key past
    first_slot + end - 1 and (with a sliding `window`) its first none before
    first_slot + start - window + 1. The key ranges hold every key a block may attend to."""
    spans = []
    for start in range(0, num_queries, block):
        end = min(num_queries, start + block)
        key_end = min(num_keys, first_slot + end)
        key_start = 0 if window is None else max(0, first_slot + start - window + 1)
        spans.append((start, end, min(key_start, key_end), key_end))
    return spans


def _causal_block_attention(cfg, q, k, v, mask, spans):
    """`_attend` of each query block over only its key range (`causal_query_blocks`): the
    keys after a block's last query (and before a sliding window) are masked for all of its
    queries, so their scores are not computed. Same values wherever a query sees at least
    one key (a query that sees none, e.g. a left-padding slot, averages the values of its
    block's range instead of all of them; its output is masked downstream either way).
    """
    outs = [_attend(cfg, q[:, a:b], k[:, lo:hi], v[:, lo:hi], mask[:, a:b, lo:hi])
            for a, b, lo, hi in spans]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def _causal_block(length: int, dtype) -> int | None:
    """Query block of `_causal_block_attention` for `length` queries, or None to attend in
    one piece. On CPU (measured: bench-tiny's [64, 8, 127, 159] training attention, forward
    and backward, 144 -> 96 ms in 4 blocks) about `_CAUSAL_BLOCK` queries per block, at most
    8 blocks (the program holds one attention per block). Elsewhere None: XLA's TPU/GPU
    matmuls want larger tiles, and nothing was measured there."""
    blocks = min(8, round(length / _CAUSAL_BLOCK))
    if not cpu_float32(dtype) or blocks < 2:
        return None
    return -(-length // blocks)


_CAUSAL_BLOCK = 32


def _chunked_attention(cfg, q, k, v, mask, chunk: int):
    """`_attend` over query chunks of `chunk` positions, one at a time (`lax.map`), each
    rematerialized in the backward pass: the [B, K, G, T, S] score tensors become
    [B, K, G, chunk, S] (memory-efficient attention, Rabe & Staats 2021). Same values.
    T need not be a multiple of `chunk` (the queries are padded, the padding dropped)."""
    batch, length = q.shape[:2]
    n = -(-length // chunk)
    pad = n * chunk - length
    if pad:
        q = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
        mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)), constant_values=True)
    qs = jnp.moveaxis(q.reshape(batch, n, chunk, *q.shape[2:]), 1, 0)
    ms = jnp.moveaxis(mask.reshape(batch, n, chunk, mask.shape[-1]), 1, 0)
    step = jax.checkpoint(lambda qm: _attend(cfg, qm[0], k, v, qm[1]))
    out = jax.lax.map(step, (qs, ms))                       # [n, B, chunk, K, G, hd]
    out = jnp.moveaxis(out, 0, 1).reshape(batch, n * chunk, *q.shape[2:])
    return out[:, :length]


def reference_attention(cfg, q, k, v, mask, first_slot: int | None, window) -> jax.Array:
    """The jnp attention of q [B, T, K, G, hd] over k, v [B, S, K, hd] under mask bool
    [B, T, S]: in query chunks with `cfg.attention_chunk`, in causal query blocks on CPU
    float32 when the first slot is static, else in one piece. Returns [B, T, K, G, hd]."""
    length = q.shape[1]
    chunk = cfg.attention_chunk
    block = None if first_slot is None else _causal_block(length, q.dtype)
    if chunk and length > chunk:
        return _chunked_attention(cfg, q, k, v, mask, chunk)
    if block is not None:
        # a traced window (the scanned stack's per-layer flag) trims nothing
        spans = causal_query_blocks(length, k.shape[1], first_slot, block,
                                    window if isinstance(window, int) else None)
        return _causal_block_attention(cfg, q, k, v, mask, spans)
    return _attend(cfg, q, k, v, mask)


# ----------------------------------------------------------------------------- dispatch


def resolve_impl(impl: str) -> str:
    """"reference" | "splash" | "cudnn" for `ModelConfig.attention_impl` ("auto": splash on
    TPU, cudnn on GPU, reference elsewhere, by `kernels.platform.current()`)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    return {"tpu": "splash", "gpu": "cudnn"}.get(platform.current(), "reference")


def _cudnn_max_head_dim() -> int:
    """256 on GPUs of compute capability >= 9.0 (Hopper), else 128 (what cuDNN's flash
    attention accepts; unknown devices, e.g. an ahead-of-time target, get 128)."""
    try:
        capability = getattr(jax.devices()[0], "compute_capability", None)
        return 256 if capability is not None and float(capability) >= 9.0 else 128
    except (RuntimeError, ValueError, TypeError):
        return 128


def fallback_reason(impl: str, cfg, *, dtype, first_slot: int | None,
                    window) -> str | None:
    """Why the kernel `impl` ("splash" or "cudnn") cannot compute this attention over
    several queries (the reference then does), or None when it can. dtype: the compute
    dtype; first_slot: the static slot of the first query, or None when the cache index is
    traced; window: None, a python int, or a traced int32 []. (A decode step, one query
    against the cache, always runs the reference `_attend_one_query`: not a fallback.)"""
    if first_slot is None:
        return "the cache index is traced (multi-token steps of the decode loop)"
    if impl == "splash":
        return None
    if platform.current() != "gpu":
        return f"cuDNN attention runs only on GPU (platform: {platform.current()})"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN attention needs bfloat16 or float16, got {jnp.dtype(dtype).name}"
    limit = _cudnn_max_head_dim()
    if cfg.head_dim % 8 or cfg.head_dim > limit:
        return (f"cuDNN attention needs head_dim a multiple of 8 and <= {limit}, got "
                f"{cfg.head_dim}")
    if cfg.attn_logit_softcap is not None:
        return "cuDNN attention has no attention-logit softcap"
    if window is not None and not isinstance(window, int):
        return "the sliding window is traced (scanned stack with local and global layers)"
    if first_slot != 0:
        return "queries start past cache slot 0 (cuDNN's causal mask has no offset)"
    return None


def _note_fallback(impl: str, reason: str, requested: str) -> None:
    """One log line per (impl, reason) per process."""
    if (impl, reason) in _NOTED:
        return
    _NOTED.add((impl, reason))
    level = logging.INFO if requested == "auto" else logging.WARNING
    logger.log(level, "attention_impl=%r: %s attention does not apply (%s); running the "
               "jnp reference attention", requested, impl, reason)


def attend(cfg, q, k, v, key_valid, cache_index, window, *, head_major: bool,
           first_slot: int | None, segment_ids: jax.Array | None = None,
           prompt_segment_ids: jax.Array | None = None) -> jax.Array:
    """Attention of the queries over the keys/values, by `cfg.attention_impl`.

    Args:
      cfg: the ModelConfig (head_dim, softcap, query_pre_attn_scalar, attention_chunk,
        attention_impl, sliding_window).
      q: [B, T, K, G, hd] queries after RoPE (K kv heads, G queries per kv head).
      k, v: [B, S, K, hd], or the head-major cache [B, K, S, hd] when `head_major`.
      key_valid: bool [B, S].
      cache_index: int32 [] (or a python int), the slot of the first query.
      window: None, a python int (a sliding-window layer) or a traced int32 [] (the scanned
        stack's per-layer window, `transformer.layer_attention_setup`).
      first_slot: cache_index as a python int when it is static, else None.
      segment_ids: optional int32 [B, T] (no cache; see the module docstring).
      prompt_segment_ids: optional int32 [B, T] with segment_ids: the shared-prompt
        segment each query also attends to (module docstring); reference attention only.
    Returns: [B, T, K, G, hd] in q's dtype.
    """
    length = q.shape[1]
    if prompt_segment_ids is not None and (segment_ids is None or window is not None):
        raise ValueError("prompt_segment_ids need segment_ids and a layer without a sliding "
                         "window (the window counts slots, not positions)")
    if segment_ids is not None and k.shape[2 if head_major else 1] != length:
        raise ValueError(f"segment_ids need keys = queries (no KV cache): got {length} "
                         f"queries over {k.shape[2 if head_major else 1]} key slots")
    decode = head_major and length == 1
    impl = resolve_impl(cfg.attention_impl)
    from jaxrl_reason.models import context_parallel  # it builds on this module

    shards = None if head_major else context_parallel.context_shards(length)
    if shards is not None:
        return context_parallel.context_parallel_attention(
            cfg, impl, q, k, v, key_valid, window, segment_ids, prompt_segment_ids, *shards)
    if impl != "reference" and not decode:
        reason = ("the shared-prompt mask (prompt_segment_ids) is not segment equality"
                  if prompt_segment_ids is not None else
                  fallback_reason(impl, cfg, dtype=q.dtype, first_slot=first_slot,
                                  window=window))
        if reason is None:
            if head_major:
                k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
            q_ids, kv_ids = _kernel_segments(key_valid, first_slot, length, segment_ids)
            kernel = splash_attention if impl == "splash" else cudnn_attention
            return kernel(cfg, q, k, v, q_ids, kv_ids, first_slot, window)
        _note_fallback(impl, reason, cfg.attention_impl)
    mask = attention_mask(key_valid, length, cache_index, window, segment_ids,
                          prompt_segment_ids)                                # [B, T, S]
    if decode:  # reads the head-major cache in place
        return _attend_one_query(cfg, q, k, v, mask)
    if head_major:  # prefill / a tool result: the cache back to [B, S, K, hd]
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    return reference_attention(cfg, q, k, v, mask, first_slot, window)


def _kernel_segments(key_valid, first_slot: int, length: int, segment_ids):
    """(q ids int32 [B, T], kv ids int32 [B, first_slot + T]) for the kernels, which know
    only "same id attends": a real token keeps its segment (1 without segment ids), padding
    (key_valid False or segment 0) gets 0. Padding then attends to padding only, so no row
    of the mask is empty (its own slot is allowed), and real tokens never see it."""
    num_keys = first_slot + length
    valid = key_valid[:, :num_keys]
    kv_ids = valid.astype(jnp.int32)
    if segment_ids is not None:
        kv_ids = jnp.where(valid, segment_ids.astype(jnp.int32), 0)
    return kv_ids[:, first_slot:], kv_ids


# ----------------------------------------------------------------------------- kernels


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pad_length(x: jax.Array, n: int) -> jax.Array:
    """x [B, L, ...] zero-padded to [B, n, ...] (n >= L) along its second axis."""
    return jnp.pad(x, [(0, 0), (0, n - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def splash_attention(cfg, q, k, v, q_ids, kv_ids, first_slot: int, window) -> jax.Array:
    """Splash attention (`make_splash_mha`, one kernel per example under `vmap`) of
    q [B, T, K, G, hd] over the first first_slot + T keys of k, v [B, S, K, hd], with
    segment ids q_ids int32 [B, T] and kv_ids int32 [B, first_slot + T] (`_kernel_segments`).
    Causal (`CausalMask` at offset first_slot) or, in a sliding-window layer, `LocalMask`
    with window (window - 1, 0); a traced window selects between the two kernels with
    `lax.cond`. The queries are pre-scaled by 1/sqrt(scale_dim) (the kernel does not scale)
    and the softcap is the kernel's `attn_logits_soft_cap`. Sequences are padded to tiles of
    up to `_SPLASH_BLOCK` (segment 0, dropped after). Under an `activation_sharding` context
    with a multi-device mesh the kernel runs per device under `shard_map` (rows over the
    batch axes, kv heads over theirs): Mosaic kernels are not partitioned automatically.
    Mosaic on TPU, the Pallas interpreter elsewhere. Returns [B, T, K, G, hd] in q's dtype.
    """
    length, num_keys = q.shape[1], first_slot + q.shape[1]
    q = (q * jnp.asarray(scale_dim_of(cfg) ** -0.5, q.dtype)).astype(q.dtype)
    k, v = k[:, :num_keys], v[:, :num_keys]
    block_q = min(_SPLASH_BLOCK, _round_up(length, _LANES))
    padded_q = _round_up(length, block_q)
    block_kv = min(_SPLASH_BLOCK, _round_up(first_slot + padded_q, _LANES))
    padded_kv = _round_up(first_slot + padded_q, block_kv)
    q, q_ids = _pad_length(q, padded_q), _pad_length(q_ids, padded_q)
    k, v = _pad_length(k, padded_kv), _pad_length(v, padded_kv)
    kv_ids = _pad_length(kv_ids, padded_kv)
    local = functools.partial(_splash_local, cfg, (block_q, block_kv), first_slot)
    ctx = activation_context()
    mesh = None if ctx is None else ctx[0]
    if mesh is None or mesh.size == 1:
        out = local(q, k, v, q_ids, kv_ids, window)
    else:
        rules = ctx[1]
        spec = lambda logical, x: logical_to_spec(logical, rules, x.shape, mesh)  # noqa: E731
        q_spec = spec(("batch", None, "kv_heads", None, None), q)
        kv_spec = spec(("batch", None, "kv_heads", None), k)
        rows = spec(("batch", None), q_ids)
        traced = window is not None and not isinstance(window, int)
        call = local if traced else (lambda *a: local(*a, window))
        args = (q, k, v, q_ids, kv_ids) + ((window,) if traced else ())
        specs = (q_spec, kv_spec, kv_spec, rows, rows) + ((jax.sharding.PartitionSpec(),)
                                                          if traced else ())
        out = jax.shard_map(call, mesh=mesh, in_specs=specs, out_specs=q_spec,
                            check_vma=False)(*args)
    return out[:, :length]


def _splash_kernel(cfg, heads: int, shape: tuple[int, int], blocks: tuple[int, int],
                   first_slot: int, win: int | None, q_seq_shards: int = 1):
    """The splash kernel (`make_splash_mha`) of `heads` heads over a [queries, keys] `shape`
    mask: causal at offset first_slot, or `LocalMask` with window (win - 1, 0); tiles
    `blocks` (q, kv); the mask's query axis split into `q_seq_shards` shards (context
    parallelism: each shard's kernel then holds its own rows of the mask)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    block_q, block_kv = blocks
    sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                              block_q_dkv=block_q, block_kv_dkv=block_kv,
                              block_kv_dkv_compute=block_kv, block_q_dq=block_q,
                              block_kv_dq=block_kv)
    one = (splash.CausalMask(shape, offset=first_slot) if win is None else
           splash.LocalMask(shape, window_size=(win - 1, 0), offset=first_slot))
    return splash.make_splash_mha(splash.MultiHeadMask([one] * heads), block_sizes=sizes,
                                  head_shards=1, q_seq_shards=q_seq_shards,
                                  attn_logits_soft_cap=cfg.attn_logit_softcap,
                                  interpret=platform.current() != "tpu")


def _splash_apply(fn, q, k, v, q_ids, kv_ids):
    """The splash kernel `fn` on q [B, Tq, K, G, hd] over k, v [B, S, K, hd] with segment
    ids q_ids int32 [B, Tq], kv_ids int32 [B, S], one kernel call per example (`vmap`).
    Returns [B, Tq, K, G, hd] in q's dtype."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, length, kv_heads, groups, head_dim = q.shape
    heads_q = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(batch, kv_heads * groups, length,
                                                        head_dim)   # head k*G+g uses kv head k
    heads_k, heads_v = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
    ids = splash.SegmentIds(q=q_ids, kv=kv_ids)
    out = jax.vmap(fn, in_axes=(0, 0, 0, splash.SegmentIds(0, 0)))(
        heads_q, heads_k, heads_v, ids)                              # [B, H, Tq, hd]
    out = out.reshape(batch, kv_heads, groups, length, head_dim)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).astype(q.dtype)


def _splash_local(cfg, blocks, first_slot, q, k, v, q_ids, kv_ids, window):
    """`splash_attention` on one device's (or the whole) arrays, already padded and scaled:
    q [B, Tp, K, G, hd], k, v [B, Sp, K, hd], q_ids [B, Tp], kv_ids [B, Sp]."""
    heads, shape = q.shape[2] * q.shape[3], (q.shape[1], k.shape[1])

    def kernel(win: int | None):
        fn = _splash_kernel(cfg, heads, shape, blocks, first_slot, win)
        return _splash_apply(fn, q, k, v, q_ids, kv_ids)

    if window is None or isinstance(window, int):
        return kernel(window)
    # the scanned stack's per-layer window: local or global, picked at run time
    return jax.lax.cond(window == cfg.sliding_window,
                        lambda: kernel(cfg.sliding_window), lambda: kernel(None))


def cudnn_attention(cfg, q, k, v, q_ids, kv_ids, first_slot: int, window) -> jax.Array:
    """`jax.nn.dot_product_attention(implementation="cudnn")` of q [B, T, K, G, hd] over the
    first T keys of k, v [B, S, K, hd] (first_slot is 0, see `fallback_reason`): causal
    (`is_causal`), the sliding window as `local_window_size=(window - 1, 0)`, and the
    segments (`_kernel_segments`) as a boolean mask [B, 1, T, T] (cuDNN adds it as a bias).
    Returns [B, T, K, G, hd] in q's dtype."""
    del first_slot
    batch, length, kv_heads, groups, head_dim = q.shape
    k, v = k[:, :length], v[:, :length]
    mask = (q_ids[:, :, None] == kv_ids[:, None, :])[:, None]
    out = jax.nn.dot_product_attention(
        q.reshape(batch, length, kv_heads * groups, head_dim), k, v, mask=mask,
        scale=scale_dim_of(cfg) ** -0.5, is_causal=True,
        local_window_size=None if window is None else (window - 1, 0),
        implementation="cudnn")
    return out.reshape(q.shape).astype(q.dtype)
