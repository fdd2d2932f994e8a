"""Memory-lean token log-probs and entropies from final hidden states and the unembedding.

The policy-gradient losses need, per position, the log-prob of the chosen token and the
entropy of the (tempered) next-token distribution:

    a = h @ W                     h [B, L, D] final hidden states, W [D, V] unembedding
    z = softcap(a) / T            softcap(a) = c * tanh(a / c) when set (Gemma 2), else a
    lse = logsumexp_v z           logp = z[y] - lse           H = lse - sum_v p_v z_v

The naive computation holds [B, L, V] float32 logits, their softmax and their gradient: at
V = 32k..256k that dominates training memory. Here the logits only ever exist as chunks:

  * forward: an online logsumexp over vocabulary chunks keeps, per row, the running max m,
    s = sum exp(z - m) and t = sum exp(z - m) * z (so that E_p[z] = t / s), plus z[y];
  * backward (custom_vjp, residuals lse and E_p[z] per row): the logits are recomputed chunk
    by chunk and, with p = exp(z - lse), cotangents g_logp and g_ent of logp and H,

        dlogp/dz = onehot(y) - p
        dH/dz    = -p * (z - E_p[z])          (dlse/dz = p; d(sum p z)/dz = p + p (z - E_p[z]))
        dz       = g_logp * (onehot(y) - p) - g_ent * p * (z - E_p[z])
        da       = dz / T * (1 - tanh(a / c)^2)      (the last factor only with a softcap)
        dh = da @ W^T,   dW = h^T @ da.

Two implementations share that math (sums and accumulators in float32 whatever the input
dtype; matmul operands in h's dtype, as `Transformer.logits` casts W to it):

  * `chunked_logprobs`: jnp + `lax.fori_loop` over sequence chunks (all B rows at once)
    and, inside, vocabulary chunks; any backend. Peak logits memory O(B * seq_chunk *
    vocab_chunk); dW is summed in an f32 [D, V] buffer (the output itself for f32 weights).
    Chunks never pad or copy h or W: the last chunk is clamped to end at the array's edge
    and its overlap with the previous one is masked. (XLA:TPU hoists the bf16 cast of an
    f32 W out of the loop: one bf16 copy of W, D * V * 2 bytes, on that backend.)
  * `pallas_logprobs`: Pallas kernels over rows = B * L flattened. Forward grid (row blocks,
    vocab blocks) with the online state in VMEM scratch; backward as two kernels, as in
    flash attention: dh on grid (row blocks, vocab blocks) and dW on grid (vocab blocks,
    row blocks), each reducing over its last grid axis into an f32 VMEM accumulator. W
    blocks are cast in the kernel (no copy of W); edge blocks are masked in the kernel
    (rows >= B * L and columns >= V read as zero).

`logprobs_reference` is the naive full-logits computation, the same one as
`jaxrl_reason.models.scoring.completion_logprobs`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxrl_reason.kernels import platform as _platform

IMPLS = ("full", "chunked", "pallas")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Pallas block sizes (TPU tiling: rows a multiple of 8, vocabulary a multiple of 128).

    Attributes:
      block_rows: rows (flattened batch * length positions) per block.
      block_vocab: vocabulary columns per block.
      vmem_limit_bytes: Mosaic's scoped VMEM limit. None: the compiler default (16 MiB)
        when `_vmem_estimate` fits in it, else 1.25x the estimate (seen to compile on v5e,
        which has 128 MiB of VMEM, up to D = 8192 with the default blocks).
    """
    block_rows: int = 256
    block_vocab: int = 256
    vmem_limit_bytes: int | None = None

    def __post_init__(self):
        if self.block_rows <= 0 or self.block_rows % 8:
            raise ValueError(f"block_rows must be a positive multiple of 8, got {self.block_rows}")
        if self.block_vocab <= 0 or self.block_vocab % 128:
            raise ValueError(
                f"block_vocab must be a positive multiple of 128, got {self.block_vocab}")


# ----------------------------------------------------------------------------- public entries


