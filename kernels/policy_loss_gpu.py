"""Fused clipped policy-gradient loss ("ppo" mode) as Pallas Triton (GPU) kernels, with its
gradient. The GPU twin of ``policy_loss.py``: same entry point, arguments, returns, metrics and
``custom_vjp`` semantics (see that module's docstring for the math).

Design. As on TPU, every ``loss_type`` is linear in the per-token values, ``loss = sum_b w_b *
sum_t m_bt * tok_bt``, so the kernels only produce per-row sums and the ``[B]``-sized jnp
epilogue applies the row weights ``w_b`` and the global normalizers (``num_sequences``,
``num_tokens_global``, ``max_completion_length``). What changes for Triton, whose programs run
in parallel with no scratch that persists across grid steps:

- forward kernel, grid ``(cdiv(B, block_b),)``: each program owns ``block_b`` rows and loops
  (``lax.fori_loop``) over ``L`` in ``block_l`` chunks, carrying the row sums of the mask,
  ``m * pg``, ``m * kl``, ``m * entropy``, ``m * ratio``, the clip counts and the running ratio
  max in registers; it stores them once as a ``(block_b, 16)`` tile of the f32 ``[B, 16]``
  row statistics (columns as the TPU kernel's lanes ``Stat.N`` ... ``Stat.MAX``). Batch-wide
  sums (the "bnpo"/"dapo" token count, the metrics) are then reductions of those per-row
  partials in jnp, outside the kernel;
- backward kernel, same grid and loop: ``d loss / d logp`` and ``d loss / d entropy`` chunk by
  chunk; ``beta`` and ``entropy_coef`` come from an f32 ``[2]`` input read with scalar loads (no
  SMEM scalar prefetch), ``g * w_b`` from an f32 ``[B]`` input.

Blocks are powers of two (a Triton requirement) and need not divide ``B`` or ``L``: loads and
stores are masked (``row < B``, ``col < L``), so nothing is padded except ``B`` up to a multiple
of the number of shards under ``shard_map`` (``mask = 0`` rows). Inputs keep their dtype in HBM
and are cast to float32 in the kernel; gradients come back in the inputs' dtypes.

Sharding: with ``mesh`` and ``batch_axes`` the (row-local) kernels run per shard under
``jax.shard_map`` (``policy_loss.per_shard``), and only the ``[B]``-sized epilogue is global.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxrl_reason.kernels.formulas import KL_FORMULAS, clipped_surrogate
from jaxrl_reason.kernels.policy_loss import (
    Stat,
    check_fused_arguments,
    make_custom_loss,
    per_shard,
    surrogate_grad,
)

__all__ = ["SUPPORTS", "BlockSizes", "policy_loss"]

SUPPORTS = types.MappingProxyType({
    "loss_type": frozenset({"grpo", "bnpo", "dr_grpo", "dapo"}),
    "kl_estimator": frozenset(KL_FORMULAS),
    "policy_loss_mode": frozenset({"ppo"}),
    "tis_cap": frozenset({None}),
})
"""What the kernels implement: option -> values (as the TPU kernels; the row weights of the
aggregations are the shared ``make_custom_loss`` epilogue's). Anything else is refused here
and computed by the jnp reference (``rl/backends.py`` routes it)."""

_STATS = 16  # columns of the row statistics (9 used), a power of two for Triton


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Triton tiling of the ``[B, L]`` inputs.

    Attributes:
      block_b: rows per program, a power of two; clamped to ``next_pow2(rows per shard)``.
      block_l: tokens per loop step, a power of two; clamped to ``next_pow2(L)``.
      num_warps: Triton warps per program (a power of two).
      num_stages: Triton software-pipelining stages of the ``L`` loop.
    """

    block_b: int = 16
    block_l: int = 256
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_b", "block_l", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a positive power of two, got {value}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static configuration shared by the forward and backward kernels (``mesh`` and
    ``batch_axes`` are what ``policy_loss.per_shard`` reads)."""

    loss_type: str
    epsilon_low: float
    epsilon_high: float
    clip_ratio_c: float | None
    kl_estimator: str
    max_completion_length: int | None
    has_ref: bool
    has_entropy: bool
    token_advantages: bool
    blocks: BlockSizes
    interpret: bool
    mesh: jax.sharding.Mesh | None = None
    batch_axes: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- public entry


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    loss_type: str,
    epsilon_low: float,
    epsilon_high: float,
    beta: float | jax.Array = 0.0,
    ref_logp: jax.Array | None = None,
    max_completion_length: int | None = None,
    kl_estimator: str = "k3",
    num_tokens_global: jax.Array | int | None = None,
    num_sequences: jax.Array | int | None = None,
    entropy: jax.Array | None = None,
    entropy_coef: float | jax.Array = 0.0,
    clip_ratio_c: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    batch_axes: str | tuple[str, ...] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped token-level policy loss and its metrics (validates, then runs a jitted core).

    Args:
      logp: float ``[B, L]`` (f32 or bf16) sampled-token log-probs of the current policy;
        ``B, L >= 1``.
      old_logp: float ``[B, L]``, the sampling policy's (constant).
      advantages: float ``[B]`` per sequence or ``[B, L]`` per token (constant).
      mask: bool or float ``[B, L]``, 1 on completion tokens (float values act as weights).
      loss_type: "grpo", "bnpo", "dr_grpo" or "dapo" (``SUPPORTS["loss_type"]``).
      epsilon_low, epsilon_high: static clip range ``[1 - epsilon_low, 1 + epsilon_high]``.
      beta: KL coefficient >= 0, float or scalar array; > 0 requires ``ref_logp``.
      ref_logp: float ``[B, L]`` under the reference model (constant), or None.
      max_completion_length: static int, required for "dr_grpo".
      kl_estimator: "k1", "k2" or "k3" (``SUPPORTS["kl_estimator"]``).
      num_tokens_global: int or scalar array, the global batch's token count, or None.
      num_sequences: int or scalar array, the global batch's sequence count, or None.
      entropy: float ``[B, L]`` per-token entropy, or None.
      entropy_coef: entropy bonus coefficient (float or scalar array).
      clip_ratio_c: static float > 1 (dual clip for negative advantages) or None.
      block_sizes: static Triton tiling; None for the defaults.
      interpret: run the kernels in the Pallas interpreter, on any backend (CPU tests).
      mesh, batch_axes: for ``[B, ...]`` arrays sharded over the mesh axes ``batch_axes``: the
        kernels then run per shard under ``jax.shard_map``; only the ``[B]``-sized epilogue is
        global. ``pallas_call`` is not auto-partitioned, so without them XLA gathers arrays.

    Returns:
      ``(loss f32[], metrics)`` exactly as the reference ``policy_loss`` (``rl/losses.py``)
      with ``policy_loss_mode="ppo"`` and no ``sampler_logp``: "clip_frac_low",
      "clip_frac_high", "ratio_mean", "ratio_max", ["clip_frac_dual"], "kl", "entropy",
      "pg_loss". Gradients
      flow to ``logp``, ``entropy`` and array-valued ``beta`` / ``entropy_coef`` (as the TPU
      kernel: zero cotangents for the constants, the counts and the mask).
    """
    check_fused_arguments("policy_loss_gpu", SUPPORTS, logp, old_logp, advantages, mask,
                          loss_type, epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
                          max_completion_length, entropy, entropy_coef, clip_ratio_c)
    return _policy_loss_jit(
        logp, old_logp, advantages, mask, beta, ref_logp, num_tokens_global, num_sequences,
        entropy, entropy_coef, loss_type=loss_type, epsilon_low=float(epsilon_low),
        epsilon_high=float(epsilon_high), max_completion_length=max_completion_length,
        kl_estimator=kl_estimator, clip_ratio_c=clip_ratio_c,
        block_sizes=block_sizes or BlockSizes(), interpret=interpret, mesh=mesh,
        batch_axes=(batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes or ()))


