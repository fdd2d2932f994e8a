"""Argument checks shared by the kernels and their jnp references in the ``rl`` package.

The kernels are the leaf of the package graph: they import nothing from the ``rl`` package,
while ``rl`` may import them. So the checks both sides run live here, and the sets of known
names (the ``rl`` registries, or a kernel's ``SUPPORTS``) are passed in by the caller.

Every check raises ``ValueError`` (or ``TypeError`` for a wrong Python type) with a message
naming the argument and the offending value; none of them touches array values, only shapes
and static options, so they are safe to call while tracing.
"""
from __future__ import annotations

import numbers
from collections.abc import Collection, Mapping

import jax.numpy as jnp

__all__ = [
    "check_aggregation_args",
    "check_choice",
    "check_group_args",
    "check_new_entry",
    "check_policy_loss_options",
    "check_policy_loss_shapes",
    "check_supported",
    "unsupported_reason",
]


def check_choice(kind: str, name, known: Collection) -> None:
    """Raises ValueError ``unknown {kind} {name!r}; known: [...]`` unless ``name`` is known."""
    if name not in known:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(known)}")


def unsupported_reason(kernel: str, supports: Mapping[str, Collection],
                       request: Mapping[str, object]) -> str | None:
    """Why ``kernel`` cannot serve ``request``, or None when it can.

    Args:
      kernel: the kernel's name, for the message.
      supports: the kernel's ``SUPPORTS``: option name -> the values it implements.
      request: option name -> the requested value; every key must be in ``supports``.
    Returns:
      None, or a sentence naming the first option (in ``request`` order) whose value the
      kernel does not implement, and the values it does.
    """
    for option, value in request.items():
        if option not in supports:
            raise KeyError(f"{kernel}: SUPPORTS declares no option {option!r}; "
                           f"declared: {sorted(supports)}")
        if value not in supports[option]:
            known = sorted(supports[option], key=repr)
            return f"{kernel} does not implement {option}={value!r} (it implements {known})"
    return None


def check_supported(kernel: str, supports: Mapping[str, Collection], **request) -> None:
    """Raises ValueError when ``kernel`` does not implement ``request`` (see
    ``unsupported_reason``): a kernel called directly with a name it does not implement fails
    instead of computing another formula. ``rl/backends.py`` routes such requests
    to the jnp reference."""
    reason = unsupported_reason(kernel, supports, request)
    if reason is not None:
        raise ValueError(f"{reason}; call the jnp reference, or rl/backends.py, "
                         f"which falls back to it")


def check_new_entry(kind: str, name, fn, registry: Collection) -> None:
    """Checks that ``name -> fn`` may be added to ``registry``: ``name`` a non-empty str not
    yet registered (built-in names cannot be replaced: the kernels implement them by name,
    so a replaced entry would make kernel and reference disagree) and ``fn`` callable."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"{kind} {name!r}: expected a function, got {type(fn).__name__}")
    if name in registry:
        raise ValueError(f"{kind} {name!r} is already registered; known: {sorted(registry)}")


# ----------------------------------------------------------------------------- advantages


def check_group_args(rewards, group_size, ddof: int = 0, eps: float = 0.0) -> None:
    """Checks the arguments of a group-advantage computation.

    Args:
      rewards: array-like, must be 1-D ``[N]`` with ``N`` a positive multiple of ``group_size``.
      group_size: a Python int >= 1.
      ddof: 0 or 1.
      eps: a float >= 0.
    Raises:
      TypeError: ``group_size`` is not a Python int.
      ValueError: anything else out of range, naming the argument.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be a Python int, got {type(group_size).__name__}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if isinstance(ddof, bool) or ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    shape = jnp.shape(rewards)
    if len(shape) != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {shape}")
    if shape[0] == 0 or shape[0] % group_size != 0:
        raise ValueError(
            f"rewards length {shape[0]} must be a positive multiple of group_size={group_size}"
        )


# ----------------------------------------------------------------------------- policy loss


