"""Fused clipped policy-gradient loss ("ppo" mode) as Pallas TPU kernels, with its gradient.

Computes the loss and metrics of the reference ``policy_loss`` (``rl/losses.py``) with
``policy_loss_mode="ppo"`` (optionally dual-clipped), every ``loss_type`` ("grpo", "bnpo",
"dr_grpo", "dapo"), every KL estimator with ``beta``, and the entropy bonus; advantages may be
per sequence ``[B]`` or per token ``[B, L]``. Other modes and the TIS correction stay with the
reference (``SUPPORTS``; ``rl/backends.py`` falls back to it).

Design. Every ``loss_type`` is linear in the per-token values, ``loss = sum_b w_b *
sum_t m_bt * tok_bt``, with a per-row weight ``w_b``: ``1 / (max(n_b, 1) * S)`` for "grpo"
(``n_b`` = the row's token count), ``1 / T`` for "bnpo"/"dapo" and ``1 / (S *
max_completion_length)`` for "dr_grpo" (``S`` = ``num_sequences``, default ``B``; ``T`` =
``max(num_tokens_global, 1)``, default this batch's token count). So:

- forward kernel, grid ``(B / block_b, L / block_l)``, rows "parallel" (outer), L "arbitrary"
  (inner): for each row it accumulates, over the L blocks and directly in its resident
  ``(block_b, 128)`` float32 output block, the row sums of the mask, of ``m * pg``,
  ``m * kl``, ``m * entropy``, ``m * ratio``, the clip counts and the running ratio max (one
  quantity per lane). One read of each input, no ``[B, L]`` intermediate in HBM;
- a few ``[B]``-sized jnp ops in the wrapper then give ``n_b``, ``w_b``, the loss
  ``sum_b w_b (pg_b + beta kl_b - entropy_coef ent_b)`` and the token-mean metrics. The global
  normalizers (``num_sequences``, ``num_tokens_global``, ``max_completion_length``) never enter
  a kernel, so "grpo"'s per-row mean needs no second pass over ``[B, L]``;
- backward kernel (``jax.custom_vjp``), same grid, all "parallel": ``d loss / d logp_bt =
  g w_b m_bt (d pg / d logp + beta d kl / d logp)`` and ``d loss / d entropy_bt = -g
  entropy_coef w_b m_bt``; ``beta`` and ``entropy_coef`` arrive through scalar prefetch (SMEM),
  ``g w_b`` as a ``(block_b, 1)`` column.

Inputs keep their dtype in HBM (bfloat16 log-probs are read as such) and are cast to float32
in the kernel. ``B`` and ``L`` need not be multiples of the blocks: the wrapper pads with
``mask = 0`` and passes ``num_sequences = B`` explicitly, so padding changes nothing.

Gradients: to ``logp`` and ``entropy`` as in the reference, and also to array-valued ``beta``
/ ``entropy_coef`` (the aggregated KL / minus the aggregated entropy). Cotangents of
``old_logp``, ``ref_logp``, ``advantages`` are 0 (``stop_gradient`` in the reference); those of
``mask``, ``num_sequences`` and ``num_tokens_global`` are 0 too, where the reference would
differentiate through them (counts and masks are not trained). At an exact tie (``ratio`` on a
clip boundary or at ``clip_ratio_c``) autodiff splits the gradient in halves; the kernel
takes one side.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxrl_reason.kernels.checks import (
    check_policy_loss_options,
    check_policy_loss_shapes,
    check_supported,
)
from jaxrl_reason.kernels.formulas import KL_FORMULAS, clipped_surrogate

__all__ = ["SUPPORTS", "BlockSizes", "Stat", "check_fused_arguments", "make_custom_loss",
           "per_shard", "policy_loss", "surrogate_grad"]

SUPPORTS = types.MappingProxyType({
    "loss_type": frozenset({"grpo", "bnpo", "dr_grpo", "dapo"}),
    "kl_estimator": frozenset(KL_FORMULAS),
    "policy_loss_mode": frozenset({"ppo"}),
    "tis_cap": frozenset({None}),
})
"""What the kernels implement: option -> values. The row weights of the four aggregations are
written out in ``make_custom_loss``, the KL estimators need their derivative
(``formulas.KL_FORMULAS``), "gspo" needs a second pass over each row and "cispo" and truncated
importance sampling are not fused. Anything else is refused here and computed by the jnp
reference (``rl/backends.py`` routes it)."""

_LANES = 128


class Stat:
    """Lanes (TPU) / columns (GPU) of the per-row statistics written by the forward kernels
    (plain ints): the row's token count, sums of ``m * pg``, ``m * kl``, ``m * entropy``,
    ``m * ratio``, the low / high / dual clip counts, and the running ratio max."""

    N, PG, KL, ENT, RATIO, LOW, HIGH, DUAL, MAX = range(9)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiling of the ``[B, L]`` inputs.

    Attributes:
      block_b: rows per tile, a multiple of 8; rounded up to 16 for 16-bit inputs (bf16
        tiling) and clamped to the padded ``B``.
      block_l: tokens per tile, a multiple of 128; clamped to the padded ``L``.
    """

    block_b: int = 16
    block_l: int = 1024

    def __post_init__(self):
        if self.block_b < 8 or self.block_b % 8:
            raise ValueError(f"block_b must be a positive multiple of 8, got {self.block_b}")
        if self.block_l < _LANES or self.block_l % _LANES:
            raise ValueError(f"block_l must be a positive multiple of {_LANES}, "
                             f"got {self.block_l}")


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static configuration shared by the forward and backward kernels."""

    loss_type: str
    epsilon_low: float
    epsilon_high: float
    clip_ratio_c: float | None
    kl_estimator: str
    max_completion_length: int | None
    has_ref: bool
    has_entropy: bool
    token_advantages: bool
    block_b: int
    block_l: int
    interpret: bool | pltpu.InterpretParams
    mesh: jax.sharding.Mesh | None = None
    batch_axes: tuple[str, ...] = ()


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


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
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool | pltpu.InterpretParams = False,
    mesh: jax.sharding.Mesh | None = None,
    batch_axes: str | tuple[str, ...] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped token-level policy loss and its metrics (validates, then runs a jitted core).

    Args:
      logp: float ``[B, L]`` (f32 or bf16) sampled-token log-probs of the current policy.
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
      block_sizes: static tiling.
      interpret: True (or ``pltpu.InterpretParams()``, which models TPU block write-back) runs
        the kernels in the Pallas interpreter, on any backend (CPU tests).
      mesh, batch_axes: for ``[B, ...]`` arrays sharded over the mesh axes ``batch_axes``
        (e.g. the trainer's "batch" rule): the kernels then run per shard under
        ``jax.shard_map`` (they are row-local), and only the ``[B]``-sized epilogue is global.
        ``pallas_call`` is not auto-partitioned, so without them XLA gathers whole arrays.

    Returns:
      ``(loss f32[], metrics)`` exactly as the reference ``policy_loss`` of ``rl/losses.py``
      with ``policy_loss_mode="ppo"`` and no ``sampler_logp``: "clip_frac_low",
      "clip_frac_high", "ratio_mean", "ratio_max", ["clip_frac_dual"], "kl", "entropy",
      "pg_loss".

    Raises:
      ValueError: a ``loss_type`` or ``kl_estimator`` outside ``SUPPORTS`` (even if registered
        in ``rl/losses.py``), and the argument errors of the reference.
    """
    check_fused_arguments("policy_loss", SUPPORTS, logp, old_logp, advantages, mask,
                          loss_type, epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
                          max_completion_length, entropy, entropy_coef, clip_ratio_c)
    return _policy_loss_jit(
        logp, old_logp, advantages, mask, beta, ref_logp, num_tokens_global, num_sequences,
        entropy, entropy_coef, loss_type=loss_type, epsilon_low=float(epsilon_low),
        epsilon_high=float(epsilon_high), max_completion_length=max_completion_length,
        kl_estimator=kl_estimator, clip_ratio_c=clip_ratio_c, block_sizes=block_sizes,
        interpret=interpret, mesh=mesh,
        batch_axes=(batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes or ()))


