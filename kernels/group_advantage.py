"""Group-relative advantages as a Pallas TPU kernel (forward only: advantages are constants).

Computes, for rewards ``[N]`` laid out group-major (``N = num_groups * G``), the advantages of
``rl/advantages.py``'s ``group_advantages`` for the estimators of ``SUPPORTS`` ("grpo", "rloo",
"reinforce_pp") and scale ("group", "batch", "none"), plus the per-group statistics of
``group_stats`` (mean, std, zero-variance mask), in one ``pallas_call``.

Layout: the wrapper reshapes the rewards to ``[num_groups, G]`` (a group on a row) and pads it
to the TPU tile: rows to a multiple of ``block_groups`` (itself a multiple of 8), lanes to a
multiple of 128. In-kernel masks (``lane < G``, ``row < num_groups``) keep the padding out of
every statistic; the wrapper slices it off.

Grid ``(num_phases, num_row_blocks)``. Group-relative estimators with a "group"/"none" scale
need only their own row, so there is one phase and the row axis is "parallel". Global
statistics take extra phases of the same call, each reading the rewards once more and
accumulating into VMEM scratch (both axes then "arbitrary", i.e. sequential):

- "mean" (only for "reinforce_pp"): batch sum, max and min of the rewards -> batch mean and
  "the whole batch is constant";
- "var" (only for scale "batch"): sum and sum of squares of the *centered* values; the batch
  std is ``sqrt((s2 - s1**2 / N) / max(N - ddof, 1))``. The centered values have a mean of
  (almost exactly) 0 for every estimator, so this one-pass form loses no precision against
  the reference's two-pass ``_std``;
- "write": advantages and per-group statistics. Output blocks map to block 0 during the
  earlier phases and are first written in this one (the flash-attention accumulator trick), so
  nothing stale is written back.

The reference is the jnp implementation ``rl/advantages.py``'s ``group_advantages`` and
``group_stats`` (this module imports nothing from ``rl``: the tests compare the two); results
agree to float32 round-off (reduction order differs). ``SUPPORTS`` lists what the kernel
implements; it refuses anything else rather than compute a neighbouring formula.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxrl_reason.kernels.checks import check_group_args, check_supported

__all__ = ["SUPPORTS", "BlockSizes", "group_advantage", "safe_sqrt"]

SUPPORTS = types.MappingProxyType({
    "estimator": frozenset({"grpo", "rloo", "reinforce_pp"}),
    "scale": frozenset({"group", "batch", "none"}),
})
"""What the kernel implements: option -> values. Any other registered estimator or scale is
refused here and computed by the jnp reference (``rl/backends.py`` routes it)."""

_LANES, _SUBLANES = 128, 8
_MAX_TILE_ELEMENTS = 1 << 18  # 1 MiB of f32 per (block_groups, padded G) tile


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiling of the ``[num_groups, G]`` reward matrix.

    Attributes:
      block_groups: groups (rows) per tile, a multiple of 8. Clamped to the padded number of
        groups, and lowered for very large ``G`` so one tile stays under 1 MiB of VMEM.
    """

    block_groups: int = 256

    def __post_init__(self):
        if self.block_groups < _SUBLANES or self.block_groups % _SUBLANES:
            raise ValueError(f"block_groups must be a positive multiple of {_SUBLANES}, "
                             f"got {self.block_groups}")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


# ----------------------------------------------------------------------------- public entry


@functools.partial(jax.jit, static_argnames=("group_size", "estimator", "scale", "eps", "ddof",
                                             "block_sizes", "interpret"))
