"""Choose between the Pallas kernels and the jnp reference (``config.kernels.backend``).

``backend`` is one of:

- ``"auto"``: the Pallas kernels on TPU and GPU, the jnp reference elsewhere (CPU, where XLA
  fuses the reference well and Pallas only interprets). Each kernel has two versions with
  one signature: the Mosaic TPU one (``group_advantage.py``, ``policy_loss.py``: sequential
  grid axes with resident accumulators, SMEM scalar prefetch) and the Triton one for GPU
  (``*_gpu.py``: parallel programs that loop over the reduction dim, cross-program sums in
  jnp); the platform picks;
- ``"pallas"``: the kernels; off TPU/GPU they run in the Pallas interpreter
  (``interpret=True``, the TPU version), which is for tests, not for speed;
- ``"reference"``: the jnp functions of ``jaxrl_reason.rl``.

The functions below take the reference functions' arguments plus ``backend`` and return what
the reference returns. Options a kernel does not implement fall back to the reference; the
reason is logged once (``fallback_reason_*`` give it without running anything):

- ``policy_loss``: ``policy_loss_mode`` "gspo" (a per-sequence ratio that needs the row's mean
  log-ratio before any token's loss: a second pass) and "cispo" (not fused); ``tis_cap``
  (truncated importance sampling; ``sampler_logp`` without a cap only adds metrics, computed
  next to the kernel); empty ``[B, L]`` (``B == 0`` or ``L == 0``);
- ``group_advantages`` / ``group_stats``: none.

Sharding: Mosaic kernels are not auto-partitioned. ``policy_loss`` takes ``mesh`` and
``batch_axes`` and then runs its (row-local) kernels per shard under ``shard_map``; the
``[B]``-sized epilogue stays global, so normalizers and metrics are those of the whole batch.
``group_advantages`` works on the small ``[N]`` rewards: pass them unsharded (replicated).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import group_advantage as _ga
from jaxrl_reason.kernels import platform as _platform
from jaxrl_reason.kernels import group_advantage_gpu as _ga_gpu
from jaxrl_reason.kernels import policy_loss as _pl
from jaxrl_reason.kernels import policy_loss_gpu as _pl_gpu
from jaxrl_reason.rl import advantages as _adv_ref
from jaxrl_reason.rl import losses as _loss_ref

__all__ = [
    "BACKENDS",
    "fallback_reason_policy_loss",
    "group_advantages",
    "group_stats",
    "policy_loss",
    "resolve_backend",
]

BACKENDS = ("auto", "pallas", "reference")
"""Accepted values of ``backend`` / ``config.kernels.backend``."""

_log = logging.getLogger(__name__)
_logged: set[str] = set()


def resolve_backend(backend: str) -> str:
    """``"auto"`` | ``"pallas"`` | ``"reference"`` -> ``"pallas"`` or ``"reference"``.

    ``"auto"`` is ``"pallas"`` when the platform (``kernels.platform.current()``: the default
    backend, or the target of an ahead-of-time compilation) is ``"tpu"`` or ``"gpu"``, else
    ``"reference"``. Raises ValueError for any other name.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; known: {list(BACKENDS)}")
    if backend == "auto":
        return "pallas" if _platform.compiles_kernels() else "reference"
    return backend


def _interpret() -> bool:
    """Kernels compile for TPU (Mosaic) and GPU (Triton); elsewhere they are interpreted."""
    return not _platform.compiles_kernels()


def _kernels():
    """(group advantage module, policy loss module): Triton on GPU, Mosaic TPU otherwise."""
    return (_ga_gpu, _pl_gpu) if _platform.current() == "gpu" else (_ga, _pl)


def _note_fallback(name: str, reason: str) -> None:
    key = f"{name}: {reason}"
    if key not in _logged:
        _logged.add(key)
        _log.info("%s falls back to the jnp reference: %s", name, reason)


# ----------------------------------------------------------------------------- advantages


def group_advantages(rewards, group_size: int, *, estimator: str = "grpo",
                     scale: str = "group", eps: float = 1e-6, ddof: int = 0,
                     backend: str = "auto") -> jax.Array:
    """``jaxrl_reason.rl.advantages.group_advantages`` on the chosen backend.

    Args: as the reference (rewards real ``[N]`` group-major, static ``group_size``,
      ``estimator``, ``scale``, ``eps``, ``ddof``), plus ``backend`` (see the module docstring).
    Returns: float32 ``[N]`` advantages.
    """
    if resolve_backend(backend) == "reference":
        return _adv_ref.group_advantages(rewards, group_size, estimator=estimator, scale=scale,
                                         eps=eps, ddof=ddof)
    adv, _ = _kernels()[0].group_advantage(rewards, group_size, estimator=estimator, scale=scale,
                                 eps=eps, ddof=ddof, interpret=_interpret())
    return adv


