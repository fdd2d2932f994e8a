"""Policy-gradient loss with a KL penalty, an entropy bonus and a sampler-mismatch correction
(jnp reference).

Per completion token ``t`` of sequence ``b`` (``A_b`` is the sequence's advantage):

    pg       = POLICY_LOSS_MODES[policy_loss_mode](logp, old_logp, A)   (see loss_modes.py)
    pg       = w_t * pg                        (only with sampler_logp and tis_cap, see below)
    per_tok  = pg + beta * kl(logp, ref_logp) - entropy_coef * entropy

The default mode ``"ppo"`` is the token-level clipped surrogate with asymmetric epsilons,

    ratio    = exp(logp - old_logp)
    pg       = -min(ratio * A_b, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A_b)

optionally dual-clipped (``clip_ratio_c``, Ye et al. 2020); ``"gspo"`` (Zheng et al. 2025)
uses the length-normalized sequence ratio and ``"cispo"`` (MiniMax-M1, 2025) REINFORCE with a
clipped stop-gradient token weight. The formulas, and where they depart from the papers, are in
``loss_modes.py``.

The per-token values are reduced to a scalar by ``loss_type`` (registry
``LOSS_AGGREGATIONS``), with the meanings users know from TRL:

- ``"grpo"``:    mean over each sequence's masked tokens, then mean over the ``B`` sequences
                 (a sequence with no masked token contributes 0 but still counts in ``B``).
- ``"bnpo"``:    sum over all masked tokens / number of masked tokens in this batch.
- ``"dr_grpo"``: sum over all masked tokens / (``B * max_completion_length``).
- ``"dapo"``:    sum over all masked tokens / ``num_tokens_global``, the masked-token count of the
                 whole global batch (all micro-batches and devices). The trainer passes it and
                 SUMS the losses of the micro-batches; that sum is the token mean over the
                 global batch. Without it, this batch's own token count is used (= "bnpo").

New aggregations and KL estimators are added with ``register_loss_aggregation`` and
``register_kl_estimator``, policy-loss modes with ``loss_modes.register_policy_loss_mode``
(built-in names cannot be replaced). The policy-loss kernels implement the built-in names only
(their ``SUPPORTS``); ``jaxrl_reason.rl.backends`` runs anything else here, on every backend.

Global normalizers: ``num_sequences`` (the ``B`` of "grpo" and "dr_grpo") and
``num_tokens_global`` (the token count of "bnpo" and "dapo") default to this batch's own; a
caller that computes the loss on a subset of the rows (micro-batches, or the trainer skipping
rows whose advantage is 0) passes the whole batch's counts and gets the whole batch's loss.

KL estimators (registry ``KL_ESTIMATORS``, per token, ``d = ref_logp - logp``):
``"k1"``: ``-d``; ``"k2"``: ``d**2 / 2``; ``"k3"``: ``exp(d) - d - 1`` (Schulman's unbiased,
non-negative estimator of KL(pi || pi_ref); TRL's and DeepSeekMath's choice; not clamped).
KL in the reward instead of the loss (InstructGPT / verl ``use_kl_in_reward``):
``kl_reward_penalty`` gives ``beta * sum_t kl_t`` per sequence, to subtract from the rewards
before the advantages; the in-loss KL must then be off (``beta=0`` here) or it counts twice.

Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training"): the sampler (e.g. a fast inference engine, other kernels
or precision) and the trainer give different log-probs for the same policy, so the rollouts
are off-policy. With ``sampler_logp`` (the sampler's log-probs of the sampled tokens) and
``tis_cap = C`` the per-token policy-gradient term is multiplied by the constant

    w_t = min(exp(old_logp - sampler_logp), C)

in every mode (the paper derives it for the token-level PPO term; for "gspo" we weight each
token, not the sequence). Metrics: "sampler_kl", the masked token mean of the k3 estimate
``exp(d) - d - 1`` with ``d = old_logp - sampler_logp`` (an unbiased, non-negative estimate of
KL(sampler || old policy), as the tokens are drawn from the sampler), "tis_weight_mean" (mean
``w_t``; the uncapped ratio when ``tis_cap`` is None) and "tis_clip_frac" (tokens whose ratio
exceeds the cap; 0 without a cap). ``sampler_logp`` without ``tis_cap`` only reports them.

Gradients: ``old_logp``, ``ref_logp``, ``sampler_logp`` and ``advantages`` are constants
(``stop_gradient``); gradients flow to ``logp`` and to ``entropy``. Token values at masked-out
positions are replaced by 0 before any arithmetic, so padding holding ``-inf``/NaN log-probs
gives neither a NaN loss nor a NaN gradient. All math is float32 whatever the input dtype.

Deviation from TRL: TRL's "dapo" normalizer is ``num_items_in_batch / num_processes`` because
DDP averages gradients over processes; here arrays are global (or the caller sums), so the
normalizer is the plain global token count.
"""
from __future__ import annotations

