"""PPO's critic as one object: the value model's training state, its GAE advantages and its
update. `RLTrainer` holds one when `rl.advantage_estimator == "gae"` and otherwise uses the
group estimators of `rl/advantages.py`.

The pure pieces (value model, token rewards, GAE, whitening, the clipped value loss, the
jitted value pass and update) are in `rl/value.py`; this module wires them to a run:

  ppo_advantages  seq rewards f32 [N] + values f32 [N, L] -> (advantages, returns) f32 [N, L]
  Critic          value params + optimizer state; `advantages(...)`, `update(batch)`,
                  `trains_policy(step)`, `checkpoint_tree()` / `load_checkpoint_tree(tree)`

The checkpoint layout is the trainer's "value_state" entry: {"step", "params", "opt_state"}.

With a LoRA policy (`model.lora`) the critic has no trunk of its own: it trains its own
adapters and the head on the policy's frozen (possibly quantized) base, read through
`policy_params` at each call (the policy's update donates its buffers, so the critic keeps
no reference to them). Its checkpoint entry then holds only the adapters, the head and their
optimizer state.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.rl.batches import Rollout
from jaxrl_reason.models.lora import without_adapters
from jaxrl_reason.rl.value import (create_critic_state, gae, init_lora_value_params,
                                   init_value_params, token_rewards, whiten)
from jaxrl_reason.rl.value_passes import make_value_fn, make_value_update_fn
from jaxrl_reason.runtime.train_state import (TrainState, create_train_state,
                                              learning_rate_schedule, make_optimizer)

VALUE_INITS = ("policy", "sft", "random")


@functools.partial(jax.jit, static_argnames=("whiten_advantages",))
def ppo_advantages(seq_rewards, mask, values, kl, kl_coef, *, gamma, lam,
                   whiten_advantages: bool):
    """PPO's per-token advantages: InstructGPT token rewards (the sequence reward at the last
    token, -kl_coef * KL per token when `kl` is given), GAE against the critic's `values`,
    optionally whitened over the batch's tokens.

    Args: seq_rewards f32 [N]; mask, values, kl f32 [N, L] (kl may be None); kl_coef f32 [].
    Returns: (advantages f32 [N, L], returns f32 [N, L]) with returns = GAE + values (before
    whitening).
    """
    rewards = token_rewards(seq_rewards, mask, kl=kl, kl_coef=kl_coef)
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages, returns


class Critic:
    """The value model (policy trunk + scalar head), its optimizer state and its PPO pieces.

    Built before the policy's first update donates `init_params` (the trunk is copied from
    them, or from `sft_params`, by `rl.value.init`). `state` is a `TrainState` of the value
    params; `values_fn` / `update_fn` are the jitted value pass and donated critic update.
    """

    per_token = True  # advantages [N, L]: see `rl/group_estimator.py` for the interface

    def __init__(self, rt, rl, init_params, sft_params=None,
                 policy_params: Callable[[], Any] | None = None,
                 packer=None):
        """rt: the `Runtime` (model, mesh, rules, `put`); rl: the config's `rl` section (its
        `value` subsection: init, learning_rate, clip_range, warmup_steps, weight_decay,
        max_grad_norm). policy_params: returns the policy's current params; required with
        `model.lora` (the critic's adapters read the policy's frozen base through it).
        packer: None for padded passes (`rl.micro_batches` slices of rows); with
        `rl.packing` the policy's `packing.Packer`: the value pass and update read packs
        (`advantages`' packs, the batch's) with its prompt sharing, `packs_per_micro` at a
        time."""
        v = rl.value
        if v.init not in VALUE_INITS:
            raise ValueError(f"rl.value.init must be one of {VALUE_INITS}, got {v.init!r}")
        self.lora = rt.model_cfg.lora is not None
        if self.lora:
            _check_lora(v.init, policy_params)
        source = {"policy": init_params, "random": None,
                  "sft": sft_params if sft_params is not None else init_params}[v.init]
        self.optimizer = make_optimizer(
            learning_rate_schedule(v.learning_rate, rl.warmup_steps, rl.steps, "constant"),
            weight_decay=v.weight_decay, max_grad_norm=v.max_grad_norm)
        rng = jax.random.key(rt.config.seed + 2)
        if self.lora:  # own adapters + head on the policy's frozen base
            params = init_lora_value_params(rt.model_cfg, rng, rt.mesh, rt.rules,
                                            from_params=source)
            self.state = create_critic_state(params, self.optimizer)
        else:
            params = init_value_params(rt.model_cfg, rng, rt.mesh, rt.rules,
                                       from_params=source)
            self.state = create_train_state(params, self.optimizer)
        self.policy_params = policy_params
        share_prompts = None if packer is None else packer.share_prompts
        self.packed = packer is not None
        micro = {"micro_batches": int(rl.get("micro_batches", 1)),
                 "packs_per_micro": None if packer is None else packer.packs_per_micro}
        self.values_fn = make_value_fn(rt.model, rt.mesh, rt.rules, lora=self.lora,
                                       share_prompts=share_prompts, **micro)
        self.update_fn = make_value_update_fn(
            rt.model, self.optimizer, clip_range=v.clip_range or None, loss_type="bnpo",
            max_completion_length=rl.max_new_tokens, mesh=rt.mesh, rules=rt.rules,
            lora=self.lora, share_prompts=share_prompts, **micro)
        self.put = rt.put
        self.gamma, self.lam = rl.gamma, rl.lam
        self.whiten_advantages = bool(rl.whiten_advantages)
        self.warmup_steps = int(v.warmup_steps)

    def trains_policy(self, step: int) -> bool:
        """False during the critic's warm-up (`rl.value.warmup_steps` first steps of the run),
        when only the critic learns; `step` counts the steps taken before this one."""
        return step >= self.warmup_steps

    def advantages(self, seq_rewards: np.ndarray, rollout: Callable[[], Rollout],
                   kl: jax.Array | None, beta: float, lengths: np.ndarray | None = None,
                   packs: Callable[[], dict] | None = None) -> dict[str, jax.Array]:
        """GAE advantages of every row against the current critic.

        Args:
          seq_rewards: f32 [N] host, one reward per completion.
          rollout: returns the update batch of all N rows (a prompt per row).
          kl: f32 [N, L] per-token KL of the sampler to the reference (KL in the reward), or
            None.
          beta: the KL coefficient of the token rewards.
          lengths: not read (the rollout's mask says which tokens count).
          packs: returns the packs of all N rows (`packing.Packs.arrays()` on the mesh);
            read by a packed critic only.
        Returns:
          {"advantages", "old_values", "returns"}: f32 [N, L] each, on the mesh (the
          update batch's entries for the policy's and the critic's losses).
        """
        del lengths
        rollout = rollout()
        rows = (packs(),) if self.packed else rollout.scoring_args()
        values = self.values_fn(self.state.params, *self._base(), *rows)
        advantages, returns = ppo_advantages(
            self.put(np.asarray(seq_rewards, np.float32)), rollout.mask, values, kl,
            jnp.float32(beta), gamma=self.gamma, lam=self.lam,
            whiten_advantages=self.whiten_advantages)
        return {"advantages": advantages, "old_values": values, "returns": returns}

    def update(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """One donated critic update on `batch` (the policy's update batch, with
        "old_values" and "returns" from `advantages`); returns its metrics (f32 [] on the
        device: value_loss, value_clip_frac, value_mean, explained_variance,
        value_grad_norm)."""
        self.state, metrics = self.update_fn(self.state, *self._base(), batch)
        return metrics

    def _base(self) -> tuple:
        """(the policy's frozen base,) for a LoRA critic's calls, else ()."""
        return (without_adapters(self.policy_params()),) if self.lora else ()

    def checkpoint_tree(self) -> dict[str, Any]:
        """The critic's part of an RL checkpoint: {"step": int32 [], "params", "opt_state"}."""
        return {"step": self.state.step, "params": self.state.params,
                "opt_state": self.state.opt_state}

    def load_checkpoint_tree(self, tree: dict[str, Any]) -> None:
        """Restores `state` from a `checkpoint_tree()` read back from a checkpoint."""
        self.state = TrainState(**tree)

    def checkpoint_extra(self) -> dict[str, Any]:
        """The critic's entry of an RL checkpoint's extra items: {"value_state": tree}."""
        return {"value_state": self.checkpoint_tree()}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        """Restores the critic from the extra items of an RL checkpoint."""
        self.load_checkpoint_tree(extra["value_state"])


def _check_lora(init: str, policy_params) -> None:
    """ValueError for what a LoRA policy's critic cannot do: a random trunk (it shares the
    policy's frozen base), or no access to that base."""
    if init == "random":
        raise ValueError("rl.value.init='random' with model.lora: the critic's trunk is the "
                         "policy's frozen base plus its own adapters, so it cannot be random; "
                         "use 'policy' or 'sft'")
    if policy_params is None:
        raise ValueError("LoRA with a critic that has no adapters: a LoRA policy's critic "
                         "needs policy_params (the policy's frozen base) to train its own "
                         "adapters on")