def check_aggregation_args(loss_type, max_completion_length, loss_types: Collection) -> None:
    """Checks ``loss_type`` against ``loss_types`` and ``max_completion_length`` (None or a
    Python int >= 1; required by "dr_grpo")."""
    check_choice("loss_type", loss_type, loss_types)
    if max_completion_length is not None:
        if isinstance(max_completion_length, bool) or not isinstance(
            max_completion_length, numbers.Integral
        ):
            raise TypeError(
                "max_completion_length must be a Python int, got "
                f"{type(max_completion_length).__name__}"
            )
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    elif loss_type == "dr_grpo":
        raise ValueError("loss_type 'dr_grpo' requires max_completion_length")


def _check_positive_float(name, value, above):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a Python float or None, got {type(value).__name__}")
    if not value > above:
        raise ValueError(f"{name} must be > {above}, got {value}")


def check_policy_loss_options(
    loss_type, epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
    max_completion_length, entropy, entropy_coef, policy_loss_mode, clip_ratio_c,
    sampler_logp, tis_cap, *, loss_types: Collection, kl_estimators: Collection,
    policy_loss_modes: Collection, dual_clip_modes: Collection,
) -> None:
    """Eager validation of the non-array arguments of a policy loss (see
    ``rl/losses.py``'s ``policy_loss`` for their meaning).

    The names are checked against the collections the caller passes: the ``rl`` registries
    for the reference, a kernel's ``SUPPORTS`` for a kernel.

    Raises:
      ValueError / TypeError naming the argument: an unknown name, epsilons out of range,
      ``clip_ratio_c <= 1`` or with a mode outside ``dual_clip_modes``, ``tis_cap <= 0`` or
      without ``sampler_logp``, ``beta > 0`` without ``ref_logp``, a non-zero
      ``entropy_coef`` without ``entropy``, "dr_grpo" without ``max_completion_length``.
    """
    check_aggregation_args(loss_type, max_completion_length, loss_types)
    check_choice("policy_loss_mode", policy_loss_mode, policy_loss_modes)
    if clip_ratio_c is not None:
        _check_positive_float("clip_ratio_c", clip_ratio_c, 1.0)
        if policy_loss_mode not in dual_clip_modes:
            raise ValueError(f"clip_ratio_c (dual clip) does not apply to policy_loss_mode "
                             f"{policy_loss_mode!r}; it needs one of {tuple(dual_clip_modes)}")
    if tis_cap is not None:
        _check_positive_float("tis_cap", tis_cap, 0.0)
        if sampler_logp is None:
            raise ValueError("tis_cap requires sampler_logp")
    check_choice("kl_estimator", kl_estimator, kl_estimators)
    for name, value in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    if not 0.0 < epsilon_low < 1.0:
        raise ValueError(f"epsilon_low must be in (0, 1), got {epsilon_low}")
    if not epsilon_high > 0.0:
        raise ValueError(f"epsilon_high must be > 0, got {epsilon_high}")
    if isinstance(beta, numbers.Real):
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        if beta > 0 and ref_logp is None:
            raise ValueError(f"beta={beta} > 0 requires ref_logp")
    elif ref_logp is None:
        raise ValueError("a non-constant beta requires ref_logp")
    if isinstance(entropy_coef, numbers.Real):
        if entropy_coef != 0 and entropy is None:
            raise ValueError(f"entropy_coef={entropy_coef} != 0 requires entropy")
    elif entropy is None:
        raise ValueError("a non-constant entropy_coef requires entropy")


def check_policy_loss_shapes(logp, old_logp, advantages, mask, ref_logp=None, entropy=None,
                             sampler_logp=None) -> None:
    """Checks that ``logp`` is ``[B, L]``, that ``old_logp``, ``mask`` and the optional
    ``ref_logp`` / ``entropy`` / ``sampler_logp`` have its shape, and that ``advantages`` is
    ``[B]`` or ``[B, L]``; raises ValueError naming the first array that does not."""
    shape = jnp.shape(logp)
    if len(shape) != 2:
        raise ValueError(f"logp must be [B, L], got shape {shape}")
    for name, arr in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp),
                      ("entropy", entropy), ("sampler_logp", sampler_logp)):
        if arr is not None and jnp.shape(arr) != shape:
            raise ValueError(f"{name} shape {jnp.shape(arr)} != logp shape {shape}")
    if jnp.shape(advantages) not in (shape[:1], shape):
        raise ValueError(f"advantages must be [B]={shape[:1]} (one per sequence) or [B, L]="
                         f"{shape} (per token, e.g. GAE), got {jnp.shape(advantages)}")