def token_logprobs(hidden, unembedding, targets, *, impl: str = "chunked",
                   temperature: float = 1.0, softcap: float | None = None,
                   with_entropy: bool = True, seq_chunk: int = 128, vocab_chunk: int = 8192,
                   block_sizes: BlockSizes | None = None, interpret: bool = False):
    """Dispatches to `logprobs_reference` ("full"), `chunked_logprobs` or `pallas_logprobs`.

    Shapes and dtypes as in `chunked_logprobs`; arguments an implementation does not use are
    ignored."""
    if impl == "full":
        logp, ent = logprobs_reference(hidden, unembedding, targets, temperature, softcap=softcap)
        return logp, (ent if with_entropy else jnp.zeros_like(logp))
    if impl == "chunked":
        return chunked_logprobs(hidden, unembedding, targets, temperature=temperature,
                                softcap=softcap, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk,
                                with_entropy=with_entropy)
    if impl == "pallas" and _platform.current() == "gpu":  # the Triton version
        from jaxrl_reason.kernels import logprobs_gpu
        gpu_blocks = block_sizes if isinstance(block_sizes, logprobs_gpu.BlockSizes) else None
        return logprobs_gpu.pallas_logprobs(hidden, unembedding, targets,
                                            temperature=temperature, softcap=softcap,
                                            block_sizes=gpu_blocks, with_entropy=with_entropy,
                                            interpret=interpret)
    if impl == "pallas":
        return pallas_logprobs(hidden, unembedding, targets, temperature=temperature,
                               softcap=softcap, block_sizes=block_sizes,
                               with_entropy=with_entropy, interpret=interpret)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


@functools.partial(jax.jit, static_argnames=("temperature", "softcap", "seq_chunk",
                                             "vocab_chunk", "with_entropy"))
def chunked_logprobs(hidden, unembedding, targets, *, temperature: float = 1.0,
                     softcap: float | None = None, seq_chunk: int = 128,
                     vocab_chunk: int = 8192, with_entropy: bool = True):
    """Log-prob of each target token and entropy of log_softmax(softcap(h @ W) / T), chunked.

    Args:
      hidden: [B, L, D] float32 or bfloat16 final hidden states.
      unembedding: [D, V] (cast to hidden.dtype for the matmuls, as `Transformer.logits`).
      targets: int32 [B, L] in [0, V).
      temperature: python float > 0. softcap: python float or None (Gemma-2 logit cap).
      seq_chunk: positions per chunk (all B rows at once); vocab_chunk: columns per chunk.
        Both are capped at L and V; neither needs to divide them.
      with_entropy: if False the returned entropy is zeros (and skipped in the chunked path).
    Returns:
      (logp f32 [B, L], entropy f32 [B, L]); differentiable w.r.t. hidden and unembedding.
    """
    cfg = LogprobConfig(float(temperature), softcap, with_entropy,
                        min(seq_chunk, hidden.shape[1]), min(vocab_chunk, unembedding.shape[1]))
    return _chunked(cfg, hidden, unembedding, targets.astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("temperature", "softcap", "block_sizes",
                                             "with_entropy", "interpret"))
def pallas_logprobs(hidden, unembedding, targets, *, temperature: float = 1.0,
                    softcap: float | None = None, block_sizes: BlockSizes | None = None,
                    with_entropy: bool = True, interpret: bool = False):
    """`chunked_logprobs` as Pallas kernels (forward and backward); same shapes and dtypes.

    Args:
      hidden [B, L, D], unembedding [D, V], targets int32 [B, L], temperature, softcap,
      with_entropy: as in `chunked_logprobs`.
      block_sizes: `BlockSizes` (default 256 rows x 256 columns); rows are B * L flattened.
      interpret: run the kernels in the Pallas interpreter (required on CPU).
    Returns:
      (logp f32 [B, L], entropy f32 [B, L]).
    """
    cfg = LogprobConfig(float(temperature), softcap, with_entropy, 0, 0)
    return _pallas(cfg, block_sizes or BlockSizes(), interpret, hidden, unembedding,
                   targets.astype(jnp.int32))


# ----------------------------------------------------------------------------- shared math


@dataclasses.dataclass(frozen=True)
class LogprobConfig:
    """Static options of the log-prob computations, shared with ``logprobs_gpu``: sampling
    temperature, optional logit softcap, whether to compute the entropy, and the chunk sizes
    of ``chunked_logprobs`` (0 for the Pallas versions)."""

    temperature: float
    softcap: float | None
    with_entropy: bool
    seq_chunk: int
    vocab_chunk: int


