"""Training state shared by SFT and RL: params + optimizer state + step, and the optimizer.

The optimizer state is created by a jitted `init` whose outputs are laid out explicitly like
the params (`opt_state_shardings`): Adam moments are params-shaped, so FSDP shards them too
(ZeRO-3). XLA would not do it by itself: `zeros_like(params)` does not depend on the params'
values, so without out_shardings the moments came back replicated on every device.

Trainable leaves: when the params hold LoRA adapters (`models.lora`), only the adapter leaves
are trained. `value_and_grad` differentiates those alone (the base's gradients are never
computed; a quantized base could not be differentiated at all), the optimizer state covers
only them, and `apply_gradients` updates only them. Without adapters every leaf is trainable
and all of this is the plain full fine-tuning.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_reason.models.lora import has_adapters, merge_trees, split_adapters


@flax.struct.dataclass
class TrainState:
    """step: int32 []; params: pytree of f32 arrays; opt_state: optax state (same sharding)."""
    step: jax.Array
    params: Any
    opt_state: Any


def split_trainable(params: Any) -> tuple[Any, Any]:
    """(trainable, frozen): the adapter leaves and the rest when `params` holds LoRA
    adapters, else (params, {}). `combine(trainable, frozen)` is `params` again."""
    if has_adapters(params):
        return split_adapters(params)
    return params, {}


def trainable_params(params: Any) -> Any:
    """The leaves the optimizer trains (see `split_trainable`)."""
    return split_trainable(params)[0]


def combine(trainable: Any, frozen: Any) -> Any:
    """Inverse of `split_trainable`."""
    return merge_trees(trainable, frozen) if frozen else trainable


def value_and_grad(fn, has_aux: bool = False):
    """`jax.value_and_grad(fn)` over only the trainable leaves of its first argument (the
    params): returns (value, grads) with grads shaped like `trainable_params(params)`."""

    def wrapped(params, *args, **kwargs):
        trainable, frozen = split_trainable(params)
        return jax.value_and_grad(lambda t: fn(combine(t, frozen), *args, **kwargs),
                                  has_aux=has_aux)(trainable)

    return wrapped


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int,
                           decay: str = "cosine", final_fraction: float = 0.1) -> optax.Schedule:
    """Linear warm-up to `peak`, then cosine decay to `final_fraction * peak` or constant."""
    if decay not in ("cosine", "constant"):
        raise ValueError(f"decay must be 'cosine' or 'constant', got {decay!r}")
    warmup = optax.linear_schedule(0.0 if warmup_steps else peak, peak, max(warmup_steps, 1))
    if decay == "constant":
        after = optax.constant_schedule(peak)
    else:
        after = optax.cosine_decay_schedule(peak, max(total_steps - warmup_steps, 1),
                                            alpha=final_fraction)
    return optax.join_schedules([warmup, after], [warmup_steps])


def make_optimizer(learning_rate: optax.ScalarOrSchedule, *, weight_decay: float,
                   max_grad_norm: float, b1: float = 0.9, b2: float = 0.95,
                   eps: float = 1e-8) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (clipping skipped when max_grad_norm <= 0)."""
    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    return optax.chain(*parts)


def opt_state_shardings(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """Shardings of `optimizer.init(params)`: params-shaped parts (Adam's mu and nu) take
    their param's sharding, everything else (step counts) is replicated on the params' mesh.

    Args: params: arrays or `jax.ShapeDtypeStruct`s carrying `NamedSharding`s on one mesh.
    Returns: a pytree of `NamedSharding`s with the optimizer state's structure, or None
      when the params are not laid out on a mesh.
    """
    leaves = jax.tree.leaves(params)
    first = getattr(leaves[0], "sharding", None) if leaves else None
    if not isinstance(first, jax.sharding.NamedSharding):
        return None
    replicated = jax.sharding.NamedSharding(first.mesh, jax.sharding.PartitionSpec())
    abstract = jax.eval_shape(optimizer.init, params)
    return optax.tree_map_params(optimizer, lambda _, param: param.sharding, abstract, params,
                                 transform_non_params=lambda _: replicated)


def create_train_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """A TrainState at step 0 whose optimizer state is laid out like `params`.

    Leaves that are not laid out on the params' mesh (the step counter, optax's counts) are
    placed on it replicated: a donated update returns them that way, and inputs laid out
    differently on the first call would make every update function compile twice.
    """
    trainable = trainable_params(params)
    opt_state = jax.jit(optimizer.init,
                        out_shardings=opt_state_shardings(optimizer, trainable))(trainable)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None) if params else None
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return state
    replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())

    def on_mesh(x):
        if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding):
            return x
        return jax.device_put(x, replicated)

    return TrainState(step=on_mesh(state.step), params=params,
                      opt_state=jax.tree.map(on_mesh, opt_state))


def apply_gradients(state: TrainState, grads: Any,
                    optimizer: optax.GradientTransformation) -> tuple[TrainState, jax.Array]:
    """One optimizer update (call inside jit). Returns the new state and the gradient norm.

    grads: shaped like `trainable_params(state.params)` (a full tree is cut down to it)."""
    trainable, frozen = split_trainable(state.params)
    grads = trainable_params(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
    params = combine(optax.apply_updates(trainable, updates), frozen)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), optax.tree.norm(grads)


def apply_gradients_if_finite(state: TrainState, grads: Any, loss: jax.Array,
                              optimizer: optax.GradientTransformation
                              ) -> tuple[TrainState, jax.Array, jax.Array]:
    """(state, grad_norm, ok): one optimizer update when `loss` and the gradient norm are
    finite, else `state` unchanged (params, optimizer state and step). Call inside jit.

    The update runs inside `lax.cond` rather than as a select between the old and the new
    state: a select needs both states alive at once (params and optimizer state twice),
    while the conditional's branch updates the donated buffers in place.
    """
    grads = trainable_params(grads)
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    state = jax.lax.cond(ok, lambda s: apply_gradients(s, grads, optimizer)[0],
                         lambda s: s, state)
    return state, grad_norm, ok
