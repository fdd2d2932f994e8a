"""The critic's jitted programs, the counterparts of `rl/update.py`'s `make_logprob_fn` /
`make_update_fn` for PPO's value model (`rl/value.py`: the model, GAE and the value loss):

  make_value_fn         (value params, rows or packs) -> values f32 [N, L]
  make_value_update_fn  (value state, batch) -> (value state, metrics), state donated

Both read padded rows, or with `share_prompts` not None padding-free packs (`rl.packing`),
and run micro-batches as the policy's passes do (`rl/micro.py`): `micro_batches` strided
slices of rows, or `packs_per_micro` packs at a time (`packing.Packer.packs_per_micro`).
The update's metrics are the whole batch's (the micro-batches' values gathered, the loss's
metrics computed once on all rows), so they do not depend on the micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxrl_reason.kernels import platform
from jaxrl_reason.rl import micro
from jaxrl_reason.rl.value import (completion_values, lora_value_params, packed_slot_values,
                                   value_loss)
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import TrainState, apply_gradients

ROW_KEYS = ("prompt_tokens", "prompt_valid", "completion_tokens", "mask")


def _values(model, share_prompts, packs_per_micro, mesh, rules):
    """(value_params, batch) -> values f32 [M, L] of a batch's rows (ROW_KEYS) or packs
    (`micro.PACK_KEYS`); packs `packs_per_micro` at a time (`micro.map_packs`)."""
    def values(value_params, batch):
        if share_prompts is None:
            return completion_values(model, value_params, *(batch[k] for k in ROW_KEYS))
        slots = micro.map_packs(
            lambda p: packed_slot_values(model, value_params, p, share_prompts=share_prompts),
            batch, packs_per_micro, mesh, rules)
        return micro.slots_to_rows(slots, batch["pack_index"])
    return values


def make_value_fn(model, mesh=None, rules=(), lora: bool = False,
                  share_prompts: bool | None = None, micro_batches: int = 1,
                  packs_per_micro: int | None = None):
    """Jitted (value_params, prompt_tokens, prompt_valid, completion_tokens, mask) -> values
    f32 [B, L] (`completion_values`; the rollout's `scoring_args()` after the params).

    mesh, rules: lay the activations out by `rules` (`sharding.activation_sharding`).
    lora: a LoRA critic's (critic_params, base, ...) instead (`lora_value_params`).
    share_prompts: not None, (value_params, packs) instead (`value.packed_values`; packs
    holds the `micro.PACK_KEYS`), `packs_per_micro` packs at a time (None: all).
    micro_batches: padded rows, that many strided slices of rows at a time (same values).
    """
    values = _values(model, share_prompts, packs_per_micro, mesh, rules)

    def fn(value_params, *args):
        if share_prompts is not None:
            return values(value_params, args[0])
        batch = dict(zip(ROW_KEYS, args))
        if micro_batches == 1:
            return values(value_params, batch)
        return micro.map_rows(lambda b: values(value_params, b), batch, micro_batches, mesh,
                              rules)

    def lora_fn(critic_params, base, *args):
        return fn(lora_value_params(critic_params, base), *args)

    return jax.jit(shd.with_activation_sharding(lora_fn if lora else fn, mesh, rules),
                   compiler_options=platform.compiler_options("dense", mesh))


def make_value_update_fn(model, optimizer, *, clip_range: float | None,
                         loss_type: str = "bnpo", max_completion_length: int | None = None,
                         mesh=None, rules=(), lora: bool = False,
                         share_prompts: bool | None = None, micro_batches: int = 1,
                         packs_per_micro: int | None = None):
    """Jitted, state-donating critic update: (value_state, batch) -> (value_state, metrics).

    Args:
      model: the policy's `Transformer` (see `completion_values`).
      optimizer: optax transformation (e.g. `train_state.make_optimizer`).
      clip_range, loss_type, max_completion_length: as in `value_loss`.
      mesh, rules: lay the activations out by `rules` (`sharding.activation_sharding`).
      micro_batches: k > 1 accumulates the gradient over k strided micro-batches of the
        padded rows (one optimizer step; the whole batch's normalizers, `num_tokens` /
        `num_sequences`, make the sum the batch's loss).
      packs_per_micro: with packs, the packs of a micro-batch (`Packer.packs_per_micro`;
        None: all at once); a batch runs as many micro-batches as its packs fill.
    `batch` is a dict with prompt_tokens, prompt_valid, completion_tokens, mask (the
    Rollout's fields), "old_values" and "returns" f32 [B, L], and optionally "num_tokens" /
    "num_sequences" (global normalizers); other keys are ignored, so the policy's batch dict
    can be reused. Metrics: those of `value_loss` on the whole batch plus "value_grad_norm".

    lora: a LoRA critic, (value_state, base, batch) -> (value_state, metrics): the state
    holds its adapters and head (`init_lora_value_params`, all trained), `base` is the
    policy's frozen base (not donated, not differentiated).

    share_prompts: not None, the values come from the batch's packs instead of its prompt
    and completion tokens (`packed_values`; `rl.packing`); the loss is the same code.
    """
    split = micro.MicroBatches(share_prompts is not None, micro_batches, packs_per_micro,
                               mesh, tuple(rules))
    # a micro-batch's values come from its own packs: never micro-batched again inside
    values_of = _values(model, share_prompts, None, mesh, rules)

    def loss_terms(values, batch):
        return value_loss(values, batch["old_values"], batch["returns"], batch["mask"],
                          clip_range=clip_range, loss_type=loss_type,
                          max_completion_length=max_completion_length,
                          num_tokens_global=batch.get("num_tokens"),
                          num_sequences=batch.get("num_sequences"))

    def grad_fn(params, batch, base):
        """((loss, (metrics, values)), grads) with respect to the trained params."""
        def loss_fn(p):
            values = values_of(lora_value_params(p, base) if lora else p, batch)
            loss, metrics = loss_terms(values, batch)
            return loss, (metrics, jax.lax.stop_gradient(values))
        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    def loss_and_grads(params, batch, base):
        """(the whole batch's metrics, gradients), over `split`'s micro-batches."""
        if split.count(batch) == 1:
            (_, (metrics, _)), grads = grad_fn(params, batch, base)
            return metrics, grads

        def micro_grad(p, b, i):  # a micro-batch's loss, (values,) and gradients
            (loss, (_, values)), grads = grad_fn(p, b, base)
            return (loss, (values,)), grads

        batch = micro.with_normalizers(batch, "mask")
        if not split.packed:  # only the arrays the value pass and loss read are sliced
            batch = {k: v for k, v in batch.items()
                     if k in (*ROW_KEYS, "old_values", "returns") or jnp.ndim(v) == 0}
        _, (values,), grads = split.accumulate(micro_grad, params, batch, params, 1)
        # The whole batch's metrics, from the micro-batches' values (no gradient).
        return loss_terms(values, batch)[1], grads

    def update(state: TrainState, batch):
        metrics, grads = loss_and_grads(state.params, batch, None)
        state, grad_norm = apply_gradients(state, grads, optimizer)
        return state, {**metrics, "value_grad_norm": grad_norm}

    def lora_update(state: TrainState, base, batch):
        metrics, grads = loss_and_grads(state.params, batch, base)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        state = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state)
        return state, {**metrics, "value_grad_norm": optax.tree.norm(grads)}

    return jax.jit(shd.with_activation_sharding(lora_update if lora else update, mesh, rules),
                   donate_argnums=0, compiler_options=platform.compiler_options("dense", mesh))
