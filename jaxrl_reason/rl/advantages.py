"""Advantage estimators for critic-free policy gradients (GRPO, Dr. GRPO, RLOO, REINFORCE++).

Every estimator turns one scalar reward per sampled completion into one scalar advantage per
completion; the loss broadcasts it over the completion's tokens.

Layout: rows are group-major. With ``G = group_size``, rows ``[g*G:(g+1)*G]`` are the ``G``
samples drawn for prompt ``g``, so ``rewards.reshape(num_groups, G)`` puts a group on a row.

An advantage is computed in two steps, each chosen by name:

1. centering (``estimator``, registry ``ADVANTAGE_ESTIMATORS``):
   - ``"grpo"``:         ``r_i - mean(group)``                      (DeepSeekMath GRPO)
   - ``"rloo"``:         ``r_i - mean(the other G-1 rewards of the group)``
                         (REINFORCE leave-one-out; equals ``G/(G-1) * (r_i - mean(group))``)
   - ``"reinforce_pp"``: ``r_i - mean(whole batch)``                (REINFORCE++ global baseline)
2. scaling (``scale``, registry ``ADVANTAGE_SCALES``):
   - ``"group"``: divide by the std of the raw rewards of the sample's group, plus ``eps``
   - ``"batch"``: divide by the std of the *centered* values over the whole batch, plus ``eps``
   - ``"none"``:  no division (``estimator="grpo", scale="none"`` is Dr. GRPO)

Standard deviation: population std (``ddof=0``) by default, as Tunix (``jnp.std``) and the
REINFORCE++ whitening do. TRL divides by ``torch.std`` which is Bessel-corrected (``ddof=1``);
pass ``ddof=1`` for parity with TRL. The divisor is ``max(G - ddof, 1)``, so ``G = 1`` never
divides by zero.

Deviations from the published methods / from TRL, on purpose:

- ``scale="batch"`` divides by the std of the centered values. TRL's ``scale_rewards="batch"``
  divides group-centered rewards by the std of the *raw* rewards over the batch. For
  ``"reinforce_pp"`` both are the same number (whitening); for ``"grpo"`` they differ.
- Zero-variance groups (all rewards equal, compared exactly) get an advantage of exactly 0
  with the group-relative estimators ("grpo", "rloo"), instead of a round-off residue divided
  by ``eps``. With ``scale="group"`` a zero-variance group gets 0 for every estimator, since its
  std is 0 and the quotient is meaningless. ``"reinforce_pp"`` with ``scale`` in
  {"batch", "none"} keeps the (non-zero) advantage of an all-equal group relative to the batch
  mean: that is the meaning of a global baseline.
- The default ``eps`` is 1e-6 (TRL uses 1e-4).

New estimators and scales are added with ``register_advantage_estimator`` and
``register_advantage_scale`` (built-in names cannot be replaced). The kernels implement the
built-in names only (their ``SUPPORTS``); ``jaxrl_reason.rl.backends`` runs anything else with
this module, on every backend.

All functions are pure ``jnp``, shape-static and safe under ``jax.jit`` (``group_size``,
``estimator``, ``scale``, ``eps`` and ``ddof`` are static Python values).
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from jaxrl_reason.kernels.checks import check_choice, check_group_args, check_new_entry

Array = jnp.ndarray

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SCALES",
    "group_advantages",
    "group_stats",
    "register_advantage_estimator",
    "register_advantage_scale",
]


# ----------------------------------------------------------------------------- helpers


def _std(x: Array, axis, ddof: int) -> Array:
    """Standard deviation with divisor max(n - ddof, 1); gradient-safe at zero variance."""
    n = x.size if axis is None else x.shape[axis]
    centered = x - jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.sum(centered * centered, axis=axis) / max(n - ddof, 1)
    positive = var > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, var, 1.0)), 0.0)


def _zero_variance(grouped: Array) -> Array:
    """bool[num_groups]: True where every reward of the group is exactly equal."""
    return jnp.max(grouped, axis=1) == jnp.min(grouped, axis=1)


# ----------------------------------------------------------------------------- estimators


def _grpo_center(grouped: Array) -> Array:
    """f32[num_groups, G] -> r - group mean; exactly 0 in zero-variance groups."""
    centered = grouped - jnp.mean(grouped, axis=1, keepdims=True)
    return jnp.where(_zero_variance(grouped)[:, None], 0.0, centered)


def _rloo_center(grouped: Array) -> Array:
    """f32[num_groups, G] -> r - mean of the other G-1 samples; exactly 0 if zero-variance."""
    g = grouped.shape[1]
    if g < 2:
        raise ValueError(f"estimator 'rloo' needs group_size >= 2, got {g}")
    others_mean = (jnp.sum(grouped, axis=1, keepdims=True) - grouped) / (g - 1)
    return jnp.where(_zero_variance(grouped)[:, None], 0.0, grouped - others_mean)


def _reinforce_pp_center(grouped: Array) -> Array:
    """f32[num_groups, G] -> r - batch mean; exactly 0 if the whole batch is constant."""
    centered = grouped - jnp.mean(grouped)
    return jnp.where(jnp.max(grouped) == jnp.min(grouped), 0.0, centered)


ADVANTAGE_ESTIMATORS: dict[str, Callable[[Array], Array]] = {
    "grpo": _grpo_center,
    "rloo": _rloo_center,
    "reinforce_pp": _reinforce_pp_center,
}
"""Name -> centering function ``f32[num_groups, G] -> f32[num_groups, G]``."""


# ----------------------------------------------------------------------------- scales


def _scale_group(centered: Array, grouped: Array, eps: float, ddof: int) -> Array:
    """Divide by the std of each group's raw rewards + eps; zero-variance groups -> 0."""
    std = _std(grouped, axis=1, ddof=ddof)[:, None]
    return jnp.where(_zero_variance(grouped)[:, None], 0.0, centered / (std + eps))


