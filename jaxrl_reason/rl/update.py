"""The jitted pieces of an RL step, built once per run and called by `RLTrainer.step`
(and by `plan.py`'s ahead-of-time compiles and the benchmarks, which time them alone):

  make_logprob_fn   (params, rollout arrays) -> log-probs f32 [N, L]: old-policy / reference
  make_packed_logprob_fn  the same from packs (`rl.packing`, `rl/packing.py`)
  make_update_fn    (state, batch) -> (state, metrics): the policy loss's gradient step,
                    state donated, optionally accumulated over micro-batches (of rows, or
                    with `packed=True` of the batch's packs: `packed_logprobs`,
                    `packed_micro_batch`)
  mix_reference     the TR-DPO / TRL reference sync, alpha * policy + (1 - alpha) * ref
  adaptive_kl_beta  Ziegler et al.'s adaptive KL coefficient (host float math)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform
from jaxrl_reason.models.lora import dropout_key, dropout_rngs
from jaxrl_reason.models.scoring import completion_logprobs, hidden_logprobs, per_row_prompts
from jaxrl_reason.rl import backends as kernel_dispatch
from jaxrl_reason.rl.batches import micro_sharding, from_micro, to_micro
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
        n = completion_tokens.shape[0]  # micro-batches slice rows: a prompt per row
        rows = (per_row_prompts(prompt_tokens, n), per_row_prompts(prompt_valid, n),
                completion_tokens, mask)
        micro = [to_micro(x, micro_batches, micro_sharding(mesh, rules, x.ndim + 1))
                 for x in rows]
        return from_micro(jax.lax.map(lambda r: one(params, *r), micro))

    return jax.jit(shd.with_activation_sharding(fn, mesh, rules),
                   compiler_options=platform.compiler_options("dense", mesh))


PACK_KEYS = ("pack_tokens", "pack_positions", "pack_segments", "pack_prompt_segments",
             "pack_targets", "pack_index")


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
    segments = packs["pack_segments"]
    hidden, _ = model.apply(
        {"params": params}, packs["pack_tokens"], packs["pack_positions"], segments > 0,
        return_hidden=True, segment_ids=segments,
        prompt_segment_ids=packs["pack_prompt_segments"] if share_prompts else None,
        rngs=dropout_rngs(dropout_rng, 0))
    return hidden_logprobs(model, params, hidden, packs["pack_targets"],
                           temperature=temperature, with_entropy=with_entropy, mesh=mesh,
                           batch_axes=batch_axes)


def slots_to_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """Per-slot values [K, T] -> per-row values [N, L]: x.reshape(-1)[index], 0 where index
    (int32 [N, L]) is -1. The gradient scatters back to the slots."""
    return jnp.where(index >= 0, x.reshape(-1)[jnp.maximum(index, 0)], 0.0)


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
    return slots_to_rows(logp, index), slots_to_rows(entropy, index)


def micro_pack_index(index: jax.Array, i, k: int, pack_tokens: int) -> jax.Array:
    """`pack_index` int32 [N, L] (flat slots of K packs of T tokens) -> the slots of
    micro-batch i of `to_micro(packs, k)` (packs i, k + i, 2k + i, ...: pack j is its local
    pack j // k), -1 where a row's token lives in another micro-batch's packs."""
    pack, slot = index // pack_tokens, index % pack_tokens
    mine = (index >= 0) & (pack % k == i)
    return jnp.where(mine, (pack // k) * pack_tokens + slot, -1)


def packed_micro_batch(batch, micro_packs, i, k: int):
    """Micro-batch i of k of a packed update batch: `micro_packs` (the `pack_*` arrays of
    micro-batch i, [K/k, T]) with `pack_index` re-addressed to them (`micro_pack_index`)
    and the loss mask (`loss_mask`, else `mask`, f32 [N, L]) zero on the rows whose packs
    are elsewhere (a row lives in one pack); the other arrays (one per row, or scalars
    such as the whole batch's normalizers) unchanged."""
    index = micro_pack_index(batch["pack_index"], i, k, micro_packs["pack_tokens"].shape[1])
    loss_mask = batch.get("loss_mask", batch["mask"])
    return {**batch, **micro_packs, "pack_index": index,
            "loss_mask": jnp.where(index >= 0, loss_mask, 0).astype(loss_mask.dtype)}


def micro_batch_count(packs, packs_per_micro: int | None) -> int:
    """How many micro-batches a packed batch runs: K / packs_per_micro for `pack_tokens`
    [K, T] (1 when packs_per_micro is None); ValueError when it does not divide K."""
    num = packs["pack_tokens"].shape[0]
    if packs_per_micro is None:
        return 1
    if num % packs_per_micro:
        raise ValueError(f"rl.micro_batches: {num} packs do not split into micro-batches of "
                         f"{packs_per_micro} packs (the packer's pack counts are multiples "
                         "of a micro-batch's packs)")
    return num // packs_per_micro


def _micro_packs(packs, k: int, mesh, rules) -> dict:
    """The `pack_*` arrays [K, T] of `packs` (not `pack_index`) as [k, K/k, T] strided
    micro-batches (`to_micro`)."""
    return {key: to_micro(packs[key], k, micro_sharding(mesh, rules, 3))
            for key in PACK_KEYS[:-1]}


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
        k = micro_batch_count(packs, packs_per_micro)
        if k == 1:
            logp = slots(params, packs)
        else:
            micro = _micro_packs(packs, k, mesh, rules)
            logp = from_micro(jax.lax.map(lambda p: slots(params, p), micro))
        return slots_to_rows(logp, packs["pack_index"])

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
    batch's packs need (`packed_micro_batch`: each row's tokens are in one pack, so its loss
    counts in exactly one micro-batch). The metrics are those of the whole batch either way: the
    micro-batches' log-probs and entropies are gathered and the loss's metrics computed
    once on all rows (no gradient), so they do not depend on k.

    LoRA dropout (`model.cfg.lora.dropout` > 0) runs in this pass only, with the key
    `lora.dropout_key(lora, dropout_seed, state.step)` (micro-batch i: folded with i).

    packed: the batch carries packs (the `PACK_KEYS`, `rl/packing.py`) instead of prompt and
    completion tokens, and the log-probs come from `packed_logprobs` (share_prompts as
    there); the loss, on the [N, L] rows, is the same code.
    """
    k = int(rl.get("micro_batches", 1))
    if packed and k > 1 and packs_per_micro is None:
        raise ValueError(f"rl.micro_batches = {k} with rl.packing: give the update the packs "
                         "of a micro-batch (packs_per_micro = Packer.packs_per_micro)")
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

    def with_normalizers(batch):
        """The whole batch's normalizers, so that each micro-batch's loss is its share."""
        mask = batch.get("loss_mask", batch["mask"])
        return {"num_sequences": jnp.float32(mask.shape[0]),
                "num_tokens": jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0), **batch}

    def accumulate_rows(params, batch, dropout_rng):
        # Micro-batches slice rows: a prompt per row.
        num_rows = batch["completion_tokens"].shape[0]
        batch = {**batch, "prompt_tokens": per_row_prompts(batch["prompt_tokens"], num_rows),
                 "prompt_valid": per_row_prompts(batch["prompt_valid"], num_rows)}
        rows = {n: x for n, x in batch.items() if jnp.ndim(x) >= 1}
        consts = {n: x for n, x in batch.items() if jnp.ndim(x) == 0}
        micro = {n: to_micro(x, k, micro_sharding(mesh, rules, x.ndim + 1))
                 for n, x in rows.items()}

        def body(carry, xs):
            grads, loss = carry
            mb, i = xs
            rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
            (l, (_, logp, entropy)), g = grad_fn(params, {**mb, **consts}, rng)
            return (jax.tree.map(jnp.add, grads, g), loss + l), (logp, entropy)

        zeros = jax.tree.map(jnp.zeros_like, trainable_params(params))
        (grads, loss), (logp, entropy) = jax.lax.scan(
            body, (zeros, jnp.float32(0.0)), (micro, jnp.arange(k)))
        return (loss, from_micro(logp), from_micro(entropy)), grads

    def accumulate_packs(params, batch, dropout_rng, k):
        micro = _micro_packs(batch, k, mesh, rules)

        def body(carry, xs):
            grads, loss, logp, entropy = carry
            packs, i = xs
            rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
            mb = packed_micro_batch(batch, packs, i, k)
            (l, (_, lp, ent)), g = grad_fn(params, mb, rng)
            # Each row is read by one micro-batch (0 elsewhere): the sums are the rows.
            return (jax.tree.map(jnp.add, grads, g), loss + l, logp + lp, entropy + ent), None

        rows = jnp.zeros(batch["pack_index"].shape, jnp.float32)
        zeros = jax.tree.map(jnp.zeros_like, trainable_params(params))
        (grads, loss, logp, entropy), _ = jax.lax.scan(
            body, (zeros, jnp.float32(0.0), rows, rows), (micro, jnp.arange(k)))
        return (loss, logp, entropy), grads

    def update(state: TrainState, batch):
        dropout_rng = dropout_key(model.cfg.lora, dropout_seed, state.step)
        micro = micro_batch_count(batch, packs_per_micro) if packed else k
        if micro == 1:
            (loss, (metrics, _, _)), grads = grad_fn(state.params, batch, dropout_rng)
        else:
            batch = with_normalizers(batch)
            accumulate = (functools.partial(accumulate_packs, k=micro) if packed
                          else accumulate_rows)
            (loss, logp, entropy), grads = accumulate(state.params, batch, dropout_rng)
            # The whole batch's metrics, from the micro-batches' log-probs (no gradient).
            _, metrics = loss_terms(logp, entropy, batch)
        # A non-finite loss or gradient leaves weights and optimizer state untouched.
        state, grad_norm, ok = apply_gradients_if_finite(state, grads, loss, optimizer)
        return state, {**metrics, "loss": loss, "grad_norm": grad_norm,
                       "update_skipped": 1.0 - ok}

    return jax.jit(shd.with_activation_sharding(update, mesh, rules), donate_argnums=0,
                   compiler_options=platform.compiler_options("dense", mesh))