def check_fused_arguments(kernel, supports, logp, old_logp, advantages, mask, loss_type,
                          epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
                          max_completion_length, entropy, entropy_coef, clip_ratio_c) -> None:
    """The argument checks of a fused policy loss (this module's or ``policy_loss_gpu``'s):
    ``loss_type`` and ``kl_estimator`` inside ``supports`` (the kernel's ``SUPPORTS``), then
    the reference's checks of the options and shapes (mode "ppo", no TIS). Raises ValueError
    or TypeError naming the argument."""
    check_supported(kernel, supports, loss_type=loss_type, kl_estimator=kl_estimator)
    check_policy_loss_options(
        loss_type, epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
        max_completion_length, entropy, entropy_coef, "ppo", clip_ratio_c, None, None,
        loss_types=supports["loss_type"], kl_estimators=supports["kl_estimator"],
        policy_loss_modes=supports["policy_loss_mode"], dual_clip_modes=("ppo",))
    check_policy_loss_shapes(logp, old_logp, advantages, mask, ref_logp, entropy)


@functools.partial(jax.jit, static_argnames=(
    "loss_type", "epsilon_low", "epsilon_high", "max_completion_length", "kl_estimator",
    "clip_ratio_c", "block_sizes", "interpret", "mesh", "batch_axes"))