import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels.checks import (
    check_aggregation_args,
    check_new_entry,
    check_policy_loss_options,
    check_policy_loss_shapes,
)
from jaxrl_reason.kernels.formulas import kl_k1, kl_k2, kl_k3
from jaxrl_reason.rl.loss_modes import MODES_WITH_DUAL_CLIP, POLICY_LOSS_MODES, masked_mean

Array = jnp.ndarray

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSS_MODES",
    "aggregate_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "policy_loss",
    "register_kl_estimator",
    "register_loss_aggregation",
    "sampler_mismatch",
]


# ----------------------------------------------------------------------------- KL estimators


KL_ESTIMATORS: dict[str, Callable[[Array, Array], Array]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}
"""Name -> per-token KL estimator ``(logp f32[B, L], ref_logp f32[B, L]) -> f32[B, L]``."""


def kl_penalty(logp: Array, ref_logp: Array, *, estimator: str = "k3") -> Array:
    """Per-token KL(pi_theta || pi_ref) estimate from sampled-token log-probs.

    Args:
      logp: float ``[...]`` log-probs of the sampled tokens under the policy.
      ref_logp: float, same shape, under the reference model.
      estimator: a key of ``KL_ESTIMATORS`` ("k1", "k2", "k3").

    Returns:
      float32, same shape as ``logp``. No masking is applied.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; known: {sorted(KL_ESTIMATORS)}")
    if jnp.shape(logp) != jnp.shape(ref_logp):
        raise ValueError(
            f"kl_penalty: ref_logp shape {jnp.shape(ref_logp)} != logp shape {jnp.shape(logp)}"
        )
    return KL_ESTIMATORS[estimator](
        jnp.asarray(logp, jnp.float32), jnp.asarray(ref_logp, jnp.float32)
    )


def kl_reward_penalty(logp: Array, ref_logp: Array, mask: Array, *, beta: float | Array,
                      estimator: str = "k1") -> Array:
    """Per-sequence KL penalty for the reward: ``beta * sum_t mask * kl(logp_t, ref_logp_t)``.

    Subtract it from the rewards before the advantages (``rewards - kl_reward_penalty(...)``)
    when the KL lives in the reward (InstructGPT, verl's ``use_kl_in_reward``); the in-loss KL
    must then be off (``policy_loss(beta=0)``). ``logp`` is the log-prob of the policy that
    sampled the tokens (the old policy), a constant of the update.

    Args:
      logp: float ``[B, L]`` sampled-token log-probs under the sampling policy.
      ref_logp: float ``[B, L]`` under the reference model.
      mask: bool or float ``[B, L]``; 1/True on completion tokens.
      beta: KL coefficient >= 0 (float or scalar array).
      estimator: a key of ``KL_ESTIMATORS``. The default "k1" summed over a sequence is the
        unbiased estimate of the sequence KL ``log pi(y) / pi_ref(y)``, the classic choice.

    Returns:
      float32 ``[B]``; 0 for a row without masked tokens. Masked-out values are ignored even
      if they are NaN or inf.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; known: {sorted(KL_ESTIMATORS)}")
    if isinstance(beta, numbers.Real) and beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    shape = jnp.shape(logp)
    if len(shape) != 2 or jnp.shape(ref_logp) != shape or jnp.shape(mask) != shape:
        raise ValueError(
            f"kl_reward_penalty: logp, ref_logp and mask must be [B, L] of one shape, got "
            f"{shape}, {jnp.shape(ref_logp)} and {jnp.shape(mask)}"
        )
    m = jnp.asarray(mask).astype(jnp.float32)
    lp = jnp.where(m != 0, jnp.asarray(logp, jnp.float32), 0.0)
    ref = jnp.where(m != 0, jnp.asarray(ref_logp, jnp.float32), 0.0)
    kl = jnp.sum(KL_ESTIMATORS[estimator](lp, ref) * m, axis=1)
    return jnp.asarray(beta, jnp.float32) * kl


# ----------------------------------------------------------------------------- aggregation


def _sequence_count(mask, num_sequences):
    return jnp.float32(mask.shape[0]) if num_sequences is None else jnp.asarray(
        num_sequences, jnp.float32)


def _token_count(mask, num_tokens_global):
    count = jnp.sum(mask) if num_tokens_global is None else num_tokens_global
    return jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)


