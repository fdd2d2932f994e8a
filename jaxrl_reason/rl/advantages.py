"""Advantage estimators for critic-free policy gradients (GRPO, Dr. GRPO, RLOO, REINFORCE++,
pass@k training).

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
   - ``"passk"``:        the pass@k objective's expected centered group reward (Chen et al.
                         2025, "Pass@k Training ...", arXiv 2508.10751, the analytical
                         variant), for binary rewards; see "pass@k" below. Takes ``passk_k``.
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

pass@k (``estimator="passk"``, ``passk_k = k``, ``1 <= k <= G``). A sample is correct when
its reward is ``> PASSK_CORRECT_THRESHOLD`` (0.5). With ``N = G`` samples of which ``c`` are
correct, a k-subset of the group scores 1 if it holds a correct sample, so (the paper's
analytical advantage, its equations for the group mean, std and the two advantages)::

    R = 1 - C(N-c, k) / C(N, k)                 mean pass@k reward of the group's k-subsets
    s = sqrt(R (1 - R))                         their std
    A_correct = (1 - R) / s
    A_wrong   = (1 - R - C(N-c-1, k-1) / C(N-1, k-1)) / s   (= -(c/N) C(N-c-1,k-1)/C(N-1,k-1) / s)

The centering step gives the numerators, ``scale="group"`` divides them by ``s + eps`` (the
paper's std, *not* the std of the raw rewards; ``ddof`` must be 0 there), ``scale="none"``
keeps them unnormalized (a Dr. GRPO analogue) and ``scale="batch"`` divides them by their std
over the batch. The ratios are products of ``(N-c-1-i) / (N-1-i)`` (``k - 1`` factors, no
factorials; ``1 - R = (N-c)/N * C(N-c-1,k-1)/C(N-1,k-1)``). Groups with ``s = 0`` (no correct
sample, or fewer than ``k`` wrong ones, so every k-subset passes) get exactly 0. With ``k = 1``
this is GRPO on the 0/1 correctness: ``R = c/N``, ``s`` its population std, for every scale.
Departures from the paper / its code (``RUCAIBox/Passk_Training``, ``calc_adv``): ``eps``
(1e-6 by default, as that code) is added to ``s`` as for every scale; rewards that are not
exactly 0 or 1 are thresholded at 0.5 here, under ``jax.jit`` where values cannot be checked
(that code passes such rewards through unchanged as advantages). The trainer
(``rl/group_estimator.py``) does not threshold: it refuses a batch whose rewards are not all
0 or 1 (``binary_reward_problem``), and config validation requires ``rl.passk_k`` in
``[1, rl.num_generations]``. ``passk_k`` has no default: "passk" without it is a ValueError
rather than a silent pass@1 (which is GRPO).

New estimators and scales are added with ``register_advantage_estimator`` and
``register_advantage_scale`` (built-in names cannot be replaced). The kernels implement the
built-in names only (their ``SUPPORTS``); ``jaxrl_reason.rl.backends`` runs anything else with
this module, on every backend.

All functions are pure ``jnp``, shape-static and safe under ``jax.jit`` (``group_size``,
``estimator``, ``scale``, ``eps``, ``ddof`` and ``passk_k`` are static Python values).
"""
from __future__ import annotations

import functools
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.kernels.checks import check_choice, check_group_args, check_new_entry

Array = jnp.ndarray

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SCALES",
    "PASSK_CORRECT_THRESHOLD",
    "binary_reward_problem",
    "check_passk_k",
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


PASSK_CORRECT_THRESHOLD = 0.5
"""``"passk"`` counts a sample as correct when its reward is above this (0/1 rewards: == 1)."""


def check_passk_k(k, group_size: int, name: str = "passk_k") -> None:
    """Raises unless ``k`` (named ``name`` in the message) is a Python int in [1, group_size]."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} (the k of pass@k) must be a Python int, got {k!r}")
    if not 1 <= k <= group_size:
        raise ValueError(f"{name} (the k of pass@k) must be in [1, group_size={group_size}] "
                         f"(k samples are drawn from the group of {group_size}), got {k}")


def _passk_parts(grouped: Array, k: int) -> tuple[Array, Array]:
    """f32[num_groups, G] -> (centered f32[num_groups, G], std f32[num_groups, 1]) of pass@k.

    centered: ``1 - R`` for a correct sample, ``1 - R - C(N-c-1,k-1)/C(N-1,k-1)`` for a wrong
    one; std: ``sqrt(R (1 - R))``. Both exactly 0 in groups where it is 0 (module docstring).
    """
    n = grouped.shape[1]
    check_passk_k(k, n)
    correct = grouped > PASSK_CORRECT_THRESHOLD
    c = jnp.sum(correct, axis=1, keepdims=True).astype(jnp.float32)  # exact small integers
    wrong = n - c
    i = jnp.arange(k - 1, dtype=jnp.float32)
    # rho = C(N-c-1, k-1) / C(N-1, k-1): a factor is 0 once the wrong ones run out (and the
    # denominators N-1-i >= N-k+1 >= 1). rho = 1 for k = 1 (empty product).
    rho = jnp.prod(jnp.maximum(wrong - 1.0 - i, 0.0) / (n - 1.0 - i), axis=1, keepdims=True)
    fail = wrong / n * rho                      # 1 - R = C(N-c, k) / C(N, k)
    mean = 1.0 - fail                           # R
    var = mean * fail
    degenerate = (c == 0) | (wrong < k)         # every k-subset fails / every one passes
    std = jnp.where(degenerate, 0.0, jnp.sqrt(jnp.where(degenerate, 1.0, var)))
    centered = jnp.where(correct, fail, -(c / n) * rho)  # 1 - R - rho = -(c/N) rho
    return jnp.where(degenerate, 0.0, centered), std


def _passk_center(grouped: Array, k: int = 1) -> Array:
    """f32[num_groups, G] -> the pass@k numerators (module docstring); k = 1: GRPO's r - mean."""
    return _passk_parts(grouped, k)[0]


