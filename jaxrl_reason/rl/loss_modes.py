"""Policy-gradient terms of ``policy_loss``, one per ``policy_loss_mode`` (registry
``POLICY_LOSS_MODES``).

Each mode maps the cleaned inputs of ``policy_loss`` to a per-token policy-gradient loss
``pg f32[B, L]`` (aggregated afterwards by ``loss_type``) and its ratio metrics. Per token
``t`` of sequence ``i``, with ``r = exp(logp - old_logp)``, ``A = A_i`` and
``clip(x) = clip(x, 1 - epsilon_low, 1 + epsilon_high)``:

- ``"ppo"``: the clipped surrogate (PPO, Schulman et al. 2017; GRPO/DAPO use it per token):
      pg = -min(r A, clip(r) A)
  With ``clip_ratio_c = c`` (dual-clip PPO, Ye et al. 2020, "Mastering Complex Control in
  MOBA Games with Deep RL"), tokens with ``A < 0`` are further bounded:
      pg = min(max(-r A, -clip(r) A), -c A)
  so a huge ratio on a negative-advantage token cannot give an unbounded loss; the bound is
  active (and the token's gradient 0) exactly when ``A < 0`` and ``r > c``.

- ``"gspo"`` (Zheng et al. 2025, "Group Sequence Policy Optimization"), in its GSPO-token
  form: the length-normalized sequence ratio
      s_i = exp( (1/|y_i|) sum_t (logp_t - old_logp_t) )
  and, per token, ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` (value ``s_i``), then the
  ``"ppo"`` formula with ``s_it`` in place of ``r`` (dual clip included). Every token of a
  sequence carries the sequence's objective ``-min(s_i A_i, clip(s_i) A_i)``, clipping is
  decided per sequence, and the gradient of a token is ``-s_i A_i * d logp_t`` (0 when the
  sequence is clipped). Aggregated by ``loss_type="grpo"`` (token mean per sequence, then mean
  over sequences) this is exactly the paper's objective and gradient; "bnpo"/"dapo" weight each
  sequence by its length and "dr_grpo" by ``|y_i| / max_completion_length`` instead.
  The paper's ranges are tiny (epsilon_low=3e-4, epsilon_high=4e-4); the given values are used
  as they are.

- ``"cispo"`` (MiniMax-M1, 2025, "Clipped IS-weight Policy Optimization"): REINFORCE with a
  clipped, stop-gradient importance weight,
      pg = -sg[clip(r)] * A * logp_t
  No token is dropped: a clipped weight still multiplies the token's gradient. The value is
  not a surrogate of the return (only its gradient ``-clip(r) A d logp`` means anything), so
  ``pg_loss`` is not comparable across modes. The paper uses a token mean over the group
  (``loss_type="dapo"`` or ``"bnpo"``). MiniMax sets no lower bound on the weight and tunes
  only the upper one; ``epsilon_low`` must stay in (0, 1) here, so use ``epsilon_low`` close
  to 1 (e.g. 0.99) for "no lower bound" and a large ``epsilon_high`` (e.g. 4.0) for the upper.
  ``clip_ratio_c`` does not apply (there is no min/max to bound).

Ratio metrics (float32 scalars, ``sg``): "clip_frac_low", "clip_frac_high", "ratio_mean",
"ratio_max" and, with ``clip_ratio_c``, "clip_frac_dual". For "ppo" they are means over the
masked tokens (low: ``r < 1 - epsilon_low`` and ``A < 0``; high: ``r > 1 + epsilon_high`` and
``A > 0``; dual: ``r > c`` and ``A < 0``). For "gspo" they are the same tests on ``s_i``, means
over the sequences with at least one masked token. For "cispo" low/high count the tokens whose
weight is clipped whatever the sign of ``A`` (they keep their gradient).

Departures from the papers / verl: no clamp of the log-ratio before ``exp`` (verl clamps it
at 10 or 20); GSPO's clip fractions count sequences, not tokens.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels.checks import check_new_entry
from jaxrl_reason.kernels.formulas import clipped_surrogate

Array = jnp.ndarray

__all__ = ["MODES_WITH_DUAL_CLIP", "POLICY_LOSS_MODES", "masked_mean",
           "register_policy_loss_mode"]


def masked_mean(x: Array, weight: Array) -> Array:
    """sum(sg[x] * weight) / max(sum(weight), 1): a float32 metric, 0 when nothing counts."""
    x = jax.lax.stop_gradient(jnp.asarray(x, jnp.float32))
    return jnp.sum(x * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def _ratio_metrics(ratio, adv, weight, epsilon_low, epsilon_high, clip_ratio_c,
                   signed=True) -> dict[str, Array]:
    """Clip fractions and ratio statistics over the elements where ``weight`` is 1."""
    ratio = jax.lax.stop_gradient(ratio)
    low, high = ratio < 1.0 - epsilon_low, ratio > 1.0 + epsilon_high
    if signed:
        low, high = low & (adv < 0), high & (adv > 0)
    metrics = {
        "clip_frac_low": masked_mean(low, weight),
        "clip_frac_high": masked_mean(high, weight),
        "ratio_mean": masked_mean(ratio, weight),
        "ratio_max": jnp.max(jnp.where(weight != 0, ratio, 0.0)),
    }
    if clip_ratio_c is not None:
        metrics["clip_frac_dual"] = masked_mean((ratio > clip_ratio_c) & (adv < 0), weight)
    return metrics


def _ppo(logp, old_logp, adv, mask, *, epsilon_low, epsilon_high, clip_ratio_c):
    """Token-level clipped surrogate (optionally dual-clipped)."""
    ratio = jnp.exp(logp - old_logp)
    pg = clipped_surrogate(ratio, adv, epsilon_low, epsilon_high, clip_ratio_c)
    return pg, _ratio_metrics(ratio, adv, mask, epsilon_low, epsilon_high, clip_ratio_c)


def _gspo(logp, old_logp, adv, mask, *, epsilon_low, epsilon_high, clip_ratio_c):
    """GSPO-token: the sequence ratio on every token, gradient through logp_t only."""
    n = jnp.sum(mask, axis=1, keepdims=True)                                   # [B, 1]
    log_s = jnp.sum((logp - old_logp) * mask, axis=1, keepdims=True) / jnp.maximum(n, 1.0)
    s = jnp.exp(jax.lax.stop_gradient(log_s))                                  # [B, 1]
    s_tok = s * jnp.exp(logp - jax.lax.stop_gradient(logp))                    # value s_i
    pg = clipped_surrogate(s_tok, adv, epsilon_low, epsilon_high, clip_ratio_c)
    nonempty = (n > 0).astype(jnp.float32)
    return pg, _ratio_metrics(s, adv, nonempty, epsilon_low, epsilon_high, clip_ratio_c)


def _cispo(logp, old_logp, adv, mask, *, epsilon_low, epsilon_high, clip_ratio_c):
    """REINFORCE weighted by the clipped, stop-gradient token ratio."""
    del clip_ratio_c  # rejected by policy_loss's validation
    ratio = jax.lax.stop_gradient(jnp.exp(logp - old_logp))
    weight = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    pg = -weight * adv * logp
    return pg, _ratio_metrics(ratio, adv, mask, epsilon_low, epsilon_high, None, signed=False)


POLICY_LOSS_MODES: dict[str, Callable[..., tuple[Array, dict[str, Array]]]] = {
    "ppo": _ppo,
    "gspo": _gspo,
    "cispo": _cispo,
}
"""Name -> ``(logp f32[B, L], old_logp f32[B, L] (constant), adv f32[B, 1] (constant),
mask f32[B, L], *, epsilon_low, epsilon_high, clip_ratio_c) -> (pg f32[B, L], metrics)``.
Inputs are 0 at masked-out positions; ``pg`` there is ignored by the aggregation."""

MODES_WITH_DUAL_CLIP = ["ppo", "gspo"]
"""Modes that accept ``clip_ratio_c``."""


def register_policy_loss_mode(name: str, mode: Callable[..., tuple[Array, dict[str, Array]]],
                              *, dual_clip: bool = False) -> None:
    """Registers a policy-gradient term under ``name`` (usable as ``rl.policy_loss_mode``).

    Args:
      name: a new name (existing names cannot be replaced).
      mode: the signature of the ``POLICY_LOSS_MODES`` values.
      dual_clip: whether ``mode`` honours ``clip_ratio_c`` (then it is accepted with it).
    The policy-loss kernels fuse "ppo" only; ``jaxrl_reason.rl.backends`` runs every other
    mode with the jnp reference.
    """
    check_new_entry("policy_loss_mode", name, mode, POLICY_LOSS_MODES)
    POLICY_LOSS_MODES[name] = mode
    if dual_clip:
        MODES_WITH_DUAL_CLIP.append(name)
