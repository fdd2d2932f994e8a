"""Run the RL math on the Pallas kernels or on the jnp reference (``config.kernels.backend``).

``backend`` is one of:

- ``"auto"``: the Pallas kernels on TPU and GPU, the jnp reference elsewhere (CPU, where XLA
  fuses the reference well and Pallas only interprets). Each kernel has two versions with
  one signature: the Mosaic TPU one (``kernels/group_advantage.py``, ``policy_loss.py``) and
  the Triton one for GPU (``*_gpu.py``); the platform (``kernels.platform.current()``, which
  follows an ahead-of-time compilation's target) picks;
- ``"pallas"``: the kernels; off TPU/GPU they run in the Pallas interpreter
  (``interpret=True``, the TPU version), which is for tests, not for speed;
- ``"reference"``: the jnp functions of ``advantages.py`` and ``losses.py``.

The functions below take the reference functions' arguments plus ``backend`` and return what
the reference returns. Each kernel module declares what it implements in ``SUPPORTS``
(option -> values). A request inside it runs on the kernel; anything else -- a name
registered with ``register_advantage_estimator``, ``register_loss_aggregation``,
``register_kl_estimator`` or ``register_policy_loss_mode``, "gspo", "cispo", ``tis_cap``, an
empty batch -- runs on the reference, and the reason is logged once per (kernel, reason) at
INFO on this module's logger. ``fallback_reason_*`` give the reason without running anything.
So a kernel never computes a neighbouring formula for a name it does not know.

Sharding: Mosaic kernels are not auto-partitioned. ``policy_loss`` takes ``mesh`` and
``batch_axes`` and then runs its (row-local) kernels per shard under ``shard_map``; the
``[B]``-sized epilogue stays global, so normalizers and metrics are those of the whole batch.
``group_advantages`` works on the small ``[N]`` rewards: pass them unsharded (replicated).
"""
from __future__ import annotations

import logging
import types

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import group_advantage, group_advantage_gpu, platform
from jaxrl_reason.kernels import policy_loss as policy_loss_kernel
from jaxrl_reason.kernels import policy_loss_gpu
from jaxrl_reason.kernels.checks import unsupported_reason
from jaxrl_reason.rl import advantages as advantages_reference
from jaxrl_reason.rl import losses as losses_reference

__all__ = [
    "BACKENDS",
    "fallback_reason_group_advantages",
    "fallback_reason_policy_loss",
    "group_advantages",
    "group_stats",
    "policy_loss",
    "resolve_backend",
]

BACKENDS = ("auto", "pallas", "reference")
"""Accepted values of ``backend`` / ``config.kernels.backend``."""

_log = logging.getLogger(__name__)
_logged: set[tuple[str, str]] = set()


