"""Group-relative advantages as Pallas Triton (GPU) kernels (forward only: advantages are
constants). The GPU twin of ``group_advantage.py``: same entry point, same results.

Computes, for rewards ``[N]`` laid out group-major (``N = num_groups * G``), the advantages of
``rl/advantages.py``'s ``group_advantages`` for the estimators of ``SUPPORTS`` ("grpo", "rloo",
"reinforce_pp") and scale ("group", "batch", "none"), plus the per-group statistics of
``group_stats`` (mean, std, zero-variance mask).

Layout: the wrapper reshapes the rewards to ``[num_groups, G]`` (a group on a row, no
padding in HBM). Each Triton program owns ``block_groups`` rows and loads them as one
``(block_groups, next_pow2(G))`` tile (Triton tensors have power-of-two shapes); masks
(``lane < G``, ``row < num_groups``) keep the out-of-range slots out of every statistic and
out of every store.

Triton programs run in parallel and keep nothing between grid steps, so the batch-wide
statistics of the TPU kernel's sequential phases become separate ``pallas_call``s whose
per-group partial results are reduced in jnp:

- "mean" (only for "reinforce_pp"): per-group sum, max and min -> batch mean and "the whole
  batch is constant";
- "var" (only for scale "batch"): per-group sum and sum of squares of the *centered* values ->
  batch std ``sqrt((s1_sq - s1**2 / N) / max(N - ddof, 1))`` (as the TPU kernel; the centered
  values have a mean of ~0 for every estimator, so the one-pass form loses no precision);
- "write": advantages and per-group statistics, given those batch scalars (an f32 ``[4]``
  input read with scalar loads: Triton has no SMEM scalar prefetch).

The reference is the jnp implementation ``rl/advantages.py``'s ``group_advantages`` and
``group_stats``; results agree to float32 round-off (reduction order differs). ``SUPPORTS``
lists what the kernels implement; they refuse anything else.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxrl_reason.kernels.checks import check_group_args, check_supported
from jaxrl_reason.kernels.group_advantage import safe_sqrt

__all__ = ["MAX_GROUP_SIZE", "SUPPORTS", "BlockSizes", "group_advantage"]

SUPPORTS = types.MappingProxyType({
    "estimator": frozenset({"grpo", "rloo", "reinforce_pp"}),
    "scale": frozenset({"group", "batch", "none"}),
})
"""What the kernels implement: option -> values (as the TPU kernel). Anything else is refused
here and computed by the jnp reference (``rl/backends.py`` routes it)."""

MAX_GROUP_SIZE = 1 << 16
"""Largest ``G``: a group is one Triton tile of ``next_pow2(G)`` lanes."""
_MAX_TILE_ELEMENTS = 1 << 13  # per program: block_groups * next_pow2(G)
# Slots of the f32[4] batch-scalar input of the "var" and "write" kernels.
_MEAN, _CONSTANT, _STD = range(3)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Triton tiling of the ``[num_groups, G]`` reward matrix.

    Attributes:
      block_groups: groups (rows) per program, a power of two. Clamped to
        ``next_pow2(num_groups)`` and lowered for large ``G`` so that one tile holds at most
        8192 rewards.
      num_warps: Triton warps per program (a power of two).
    """

    block_groups: int = 64
    num_warps: int = 4

    def __post_init__(self):
        for name in ("block_groups", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a positive power of two, got {value}")


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
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Advantages and per-group reward statistics with Triton kernels (jitted).

    Args:
      rewards: real ``[N]``, group-major (rows ``[g*G:(g+1)*G]`` belong to prompt ``g``); cast
        to float32. ``N`` must be a positive multiple of ``group_size``.
      group_size: ``G`` (static int, 1 <= G <= ``MAX_GROUP_SIZE``; >= 2 for "rloo").
      estimator: "grpo", "rloo" or "reinforce_pp" (static; ``SUPPORTS["estimator"]``).
      scale: "group", "batch" or "none" (static; ``SUPPORTS["scale"]``).
      eps: static float >= 0 added to the std before dividing.
      ddof: 0 (population std) or 1 (Bessel).
      block_sizes: Triton tiling (static); None for the defaults.
      interpret: run the kernels in the Pallas interpreter, on any backend (CPU tests).

    Returns:
      ``(advantages, stats)``: advantages float32 ``[N]`` equal to
      ``rl/advantages.py``'s ``group_advantages`` and ``stats`` equal to ``group_stats``:
      "mean" float32 ``[N // G]``, "std" float32 ``[N // G]``, "zero_variance" bool ``[N // G]``.

    Raises:
      ValueError / TypeError: an estimator or scale outside ``SUPPORTS``, the argument errors
        of the reference (``rl/advantages.py``'s ``group_advantages``), and
        ``G > MAX_GROUP_SIZE``.
    """
    check_supported("group_advantage_gpu", SUPPORTS, estimator=estimator, scale=scale)
    check_group_args(rewards, group_size, ddof, eps)
    if estimator == "rloo" and group_size < 2:
        raise ValueError(f"estimator 'rloo' needs group_size >= 2, got {group_size}")
    if group_size > MAX_GROUP_SIZE:
        raise ValueError(f"group_size {group_size} > {MAX_GROUP_SIZE}: a group must fit one "
                         f"Triton tile; use the jnp reference")

    blocks = block_sizes or BlockSizes()
    num_groups = rewards.shape[0] // group_size
    lanes = pl.next_power_of_2(group_size)
    block_groups = max(1, min(blocks.block_groups, pl.next_power_of_2(num_groups),
                              _MAX_TILE_ELEMENTS // lanes))
    grouped = jnp.asarray(rewards, jnp.float32).reshape(num_groups, group_size)
    call = functools.partial(_call, grouped, estimator=estimator, eps=float(eps), ddof=ddof,
                             block_groups=block_groups, lanes=lanes,
                             num_warps=blocks.num_warps, interpret=interpret)
    n = float(num_groups * group_size)

    batch = jnp.zeros((4,), jnp.float32)  # _MEAN, _CONSTANT, _STD
    if estimator == "reinforce_pp":
        g_sum, g_max, g_min = call("mean", batch)
        batch = batch.at[_MEAN].set(jnp.sum(g_sum) / n)
        batch = batch.at[_CONSTANT].set((jnp.max(g_max) == jnp.min(g_min)).astype(jnp.float32))
    if scale == "batch":
        s1, s2 = (jnp.sum(x) for x in call("var", batch))
        var = jnp.maximum(s2 - s1 * s1 / n, 0.0) / max(n - ddof, 1.0)
        batch = batch.at[_STD].set(safe_sqrt(var))
    adv, mean, std, zero_var = call(f"write_{scale}", batch)
    stats = {"mean": mean, "std": std, "zero_variance": zero_var != 0}
    return adv.reshape(-1), stats


def _call(grouped, phase, batch, *, estimator, eps, ddof, block_groups, lanes, num_warps,
          interpret):
    """One ``pallas_call`` of ``phase`` over the ``[num_groups, G]`` rewards."""
    num_groups, group_size = grouped.shape
    per_group = jax.ShapeDtypeStruct((num_groups,), jnp.float32)
    if phase == "mean":
        out_shape = [per_group] * 3  # sum, max, min
    elif phase == "var":
        out_shape = [per_group] * 2  # sum, sum of squares of the centered values
    else:
        out_shape = [jax.ShapeDtypeStruct((num_groups, group_size), jnp.float32), per_group,
                     per_group, jax.ShapeDtypeStruct((num_groups,), jnp.int32)]
    kernel = functools.partial(_advantage_kernel, phase=phase, estimator=estimator, eps=eps,
                               ddof=ddof, block_groups=block_groups, lanes=lanes)
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(num_groups, block_groups),),
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name=f"group_advantage_{phase}",
    )(grouped, batch)


# ----------------------------------------------------------------------------- kernel body


def _advantage_kernel(r_ref, batch_ref, *out_refs, phase, estimator, eps, ddof, block_groups,
                      lanes):
    """One ``(block_groups, lanes)`` tile of one phase (see the module docstring)."""
    num_groups, group_size = r_ref.shape
    n = float(num_groups * group_size)
    start = pl.program_id(0) * block_groups
    rows = pl.ds(start, block_groups)
    row_ok = start + jnp.arange(block_groups) < num_groups
    in_group = (jnp.arange(lanes) < group_size)[None, :]
    valid = row_ok[:, None] & in_group
    r = pltriton.load(r_ref.at[rows, pl.ds(0, lanes)], mask=valid, other=0.0)

    g_sum = jnp.sum(r, axis=1, keepdims=True)
    g_max = jnp.max(jnp.where(in_group, r, -jnp.inf), axis=1, keepdims=True)
    g_min = jnp.min(jnp.where(in_group, r, jnp.inf), axis=1, keepdims=True)

    def store_rows(ref, x):
        pltriton.store(ref.at[rows], x[:, 0].astype(ref.dtype), mask=row_ok)

    if phase == "mean":
        for ref, x in zip(out_refs, (g_sum, g_max, g_min)):
            store_rows(ref, x)
        return

    g_mean = g_sum / group_size
    zero_var = g_max == g_min
    if estimator == "grpo":
        centered = jnp.where(zero_var, 0.0, r - g_mean)
    elif estimator == "rloo":
        centered = jnp.where(zero_var, 0.0, r - (g_sum - r) / (group_size - 1))
    else:  # reinforce_pp
        centered = jnp.where(batch_ref[_CONSTANT] != 0, 0.0, r - batch_ref[_MEAN])
    centered = jnp.where(valid, centered, 0.0)

    if phase == "var":
        s1_ref, s2_ref = out_refs
        store_rows(s1_ref, jnp.sum(centered, axis=1, keepdims=True))
        store_rows(s2_ref, jnp.sum(centered * centered, axis=1, keepdims=True))
        return

    adv_ref, mean_ref, std_ref, zv_ref = out_refs
    dev = jnp.where(in_group, r - g_mean, 0.0)
    g_std = safe_sqrt(jnp.sum(dev * dev, axis=1, keepdims=True) / max(group_size - ddof, 1))
    if phase == "write_group":
        adv = jnp.where(zero_var, 0.0, centered / (g_std + eps))
    elif phase == "write_batch":
        b_std = batch_ref[_STD]
        adv = jnp.where(b_std > 0, centered / (b_std + eps), 0.0)
    else:  # write_none
        adv = centered
    pltriton.store(adv_ref.at[rows, pl.ds(0, lanes)], adv, mask=valid)
    store_rows(mean_ref, g_mean)
    store_rows(std_ref, g_std)
    store_rows(zv_ref, zero_var)