def group_stats(rewards, group_size: int, *, ddof: int = 0,
                backend: str = "auto") -> dict[str, jax.Array]:
    """``jaxrl_reason.rl.advantages.group_stats`` on the chosen backend.

    Returns: ``{"mean": f32[N // G], "std": f32[N // G], "zero_variance": bool[N // G]}``.
    """
    if resolve_backend(backend) == "reference":
        return _adv_ref.group_stats(rewards, group_size, ddof=ddof)
    _, stats = _kernels()[0].group_advantage(rewards, group_size, estimator="grpo", scale="none",
                                   ddof=ddof, interpret=_interpret())
    return stats


# ----------------------------------------------------------------------------- policy loss


def fallback_reason_policy_loss(logp, *, policy_loss_mode: str = "ppo",
                                sampler_logp=None, tis_cap=None) -> str | None:
    """Why ``policy_loss`` would use the reference with these options, or None."""
    if policy_loss_mode != "ppo":
        return (f"policy_loss_mode={policy_loss_mode!r} is not fused (the kernel implements "
                f"the token-level 'ppo' surrogate)")
    if tis_cap is not None:
        return "tis_cap (truncated importance sampling) is not fused"
    if 0 in jnp.shape(logp):
        return f"empty logp of shape {jnp.shape(logp)}"
    return None


def policy_loss(logp, old_logp, advantages, mask, *, loss_type: str, epsilon_low: float,
                epsilon_high: float, beta=0.0, ref_logp=None,
                max_completion_length: int | None = None, kl_estimator: str = "k3",
                num_tokens_global=None, num_sequences=None, entropy=None, entropy_coef=0.0,
                policy_loss_mode: str = "ppo", clip_ratio_c: float | None = None,
                sampler_logp=None, tis_cap: float | None = None, backend: str = "auto",
                mesh: jax.sharding.Mesh | None = None,
                batch_axes: str | tuple[str, ...] | None = None,
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``jaxrl_reason.rl.losses.policy_loss`` on the chosen backend.

    Args: exactly the reference's (``logp``/``old_logp``/``mask`` ``[B, L]``, advantages
      ``[B]`` or ``[B, L]``, ...), plus ``backend`` (see the module docstring) and, for
      batch-sharded arrays, ``mesh`` and ``batch_axes`` (the mesh axes of the batch dim):
      the kernels then run per shard in ``shard_map``. Mosaic kernels cannot be
      auto-partitioned, so on TPU sharded inputs need them. The reference ignores them.
    Returns: ``(loss f32[], metrics)`` as the reference; gradients flow to ``logp`` and
      ``entropy`` (and array-valued ``beta`` / ``entropy_coef``).
    """
    kwargs = dict(loss_type=loss_type, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
                  beta=beta, ref_logp=ref_logp, max_completion_length=max_completion_length,
                  kl_estimator=kl_estimator, num_tokens_global=num_tokens_global,
                  num_sequences=num_sequences, entropy=entropy, entropy_coef=entropy_coef,
                  clip_ratio_c=clip_ratio_c)
    if resolve_backend(backend) == "pallas":
        reason = fallback_reason_policy_loss(logp, policy_loss_mode=policy_loss_mode,
                                             sampler_logp=sampler_logp, tis_cap=tis_cap)
        if reason is None:
            loss, metrics = _kernels()[1].policy_loss(
                logp, old_logp, advantages, mask, **kwargs, interpret=_interpret(), mesh=mesh,
                batch_axes=batch_axes)
            if sampler_logp is not None:  # metrics only (no tis_cap): constants, no gradient
                metrics = {**metrics,
                           **_loss_ref.sampler_mismatch(old_logp, sampler_logp, mask)[1]}
            return loss, metrics
        _note_fallback("policy_loss", reason)
    return _loss_ref.policy_loss(logp, old_logp, advantages, mask, **kwargs,
                                 policy_loss_mode=policy_loss_mode, sampler_logp=sampler_logp,
                                 tis_cap=tis_cap)