def _agg_grpo(values, mask, max_completion_length, num_tokens_global, num_sequences):
    """Per-sequence token mean, then mean over B sequences (empty rows give 0)."""
    del max_completion_length, num_tokens_global
    per_seq = jnp.sum(values * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    return jnp.sum(per_seq) / _sequence_count(mask, num_sequences)


def _agg_bnpo(values, mask, max_completion_length, num_tokens_global, num_sequences):
    """Token mean over the batch."""
    del max_completion_length, num_sequences
    return jnp.sum(values * mask) / _token_count(mask, num_tokens_global)


def _agg_dr_grpo(values, mask, max_completion_length, num_tokens_global, num_sequences):
    """Token sum / (B * max_completion_length)."""
    del num_tokens_global
    if max_completion_length is None:
        raise ValueError("loss_type 'dr_grpo' requires max_completion_length")
    return jnp.sum(values * mask) / (_sequence_count(mask, num_sequences)
                                     * max_completion_length)


def _agg_dapo(values, mask, max_completion_length, num_tokens_global, num_sequences):
    """Token sum / token count of the global batch (this batch's count when None)."""
    del max_completion_length, num_sequences
    return jnp.sum(values * mask) / _token_count(mask, num_tokens_global)


LOSS_AGGREGATIONS: dict[str, Callable[..., Array]] = {
    "grpo": _agg_grpo,
    "bnpo": _agg_bnpo,
    "dr_grpo": _agg_dr_grpo,
    "dapo": _agg_dapo,
}
"""Name -> ``(values f32[B, L], mask f32[B, L], max_completion_length, num_tokens_global,
num_sequences) -> f32[]``."""


def register_loss_aggregation(name: str, aggregate: Callable[..., Array]) -> None:
    """Registers a loss aggregation under ``name`` (usable as ``rl.loss_type``).

    Args:
      name: a new name (existing names cannot be replaced).
      aggregate: ``(values f32[B, L], mask f32[B, L], max_completion_length,
        num_tokens_global, num_sequences) -> f32[]``; masked-out values arrive as 0.
    The policy-loss kernels implement the built-in aggregations only (their ``SUPPORTS``);
    ``jaxrl_reason.rl.backends`` runs a new one with ``policy_loss`` here, on every backend.
    """
    check_new_entry("loss aggregation", name, aggregate, LOSS_AGGREGATIONS)
    LOSS_AGGREGATIONS[name] = aggregate


def register_kl_estimator(name: str, estimator: Callable[[Array, Array], Array]) -> None:
    """Registers a per-token KL estimator under ``name`` (usable as ``rl.kl_estimator``).

    Args:
      name: a new name (existing names cannot be replaced).
      estimator: ``(logp f32[B, L], ref_logp f32[B, L]) -> f32[B, L]``, differentiable in
        ``logp``.
    """
    check_new_entry("kl_estimator", name, estimator, KL_ESTIMATORS)
    KL_ESTIMATORS[name] = estimator


def aggregate_loss(
    values: Array,
    mask: Array,
    *,
    loss_type: str,
    max_completion_length: int | None = None,
    num_tokens_global: Array | int | None = None,
    num_sequences: Array | int | None = None,
) -> Array:
    """Reduces per-token values to a scalar the way ``policy_loss`` does.

    Args:
      values: float ``[B, L]`` per-token values (e.g. a per-token loss).
      mask: bool or float ``[B, L]``; 1/True marks completion tokens.
      loss_type: a key of ``LOSS_AGGREGATIONS`` ("grpo", "bnpo", "dr_grpo", "dapo").
      max_completion_length: static int, required for "dr_grpo".
      num_tokens_global: int or scalar array, the global batch's token count ("dapo",
        "bnpo"); None = this batch's.
      num_sequences: int or scalar array, the global batch's sequence count B ("grpo",
        "dr_grpo"); None = this batch's rows.

    Returns:
      float32 scalar ``[]``. Masked-out values are ignored even if they are NaN or inf.
    """
    check_aggregation_args(loss_type, max_completion_length, LOSS_AGGREGATIONS)
    if jnp.ndim(values) != 2 or jnp.shape(mask) != jnp.shape(values):
        raise ValueError(
            f"aggregate_loss: values must be [B, L] and mask the same shape, got "
            f"{jnp.shape(values)} and {jnp.shape(mask)}"
        )
    m = jnp.asarray(mask).astype(jnp.float32)
    v = jnp.where(m != 0, jnp.asarray(values, jnp.float32), 0.0)
    return LOSS_AGGREGATIONS[loss_type](v, m, max_completion_length, num_tokens_global,
                                         num_sequences)


# ----------------------------------------------------------------------------- policy loss


def sampler_mismatch(old_logp: Array, sampler_logp: Array, mask: Array, *,
                     tis_cap: float | None = None) -> tuple[Array, dict[str, Array]]:
    """Sampler/trainer mismatch: the truncated importance weight and its metrics.

    Args:
      old_logp, sampler_logp: float [B, L] trainer (old policy) and sampler log-probs of the
        sampled tokens (constants: no gradient flows).
      mask: bool/float [B, L].
      tis_cap: the cap C > 0, or None (the weight is then the uncapped ratio).
    Returns:
      (w f32 [B, L] = min(exp(old_logp - sampler_logp), C) (1 where masked: both are 0);
       {"sampler_kl": masked token mean of the k3 estimate of KL(sampler || old),
        "tis_weight_mean", "tis_clip_frac" (0 without a cap)}).
    """
    valid = jnp.asarray(mask) != 0
    m = valid.astype(jnp.float32)

    def clean(x):
        return jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(x, jnp.float32), 0.0))

    old, sampler = clean(old_logp), clean(sampler_logp)
    weight = jnp.exp(old - sampler)                      # pi_old / pi_sampler
    capped = jnp.zeros_like(m)
    if tis_cap is not None:
        weight, capped = jnp.minimum(weight, tis_cap), (weight > tis_cap).astype(jnp.float32)
    return weight, {"sampler_kl": masked_mean(kl_k3(sampler, old), m),
                    "tis_weight_mean": masked_mean(weight, m),
                    "tis_clip_frac": masked_mean(capped, m)}