def _policy_loss_jit(logp, old_logp, advantages, mask, beta, ref_logp, num_tokens_global,
                     num_sequences, entropy, entropy_coef, *, loss_type, epsilon_low,
                     epsilon_high, max_completion_length, kl_estimator, clip_ratio_c,
                     block_sizes, interpret, mesh, batch_axes):
    """Casts scalars, pads ``[B, L]`` to whole blocks (mask 0) and calls the custom_vjp."""
    b, length = logp.shape
    shards = 1 if mesh is None else int(np.prod([mesh.shape[a] for a in batch_axes]))
    arrays = [a for a in (logp, old_logp, ref_logp, entropy) if a is not None]
    sublanes = max([8] + [32 // jnp.dtype(a.dtype).itemsize for a in arrays])
    block_b = _round_up(min(block_sizes.block_b, _round_up(-(-b // shards), sublanes)),
                        sublanes)
    block_l = min(block_sizes.block_l, _round_up(length, _LANES))
    pad_b = _round_up(b, block_b * shards) - b
    pad_l = _round_up(length, block_l) - length

    def pad(x):
        return None if x is None else jnp.pad(x, ((0, pad_b), (0, pad_l))[:x.ndim])

    adv = jnp.asarray(advantages, jnp.float32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    adv = jnp.pad(adv, ((0, pad_b), (0, pad_l if adv.shape[1] > 1 else 0)))
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    cfg = _Config(loss_type, epsilon_low, epsilon_high, clip_ratio_c, kl_estimator,
                  max_completion_length, ref_logp is not None, entropy is not None,
                  jnp.ndim(advantages) == 2, block_b, block_l, interpret, mesh, batch_axes)
    return _policy_loss(
        cfg, pad(logp), pad(old_logp), pad(ref_logp), adv, pad(f32(mask)), pad(entropy),
        f32(beta if ref_logp is not None else 0.0),
        f32(entropy_coef if entropy is not None else 0.0),
        f32(b if num_sequences is None else num_sequences),
        None if num_tokens_global is None else f32(num_tokens_global))


# ----------------------------------------------------------------------------- custom_vjp


def make_custom_loss(forward_call, backward_call):
    """The loss with its custom VJP around one backend's kernel calls (Mosaic here, Triton in
    ``policy_loss_gpu``): the ``[B]``-sized epilogue (normalizers, loss, metrics) and the
    cotangents are shared; only the kernels differ.

    Args:
      forward_call: ``(cfg, logp, old_logp, ref_logp, adv, mask, entropy) -> rows`` f32
        ``[B, >= Stat.MAX + 1]``, per-row statistics in the lanes ``Stat.N`` ... ``Stat.MAX``.
      backward_call: ``(cfg, scalars f32[2] (beta, entropy_coef), logp, old_logp, ref_logp,
        adv, mask, entropy, row_grad f32[B, 1]) -> (dlogp, dentropy or None)``.
    Returns: ``loss(cfg, logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef,
      num_sequences, num_tokens_global) -> (loss f32[], metrics)``.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def loss(cfg, logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef,
             num_sequences, num_tokens_global):
        return fwd(cfg, logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef,
                   num_sequences, num_tokens_global)[0]

    def fwd(cfg, logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef,
            num_sequences, num_tokens_global):
        rows = forward_call(cfg, logp, old_logp, ref_logp, adv, mask, entropy)
        n_b = rows[:, Stat.N]
        total = jnp.sum(n_b)
        if cfg.loss_type == "grpo":
            weight = 1.0 / (jnp.maximum(n_b, 1.0) * num_sequences)
        elif cfg.loss_type == "dr_grpo":
            weight = jnp.broadcast_to(1.0 / (num_sequences * cfg.max_completion_length),
                                      n_b.shape)
        elif cfg.loss_type in ("bnpo", "dapo"):  # token mean over this / the global batch
            count = total if num_tokens_global is None else num_tokens_global
            weight = jnp.broadcast_to(1.0 / jnp.maximum(count, 1.0), n_b.shape)
        else:  # unreachable past check_supported; never weight a new type as another one
            raise ValueError(f"policy_loss kernel: no row weights for loss_type "
                             f"{cfg.loss_type!r}")
        pg_loss, kl_agg, ent_agg = (jnp.sum(weight * rows[:, k])
                                    for k in (Stat.PG, Stat.KL, Stat.ENT))
        value = pg_loss + beta * kl_agg - entropy_coef * ent_agg

        denom = jnp.maximum(total, 1.0)
        metrics = {
            "clip_frac_low": jnp.sum(rows[:, Stat.LOW]) / denom,
            "clip_frac_high": jnp.sum(rows[:, Stat.HIGH]) / denom,
            "ratio_mean": jnp.sum(rows[:, Stat.RATIO]) / denom,
            "ratio_max": jnp.max(rows[:, Stat.MAX]),
        }
        if cfg.clip_ratio_c is not None:
            metrics["clip_frac_dual"] = jnp.sum(rows[:, Stat.DUAL]) / denom
        metrics.update(kl=jnp.sum(rows[:, Stat.KL]) / denom,
                       entropy=jnp.sum(rows[:, Stat.ENT]) / denom, pg_loss=pg_loss)
        residuals = (logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef,
                     num_sequences, num_tokens_global, weight, kl_agg, ent_agg)
        return (value, metrics), residuals

    def bwd(cfg, residuals, cotangents):
        (logp, old_logp, ref_logp, adv, mask, entropy, beta, entropy_coef, num_sequences,
         num_tokens_global, weight, kl_agg, ent_agg) = residuals
        g = cotangents[0]  # metrics are stop-gradient values: their cotangents are ignored
        scalars = jnp.stack([beta, entropy_coef]).astype(jnp.float32)
        dlogp, dent = backward_call(cfg, scalars, logp, old_logp, ref_logp, adv, mask, entropy,
                                    (g * weight)[:, None])

        def zeros(x):
            return None if x is None else jnp.zeros_like(x)

        return (dlogp, zeros(old_logp), zeros(ref_logp), zeros(adv), zeros(mask), dent,
                g * kl_agg, -g * ent_agg, zeros(num_sequences), zeros(num_tokens_global))

    loss.defvjp(fwd, bwd)
    return loss


# ----------------------------------------------------------------------------- pallas calls


def _token_specs(cfg, with_ref, with_entropy):
    """BlockSpecs of (logp, old_logp, [ref_logp], adv, mask, [entropy]); the index maps take
    the grid indices (and the scalar-prefetch ref, when there is one)."""
    tile = pl.BlockSpec((cfg.block_b, cfg.block_l), lambda i, j, *_: (i, j))
    adv = tile if cfg.token_advantages else pl.BlockSpec((cfg.block_b, 1),
                                                         lambda i, j, *_: (i, 0))
    return [tile, tile] + [tile] * with_ref + [adv, tile] + [tile] * with_entropy


def _cost(cfg, inputs, out_bytes, flops_per_token):
    """Advisory cost for XLA's scheduler: elementwise work on every token of [Bp, Lp]."""
    tokens = inputs[0].size
    exps = 1 + (cfg.has_ref and cfg.kl_estimator == "k3")
    in_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in inputs)
    return pl.CostEstimate(flops=flops_per_token * tokens, transcendentals=exps * tokens,
                           bytes_accessed=in_bytes + out_bytes)


def per_shard(cfg, call, num_replicated=0):
    """``call`` as is, or under ``shard_map`` over the rows when ``cfg.mesh`` is set (the
    first ``num_replicated`` arguments, scalars, are replicated). ``cfg`` needs ``mesh`` and
    ``batch_axes``; ``call``'s other arguments and its outputs are ``[B, ...]`` row-sharded."""
    if cfg.mesh is None:
        return call
    rows = jax.sharding.PartitionSpec(cfg.batch_axes)

    def specs(n):
        return (jax.sharding.PartitionSpec(),) * num_replicated + (rows,) * n

    def wrapped(*args):
        return jax.shard_map(call, mesh=cfg.mesh, in_specs=specs(len(args) - num_replicated),
                             out_specs=rows, check_vma=False)(*args)

    return wrapped


def _forward_call(cfg, logp, old_logp, ref_logp, adv, mask, entropy):
    """Per-row statistics f32[Bp, 128] (lanes ``Stat.N`` ... ``Stat.MAX``)."""
    def call(*inputs):
        bp, lp = inputs[0].shape  # this shard's
        return pl.pallas_call(
            functools.partial(_forward_kernel, cfg=cfg),
            grid=(bp // cfg.block_b, lp // cfg.block_l),
            in_specs=_token_specs(cfg, cfg.has_ref, cfg.has_entropy),
            out_specs=pl.BlockSpec((cfg.block_b, _LANES), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((bp, _LANES), jnp.float32),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")),
            cost_estimate=_cost(cfg, inputs, bp * _LANES * 4, 40),
            interpret=cfg.interpret,
        )(*inputs)

    inputs = [x for x in (logp, old_logp, ref_logp, adv, mask, entropy) if x is not None]
    return per_shard(cfg, call)(*inputs)


def _backward_call(cfg, scalars, logp, old_logp, ref_logp, adv, mask, entropy, row_grad):
    """(d loss / d logp [Bp, Lp] in logp's dtype, d loss / d entropy or None)."""
    ent_dtype = None if entropy is None else entropy.dtype

    def call(scalars, *inputs):
        bp, lp = inputs[0].shape  # this shard's
        tile = pl.BlockSpec((cfg.block_b, cfg.block_l), lambda i, j, s: (i, j))
        column = pl.BlockSpec((cfg.block_b, 1), lambda i, j, s: (i, 0))
        out_shape = [jax.ShapeDtypeStruct((bp, lp), inputs[0].dtype)] + (
            [jax.ShapeDtypeStruct((bp, lp), ent_dtype)] if cfg.has_entropy else [])
        return tuple(pl.pallas_call(
            functools.partial(_backward_kernel, cfg=cfg),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(bp // cfg.block_b, lp // cfg.block_l),
                in_specs=_token_specs(cfg, cfg.has_ref, False) + [column],
                out_specs=[tile] * len(out_shape)),
            out_shape=out_shape,
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel")),
            cost_estimate=_cost(cfg, inputs, sum(s.size * jnp.dtype(s.dtype).itemsize
                                                 for s in out_shape), 20),
            interpret=cfg.interpret,
        )(scalars, *inputs))

    inputs = [x for x in (logp, old_logp, ref_logp, adv, mask) if x is not None]
    outs = per_shard(cfg, call, num_replicated=1)(scalars, *inputs, row_grad)
    return outs[0], (outs[1] if cfg.has_entropy else None)


# ----------------------------------------------------------------------------- kernel bodies


_policy_loss = make_custom_loss(_forward_call, _backward_call)


def _load_tokens(cfg, refs):
    """Reads one tile: (mask, valid, logp, old_logp, ref_logp|None, adv), all f32, cleaned."""
    logp_ref, old_ref = refs[0], refs[1]
    ref_ref = refs[2] if cfg.has_ref else None
    adv_ref, mask_ref = refs[2 + cfg.has_ref], refs[3 + cfg.has_ref]
    m = mask_ref[...].astype(jnp.float32)
    valid = m != 0

    def clean(ref):
        return jnp.where(valid, ref[...].astype(jnp.float32), 0.0)

    adv = clean(adv_ref) if cfg.token_advantages else adv_ref[...]
    ref_logp = clean(ref_ref) if cfg.has_ref else None
    return m, valid, clean(logp_ref), clean(old_ref), ref_logp, adv


def _forward_kernel(*refs, cfg):
    """Accumulates one ``(block_b, block_l)`` tile into the row statistics ``out_ref``."""
    out_ref = refs[-1]
    m, valid, logp, old_logp, ref_logp, adv = _load_tokens(cfg, refs)

    @pl.when(pl.program_id(1) == 0)
    def _init():
        out_ref[...] = jnp.zeros_like(out_ref)

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
        columns[Stat.ENT] = jnp.where(valid, refs[-2][...].astype(jnp.float32), 0.0) * m

    lane = jax.lax.broadcasted_iota(jnp.int32, out_ref.shape, 1)
    update = jnp.zeros(out_ref.shape, jnp.float32)
    for k, x in columns.items():
        update = jnp.where(lane == k, jnp.sum(x, axis=1, keepdims=True), update)
    row_max = jnp.max(jnp.where(valid, ratio, 0.0), axis=1, keepdims=True)
    acc = out_ref[...]
    out_ref[...] = jnp.where(lane == Stat.MAX, jnp.maximum(acc, row_max), acc + update)


def surrogate_grad(cfg, ratio, adv):
    """``d pg / d logp`` of ``pg = clipped_surrogate(ratio, adv, ...)`` with ``ratio =
    exp(logp - old_logp)`` (f32, broadcast shape of ``ratio`` and ``adv``): ``-r A`` where the
    unclipped branch is selected, 0 where the clip or the dual clip (``cfg.clip_ratio_c``)
    is active. ``cfg`` needs ``epsilon_low``, ``epsilon_high`` and ``clip_ratio_c``."""
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high) * adv
    dpg = jnp.where(unclipped <= clipped, -unclipped, 0.0)
    if cfg.clip_ratio_c is not None:
        dual = (adv < 0) & (-jnp.minimum(unclipped, clipped) > -cfg.clip_ratio_c * adv)
        dpg = jnp.where(dual, 0.0, dpg)
    return dpg


def _backward_kernel(scalars_ref, *refs, cfg):
    """``d loss / d logp`` (and ``d loss / d entropy``) of one tile."""
    dent_ref = refs[-1] if cfg.has_entropy else None
    dlogp_ref = refs[-2] if cfg.has_entropy else refs[-1]
    row_grad_ref = refs[-3] if cfg.has_entropy else refs[-2]
    m, _, logp, old_logp, ref_logp, adv = _load_tokens(cfg, refs)
    w = row_grad_ref[...] * m  # g * w_b * m_bt

    dtok = surrogate_grad(cfg, jnp.exp(logp - old_logp), adv)
    if cfg.has_ref:
        dtok = dtok + scalars_ref[0] * KL_FORMULAS[cfg.kl_estimator][1](logp, ref_logp)
    dlogp_ref[...] = (w * dtok).astype(dlogp_ref.dtype)
    if cfg.has_entropy:
        dent_ref[...] = (-scalars_ref[1] * w).astype(dent_ref.dtype)
