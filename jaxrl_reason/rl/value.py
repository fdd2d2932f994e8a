"""PPO with a learned critic (InstructGPT / Ouyang et al. 2022, as verl and OpenRLHF run it).

The pieces the trainer names, each a small pure function:

- value model (`jaxrl_reason.models.value_head.ValueModel`): the policy's `Transformer`
  trunk with a scalar head. `init_value_params` builds its params, optionally copying the
  trunk from policy/SFT params; `completion_values` reads V(s_t) for every completion token.
- `token_rewards`: the per-token reward, ``-kl_coef * kl_t`` at every completion token plus
  the sequence reward at the last one.
- `gae`: generalised advantage estimation over the completion tokens (Schulman et al. 2016).
- `whiten`: masked advantage whitening.
- `value_loss`: the PPO clipped value loss and its metrics.
- `rl/value_passes.py` (`make_value_fn` / `make_value_update_fn`): the jitted value pass
  and donated critic update built from these, micro-batched like the policy's passes.
- With a LoRA policy (`model.lora`) the critic holds no trunk of its own: its trained params
  are its own adapters and the head (`init_lora_value_params`), read on top of the policy's
  frozen (possibly quantized) base, passed to every call (`lora_value_params`; no copy).

Value params layout (see `value_head.py`):

    {"trunk": <Transformer params without "lm_head">,
     "head":  {"kernel": f32 [D, 1] logical ("embed", None), "bias": f32 [1] logical (None,)}}

Deviations from the paper / from verl and OpenRLHF, on purpose:

- One MDP step per completion token; the state s_t is prompt + completion[:t] and the episode
  ends after the last completion token, whose next-state value is 0. A completion truncated at
  the token budget is treated as terminal too (no bootstrapping), as verl and OpenRLHF do.
- The head reads the final (RMS-normed) hidden state, as HF's token-classification heads do;
  its kernel is zero-initialised by default (OpenRLHF: normal, std 1/(D+1); verl: the HF
  initializer_range), so every value starts at 0 and the first advantages are the
  reward-to-go. An untied policy's `lm_head` is not copied into the critic.
- `value_loss` aggregates like the policy loss registry (`losses.LOSS_AGGREGATIONS`) with the
  token mean ("bnpo", verl's "token-mean") as default; the 0.5 factor is kept.
- `whiten` uses the Bessel-corrected variance (ddof=1), as TRL's and verl's `masked_whiten`.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_reason.models import lora as lora_lib
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.lora_params import init_adapters
from jaxrl_reason.models.scoring import packed_hidden, sequence_inputs
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.models.value_head import (ValueModel, abstract_value_params,
                                            trunk_config, value_param_shardings)
from jaxrl_reason.rl.losses import LOSS_AGGREGATIONS, aggregate_loss
from jaxrl_reason.rl.micro import slots_to_rows
from jaxrl_reason.runtime.train_state import TrainState, opt_state_shardings

Array = jnp.ndarray

__all__ = [
    "completion_values",
    "gae",
    "init_lora_value_params",
    "init_value_params",
    "lora_value_params",
    "packed_slot_values",
    "packed_values",
    "token_rewards",
    "value_loss",
    "whiten",
]


# ----------------------------------------------------------------------------- value model


def _tree_problems(got, want) -> list[str]:
    """Differences in structure / shapes between `got` (arrays) and `want` (abstract)."""
    if jax.tree.structure(got) != jax.tree.structure(want):
        return [f"structure {jax.tree.structure(got)} != expected {jax.tree.structure(want)}"]
    problems = []
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        if tuple(a.shape) != tuple(b.shape):
            problems.append(f"{jax.tree_util.keystr(path)}: shape {a.shape} != {b.shape}")
    return problems


def init_value_params(model_cfg: ModelConfig, rng: jax.Array, mesh: Mesh,
                      rules: Iterable[tuple[str, Any]], from_params: Any = None, *,
                      head_init_std: float = 0.0) -> dict:
    """Value-model params, created directly in their target sharding.

    Args:
      model_cfg: the policy's ModelConfig.
      rng: PRNG key (the head's init, and the trunk's when `from_params` is None).
      mesh, rules: placement, as for `models.init_params` (the head kernel shards its
        "embed" dim like the trunk's weights).
      from_params: policy or SFT params of `model_cfg` (an "lm_head" entry is dropped). The
        trunk is a fresh copy in new buffers, cast to `param_dtype`: donating or deleting
        `from_params` afterwards leaves the critic intact. None: a random trunk.
      head_init_std: std of the head kernel's normal init; 0.0 = zeros (values start at 0).
    Returns:
      {"trunk": ..., "head": {"kernel": [D, 1], "bias": [1]}}, `param_dtype` arrays.
    Raises:
      ValueError: `from_params` does not match `model_cfg`'s parameter tree.
    """
    shardings = value_param_shardings(model_cfg, mesh, tuple(rules))
    value_model = ValueModel(model_cfg, head_init_std=head_init_std)
    dummy = (jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool))

    def fresh(key):
        return nn.meta.unbox(value_model.init(key, *dummy))["params"]

    if from_params is None:
        return jax.jit(fresh, out_shardings=shardings)(rng)

    abstract = abstract_value_params(model_cfg)["trunk"]
    trunk = {k: v for k, v in from_params.items() if k != "lm_head"}
    problems = _tree_problems(trunk, abstract)
    if problems:
        raise ValueError("init_value_params: from_params do not match the model config: "
                         + "; ".join(problems[:5]))

    def copy(trunk, key):
        # jnp.copy inside jit: outputs are new buffers (never the inputs forwarded). The
        # unused fresh trunk is dead code that XLA removes.
        copied = jax.tree.map(lambda x, a: jnp.copy(x.astype(a.dtype)), trunk, abstract)
        return {"trunk": copied, "head": fresh(key)["head"]}

    return jax.jit(copy, out_shardings=shardings)(trunk, rng)


def init_lora_value_params(model_cfg: ModelConfig, rng: jax.Array, mesh: Mesh,
                           rules: Iterable[tuple[str, Any]], from_params: Any = None, *,
                           head_init_std: float = 0.0) -> dict:
    """The trained params of a LoRA policy's critic: its own adapters on the policy's frozen
    base, and the head. The base is not part of them (see `lora_value_params`).

    Args:
      model_cfg: the policy's ModelConfig, with `lora`.
      rng: PRNG key (the head's init, and the adapters' when `from_params` holds none).
      mesh, rules: placement, as for `init_value_params`.
      from_params: policy or SFT params; their adapter leaves, when they hold any, are
        copied into new buffers (the critic's trunk then starts as that model), else the
        adapters are fresh (A uniform, B = 0: the trunk starts as the base).
      head_init_std: as in `init_value_params`.
    Returns:
      {"trunk": <adapter leaves only, the policy's layout>, "head": {"kernel": [D, 1],
      "bias": [1]}}, `param_dtype` arrays laid out like the full value model's.
    Raises:
      ValueError: `model_cfg` has no `lora`.
    """
    if model_cfg.lora is None:
        raise ValueError("init_lora_value_params: the model config has no lora block")
    rules = tuple(rules)
    shardings = value_param_shardings(model_cfg, mesh, rules)
    adapter_shardings = lora_lib.split_adapters(shardings["trunk"])[0]
    head_key, adapter_key = jax.random.split(rng)
    dtype, d = jnp.dtype(model_cfg.param_dtype), model_cfg.d_model

    def head_init(key):  # as `ValueModel`'s Dense: kernel N(0, std^2) (zeros at 0), bias 0
        return {"kernel": (head_init_std * jax.random.normal(key, (d, 1))).astype(dtype),
                "bias": jnp.zeros((1,), dtype)}

    head = jax.jit(head_init, out_shardings=shardings["head"])(head_key)
    source = {} if from_params is None else lora_lib.split_adapters(from_params)[0]
    if source:
        problems = _tree_problems(source, lora_lib.split_adapters(
            abstract_value_params(model_cfg)["trunk"])[0])
        if problems:
            raise ValueError("init_lora_value_params: the adapters of from_params do not "
                             "match model.lora: " + "; ".join(problems[:5]))
        adapters = jax.jit(lambda t: jax.tree.map(jnp.copy, t),
                           out_shardings=adapter_shardings)(source)
    else:
        adapters = init_adapters(model_cfg, adapter_key, mesh, rules)
    return {"trunk": adapters, "head": head}


def lora_value_params(critic_params: dict, base: dict) -> dict:
    """The value model's params of a LoRA critic: its adapters (`critic_params["trunk"]`)
    merged into the policy's frozen `base` (params without adapters; an "lm_head" is
    dropped, the trunk never unembeds) and its head. The same arrays, no copy."""
    base = {k: v for k, v in base.items() if k != "lm_head"}
    return {"trunk": lora_lib.merge_trees(critic_params["trunk"], base),
            "head": critic_params["head"]}


def create_critic_state(params: Any, optimizer) -> TrainState:
    """A TrainState at step 0 training every leaf of `params` (a LoRA critic's adapters and
    head: `train_state.create_train_state` would train only the adapter leaves), the
    optimizer state laid out like the params."""
    opt_state = jax.jit(optimizer.init,
                        out_shardings=opt_state_shardings(optimizer, params))(params)
    first = jax.tree.leaves(params)[0]
    step = jax.device_put(jnp.zeros((), jnp.int32), jax.sharding.NamedSharding(
        first.sharding.mesh, jax.sharding.PartitionSpec()))
    return TrainState(step=step, params=params, opt_state=opt_state)


def completion_values(model, value_params, prompt_tokens, prompt_valid, completion_tokens,
                      mask) -> Array:
    """V(s_t) for each completion position t, s_t = prompt + completion[:t].

    The value is read at the positions `scoring.completion_logprobs` reads the logits of
    completion token t from (the last token of s_t: the prompt's last token for t = 0).

    Args:
      model: the policy's `Transformer` (only its `cfg` is used: the value model is
        `ValueModel(model.cfg)`).
      value_params: from `init_value_params`.
      prompt_tokens: int32 [B, Tp] left-padded; prompt_valid: bool [B, Tp].
      completion_tokens: int32 [B, L] right-padded; mask: [B, L] (1 on real tokens).
    Returns:
      float32 [B, L], 0 where the mask is 0.
    """
    tokens, positions, valid = sequence_inputs(prompt_tokens, prompt_valid, completion_tokens,
                                               mask)
    prompt_len, length = prompt_tokens.shape[1], completion_tokens.shape[1]
    values = ValueModel(model.cfg).apply({"params": value_params}, tokens[:, :-1],
                                         positions[:, :-1], valid[:, :-1])
    values = values[:, prompt_len - 1: prompt_len - 1 + length]
    return jnp.where(jnp.asarray(mask) != 0, values, 0.0)


def packed_slot_values(model, value_params, packs, *, share_prompts: bool) -> Array:
    """The value of every slot of a batch's packs (`rl/packing.py`): the value trunk and
    head on pack_* int32 [K, T] (`pack_index` not read) -> float32 [K, T] (the slot
    predicting completion token t holds V(s_t)). share_prompts: as in `packed_values`."""
    hidden = packed_hidden(Transformer(trunk_config(model.cfg)), value_params["trunk"], packs,
                           share_prompts=share_prompts)
    head = nn.Dense(1, dtype=jnp.float32, param_dtype=jnp.dtype(model.cfg.param_dtype))
    return head.apply({"params": value_params["head"]}, hidden.astype(jnp.float32))[..., 0]


def packed_values(model, value_params, packs, *, share_prompts: bool) -> Array:
    """`completion_values` of packed rows (`rl/packing.py`): the value trunk runs on the
    packs, each slot's value is read, and the slots are gathered back to the rows (the
    slot predicting completion token t holds the state s_t).

    Args:
      model: the policy's `Transformer` (only its `cfg` is used).
      value_params: from `init_value_params`.
      packs: `packing.Packs.arrays()` (pack_* int32 [K, T], pack_index int32 [N, L]).
      share_prompts: whether the packs share prompts (the attention then reads
        `pack_prompt_segments`; see `update.packed_logprobs`).
    Returns:
      float32 [N, L], 0 where pack_index is -1; `completion_values` of the padded rows up to
      float summation order.
    """
    values = packed_slot_values(model, value_params, packs, share_prompts=share_prompts)
    return slots_to_rows(values, packs["pack_index"])


# ----------------------------------------------------------------------------- rewards, GAE


def _check_2d(name: str, x, shape) -> None:
    if jnp.shape(x) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {jnp.shape(x)}")


def token_rewards(seq_rewards: Array, mask: Array, *, kl: Array | None = None,
                  kl_coef: float | Array = 0.0) -> Array:
    """InstructGPT reward shaping: r_t = -kl_coef * kl_t, plus the sequence reward at the last
    valid token.

    Args:
      seq_rewards: float [B], one reward per completion.
      mask: bool/float [B, L]; 1 on completion tokens (a prefix of each row).
      kl: float [B, L] per-token KL estimate (e.g. `losses.kl_penalty(old_logp, ref_logp,
        estimator="k1")`, InstructGPT's log pi_old - log pi_ref), or None (no KL term).
      kl_coef: KL coefficient (python float or scalar array).
    Returns:
      float32 [B, L]; 0 at masked positions; a row without any valid token gets no reward.
    """
    m = jnp.asarray(mask) != 0
    batch, length = m.shape
    _check_2d("seq_rewards", seq_rewards, (batch,))
    last = length - 1 - jnp.argmax(m[:, ::-1], axis=1)  # last valid index (L-1 if none)
    at_last = (jnp.arange(length)[None, :] == last[:, None]) & jnp.any(m, axis=1)[:, None]
    rewards = jnp.where(at_last, jnp.asarray(seq_rewards, jnp.float32)[:, None], 0.0)
    if kl is not None:
        _check_2d("kl", kl, m.shape)
        rewards = rewards - jnp.asarray(kl_coef, jnp.float32) * jnp.where(
            m, jnp.asarray(kl, jnp.float32), 0.0)
    return rewards


def gae(rewards: Array, values: Array, mask: Array, *, gamma: float | Array,
        lam: float | Array) -> tuple[Array, Array]:
    """Generalised advantage estimation over completion tokens (backward `lax.scan`).

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1}

    with V and A after the last valid token = 0 (terminal). A masked position gets A = 0 and
    acts as an episode boundary: nothing propagates across it (the mask is meant to be a
    prefix of ones; rows may have different lengths). With gamma = lam = 1, A_t is the
    reward-to-go minus V_t.

    Args:
      rewards: float [B, L] per-token rewards (`token_rewards`).
      values: float [B, L] V(s_t) (`completion_values`); any value (even NaN) where masked.
      mask: bool/float [B, L].
      gamma, lam: discount and GAE lambda in [0, 1] (python floats or scalar arrays).
    Returns:
      (advantages, returns), float32 [B, L] each, returns = advantages + values; both 0 where
      masked.
    """
    m = jnp.asarray(mask) != 0
    _check_2d("rewards", rewards, m.shape)
    _check_2d("values", values, m.shape)
    r = jnp.where(m, jnp.asarray(rewards, jnp.float32), 0.0)
    v = jnp.where(m, jnp.asarray(values, jnp.float32), 0.0)
    gamma = jnp.asarray(gamma, jnp.float32)
    gamma_lam = gamma * jnp.asarray(lam, jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry
        r_t, v_t, m_t = xs
        adv = jnp.where(m_t, r_t + gamma * next_value - v_t + gamma_lam * next_adv, 0.0)
        return (v_t, adv), adv  # v_t is 0 where masked: the boundary resets the carry

    zeros = jnp.zeros(m.shape[:1], jnp.float32)
    _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, m.T), reverse=True)
    adv = adv.T
    return adv, jnp.where(m, adv + v, 0.0)


def whiten(x: Array, mask: Array, shift_mean: bool = True, *, ddof: int = 1,
           eps: float = 1e-8) -> Array:
    """Masked whitening: (x - mean) / sqrt(var + eps) over the valid entries.

    Args:
      x: float [...]; any value (even NaN) where masked.
      mask: bool/float, same shape.
      shift_mean: False adds the mean back (scale only), as TRL's `masked_whiten`.
      ddof: 1 (Bessel-corrected variance, default) or 0; divisor max(n - ddof, 1).
      eps: added to the variance.
    Returns:
      float32, same shape; 0 where masked (all zeros, no NaN, for an empty mask).
    """
    m = jnp.asarray(mask) != 0
    _check_2d("x", x, m.shape)
    x = jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
    n = jnp.sum(m.astype(jnp.float32))
    mean = jnp.sum(x) / jnp.maximum(n, 1.0)
    centered = jnp.where(m, x - mean, 0.0)
    var = jnp.sum(centered * centered) / jnp.maximum(n - ddof, 1.0)
    out = centered * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(m, out, 0.0)


# ----------------------------------------------------------------------------- value loss


def _explained_variance(values, returns, m):
    """1 - Var(R - V) / Var(R) over the masked tokens; 0 when Var(R) is 0 (or no token)."""
    n = jnp.maximum(jnp.sum(m), 1.0)

    def var(x):
        mean = jnp.sum(x * m) / n
        return jnp.sum(jnp.square(x - mean) * m) / n

    var_r = var(returns)
    # Round-off makes the variance of equal returns tiny but not 0: compare to their scale.
    ok = var_r > 1e-10 * (jnp.sum(jnp.square(returns) * m) / n)
    return jnp.where(ok, 1.0 - var(returns - values) / jnp.where(ok, var_r, 1.0), 0.0)


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array, *,
               clip_range: float | None, loss_type: str = "bnpo",
               max_completion_length: int | None = None,
               num_tokens_global: Array | int | None = None,
               num_sequences: Array | int | None = None) -> tuple[Array, dict[str, Array]]:
    """PPO clipped value loss.

        per_tok = 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

    (0.5 * (V - R)^2 when `clip_range` is None), reduced by `loss_type` as in `policy_loss`.

    Args:
      values: float [B, L] V(s_t) under the critic being trained (gradients flow here).
      old_values: float [B, L] the values the returns were computed with (constant).
      returns: float [B, L] GAE returns (constant).
      mask: bool/float [B, L].
      clip_range: static float c > 0, or None for the unclipped loss.
      loss_type: a key of `losses.LOSS_AGGREGATIONS`; default "bnpo", the token mean over the
        masked tokens (with `num_tokens_global`, the global batch's token mean).
      max_completion_length, num_tokens_global, num_sequences: as in `losses.policy_loss`.
    Returns:
      (loss f32 [], metrics): float32 scalars, token means over this batch's masked tokens:
      "value_loss" (= loss), "value_clip_frac" (the clipped branch is the larger one),
      "value_mean", "explained_variance" (1 - Var(R - V) / Var(R); 0 when Var(R) = 0).
      Masked entries (even NaN) affect neither loss nor gradient.
    """
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss_type {loss_type!r}; known: {sorted(LOSS_AGGREGATIONS)}")
    if clip_range is not None and (isinstance(clip_range, bool) or not isinstance(
            clip_range, numbers.Real) or not clip_range > 0):
        raise ValueError(f"clip_range must be a float > 0 or None, got {clip_range!r}")
    shape = jnp.shape(mask)
    if len(shape) != 2:
        raise ValueError(f"mask must be [B, L], got shape {shape}")
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        _check_2d(name, x, shape)

    m = (jnp.asarray(mask) != 0).astype(jnp.float32)
    valid = m != 0
    v = jnp.where(valid, jnp.asarray(values, jnp.float32), 0.0)
    old = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(old_values, jnp.float32), 0.0))
    ret = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(returns, jnp.float32), 0.0))

    err = jnp.square(v - ret)
    if clip_range is None:
        tok, clipped = 0.5 * err, jnp.zeros_like(err)
    else:
        v_clip = old + jnp.clip(v - old, -clip_range, clip_range)
        err_clip = jnp.square(v_clip - ret)
        tok, clipped = 0.5 * jnp.maximum(err, err_clip), (err_clip > err).astype(jnp.float32)
    loss = aggregate_loss(tok, m, loss_type=loss_type,
                          max_completion_length=max_completion_length,
                          num_tokens_global=num_tokens_global, num_sequences=num_sequences)

    n_tok = jnp.maximum(jnp.sum(m), 1.0)
    v_sg = jax.lax.stop_gradient(v)
    metrics = {
        "value_loss": jax.lax.stop_gradient(loss),
        "value_clip_frac": jnp.sum(clipped * m) / n_tok,
        "value_mean": jnp.sum(v_sg * m) / n_tok,
        "explained_variance": _explained_variance(v_sg, ret, m),
    }
    return loss, metrics