def group_advantage(
    rewards: jax.Array,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-6,
    ddof: int = 0,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool | pltpu.InterpretParams = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Advantages and per-group reward statistics in one Pallas call (jitted).

    Args:
      rewards: real ``[N]``, group-major (rows ``[g*G:(g+1)*G]`` belong to prompt ``g``); cast
        to float32. ``N`` must be a positive multiple of ``group_size``.
      group_size: ``G`` (static int >= 1; >= 2 for "rloo").
      estimator: "grpo", "rloo" or "reinforce_pp" (static; ``SUPPORTS["estimator"]``).
      scale: "group", "batch" or "none" (static; ``SUPPORTS["scale"]``).
      eps: static float >= 0 added to the std before dividing.
      ddof: 0 (population std) or 1 (Bessel).
      block_sizes: tiling (static).
      interpret: True (or ``pltpu.InterpretParams()``, which models TPU block write-back) runs
        the kernel in the Pallas interpreter, on any backend (CPU tests).

    Returns:
      ``(advantages, stats)``: advantages float32 ``[N]`` equal to
      ``rl/advantages.py``'s ``group_advantages`` and ``stats`` equal to ``group_stats``:
      "mean" float32 ``[N // G]``, "std" float32 ``[N // G]``, "zero_variance" bool ``[N // G]``.

    Raises:
      ValueError: an estimator or scale outside ``SUPPORTS`` (even if registered in
        ``rl/advantages.py``), and the argument errors of the reference.
      TypeError: ``group_size`` is not a Python int.
    """
    check_supported("group_advantage", SUPPORTS, estimator=estimator, scale=scale)
    check_group_args(rewards, group_size, ddof, eps)
    if estimator == "rloo" and group_size < 2:
        raise ValueError(f"estimator 'rloo' needs group_size >= 2, got {group_size}")

    num_groups = rewards.shape[0] // group_size
    padded_g = _round_up(group_size, _LANES)
    rows_cap = max(_SUBLANES, _MAX_TILE_ELEMENTS // padded_g // _SUBLANES * _SUBLANES)
    block_groups = min(block_sizes.block_groups, rows_cap, _round_up(num_groups, _SUBLANES))
    padded_rows = _round_up(num_groups, block_groups)
    grouped = jnp.asarray(rewards, jnp.float32).reshape(num_groups, group_size)
    grouped = jnp.pad(grouped, ((0, padded_rows - num_groups), (0, padded_g - group_size)))

    adv, mean, std, zero_var = _group_advantage_call(
        grouped, group_size=group_size, num_groups=num_groups, estimator=estimator,
        scale=scale, eps=float(eps), ddof=ddof, block_groups=block_groups, interpret=interpret)
    stats = {"mean": mean[:num_groups, 0], "std": std[:num_groups, 0],
             "zero_variance": zero_var[:num_groups, 0] != 0}
    return adv[:num_groups, :group_size].reshape(-1), stats


def _group_advantage_call(grouped, *, group_size, num_groups, estimator, scale, eps, ddof,
                          block_groups, interpret):
    """pallas_call over the padded ``[padded_rows, padded_g]`` rewards."""
    padded_rows, padded_g = grouped.shape
    phases = (("mean",) if estimator == "reinforce_pp" else ()) + (
        ("var",) if scale == "batch" else ()) + ("write",)
    last = len(phases) - 1
    num_blocks = padded_rows // block_groups
    kernel = functools.partial(
        _advantage_kernel, phases=phases, estimator=estimator, scale=scale, eps=eps, ddof=ddof,
        group_size=group_size, num_groups=num_groups, block_groups=block_groups)

    def out_map(p, i):
        return (jnp.where(p == last, i, 0), 0)  # stay on block 0 until the "write" phase

    row_stat = pl.BlockSpec((block_groups, 1), out_map)
    semantics = ("parallel",) * 2 if len(phases) == 1 else ("arbitrary",) * 2
    return pl.pallas_call(
        kernel,
        grid=(len(phases), num_blocks),
        in_specs=[pl.BlockSpec((block_groups, padded_g), lambda p, i: (i, 0))],
        out_specs=[pl.BlockSpec((block_groups, padded_g), out_map), row_stat, row_stat,
                   row_stat],
        out_shape=[jax.ShapeDtypeStruct((padded_rows, padded_g), jnp.float32),
                   jax.ShapeDtypeStruct((padded_rows, 1), jnp.float32),
                   jax.ShapeDtypeStruct((padded_rows, 1), jnp.float32),
                   jax.ShapeDtypeStruct((padded_rows, 1), jnp.int32)],
        scratch_shapes=[pltpu.VMEM((1, 1), jnp.float32) for _ in range(5)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        cost_estimate=pl.CostEstimate(flops=20 * len(phases) * grouped.size, transcendentals=0,
                                      bytes_accessed=(len(phases) + 1) * grouped.nbytes),
        interpret=interpret,
    )(grouped)


# ----------------------------------------------------------------------------- kernel body


def _total(x):
    """(rows, lanes) -> (1, 1) sum, as two single-axis reductions (Mosaic-friendly)."""
    return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)


def safe_sqrt(var):
    """sqrt(var) where var > 0, else 0; no NaN gradient at 0 (any shape, float32)."""
    positive = var > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, var, 1.0)), 0.0)


def _advantage_kernel(r_ref, adv_ref, mean_ref, std_ref, zv_ref,
                      sum_ref, max_ref, min_ref, s1_ref, s2_ref, *,
                      phases, estimator, scale, eps, ddof, group_size, num_groups,
                      block_groups):
    """One ``(block_groups, padded_g)`` tile of one phase (see the module docstring)."""
    phase, block = pl.program_id(0), pl.program_id(1)
    n = float(num_groups * group_size)
    shape = r_ref.shape
    lane = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    row = block * block_groups + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    in_group = lane < group_size
    valid = in_group & (row < num_groups)
    r = jnp.where(in_group, r_ref[...], 0.0)

    g_sum = jnp.sum(r, axis=1, keepdims=True)
    g_mean = g_sum / group_size
    g_max = jnp.max(jnp.where(in_group, r, -jnp.inf), axis=1, keepdims=True)
    g_min = jnp.min(jnp.where(in_group, r, jnp.inf), axis=1, keepdims=True)
    zero_var = g_max == g_min

    def centered():
        if estimator == "grpo":
            return jnp.where(zero_var, 0.0, r - g_mean)
        if estimator == "rloo":
            return jnp.where(zero_var, 0.0, r - (g_sum - r) / (group_size - 1))
        constant = max_ref[...] == min_ref[...]
        return jnp.where(constant, 0.0, r - sum_ref[...] / n)  # reinforce_pp

    @pl.when((phase == 0) & (block == 0))
    def _init():
        for ref in (sum_ref, s1_ref, s2_ref):
            ref[...] = jnp.zeros_like(ref)
        max_ref[...] = jnp.full_like(max_ref, -jnp.inf)
        min_ref[...] = jnp.full_like(min_ref, jnp.inf)

    for p, name in enumerate(phases):
        if name == "mean":
            @pl.when(phase == p)
            def _mean():
                sum_ref[...] += _total(jnp.where(valid, r, 0.0))
                max_ref[...] = jnp.maximum(max_ref[...], jnp.max(jnp.max(
                    jnp.where(valid, r, -jnp.inf), axis=1, keepdims=True), axis=0,
                    keepdims=True))
                min_ref[...] = jnp.minimum(min_ref[...], jnp.min(jnp.min(
                    jnp.where(valid, r, jnp.inf), axis=1, keepdims=True), axis=0,
                    keepdims=True))
        elif name == "var":
            @pl.when(phase == p)
            def _var():
                c = jnp.where(valid, centered(), 0.0)
                s1_ref[...] += _total(c)
                s2_ref[...] += _total(c * c)
        else:
            @pl.when(phase == p)
            def _write():
                dev = jnp.where(in_group, r - g_mean, 0.0)
                g_std = safe_sqrt(jnp.sum(dev * dev, axis=1, keepdims=True)
                                   / max(group_size - ddof, 1))
                c = centered()
                if scale == "group":
                    adv = jnp.where(zero_var, 0.0, c / (g_std + eps))
                elif scale == "batch":
                    s1 = s1_ref[...]
                    var = jnp.maximum(s2_ref[...] - s1 * s1 / n, 0.0) / max(n - ddof, 1.0)
                    b_std = safe_sqrt(var)
                    adv = jnp.where(b_std > 0, c / (b_std + eps), 0.0)
                else:
                    adv = c
                adv_ref[...] = jnp.where(in_group, adv, 0.0)
                mean_ref[...] = g_mean
                std_ref[...] = g_std
                zv_ref[...] = zero_var.astype(jnp.int32)