def binary_reward_problem(rewards) -> str | None:
    """Why host ``rewards`` are not all exactly 0 or 1 (what ``"passk"`` is defined on), or None.

    For eager callers that want no thresholding (the trainer); values are read, so not for
    traced arrays.
    """
    r = np.asarray(rewards, np.float64).reshape(-1)
    bad = ~((r == 0.0) | (r == 1.0))
    if not bad.any():
        return None
    shown = ", ".join(f"{v:g}" for v in np.unique(r[bad])[:5])
    return (f"{int(bad.sum())} of {r.size} rewards are not 0 or 1 (e.g. {shown}); pass@k "
            "counts correct samples, so it needs binary rewards")


ADVANTAGE_ESTIMATORS: dict[str, Callable[[Array], Array]] = {
    "grpo": _grpo_center,
    "rloo": _rloo_center,
    "reinforce_pp": _reinforce_pp_center,
    "passk": _passk_center,
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


@functools.partial(jax.jit, static_argnames=("k", "scale", "eps", "ddof"))
def _passk_advantages(grouped: Array, *, k: int, scale: str, eps: float, ddof: int) -> Array:
    """f32[num_groups, G] -> f32[N]: "passk" centered and scaled ("group": by its own std).

    Compiled as one program whether called eagerly or under an outer jit, so both give the
    same bits (op-by-op dispatch would round the batch std's reduction differently).
    """
    centered, std = _passk_parts(grouped, k)
    if scale == "group":  # the paper's std of the pass@k reward, not of the raw rewards
        scaled = jnp.where(std > 0, centered / (std + eps), 0.0)
    else:
        scaled = ADVANTAGE_SCALES[scale](centered, grouped, eps, ddof)
    return scaled.reshape(-1)


def group_advantages(
    rewards: Array,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-6,
    ddof: int = 0,
    passk_k: int | None = None,
) -> Array:
    """Per-sample advantages from per-sample rewards, group by group.

    Args:
      rewards: real ``[N]``, group-major (rows ``[g*G:(g+1)*G]`` belong to prompt ``g``);
        cast to float32. ``N`` must be a positive multiple of ``group_size``.
      group_size: ``G``, samples per prompt (static Python int >= 1; >= 2 for "rloo").
      estimator: baseline, a key of ``ADVANTAGE_ESTIMATORS``: "grpo" (group mean), "rloo"
        (leave-one-out group mean), "reinforce_pp" (batch mean) or "passk" (pass@k, binary
        rewards thresholded at ``PASSK_CORRECT_THRESHOLD``; module docstring).
      scale: a key of ``ADVANTAGE_SCALES``: "group" (group reward std; for "passk" the std of
        its pass@k reward), "batch" (std of the centered batch) or "none".
      eps: added to the std before dividing (static float >= 0).
      ddof: 0 (population std, default) or 1 (Bessel-corrected, as TRL's ``torch.std``).
      passk_k: the k of ``estimator="passk"`` (static int in [1, group_size], required
        there); must stay None for the other estimators.

    Returns:
      float32 ``[N]`` advantages in the input's row order. Groups whose rewards are all equal
      get exactly 0 with "grpo"/"rloo"/"passk" and with ``scale="group"``; "passk" also gives 0
      to groups whose pass@k std is 0. Never NaN for finite input.

    Raises:
      ValueError: unknown estimator/scale (the message lists the known names), a bad shape or
        group size, negative eps, ddof not in {0, 1}, ``passk_k`` missing for "passk", out
        of [1, group_size] or given to another estimator, "passk" with ``scale="group"`` and ``ddof=1``.
      TypeError: ``group_size`` or ``passk_k`` is not a Python int.
    """
    check_choice("advantage estimator", estimator, ADVANTAGE_ESTIMATORS)
    check_choice("advantage scale", scale, ADVANTAGE_SCALES)
    check_group_args(rewards, group_size, ddof, eps)
    grouped = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
    if estimator == "passk":
        if passk_k is None:
            raise ValueError("estimator 'passk' needs passk_k, the k of its pass@k (an int in "
                             f"[1, group_size={group_size}]; k = 1 is GRPO on 0/1 rewards)")
        k = passk_k
        check_passk_k(k, group_size)
        if scale == "group" and ddof != 0:
            raise ValueError("estimator 'passk' with scale 'group' divides by the paper's "
                             "sqrt(R (1 - R)), a population std: ddof must be 0")
        return _passk_advantages(grouped, k=k, scale=scale, eps=float(eps), ddof=ddof)
    if passk_k is not None:
        raise ValueError(f"passk_k={passk_k!r} is read by estimator 'passk' only, not by "
                         f"{estimator!r}")
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
