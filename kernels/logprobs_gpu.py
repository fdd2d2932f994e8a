"""Memory-lean token log-probs and entropies as Pallas Triton (GPU) kernels. The GPU twin of
``logprobs.pallas_logprobs``: same entry point, shapes, dtypes and math (see ``logprobs.py``
for the online logsumexp and the backward formulas, whose jnp helpers are reused here).

Rows are the ``B * L`` positions flattened. Triton programs run in parallel and keep no
scratch between grid steps, so each program owns a block and loops over the reductions
itself (``lax.fori_loop`` over ``pl.ds`` slices, masked loads):

  * forward, grid ``(cdiv(rows, block_rows),)``: a program owns ``block_rows`` rows and loops
    over vocabulary blocks, carrying the online state ``(m, s, t, z[y])`` in registers; each
    logits tile ``h @ W[:, cols]`` is itself a loop over ``block_dim`` slices of ``D`` (the
    hidden size need not be a power of two, nor fit one tile). It writes logp, entropy and the
    residuals lse and ``E_p[z]`` per row;
  * backward dh, grid ``(cdiv(rows, block_rows),)``: a program owns ``block_rows`` rows of dh,
    loops over vocabulary blocks, recomputes the logits tile and its cotangent ``da`` and adds
    ``da @ W[dslice, cols]^T`` into its rows of an f32 ``[rows, D]`` output, slice by slice;
  * backward dW, grid ``(cdiv(V, block_vocab),)``: a program owns ``block_vocab`` columns of
    dW, loops over row blocks, recomputes ``da`` and adds ``h[rows, dslice]^T @ da`` into its
    columns of an f32 ``[D, V]`` output.

Why the dW kernel loops over rows instead of writing per-row-block partials summed in jnp:
the partials would be ``cdiv(B * L, block_rows) * D * V`` floats (hundreds of GiB at
``B * L = 16k``, ``V = 32k``), growing with the batch; the looping kernel needs only the
``[D, V]`` f32 sum, the same buffer the chunked jnp path keeps. The per-program
accumulators (``[block_rows, D]`` for dh, ``[D, block_vocab]`` for dW) do not fit registers
for real hidden sizes, so they live in the program's own slice of the f32 output in global
memory (read-add-write per ``block_dim`` slice; no two programs touch the same addresses, so
no atomics, and the result is deterministic). A ``debug_barrier`` orders a program's store
before its next read of the same addresses (compiled mode only; the interpreter is serial).
Memory: besides the inputs, dh f32 ``[B * L, D]`` and dW f32 ``[D, V]`` (cast to the inputs'
dtypes at the end); logits exist only as ``(block_rows, block_vocab)`` tiles. Traffic of the
read-add-write is ``rows / block_rows`` passes over dW and ``V / block_vocab`` over dh: tune
``block_rows`` / ``block_vocab`` up on real hardware (``benchmarks/``).

Blocks are powers of two and at least 16 (``tl.dot``'s minimum); ``B * L``, ``D`` and ``V``
need not be multiples of them (masked loads read zeros, masked stores drop the rest). Matmul
operands are in h's dtype (W blocks are cast in the kernel, no copy of W), accumulation and
all softmax math in float32, as in ``logprobs.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxrl_reason.kernels.logprobs import (
    LogprobConfig,
    dlogits,
    finalize,
    init_state,
    online_update,
)

__all__ = ["BlockSizes", "pallas_logprobs"]

_MIN_BLOCK = 16  # tl.dot needs M, N, K >= 16


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Triton tiling: powers of two >= 16, clamped to ``next_pow2`` of the array's size.

    Attributes:
      block_rows: rows (flattened batch * length positions) per program / loop step.
      block_vocab: vocabulary columns per loop step / program.
      block_dim: hidden-size slice per matmul step.
      num_warps: Triton warps per program (a power of two).
      num_stages: Triton software-pipelining stages of the innermost loops.
    """
    block_rows: int = 64
    block_vocab: int = 128
    block_dim: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_rows", "block_vocab", "block_dim"):
            value = getattr(self, name)
            if value < _MIN_BLOCK or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= {_MIN_BLOCK}, got {value}")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps must be a positive power of two, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


