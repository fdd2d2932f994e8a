"""Per-token formulas shared by the policy-loss kernels and the jnp reference.

Pure ``jnp``, elementwise, no Pallas: the kernels call them inside their bodies and
``rl/losses.py`` / ``rl/loss_modes.py`` build their registries from them, so a kernel and its
reference cannot drift apart on these. (``rl`` may import the kernels package; the kernels
import nothing from ``rl``.)
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp

__all__ = ["KL_FORMULAS", "clipped_surrogate", "kl_k1", "kl_k2", "kl_k3"]


def clipped_surrogate(ratio: jax.Array, adv: jax.Array, epsilon_low: float,
                      epsilon_high: float, clip_ratio_c: float | None) -> jax.Array:
    """Per-element PPO loss ``-min(r A, clip(r) A)``, bounded by ``-c A`` where ``A < 0`` when
    ``clip_ratio_c`` is given. ``ratio`` and ``adv`` f32, broadcasting (e.g. ``[B, L]`` and
    ``[B, 1]``); returns their broadcast shape."""
    clipped = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    loss = -jnp.minimum(ratio * adv, clipped * adv)
    if clip_ratio_c is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -clip_ratio_c * adv), loss)
    return loss


def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """logp - ref_logp (unbiased, can be negative); f32, same shape."""
    return logp - ref_logp


def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """0.5 * (logp - ref_logp)**2 (biased, low variance, non-negative); f32, same shape."""
    return 0.5 * jnp.square(logp - ref_logp)


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """exp(ref - logp) - (ref - logp) - 1 (unbiased, non-negative); f32, same shape."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def _dkl_k1(logp, ref_logp):
    del ref_logp
    return jnp.ones_like(logp)


def _dkl_k2(logp, ref_logp):
    return logp - ref_logp


def _dkl_k3(logp, ref_logp):
    return 1.0 - jnp.exp(ref_logp - logp)


KL_FORMULAS = types.MappingProxyType({
    "k1": (kl_k1, _dkl_k1),
    "k2": (kl_k2, _dkl_k2),
    "k3": (kl_k3, _dkl_k3),
})
"""Name -> ``(kl, d kl / d logp)``, both ``(logp, ref_logp) -> f32`` elementwise: the KL
estimators a kernel can fuse (it needs the derivative for its backward pass)."""