@functools.partial(jax.jit, static_argnames=(
    "loss_type", "epsilon_low", "epsilon_high", "max_completion_length", "kl_estimator",
    "clip_ratio_c", "block_sizes", "interpret", "mesh", "batch_axes"))
def _policy_loss_jit(logp, old_logp, advantages, mask, beta, ref_logp, num_tokens_global,
                     num_sequences, entropy, entropy_coef, *, loss_type, epsilon_low,
                     epsilon_high, max_completion_length, kl_estimator, clip_ratio_c,
                     block_sizes, interpret, mesh, batch_axes):
    """Casts scalars, pads ``B`` to a multiple of the shards (mask 0), calls the custom_vjp."""
    b = logp.shape[0]
    shards = 1 if mesh is None else int(np.prod([mesh.shape[a] for a in batch_axes]))
    pad_b = -(-b // shards) * shards - b  # up to a multiple of the shards

    def pad(x):
        return None if x is None else jnp.pad(x, ((0, pad_b),) + ((0, 0),) * (x.ndim - 1))

    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    cfg = _Config(loss_type, epsilon_low, epsilon_high, clip_ratio_c, kl_estimator,
                  max_completion_length, ref_logp is not None, entropy is not None,
                  jnp.ndim(advantages) == 2, block_sizes, interpret, mesh, batch_axes)
    return _policy_loss(
        cfg, pad(logp), pad(old_logp), pad(ref_logp), pad(f32(advantages)), pad(f32(mask)),
        pad(entropy), f32(beta if ref_logp is not None else 0.0),
        f32(entropy_coef if entropy is not None else 0.0),
        f32(b if num_sequences is None else num_sequences),
        None if num_tokens_global is None else f32(num_tokens_global))


# ----------------------------------------------------------------------------- pallas calls


def _blocks(cfg, rows, length):
    """(block_b, block_l, number of programs) for this shard's ``[rows, length]``."""
    block_b = min(cfg.blocks.block_b, pl.next_power_of_2(rows))
    block_l = min(cfg.blocks.block_l, pl.next_power_of_2(length))
    return block_b, block_l, pl.cdiv(rows, block_b)


def _params(cfg):
    return pltriton.CompilerParams(num_warps=cfg.blocks.num_warps,
                                   num_stages=cfg.blocks.num_stages)


def _forward_call(cfg, logp, old_logp, ref_logp, adv, mask, entropy):
    """Per-row statistics f32[B, 16] (columns ``Stat.N`` ... ``Stat.MAX``)."""
    def call(*inputs):
        rows, length = inputs[0].shape  # this shard's
        block_b, block_l, programs = _blocks(cfg, rows, length)
        return pl.pallas_call(
            functools.partial(_forward_kernel, cfg=cfg, block_b=block_b, block_l=block_l),
            grid=(programs,),
            out_shape=jax.ShapeDtypeStruct((rows, _STATS), jnp.float32),
            compiler_params=_params(cfg),
            interpret=cfg.interpret,
            name="policy_loss_fwd",
        )(*inputs)

    inputs = [x for x in (logp, old_logp, ref_logp, adv, mask, entropy) if x is not None]
    return per_shard(cfg, call)(*inputs)


def _backward_call(cfg, scalars, logp, old_logp, ref_logp, adv, mask, entropy, row_grad):
    """(d loss / d logp ``[B, L]`` in logp's dtype, d loss / d entropy or None)."""
    ent_dtype = None if entropy is None else entropy.dtype

    def call(scalars, *inputs):
        rows, length = inputs[0].shape  # this shard's
        block_b, block_l, programs = _blocks(cfg, rows, length)
        out_shape = [jax.ShapeDtypeStruct((rows, length), inputs[0].dtype)] + (
            [jax.ShapeDtypeStruct((rows, length), ent_dtype)] if cfg.has_entropy else [])
        return tuple(pl.pallas_call(
            functools.partial(_backward_kernel, cfg=cfg, block_b=block_b, block_l=block_l),
            grid=(programs,),
            out_shape=out_shape,
            compiler_params=_params(cfg),
            interpret=cfg.interpret,
            name="policy_loss_bwd",
        )(scalars, *inputs))

    inputs = [x for x in (logp, old_logp, ref_logp, adv, mask) if x is not None]
    outs = per_shard(cfg, call, num_replicated=1)(scalars, *inputs, row_grad)
    return outs[0], (outs[1] if cfg.has_entropy else None)


# ----------------------------------------------------------------------------- kernel bodies


def _backward_rows(cfg, scalars, *tokens_and_row_grad):
    """``_backward_call`` with the shared VJP's row gradient ``[B, 1]`` as ``[B]``."""
    *tokens, row_grad = tokens_and_row_grad
    return _backward_call(cfg, scalars, *tokens, row_grad[:, 0])


# The epilogue and cotangents are the Mosaic version's; only the kernels differ.
_policy_loss = make_custom_loss(_forward_call, _backward_rows)


def _load_row_block(cfg, refs, block_b):
    """(row slice, row_ok bool[block_b], per-sequence advantages f32[block_b, 1] or None)."""
    rows = refs[0].shape[0]
    start = pl.program_id(0) * block_b
    row_ok = start + jnp.arange(block_b) < rows
    adv_ref = refs[2 + cfg.has_ref]
    adv = None if cfg.token_advantages else pltriton.load(
        adv_ref.at[pl.ds(start, block_b)], mask=row_ok, other=0.0)[:, None]
    return pl.ds(start, block_b), row_ok, adv


def _load_chunk(cfg, refs, rows, row_ok, row_adv, j, block_l):
    """Reads one ``(block_b, block_l)`` chunk: (slices, in-bounds mask, m, valid, logp,
    old_logp, ref_logp|None, adv), all f32, zero where the mask is 0 or out of bounds."""
    length = refs[0].shape[1]
    cols = pl.ds(j * block_l, block_l)
    ok = row_ok[:, None] & (j * block_l + jnp.arange(block_l) < length)[None, :]

    def load(ref):
        return pltriton.load(ref.at[rows, cols], mask=ok, other=0).astype(jnp.float32)

    m = load(refs[3 + cfg.has_ref])
    valid = m != 0

    def clean(ref):
        return jnp.where(valid, load(ref), 0.0)

    adv = clean(refs[2 + cfg.has_ref]) if cfg.token_advantages else row_adv
    ref_logp = clean(refs[2]) if cfg.has_ref else None
    return (rows, cols), ok, m, valid, clean(refs[0]), clean(refs[1]), ref_logp, adv


def _forward_kernel(*refs, cfg, block_b, block_l):
    """Row statistics of ``block_b`` rows, looping over ``L`` in ``block_l`` chunks."""
    out_ref = refs[-1]
    in_refs = refs[:-1]
    rows, row_ok, row_adv = _load_row_block(cfg, in_refs, block_b)
    num_chunks = pl.cdiv(in_refs[0].shape[1], block_l)

    def body(j, acc):
        _, _, m, valid, logp, old_logp, ref_logp, adv = _load_chunk(
            cfg, in_refs, rows, row_ok, row_adv, j, block_l)
        ratio = jnp.exp(logp - old_logp)
        pg = clipped_surrogate(ratio, adv, cfg.epsilon_low, cfg.epsilon_high, cfg.clip_ratio_c)
        low = (ratio < 1.0 - cfg.epsilon_low) & (adv < 0)
        high = (ratio > 1.0 + cfg.epsilon_high) & (adv > 0)
        columns = {Stat.N: m, Stat.PG: pg * m, Stat.RATIO: ratio * m,
                   Stat.LOW: jnp.where(low, m, 0.0), Stat.HIGH: jnp.where(high, m, 0.0)}
        if cfg.clip_ratio_c is not None:
            columns[Stat.DUAL] = jnp.where((ratio > cfg.clip_ratio_c) & (adv < 0), m, 0.0)
        if cfg.has_ref:
            columns[Stat.KL] = KL_FORMULAS[cfg.kl_estimator][0](logp, ref_logp) * m
        if cfg.has_entropy:
            columns[Stat.ENT] = jnp.where(valid, pltriton.load(
                in_refs[-1].at[rows, pl.ds(j * block_l, block_l)],
                mask=valid, other=0).astype(jnp.float32), 0.0) * m
        acc = dict(acc)
        for k, x in columns.items():
            acc[k] = acc[k] + jnp.sum(x, axis=1)
        acc[Stat.MAX] = jnp.maximum(acc[Stat.MAX], jnp.max(jnp.where(valid, ratio, 0.0), axis=1))
        return acc

    keys = (Stat.N, Stat.PG, Stat.KL, Stat.ENT, Stat.RATIO, Stat.LOW, Stat.HIGH, Stat.DUAL,
            Stat.MAX)
    acc = jax.lax.fori_loop(0, num_chunks, body,
                            {k: jnp.zeros((block_b,), jnp.float32) for k in keys})
    column = jnp.arange(_STATS)[None, :]
    tile = jnp.zeros((block_b, _STATS), jnp.float32)
    for k in keys:
        tile = jnp.where(column == k, acc[k][:, None], tile)
    pltriton.store(out_ref.at[rows, pl.ds(0, _STATS)], tile,
                   mask=row_ok[:, None] & (column < _STATS))


def _backward_kernel(scalars_ref, *refs, cfg, block_b, block_l):
    """``d loss / d logp`` (and ``d loss / d entropy``) of ``block_b`` rows, chunk by chunk."""
    n_out = 1 + cfg.has_entropy
    in_refs, row_grad_ref, out_refs = refs[:-1 - n_out], refs[-1 - n_out], refs[-n_out:]
    rows, row_ok, row_adv = _load_row_block(cfg, in_refs, block_b)
    row_grad = pltriton.load(row_grad_ref.at[rows], mask=row_ok, other=0.0)[:, None]
    beta, entropy_coef = scalars_ref[0], scalars_ref[1]

    def body(j, carry):
        index, ok, m, _, logp, old_logp, ref_logp, adv = _load_chunk(
            cfg, in_refs, rows, row_ok, row_adv, j, block_l)
        w = row_grad * m  # g * w_b * m_bt
        dtok = surrogate_grad(cfg, jnp.exp(logp - old_logp), adv)
        if cfg.has_ref:
            dtok = dtok + beta * KL_FORMULAS[cfg.kl_estimator][1](logp, ref_logp)
        pltriton.store(out_refs[0].at[index], (w * dtok).astype(out_refs[0].dtype), mask=ok)
        if cfg.has_entropy:
            pltriton.store(out_refs[1].at[index], (-entropy_coef * w).astype(out_refs[1].dtype),
                           mask=ok)
        return carry

    jax.lax.fori_loop(0, pl.cdiv(in_refs[0].shape[1], block_l), body, 0)