# ----------------------------------------------------------------------------- public entry


@functools.partial(jax.jit, static_argnames=("temperature", "softcap", "block_sizes",
                                             "with_entropy", "interpret"))
def pallas_logprobs(hidden, unembedding, targets, *, temperature: float = 1.0,
                    softcap: float | None = None, block_sizes: BlockSizes | None = None,
                    with_entropy: bool = True, interpret: bool = False):
    """Log-prob of each target token and entropy of log_softmax(softcap(h @ W) / T), as
    Triton kernels (forward and backward).

    Args:
      hidden: [B, L, D] float32 or bfloat16 final hidden states.
      unembedding: [D, V] (cast to hidden.dtype for the matmuls, block by block).
      targets: int32 [B, L] in [0, V).
      temperature: python float > 0. softcap: python float or None (Gemma-2 logit cap).
      block_sizes: `BlockSizes` (default 64 rows x 128 columns x 64 of D).
      with_entropy: if False the returned entropy is zeros.
      interpret: run the kernels in the Pallas interpreter, on any backend (CPU tests).
    Returns:
      (logp f32 [B, L], entropy f32 [B, L]); differentiable w.r.t. hidden and unembedding.
    """
    cfg = LogprobConfig(float(temperature), softcap, with_entropy, 0, 0)
    return _pallas(cfg, block_sizes or BlockSizes(), interpret, hidden, unembedding,
                   targets.astype(jnp.int32))


# ----------------------------------------------------------------------------- custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _pallas(cfg, blocks, interpret, hidden, w, targets):
    return _pallas_fwd(cfg, blocks, interpret, hidden, w, targets)[0]


@dataclasses.dataclass(frozen=True)
class _Tiles:
    rows: int   # block_rows
    vocab: int  # block_vocab
    dim: int    # block_dim


def _tiles(blocks, rows, dim, vocab):
    def clamp(block, size):
        return min(block, max(_MIN_BLOCK, pl.next_power_of_2(size)))

    return _Tiles(clamp(blocks.block_rows, rows), clamp(blocks.block_vocab, vocab),
                  clamp(blocks.block_dim, dim))


def _params(blocks):
    return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)


def _pallas_fwd(cfg, blocks, interpret, hidden, w, targets):
    batch, length, dim = hidden.shape
    rows, vocab = batch * length, w.shape[1]
    tiles = _tiles(blocks, rows, dim, vocab)
    row_out = jax.ShapeDtypeStruct((rows,), jnp.float32)
    logp, entropy, lse, mean_z = pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg, tiles=tiles),
        grid=(pl.cdiv(rows, tiles.rows),),
        out_shape=[row_out] * 4,
        compiler_params=_params(blocks), interpret=interpret,
        name="logprobs_fwd",
    )(hidden.reshape(rows, dim), w, targets.reshape(rows))
    logp = logp.reshape(batch, length)
    entropy = entropy.reshape(batch, length) if cfg.with_entropy else jnp.zeros_like(logp)
    return (logp, entropy), (hidden, w, targets, lse, mean_z)


def _pallas_bwd(cfg, blocks, interpret, residuals, cotangents):
    hidden, w, targets, lse, mean_z = residuals
    batch, length, dim = hidden.shape
    rows, vocab = batch * length, w.shape[1]
    tiles = _tiles(blocks, rows, dim, vocab)
    g_logp, g_ent = (g.reshape(rows).astype(jnp.float32) for g in cotangents)
    inputs = (hidden.reshape(rows, dim), w, targets.reshape(rows), lse, mean_z, g_logp, g_ent)
    kernel_args = dict(cfg=cfg, tiles=tiles, interpret=interpret)
    dh = pl.pallas_call(
        functools.partial(_dh_kernel, **kernel_args),
        grid=(pl.cdiv(rows, tiles.rows),),
        out_shape=jax.ShapeDtypeStruct((rows, dim), jnp.float32),
        compiler_params=_params(blocks), interpret=interpret,
        name="logprobs_bwd_dh",
    )(*inputs)
    dw = pl.pallas_call(
        functools.partial(_dw_kernel, **kernel_args),
        grid=(pl.cdiv(vocab, tiles.vocab),),
        out_shape=jax.ShapeDtypeStruct((dim, vocab), jnp.float32),
        compiler_params=_params(blocks), interpret=interpret,
        name="logprobs_bwd_dw",
    )(*inputs)
    return (dh.astype(hidden.dtype).reshape(batch, length, dim), dw.astype(w.dtype), None)


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


