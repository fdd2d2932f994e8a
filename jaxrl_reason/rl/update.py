"""The jitted pieces of an RL step, built once per run and called by `RLTrainer.step`
(and by `plan.py`'s ahead-of-time compiles and the benchmarks, which time them alone):

  make_logprob_fn   (params, rollout arrays) -> log-probs f32 [N, L]: old-policy / reference
  make_packed_logprob_fn  the same from packs (`rl.packing`, `rl/packing.py`)
  make_update_fn    (state, batch) -> (state, metrics): the policy loss's gradient step,
                    state donated, optionally accumulated over micro-batches (of rows, or
                    with `packed=True` of the batch's packs: `packed_logprobs`,
                    `micro.packed_micro_batch`)
  mix_reference     the TR-DPO / TRL reference sync, alpha * policy + (1 - alpha) * ref
  adaptive_kl_beta  Ziegler et al.'s adaptive KL coefficient (host float math)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform
from jaxrl_reason.models.lora import dropout_key
from jaxrl_reason.models.scoring import completion_logprobs, hidden_logprobs, packed_hidden
from jaxrl_reason.rl import backends as kernel_dispatch
from jaxrl_reason.rl import micro
from jaxrl_reason.runtime.train_state import (TrainState, apply_gradients_if_finite,
                                              trainable_params, value_and_grad)


def make_logprob_fn(model, temperature: float, micro_batches: int = 1, mesh=None, rules=()):
    """Jitted (params, rollout arrays) -> logp f32 [N, L] (old-policy / reference scoring),
    computed `micro_batches` slices of rows at a time (lower peak memory, same values)."""

    batch_axes = dict(rules).get("batch") if mesh is not None else None

    def one(params, prompt_tokens, prompt_valid, completion_tokens, mask):
        logp, _ = completion_logprobs(model, params, prompt_tokens, prompt_valid,
                                      completion_tokens, mask, temperature=temperature,
                                      with_entropy=False, mesh=mesh, batch_axes=batch_axes)
        return logp

    def fn(params, prompt_tokens, prompt_valid, completion_tokens, mask):
        rows = (prompt_tokens, prompt_valid, completion_tokens, mask)
        if micro_batches == 1:
            return one(params, *rows)
        named = dict(zip(("prompt_tokens", "prompt_valid", "completion_tokens", "mask"), rows))
        return micro.map_rows(lambda r: one(params, **r), named, micro_batches, mesh, rules)

    return jax.jit(shd.with_activation_sharding(fn, mesh, rules),
                   compiler_options=platform.compiler_options("dense", mesh))


PACK_KEYS = micro.PACK_KEYS


def packed_slot_logprobs(model, params, packs, *, temperature: float, share_prompts: bool,
                         with_entropy: bool = True, mesh=None, batch_axes=None,
                         dropout_rng=None):
    """The decoder on packs: per-slot log-probs (and entropies) of the slots' targets.

    Args:
      packs: the `pack_*` arrays of `packing.Packs.arrays()` (int32 [K, T]; `pack_index`,
        if present, is not read).
      share_prompts: whether the packs share prompts (`packing.shares_prompts`): only then
        does the attention take `pack_prompt_segments` (the kernels cannot).
    Returns: logp f32 [K, T] and entropy f32 [K, T] (all 0 unless with_entropy); slots
    that predict nothing scored hold values nobody reads.
    """
    hidden = packed_hidden(model, params, packs, share_prompts=share_prompts,
                           dropout_rng=dropout_rng)
    return hidden_logprobs(model, params, hidden, packs["pack_targets"],
                           temperature=temperature, with_entropy=with_entropy, mesh=mesh,
                           batch_axes=batch_axes)


def packed_logprobs(model, params, packs, *, temperature: float, share_prompts: bool,
                    with_entropy: bool = True, mesh=None, batch_axes=None, dropout_rng=None):
    """Per-row log-probs (and entropies) of a packed batch: the decoder runs on the packs,
    each slot scores its target, and the slots are gathered back to the rows
    (`packed_slot_logprobs`, then `slots_to_rows` with `pack_index` int32 [N, L]).

    Returns: logp f32 [N, L] and entropy f32 [N, L] (0 where pack_index is -1; entropy all
    0 unless with_entropy), the values of `completion_logprobs` on the padded rows up to
    float summation order.
    """
    logp, entropy = packed_slot_logprobs(
        model, params, packs, temperature=temperature, share_prompts=share_prompts,
        with_entropy=with_entropy, mesh=mesh, batch_axes=batch_axes, dropout_rng=dropout_rng)
    index = packs["pack_index"]
    return micro.slots_to_rows(logp, index), micro.slots_to_rows(entropy, index)


def make_packed_logprob_fn(model, temperature: float, share_prompts: bool, mesh=None,
                           rules=(), packs_per_micro: int | None = None):
    """Jitted (params, packs) -> logp f32 [N, L]: `make_logprob_fn`'s values from the packs
    (`packed_logprobs`; packs a dict with the `PACK_KEYS`), `packs_per_micro` packs at a
    time (`Packer.packs_per_micro`; None: all at once): lower peak memory, same values."""
    batch_axes = dict(rules).get("batch") if mesh is not None else None

    def slots(params, packs):
        logp, _ = packed_slot_logprobs(model, params, packs, temperature=temperature,
                                       share_prompts=share_prompts, with_entropy=False,
                                       mesh=mesh, batch_axes=batch_axes)
        return logp

    def fn(params, packs):
        logp = micro.map_packs(lambda p: slots(params, p), packs, packs_per_micro, mesh, rules)
        return micro.slots_to_rows(logp, packs["pack_index"])

    return jax.jit(shd.with_activation_sharding(fn, mesh, rules),
                   compiler_options=platform.compiler_options("dense", mesh))


def adaptive_kl_beta(beta: float, kl: float, target: float, horizon: float,
                     batch_size: int) -> float:
    """Adaptive KL controller (Ziegler et al. 2019): beta *= 1 + clip(kl / target - 1,
    -0.2, 0.2) * batch_size / horizon, so the measured KL drifts toward `target`."""
    error = float(np.clip(kl / target - 1.0, -0.2, 0.2))
    return float(beta * (1.0 + error * batch_size / horizon))


@jax.jit
def _mix(ref, policy, alpha):
    return jax.tree.map(lambda r, p: (alpha * p + (1.0 - alpha) * r).astype(r.dtype),
                        ref, policy)


def mix_reference(ref_params, params, alpha: float):
    """Reference sync (TR-DPO / TRL `sync_ref_model`): alpha * policy + (1 - alpha) * ref,
    as new arrays (the policy's buffers are donated by the next update)."""
    return _mix(ref_params, params, jnp.float32(alpha))


def make_update_fn(model, optimizer, rl, mesh=None, rules=(), kernel_backend: str = "reference",
                   dropout_seed: int = 0, packed: bool = False, share_prompts: bool = True,
                   packs_per_micro: int | None = None):
    """Jitted, state-donating policy update: (state, batch) -> (state, metrics).

    With `rl.micro_batches` = k > 1 the batch is split into k micro-batches whose
    gradients are summed in a `lax.scan` (gradient accumulation: one optimizer step, the
    loss's whole-batch normalizers `num_sequences` / `num_tokens` make the sum the full
    batch's loss); peak activation memory is that of one micro-batch. Padded rows split
    into k strided micro-batches of M/k rows. Packed batches split into strided
    micro-batches of `packs_per_micro` packs (`Packer.packs_per_micro`, sized from
    rl.micro_batches and the run's largest batch; None: one micro-batch), as many as the
    batch's packs need (`micro.packed_micro_batch`: each row's tokens are in one pack, so
    its loss counts in exactly one micro-batch). The metrics are those of the whole batch
    either way: the micro-batches' log-probs and entropies are gathered and the loss's
    metrics computed once on all rows (no gradient), so they do not depend on k.

    LoRA dropout (`model.cfg.lora.dropout` > 0) runs in this pass only, with the key
    `lora.dropout_key(lora, dropout_seed, state.step)` (micro-batch i: folded with i).

    packed: the batch carries packs (the `PACK_KEYS`, `rl/packing.py`) instead of prompt and
    completion tokens, and the log-probs come from `packed_logprobs` (share_prompts as
    there); the loss, on the [N, L] rows, is the same code.
    """
    split = micro.MicroBatches(packed, int(rl.get("micro_batches", 1)), packs_per_micro,
                               mesh, tuple(rules))
    backend = kernel_backend
    batch_axes = dict(rules).get("batch") if mesh is not None else None

    def scores(params, batch, dropout_rng):
        if packed:
            return packed_logprobs(model, params, batch, temperature=rl.temperature,
                                   share_prompts=share_prompts, mesh=mesh,
                                   batch_axes=batch_axes, dropout_rng=dropout_rng)
        return completion_logprobs(
            model, params, batch["prompt_tokens"], batch["prompt_valid"],
            batch["completion_tokens"], batch["mask"], temperature=rl.temperature, mesh=mesh,
            batch_axes=batch_axes, dropout_rng=dropout_rng)

    def loss_terms(logp, entropy, batch):
        """(loss f32 [], metrics) of the policy loss on the rows' logp / entropy [M, L]."""
        old = batch["old_logp"] if rl.num_iterations > 1 else jax.lax.stop_gradient(logp)
        in_loss_kl = rl.beta > 0 and not rl.kl_in_reward
        # Tool-use rollouts: result tokens (in `mask`, read by the model) carry no loss.
        loss_mask = batch.get("loss_mask", batch["mask"])
        return kernel_dispatch.policy_loss(
            logp, old, batch["advantages"], loss_mask, loss_type=rl.loss_type,
            epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
            beta=batch["beta"] if in_loss_kl else 0.0,
            ref_logp=batch.get("ref_logp"), max_completion_length=rl.max_new_tokens,
            kl_estimator=rl.kl_estimator, entropy=entropy, entropy_coef=rl.entropy_coef,
            num_sequences=batch.get("num_sequences"), num_tokens_global=batch.get("num_tokens"),
            policy_loss_mode=rl.policy_loss_mode, clip_ratio_c=rl.clip_ratio_c or None,
            sampler_logp=batch.get("sampler_logp"), tis_cap=rl.tis_cap or None,
            backend=backend, mesh=mesh, batch_axes=batch_axes)

    def loss_fn(params, batch, dropout_rng=None):
        logp, entropy = scores(params, batch, dropout_rng)
        loss, metrics = loss_terms(logp, entropy, batch)
        return loss, (metrics, jax.lax.stop_gradient(logp), jax.lax.stop_gradient(entropy))

    grad_fn = value_and_grad(loss_fn, has_aux=True)  # LoRA: the adapters' gradients only

    def micro_grad(params, batch, rng):
        """A micro-batch's loss, (logp, entropy) and gradients (`micro.GradFn`'s form)."""
        (loss, (_, logp, entropy)), grads = grad_fn(params, batch, rng)
        return (loss, (logp, entropy)), grads

    def update(state: TrainState, batch):
        dropout_rng = dropout_key(model.cfg.lora, dropout_seed, state.step)
        if split.count(batch) == 1:
            (loss, (metrics, _, _)), grads = grad_fn(state.params, batch, dropout_rng)
        else:
            batch = micro.with_normalizers(batch)
            loss, (logp, entropy), grads = split.accumulate(
                micro.folding(micro_grad, dropout_rng), state.params, batch,
                trainable_params(state.params), 2)  # LoRA: the adapters' gradients
            # The whole batch's metrics, from the micro-batches' log-probs (no gradient).
            _, metrics = loss_terms(logp, entropy, batch)
        # A non-finite loss or gradient leaves weights and optimizer state untouched.
        state, grad_norm, ok = apply_gradients_if_finite(state, grads, loss, optimizer)
        return state, {**metrics, "loss": loss, "grad_norm": grad_norm,
                       "update_skipped": 1.0 - ok}

    return jax.jit(shd.with_activation_sharding(update, mesh, rules), donate_argnums=0,
                   compiler_options=platform.compiler_options("dense", mesh))