def _scale_batch(centered: Array, grouped: Array, eps: float, ddof: int) -> Array:
    """Divide by the std of all centered values + eps; a constant batch -> 0."""
    del grouped
    std = _std(centered, axis=None, ddof=ddof)
    return jnp.where(std > 0, centered / (std + eps), 0.0)


def _scale_none(centered: Array, grouped: Array, eps: float, ddof: int) -> Array:
    """No scaling (Dr. GRPO)."""
    del grouped, eps, ddof
    return centered


ADVANTAGE_SCALES: dict[str, Callable[[Array, Array, float, int], Array]] = {
    "group": _scale_group,
    "batch": _scale_batch,
    "none": _scale_none,
}
"""Name -> ``(centered, grouped_rewards, eps, ddof) -> scaled``, all ``f32[num_groups, G]``."""


def register_advantage_estimator(name: str, center: Callable[[Array], Array]) -> None:
    """Registers a centering function under ``name`` (usable as ``rl.advantage_estimator``).

    Args:
      name: a new estimator name (existing names cannot be replaced).
      center: ``f32[num_groups, G] -> f32[num_groups, G]``, pure jnp, shape-static.
    Kernels run only the estimators in their ``SUPPORTS``; ``jaxrl_reason.rl.backends`` sends
    a new one to this module's reference, on every backend, and logs it once.
    """
    check_new_entry("advantage estimator", name, center, ADVANTAGE_ESTIMATORS)
    ADVANTAGE_ESTIMATORS[name] = center


def register_advantage_scale(name: str,
                             scale: Callable[[Array, Array, float, int], Array]) -> None:
    """Registers a scaling function under ``name`` (usable as ``rl.advantage_scale``).

    Args:
      name: a new scale name (existing names cannot be replaced).
      scale: ``(centered, grouped_rewards, eps, ddof) -> scaled``, all ``f32[num_groups, G]``.
    """
    check_new_entry("advantage scale", name, scale, ADVANTAGE_SCALES)
    ADVANTAGE_SCALES[name] = scale


# ----------------------------------------------------------------------------- public API


def group_advantages(
    rewards: Array,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-6,
    ddof: int = 0,
) -> Array:
    """Per-sample advantages from per-sample rewards, group by group.

    Args:
      rewards: real ``[N]``, group-major (rows ``[g*G:(g+1)*G]`` belong to prompt ``g``);
        cast to float32. ``N`` must be a positive multiple of ``group_size``.
      group_size: ``G``, samples per prompt (static Python int >= 1; >= 2 for "rloo").
      estimator: baseline, a key of ``ADVANTAGE_ESTIMATORS``: "grpo" (group mean), "rloo"
        (leave-one-out group mean) or "reinforce_pp" (batch mean).
      scale: a key of ``ADVANTAGE_SCALES``: "group" (group reward std), "batch" (std of the
        centered batch) or "none".
      eps: added to the std before dividing (static float >= 0).
      ddof: 0 (population std, default) or 1 (Bessel-corrected, as TRL's ``torch.std``).

    Returns:
      float32 ``[N]`` advantages in the input's row order. Groups whose rewards are all equal
      get exactly 0 with "grpo"/"rloo" and with ``scale="group"``; never NaN for finite input.

    Raises:
      ValueError: unknown estimator/scale (the message lists the known names), a bad shape or
        group size, negative eps, ddof not in {0, 1}.
      TypeError: ``group_size`` is not a Python int.
    """
    check_choice("advantage estimator", estimator, ADVANTAGE_ESTIMATORS)
    check_choice("advantage scale", scale, ADVANTAGE_SCALES)
    check_group_args(rewards, group_size, ddof, eps)
    grouped = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
    centered = ADVANTAGE_ESTIMATORS[estimator](grouped)
    scaled = ADVANTAGE_SCALES[scale](centered, grouped, eps, ddof)
    return scaled.reshape(-1)


def group_stats(rewards: Array, group_size: int, *, ddof: int = 0) -> dict[str, Array]:
    """Per-group reward statistics (for logging and DAPO-style dynamic sampling).

    Args:
      rewards: real ``[N]``, group-major as in ``group_advantages``.
      group_size: ``G`` (static Python int >= 1).
      ddof: 0 (population std, default) or 1; divisor ``max(G - ddof, 1)``.

    Returns:
      dict with ``"mean"`` float32 ``[N // G]``, ``"std"`` float32 ``[N // G]`` and
      ``"zero_variance"`` bool ``[N // G]`` (True where all rewards of the group are exactly
      equal; such groups carry no group-relative learning signal).
    """
    check_group_args(rewards, group_size, ddof)
    grouped = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
    return {
        "mean": jnp.mean(grouped, axis=1),
        "std": _std(grouped, axis=1, ddof=ddof),
        "zero_variance": _zero_variance(grouped),
    }