# ----------------------------------------------------------------------------- kernel bodies


def _span(start, size, limit):
    """(pl.ds slice, in-bounds bool[size]) of ``[start, start + size)`` within ``limit``."""
    return pl.ds(start, size), start + jnp.arange(size) < limit


def _scale_logits(cfg, a):
    """Raw logits a (f32) -> (z = softcap(a) / T, dz/da or None), as `_scaled_logits`."""
    if cfg.softcap is None:
        return a / cfg.temperature, None
    t = jnp.tanh(a / cfg.softcap)
    return cfg.softcap * t / cfg.temperature, 1.0 - t * t


def _logits_tile(cfg, h_ref, w_ref, row0, col0, tiles):
    """(z f32 [bm, bv], dz/da or None) of rows ``row0 + [0, bm)`` and columns
    ``col0 + [0, bv)``, the matmul looping over ``block_dim`` slices of D."""
    (rows, dim), vocab = h_ref.shape, w_ref.shape[1]
    row_slice, row_ok = _span(row0, tiles.rows, rows)
    col_slice, col_ok = _span(col0, tiles.vocab, vocab)

    def body(k, acc):
        d_slice, d_ok = _span(k * tiles.dim, tiles.dim, dim)
        h = pltriton.load(h_ref.at[row_slice, d_slice], mask=row_ok[:, None] & d_ok[None, :],
                          other=0)
        w = pltriton.load(w_ref.at[d_slice, col_slice], mask=d_ok[:, None] & col_ok[None, :],
                          other=0)
        return acc + jax.lax.dot_general(h, w.astype(h.dtype), (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)

    a = jax.lax.fori_loop(0, pl.cdiv(dim, tiles.dim), body,
                          jnp.zeros((tiles.rows, tiles.vocab), jnp.float32))
    return _scale_logits(cfg, a)


def _columns(col0, tiles, vocab, y):
    """(valid bool[1, bv], onehot(y) bool[bm, bv]) of the columns ``col0 + [0, bv)``."""
    cols = col0 + jnp.arange(tiles.vocab)[None, :]
    valid = cols < vocab
    return valid, valid & (cols == y)


def _fwd_kernel(h_ref, w_ref, y_ref, logp_ref, ent_ref, lse_ref, mean_ref, *, cfg, tiles):
    rows, vocab = h_ref.shape[0], w_ref.shape[1]
    row0 = pl.program_id(0) * tiles.rows
    row_slice, row_ok = _span(row0, tiles.rows, rows)
    y = pltriton.load(y_ref.at[row_slice], mask=row_ok, other=0)[:, None]

    def body(j, state):
        z, _ = _logits_tile(cfg, h_ref, w_ref, row0, j * tiles.vocab, tiles)
        valid, onehot = _columns(j * tiles.vocab, tiles, vocab, y)
        return online_update(state, z, valid, onehot)

    state = jax.lax.fori_loop(0, pl.cdiv(vocab, tiles.vocab), body,
                              init_state((tiles.rows, 1)))
    for ref, value in zip((logp_ref, ent_ref, lse_ref, mean_ref), finalize(state)):
        pltriton.store(ref.at[row_slice], value[:, 0], mask=row_ok)


def _load_rows(refs, row0, tiles):
    """Per-row residuals and cotangents of rows ``row0 + [0, bm)``: (row_ok, y, lse, E_p[z],
    g_logp, g_ent), the last five ``[bm, 1]`` (zero out of bounds)."""
    y_ref, lse_ref, mean_ref, gl_ref, ge_ref = refs[2:]
    row_slice, row_ok = _span(row0, tiles.rows, y_ref.shape[0])
    values = [pltriton.load(ref.at[row_slice], mask=row_ok, other=0)[:, None]
              for ref in (y_ref, lse_ref, mean_ref, gl_ref, ge_ref)]
    return (row_ok, *values)


def _tile_dlogits(cfg, refs, row0, col0, row_values, tiles):
    """Cotangent of the raw logits of one (row block, vocab block), in h's dtype."""
    h_ref, w_ref = refs[:2]
    row_ok, y, lse, mean_z, g_logp, g_ent = row_values
    z, dcap = _logits_tile(cfg, h_ref, w_ref, row0, col0, tiles)
    valid, onehot = _columns(col0, tiles, w_ref.shape[1], y)
    da = dlogits(cfg, z, dcap, valid & row_ok[:, None], onehot, lse, mean_z, g_logp, g_ent)
    return da.astype(h_ref.dtype)


def _accumulate(out_ref, index, ok, part, first):
    """``out[index] = part if first else out[index] + part`` (masked by ``ok``)."""
    previous = pltriton.load(out_ref.at[index], mask=ok, other=0.0)
    pltriton.store(out_ref.at[index], jnp.where(first, 0.0, previous) + part, mask=ok)


def _dh_kernel(*refs, cfg, tiles, interpret):
    in_refs, dh_ref = refs[:7], refs[7]
    h_ref, w_ref = in_refs[:2]
    (rows, dim), vocab = h_ref.shape, w_ref.shape[1]
    row0 = pl.program_id(0) * tiles.rows
    row_slice, row_ok = _span(row0, tiles.rows, rows)
    row_values = _load_rows(in_refs, row0, tiles)

    def voc_body(j, carry):
        col0 = j * tiles.vocab
        da = _tile_dlogits(cfg, in_refs, row0, col0, row_values, tiles)
        col_slice, col_ok = _span(col0, tiles.vocab, vocab)

        def dim_body(k, carry):
            d_slice, d_ok = _span(k * tiles.dim, tiles.dim, dim)
            w = pltriton.load(w_ref.at[d_slice, col_slice],
                              mask=d_ok[:, None] & col_ok[None, :], other=0)
            part = jax.lax.dot_general(da, w.astype(da.dtype), (((1,), (1,)), ((), ())),
                                       preferred_element_type=jnp.float32)  # [bm, bd]
            _accumulate(dh_ref, (row_slice, d_slice), row_ok[:, None] & d_ok[None, :], part,
                        j == 0)
            return carry

        jax.lax.fori_loop(0, pl.cdiv(dim, tiles.dim), dim_body, 0)
        if not interpret:
            pltriton.debug_barrier()  # this step's stores before the next step's loads
        return carry

    jax.lax.fori_loop(0, pl.cdiv(vocab, tiles.vocab), voc_body, 0)


def _dw_kernel(*refs, cfg, tiles, interpret):
    in_refs, dw_ref = refs[:7], refs[7]
    h_ref, w_ref = in_refs[:2]
    (rows, dim), vocab = h_ref.shape, w_ref.shape[1]
    col0 = pl.program_id(0) * tiles.vocab
    col_slice, col_ok = _span(col0, tiles.vocab, vocab)

    def row_body(i, carry):
        row0 = i * tiles.rows
        row_values = _load_rows(in_refs, row0, tiles)
        da = _tile_dlogits(cfg, in_refs, row0, col0, row_values, tiles)
        row_slice, row_ok = _span(row0, tiles.rows, rows)

        def dim_body(k, carry):
            d_slice, d_ok = _span(k * tiles.dim, tiles.dim, dim)
            h = pltriton.load(h_ref.at[row_slice, d_slice],
                              mask=row_ok[:, None] & d_ok[None, :], other=0)
            part = jax.lax.dot_general(h, da, (((0,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)  # [bd, bv]
            _accumulate(dw_ref, (d_slice, col_slice), d_ok[:, None] & col_ok[None, :], part,
                        i == 0)
            return carry

        jax.lax.fori_loop(0, pl.cdiv(dim, tiles.dim), dim_body, 0)
        if not interpret:
            pltriton.debug_barrier()  # this step's stores before the next step's loads
        return carry

    jax.lax.fori_loop(0, pl.cdiv(rows, tiles.rows), row_body, 0)