def _scaled_logits(cfg, h, w):
    """h [..., D] @ w [D, C] -> (z f32 [..., C], dz/da or None); w is cast to h's dtype."""
    a = jax.lax.dot_general(h, w.astype(h.dtype), (((h.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.float32)
    if cfg.softcap is None:
        return a / cfg.temperature, None
    t = jnp.tanh(a / cfg.softcap)
    return cfg.softcap * t / cfg.temperature, 1.0 - t * t


def online_update(state, z, valid, onehot):
    """Folds a logits chunk z [..., C] (columns where `valid`) into (m, s, t, zy) [..., 1]."""
    m, s, t, zy = state
    z = jnp.where(valid, z, 0.0)
    m_new = jnp.maximum(m, jnp.max(jnp.where(valid, z, -jnp.inf), axis=-1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    e = jnp.where(valid, jnp.exp(z - m_new), 0.0)
    return (m_new, s * alpha + jnp.sum(e, axis=-1, keepdims=True),
            t * alpha + jnp.sum(e * z, axis=-1, keepdims=True),
            zy + jnp.sum(jnp.where(onehot, z, 0.0), axis=-1, keepdims=True))


def finalize(state):
    """(m, s, t, zy) -> (logp, entropy, lse, E_p[z]), each [..., 1]."""
    m, s, t, zy = state
    lse = m + jnp.log(s)
    mean_z = t / s
    return zy - lse, lse - mean_z, lse, mean_z


def dlogits(cfg, z, dcap, valid, onehot, lse, mean_z, g_logp, g_ent):
    """Cotangent of the raw logits a = h @ W for one chunk (f32, zero where not valid)."""
    z = jnp.where(valid, z, 0.0)
    p = jnp.where(valid, jnp.exp(z - lse), 0.0)
    dz = g_logp * (onehot.astype(jnp.float32) - p)
    if cfg.with_entropy:
        dz = dz - g_ent * p * (z - mean_z)
    da = dz / cfg.temperature
    if dcap is not None:
        da = da * dcap
    return jnp.where(valid, da, 0.0)


def init_state(shape):
    """The empty online-logsumexp state (m = -inf, s = t = zy = 0), each f32 ``shape``."""
    zeros = jnp.zeros(shape, jnp.float32)
    return (jnp.full(shape, -jnp.inf, jnp.float32), zeros, zeros, zeros)


def _clamped_chunk(index, chunk, size):
    """Start of chunk `index`, clamped to end inside `size`, and which of its slots are new
    (a last chunk that `chunk` does not divide overlaps the previous one: mask the rest)."""
    start = jnp.minimum(index * chunk, size - chunk)
    return start, start + jnp.arange(chunk) >= index * chunk


# ----------------------------------------------------------------------------- chunked (jnp)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(cfg, hidden, w, targets):
    return _chunked_fwd(cfg, hidden, w, targets)[0]


def _chunked_fwd(cfg, hidden, w, targets):
    batch, length, _ = hidden.shape
    vocab = w.shape[1]
    sc, vc = cfg.seq_chunk, cfg.vocab_chunk
    n_seq, n_voc = -(-length // sc), -(-vocab // vc)

    def seq_body(i, outs):
        start, _ = _clamped_chunk(i, sc, length)
        h = jax.lax.dynamic_slice_in_dim(hidden, start, sc, axis=1)  # [B, sc, D]
        y = jax.lax.dynamic_slice_in_dim(targets, start, sc, axis=1)[..., None]

        def voc_body(j, state):
            vstart, valid = _clamped_chunk(j, vc, vocab)
            z, _ = _scaled_logits(cfg, h, jax.lax.dynamic_slice_in_dim(w, vstart, vc, axis=1))
            onehot = valid & (vstart + jnp.arange(vc) == y)
            return online_update(state, z, valid, onehot)

        state = jax.lax.fori_loop(0, n_voc, voc_body, init_state((batch, sc, 1)))
        return tuple(jax.lax.dynamic_update_slice_in_dim(out, r[..., 0], start, axis=1)
                     for out, r in zip(outs, finalize(state)))

    zeros = jnp.zeros((batch, length), jnp.float32)
    logp, entropy, lse, mean_z = jax.lax.fori_loop(0, n_seq, seq_body, (zeros,) * 4)
    if not cfg.with_entropy:
        entropy = zeros
    return (logp, entropy), (hidden, w, targets, lse, mean_z)


def _chunked_bwd(cfg, residuals, cotangents):
    # Sequence chunks outside, vocabulary chunks inside: dh of a chunk of rows is summed in
    # a small f32 carry and written once; dW is summed in one f32 [D, V] buffer, which with
    # f32 (master) weights is the output itself, so no full-size temporary is kept.
    hidden, w, targets, lse, mean_z = residuals
    g_logp, g_ent = cotangents
    batch, length, dim = hidden.shape
    vocab = w.shape[1]
    sc, vc = cfg.seq_chunk, cfg.vocab_chunk
    n_seq, n_voc = -(-length // sc), -(-vocab // vc)

    def seq_body(i, carry):
        dh, dw = carry
        start, fresh = _clamped_chunk(i, sc, length)
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, sc, axis=1)  # noqa: E731
        h, y, lse_c, mean_c = take(hidden), take(targets)[..., None], take(lse), take(mean_z)
        # Rows of an overlapping last chunk get zero cotangents: they are done already.
        gl = jnp.where(fresh, take(g_logp), 0.0)[..., None]
        ge = jnp.where(fresh, take(g_ent), 0.0)[..., None]

        def voc_body(j, carry):
            dh_rows, dw = carry
            vstart, valid = _clamped_chunk(j, vc, vocab)
            w_chunk = jax.lax.dynamic_slice_in_dim(w, vstart, vc, axis=1).astype(h.dtype)
            z, dcap = _scaled_logits(cfg, h, w_chunk)
            onehot = valid & (vstart + jnp.arange(vc) == y)
            da = dlogits(cfg, z, dcap, valid, onehot, lse_c[..., None], mean_c[..., None],
                          gl, ge).astype(h.dtype)
            dh_rows = dh_rows + jnp.einsum("bsv,dv->bsd", da, w_chunk,
                                           preferred_element_type=jnp.float32)
            dw_cols = jnp.einsum("bsd,bsv->dv", h, da, preferred_element_type=jnp.float32)
            dw = jax.lax.dynamic_update_slice_in_dim(
                dw, jax.lax.dynamic_slice_in_dim(dw, vstart, vc, axis=1) + dw_cols, vstart, 1)
            return dh_rows, dw

        dh_rows, dw = jax.lax.fori_loop(0, n_voc, voc_body,
                                        (jnp.zeros((batch, sc, dim), jnp.float32), dw))
        # Added, not written: the overlapping rows of a last chunk hold exact zeros.
        dh = jax.lax.dynamic_update_slice_in_dim(
            dh, take(dh) + dh_rows.astype(dh.dtype), start, axis=1)
        return dh, dw

    dh, dw = jax.lax.fori_loop(0, n_seq, seq_body,
                               (jnp.zeros_like(hidden), jnp.zeros(w.shape, jnp.float32)))
    return dh, dw.astype(w.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


# ----------------------------------------------------------------------------- pallas


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _pallas(cfg, blocks, interpret, hidden, w, targets):
    return _pallas_fwd(cfg, blocks, interpret, hidden, w, targets)[0]


def _vmem_estimate(bm, bv, dim, h_bytes, w_bytes):
    """Bytes of VMEM the largest kernel (a backward one) needs: double-buffered h, W and
    output blocks, an f32 accumulator, a bf16 copy of the W block, the per-row [bm, 1]
    inputs (padded to 128 lanes), and a few f32 [bm, bv] temporaries."""
    h_block, w_block = bm * dim, bv * dim
    return (2 * (h_block * h_bytes + w_block * w_bytes)
            + 2 * max(h_block * h_bytes, w_block * w_bytes) + 4 * max(h_block, w_block)
            + w_block * h_bytes + 2 * 5 * bm * 128 * 4 + 4 * bm * bv * 4)


def _compiler_params(blocks, bm, bv, dim, h_bytes, w_bytes):
    limit = blocks.vmem_limit_bytes
    if limit is None:
        need = _vmem_estimate(bm, bv, dim, h_bytes, w_bytes)
        limit = None if need <= 15 * 2**20 else int(1.25 * need)
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                vmem_limit_bytes=limit)


def _grid(blocks, rows, vocab):
    bm = min(blocks.block_rows, -(-rows // 8) * 8)
    bv = min(blocks.block_vocab, -(-vocab // 128) * 128)
    return bm, bv, -(-rows // bm), -(-vocab // bv)


def _row_spec(bm, index_map):
    """Per-row scalars (targets, lse, E_p[z], cotangents) are [rows, 1] arrays."""
    return pl.BlockSpec((bm, 1), index_map)


def _pallas_fwd(cfg, blocks, interpret, hidden, w, targets):
    batch, length, dim = hidden.shape
    rows, vocab = batch * length, w.shape[1]
    bm, bv, n_rows, n_voc = _grid(blocks, rows, vocab)
    params = _compiler_params(blocks, bm, bv, dim, hidden.dtype.itemsize, w.dtype.itemsize)
    row_out = jax.ShapeDtypeStruct((rows, 1), jnp.float32)
    kernel = functools.partial(_fwd_kernel, cfg=cfg, rows=rows, vocab=vocab, n_voc=n_voc)
    logp, entropy, lse, mean_z = pl.pallas_call(
        kernel,
        grid=(n_rows, n_voc),
        in_specs=[pl.BlockSpec((bm, dim), lambda i, j: (i, 0)),
                  pl.BlockSpec((dim, bv), lambda i, j: (0, j)),
                  _row_spec(bm, lambda i, j: (i, 0))],
        out_specs=[_row_spec(bm, lambda i, j: (i, 0))] * 4,
        out_shape=[row_out] * 4,
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32)] * 4,
        compiler_params=params, interpret=interpret,
        name="logprobs_fwd",
    )(hidden.reshape(rows, dim), w, targets.reshape(rows, 1))
    logp = logp.reshape(batch, length)
    entropy = entropy.reshape(batch, length) if cfg.with_entropy else jnp.zeros_like(logp)
    return (logp, entropy), (hidden, w, targets, lse, mean_z)


def _pallas_bwd(cfg, blocks, interpret, residuals, cotangents):
    hidden, w, targets, lse, mean_z = residuals
    batch, length, dim = hidden.shape
    rows, vocab = batch * length, w.shape[1]
    bm, bv, n_rows, n_voc = _grid(blocks, rows, vocab)
    params = _compiler_params(blocks, bm, bv, dim, hidden.dtype.itemsize, w.dtype.itemsize)
    g_logp, g_ent = (g.reshape(rows, 1).astype(jnp.float32) for g in cotangents)
    inputs = (hidden.reshape(rows, dim), w, targets.reshape(rows, 1), lse, mean_z, g_logp, g_ent)
    kernel_args = dict(cfg=cfg, rows=rows, vocab=vocab)

    # dh: grid (row blocks, vocab blocks), reducing over vocabulary blocks.
    row = lambda i, j: (i, 0)  # noqa: E731
    dh = pl.pallas_call(
        functools.partial(_dh_kernel, n_voc=n_voc, **kernel_args),
        grid=(n_rows, n_voc),
        in_specs=[pl.BlockSpec((bm, dim), row), pl.BlockSpec((dim, bv), lambda i, j: (0, j))]
        + [_row_spec(bm, row)] * 5,
        out_specs=pl.BlockSpec((bm, dim), row),
        out_shape=jax.ShapeDtypeStruct((rows, dim), hidden.dtype),
        scratch_shapes=[pltpu.VMEM((bm, dim), jnp.float32)],
        compiler_params=params, interpret=interpret,
        name="logprobs_bwd_dh",
    )(*inputs)

    # dW: grid (vocab blocks, row blocks), reducing over row blocks.
    row = lambda j, i: (i, 0)  # noqa: E731
    dw = pl.pallas_call(
        functools.partial(_dw_kernel, n_rows=n_rows, **kernel_args),
        grid=(n_voc, n_rows),
        in_specs=[pl.BlockSpec((bm, dim), row), pl.BlockSpec((dim, bv), lambda j, i: (0, j))]
        + [_row_spec(bm, row)] * 5,
        out_specs=pl.BlockSpec((dim, bv), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((dim, vocab), w.dtype),
        scratch_shapes=[pltpu.VMEM((dim, bv), jnp.float32)],
        compiler_params=params, interpret=interpret,
        name="logprobs_bwd_dw",
    )(*inputs)
    return dh.reshape(batch, length, dim), dw, None


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


# ----------------------------------------------------------------------------- kernel bodies


def _load_block(h_ref, w_ref, y_ref, *, rows, vocab, row_block, voc_block):
    """Masked block loads: h rows >= `rows` and W columns >= `vocab` read as zero.

    Returns h [bm, D], w [D, bv], valid and onehot(target) bool [bm, bv].
    """
    bm, bv = h_ref.shape[0], w_ref.shape[1]
    row_ids = row_block * bm + jax.lax.broadcasted_iota(jnp.int32, h_ref.shape, 0)
    h = jnp.where(row_ids < rows, h_ref[...], jnp.zeros((), h_ref.dtype))
    cols_w = voc_block * bv + jax.lax.broadcasted_iota(jnp.int32, w_ref.shape, 1)
    w = jnp.where(cols_w < vocab, w_ref[...], jnp.zeros((), w_ref.dtype))
    cols = voc_block * bv + jax.lax.broadcasted_iota(jnp.int32, (bm, bv), 1)
    valid = cols < vocab
    return h, w, valid, valid & (cols == y_ref[...])


def _fwd_kernel(h_ref, w_ref, y_ref, logp_ref, ent_ref, lse_ref, mean_ref,
                m_sc, s_sc, t_sc, zy_sc, *, cfg, rows, vocab, n_voc):
    i, j = pl.program_id(0), pl.program_id(1)
    scratch = (m_sc, s_sc, t_sc, zy_sc)

    @pl.when(j == 0)
    def _init():
        for ref, value in zip(scratch, init_state(m_sc.shape)):
            ref[...] = value

    h, w, valid, onehot = _load_block(h_ref, w_ref, y_ref, rows=rows, vocab=vocab,
                                      row_block=i, voc_block=j)
    z, _ = _scaled_logits(cfg, h, w)
    state = online_update(tuple(ref[...] for ref in scratch), z, valid, onehot)
    for ref, value in zip(scratch, state):
        ref[...] = value

    @pl.when(j == n_voc - 1)
    def _write():
        for ref, value in zip((logp_ref, ent_ref, lse_ref, mean_ref), finalize(state)):
            ref[...] = value


def _block_dlogits(cfg, refs, *, rows, vocab, row_block, voc_block):
    """(h, w, da) of one (row block, vocab block): shared by both backward kernels."""
    h_ref, w_ref, y_ref, lse_ref, mean_ref, gl_ref, ge_ref = refs
    h, w, valid, onehot = _load_block(h_ref, w_ref, y_ref, rows=rows, vocab=vocab,
                                      row_block=row_block, voc_block=voc_block)
    z, dcap = _scaled_logits(cfg, h, w)
    row_ok = row_block * h.shape[0] + jax.lax.broadcasted_iota(jnp.int32, z.shape, 0) < rows
    da = dlogits(cfg, z, dcap, valid & row_ok, onehot, lse_ref[...], mean_ref[...],
                  gl_ref[...], ge_ref[...])
    return h, w.astype(h.dtype), da.astype(h.dtype)


def _dh_kernel(*refs, cfg, rows, vocab, n_voc):
    in_refs, dh_ref, acc = refs[:7], refs[7], refs[8]
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    _, w, da = _block_dlogits(cfg, in_refs, rows=rows, vocab=vocab, row_block=i, voc_block=j)
    acc[...] += jax.lax.dot_general(da, w, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(j == n_voc - 1)
    def _write():
        dh_ref[...] = acc[...].astype(dh_ref.dtype)


def _dw_kernel(*refs, cfg, rows, vocab, n_rows):
    in_refs, dw_ref, acc = refs[:7], refs[7], refs[8]
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    h, _, da = _block_dlogits(cfg, in_refs, rows=rows, vocab=vocab, row_block=i, voc_block=j)
    acc[...] += jax.lax.dot_general(h, da, (((0,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(i == n_rows - 1)
    def _write():
        dw_ref[...] = acc[...].astype(dw_ref.dtype)


# ----------------------------------------------------------------------------- reference


def logprobs_reference(hidden, unembedding, targets, temperature: float = 1.0, *,
                       softcap: float | None = None):
    """Naive full-logits log-probs and entropies (materializes [B, L, V] float32 logits).

    Args/returns as `chunked_logprobs`: hidden [B, L, D], unembedding [D, V], targets int32
    [B, L] -> (logp f32 [B, L], entropy f32 [B, L]).
    """
    logits = jnp.einsum("bld,dv->blv", hidden, unembedding.astype(hidden.dtype),
                        preferred_element_type=jnp.float32)
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    logprobs = jax.nn.log_softmax(logits / temperature, axis=-1)
    logp = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)
    return logp, entropy