def policy_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    loss_type: str,
    epsilon_low: float,
    epsilon_high: float,
    beta: float | Array = 0.0,
    ref_logp: Array | None = None,
    max_completion_length: int | None = None,
    kl_estimator: str = "k3",
    num_tokens_global: Array | int | None = None,
    num_sequences: Array | int | None = None,
    entropy: Array | None = None,
    entropy_coef: float | Array = 0.0,
    policy_loss_mode: str = "ppo",
    clip_ratio_c: float | None = None,
    sampler_logp: Array | None = None,
    tis_cap: float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Policy-gradient loss (GRPO / Dr. GRPO / DAPO / BNPO aggregations; PPO / GSPO / CISPO).

    Args:
      logp: float ``[B, L]`` log-probs of the sampled completion tokens, current policy.
      old_logp: float ``[B, L]``, the policy that sampled them (constant).
      advantages: float ``[B]``, one per sequence, or ``[B, L]`` per token (GAE; modes
        "ppo" and "cispo"); constant.
      mask: bool or float ``[B, L]``; 1/True on completion tokens, 0 on padding.
      loss_type: "grpo", "bnpo", "dr_grpo" or "dapo" (see the module docstring).
      epsilon_low: static float in (0, 1); ratios below ``1 - epsilon_low`` are clipped.
      epsilon_high: static float > 0; ratios above ``1 + epsilon_high`` are clipped (DAPO's
        clip-higher uses ``epsilon_high > epsilon_low``). For "cispo" both bound the weight.
      beta: KL coefficient >= 0 (float or scalar array); > 0 requires ``ref_logp``.
      ref_logp: float ``[B, L]`` under the reference model (constant), or None.
      max_completion_length: static int, required for "dr_grpo".
      kl_estimator: "k1", "k2" or "k3" (see ``KL_ESTIMATORS``).
      num_tokens_global: masked-token count of the global batch ("dapo", "bnpo").
      num_sequences: sequence count of the global batch ("grpo", "dr_grpo"). With both, a
        subset of the batch's rows gives the same loss as the whole batch whenever the left-out
        rows contribute nothing (zero advantage, beta = 0, no entropy term): the trainer uses
        this to skip zero-advantage rows.
      entropy: float ``[B, L]`` per-token policy entropy, or None.
      entropy_coef: coefficient of the entropy bonus (subtracted from the loss).
      policy_loss_mode: static, a key of ``POLICY_LOSS_MODES``: "ppo" (default), "gspo",
        "cispo" (see ``loss_modes.py``).
      clip_ratio_c: static float > 1 or None; dual-clip bound for negative advantages
        ("ppo" and "gspo" only).
      sampler_logp: float ``[B, L]`` log-probs the sampler reported for the tokens
        (constant), or None.
      tis_cap: static float > 0 or None; with ``sampler_logp``, the cap ``C`` of the TIS weight
        ``min(exp(old_logp - sampler_logp), C)`` on the policy-gradient term.

    Returns:
      ``(loss, metrics)``: ``loss`` float32 ``[]``; ``metrics`` float32 scalars, token means
      over this batch's masked tokens unless noted: "clip_frac_low" (ratio < 1 - epsilon_low
      and A < 0), "clip_frac_high" (ratio > 1 + epsilon_high and A > 0), "ratio_mean",
      "ratio_max" (0 if no token), "kl" (0 without ``ref_logp``), "entropy" (0 without
      ``entropy``), "pg_loss" (the loss without KL/entropy terms, aggregated by ``loss_type``);
      with ``clip_ratio_c`` also "clip_frac_dual" (ratio > c and A < 0); with ``sampler_logp``
      also "sampler_kl", "tis_weight_mean", "tis_clip_frac". For "gspo" the ratio metrics are
      over sequences, for "cispo" they ignore the sign of A (see ``loss_modes.py``).

    Raises:
      ValueError: unknown loss_type/kl_estimator/policy_loss_mode, epsilons out of range,
        clip_ratio_c <= 1 or with "cispo", tis_cap <= 0 or without sampler_logp, beta > 0
        without ref_logp, "dr_grpo" without max_completion_length, shape mismatches.
    """
    check_policy_loss_options(
        loss_type, epsilon_low, epsilon_high, beta, ref_logp, kl_estimator,
        max_completion_length, entropy, entropy_coef, policy_loss_mode, clip_ratio_c,
        sampler_logp, tis_cap, loss_types=LOSS_AGGREGATIONS, kl_estimators=KL_ESTIMATORS,
        policy_loss_modes=POLICY_LOSS_MODES, dual_clip_modes=MODES_WITH_DUAL_CLIP)
    check_policy_loss_shapes(logp, old_logp, advantages, mask, ref_logp, entropy, sampler_logp)

    m = jnp.asarray(mask).astype(jnp.float32)
    valid = m != 0

    def clean(x, constant):
        x = jnp.where(valid, jnp.asarray(x, jnp.float32), 0.0)
        return jax.lax.stop_gradient(x) if constant else x

    logp = clean(logp, False)
    old_logp = clean(old_logp, True)
    adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    if adv.ndim == 2:
        if policy_loss_mode == "gspo":
            raise ValueError("policy_loss_mode='gspo' needs one advantage per sequence ([B]); "
                             "per-token advantages (GAE) go with 'ppo' or 'cispo'")
        adv = jnp.where(valid, adv, 0.0)
    else:
        adv = adv[:, None]

    pg_tok, metrics = POLICY_LOSS_MODES[policy_loss_mode](
        logp, old_logp, adv, m, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
        clip_ratio_c=clip_ratio_c)

    if sampler_logp is not None:
        tis_weight, sampler_metrics = sampler_mismatch(old_logp, sampler_logp, mask,
                                                       tis_cap=tis_cap)
        if tis_cap is not None:
            pg_tok = pg_tok * tis_weight
        metrics.update(sampler_metrics)

    tok = pg_tok
    if ref_logp is not None:
        kl_tok = KL_ESTIMATORS[kl_estimator](logp, clean(ref_logp, True))
        tok = tok + beta * kl_tok
    if entropy is not None:
        ent_tok = clean(entropy, False)
        # A constant zero coefficient leaves the entropy a metric: no backward pass through
        # it (0 * x is not folded away for floats, so the [B, L, V] softmax would be).
        if not (isinstance(entropy_coef, numbers.Real) and entropy_coef == 0):
            tok = tok - entropy_coef * ent_tok

    aggregate = LOSS_AGGREGATIONS[loss_type]
    loss = aggregate(tok, m, max_completion_length, num_tokens_global, num_sequences)
    pg_loss = aggregate(pg_tok, m, max_completion_length, num_tokens_global, num_sequences)

    zero = jnp.zeros((), jnp.float32)
    metrics.update(
        kl=masked_mean(kl_tok, m) if ref_logp is not None else zero,
        entropy=masked_mean(ent_tok, m) if entropy is not None else zero,
        pg_loss=jax.lax.stop_gradient(pg_loss),
    )
    return loss, metrics