def resolve_backend(backend: str) -> str:
    """``"auto"`` | ``"pallas"`` | ``"reference"`` -> ``"pallas"`` or ``"reference"``.

    ``"auto"`` is ``"pallas"`` when the platform (``kernels.platform.current()``: the default
    backend, or the target of an ahead-of-time compilation) is ``"tpu"`` or ``"gpu"``, else
    ``"reference"``. Raises ValueError for any other name.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; known: {list(BACKENDS)}")
    if backend == "auto":
        return "pallas" if platform.compiles_kernels() else "reference"
    return backend


def _kernel_modules() -> types.SimpleNamespace:
    """The kernel modules for the current platform: Triton on GPU, Mosaic TPU otherwise (the
    Pallas interpreter runs the TPU version off TPU/GPU)."""
    on_gpu = platform.current() == "gpu"
    return types.SimpleNamespace(
        advantage=group_advantage_gpu if on_gpu else group_advantage,
        loss=policy_loss_gpu if on_gpu else policy_loss_kernel)


def _kernel_name(module: types.ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def _note_fallback(kernel: str, reason: str) -> None:
    """Logs ``reason`` once per (kernel, reason) for the process."""
    if (kernel, reason) not in _logged:
        _logged.add((kernel, reason))
        _log.info("%s falls back to the jnp reference: %s", kernel, reason)


# ----------------------------------------------------------------------------- advantages


def fallback_reason_group_advantages(*, estimator: str = "grpo",
                                     scale: str = "group") -> str | None:
    """Why ``group_advantages`` would run the reference on the pallas backend, or None."""
    module = _kernel_modules().advantage
    return unsupported_reason(_kernel_name(module), module.SUPPORTS,
                              {"estimator": estimator, "scale": scale})


def group_advantages(rewards, group_size: int, *, estimator: str = "grpo",
                     scale: str = "group", eps: float = 1e-6, ddof: int = 0,
                     passk_k: int | None = None, backend: str = "auto") -> jax.Array:
    """``advantages.group_advantages`` on the chosen backend.

    Args: as the reference (rewards real ``[N]`` group-major, static ``group_size``,
      ``estimator``, ``scale``, ``eps``, ``ddof``, ``passk_k``), plus ``backend`` (see the
      module docstring). No kernel implements "passk": it always runs the reference.
    Returns: float32 ``[N]`` advantages.
    """
    if resolve_backend(backend) == "pallas":
        module = _kernel_modules().advantage
        reason = fallback_reason_group_advantages(estimator=estimator, scale=scale)
        if reason is None and passk_k is None:  # passk_k elsewhere: the reference refuses it
            adv, _ = module.group_advantage(rewards, group_size, estimator=estimator,
                                            scale=scale, eps=eps, ddof=ddof,
                                            interpret=not platform.compiles_kernels())
            return adv
        if reason is not None:
            _note_fallback(_kernel_name(module), reason)
    return advantages_reference.group_advantages(rewards, group_size, estimator=estimator,
                                                 scale=scale, eps=eps, ddof=ddof,
                                                 passk_k=passk_k)


def group_stats(rewards, group_size: int, *, ddof: int = 0,
                backend: str = "auto") -> dict[str, jax.Array]:
    """``advantages.group_stats`` on the chosen backend (statistics of the raw rewards: every
    kernel computes them).

    Returns: ``{"mean": f32[N // G], "std": f32[N // G], "zero_variance": bool[N // G]}``.
    """
    if resolve_backend(backend) == "reference":
        return advantages_reference.group_stats(rewards, group_size, ddof=ddof)
    _, stats = _kernel_modules().advantage.group_advantage(
        rewards, group_size, estimator="grpo", scale="none", ddof=ddof,
        interpret=not platform.compiles_kernels())
    return stats


# ----------------------------------------------------------------------------- policy loss


def fallback_reason_policy_loss(logp, *, loss_type: str = "grpo", kl_estimator: str = "k3",
                                policy_loss_mode: str = "ppo", sampler_logp=None,
                                tis_cap=None) -> str | None:
    """Why ``policy_loss`` would run the reference on the pallas backend, or None.

    ``sampler_logp`` without ``tis_cap`` only adds metrics (computed next to the kernel), so
    it keeps the kernel.
    """
    del sampler_logp
    module = _kernel_modules().loss
    reason = unsupported_reason(_kernel_name(module), module.SUPPORTS, {
        "policy_loss_mode": policy_loss_mode, "loss_type": loss_type,
        "kl_estimator": kl_estimator, "tis_cap": tis_cap})
    if reason is None and 0 in jnp.shape(logp):
        reason = f"empty logp of shape {jnp.shape(logp)}"
    return reason


def policy_loss(logp, old_logp, advantages, mask, *, loss_type: str, epsilon_low: float,
                epsilon_high: float, beta=0.0, ref_logp=None,
                max_completion_length: int | None = None, kl_estimator: str = "k3",
                num_tokens_global=None, num_sequences=None, entropy=None, entropy_coef=0.0,
                policy_loss_mode: str = "ppo", clip_ratio_c: float | None = None,
                sampler_logp=None, tis_cap: float | None = None, backend: str = "auto",
                mesh: jax.sharding.Mesh | None = None,
                batch_axes: str | tuple[str, ...] | None = None,
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``losses.policy_loss`` on the chosen backend.

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
        module = _kernel_modules().loss
        reason = fallback_reason_policy_loss(
            logp, loss_type=loss_type, kl_estimator=kl_estimator,
            policy_loss_mode=policy_loss_mode, sampler_logp=sampler_logp, tis_cap=tis_cap)
        if reason is None:
            loss, metrics = module.policy_loss(
                logp, old_logp, advantages, mask, **kwargs,
                interpret=not platform.compiles_kernels(), mesh=mesh, batch_axes=batch_axes)
            if sampler_logp is not None:  # metrics only (no tis_cap): constants, no gradient
                metrics = {**metrics,
                           **losses_reference.sampler_mismatch(old_logp, sampler_logp, mask)[1]}
            return loss, metrics
        _note_fallback(_kernel_name(module), reason)
    return losses_reference.policy_loss(logp, old_logp, advantages, mask, **kwargs,
                                        policy_loss_mode=policy_loss_mode,
                                        sampler_logp=sampler_logp, tis_cap=tis_cap)
