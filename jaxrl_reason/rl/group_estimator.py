"""Where a step's advantages come from when there is no critic: a group estimator of the
registry (`rl/advantages.py`: GRPO, Dr. GRPO, RLOO, REINFORCE++ ...), run by the kernel
dispatcher (`rl/backends.py`).

`GroupEstimator` and PPO's `Critic` (`rl/critic.py`) are the trainer's two advantage
sources and answer the same questions, so the trainer asks "is there a critic?" once, when it
picks one:

  per_token                 False: one advantage per row [N] (the critic: per token [N, L])
  advantages(...)           the update batch's targets
  trains_policy(step)       always True (the critic: False during its warm-up)
  update(batch)             nothing to train: {} (the critic: its donated update)
  checkpoint_extra()        nothing to save: {} (the critic: {"value_state": ...})
  restore_extra(extra)      nothing to restore
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.rl import backends as kernel_dispatch
from jaxrl_reason.rl.advantages import binary_reward_problem, check_passk_k
from jaxrl_reason.rl.batches import Rollout
from jaxrl_reason.runtime import distributed


class GroupEstimator:
    """Advantages of each row from its group's rewards (`rl.advantage_estimator`, scaled by
    `rl.advantage_scale`), on the kernel backend `backend` ("auto", "reference", ...).

    "passk" reads its k from `rl.passk_k` (required, in [1, rl.num_generations]) and refuses
    a batch whose rewards are not all exactly 0 or 1 instead of thresholding them."""

    per_token = False

    def __init__(self, rl, backend: str):
        self.num_generations = int(rl.num_generations)
        self.estimator = rl.advantage_estimator
        self.scale = rl.advantage_scale
        self.backend = backend
        self.passk_k = None
        if self.estimator == "passk":
            self.passk_k = getattr(rl, "passk_k", None)
            check_passk_k(self.passk_k, self.num_generations, name="rl.passk_k")

    def advantages(self, seq_rewards: np.ndarray, rollout: Callable[[], Rollout],
                   kl: jax.Array | None, beta: float, lengths: np.ndarray,
                   packs=None) -> dict[str, Any]:
        """The group estimator on `seq_rewards` (f32 [N] host, group-major: N = B * G).

        `rollout` (the update batch of all rows, made on demand) and `kl` / `beta` (the token
        KL, for a critic's token rewards) are not read: a group estimator's KL is in the
        sequence rewards already; nor are `packs` (a packed critic's). `lengths` is int [N], the tokens each row's loss sees.
        Returns {"advantages": f32 [N] host}, 0 on rows of length 0 (the loss sees none of
        their tokens, e.g. truncated rows under `rl.mask_truncated_completions`).
        Raises ValueError for "passk" when a reward is not exactly 0 or 1.
        """
        del rollout, kl, beta, packs
        if self.estimator == "passk":
            problem = binary_reward_problem(seq_rewards)
            if problem is not None:
                raise ValueError(
                    f"rl.advantage_estimator 'passk': {problem}. Weight one 0/1 reward "
                    "component 1.0 and the others 0 (e.g. --config.rewards.weights."
                    "format_strict=0.0), with no KL or reward model in the reward")
        advantages = np.asarray(distributed.to_host(kernel_dispatch.group_advantages(
            jnp.asarray(seq_rewards), self.num_generations, estimator=self.estimator,
            scale=self.scale, passk_k=self.passk_k, backend=self.backend)), np.float32)
        return {"advantages": np.where(lengths > 0, advantages, 0.0).astype(np.float32)}

    def trains_policy(self, step: int) -> bool:
        """Always: only a critic holds the policy back (its warm-up)."""
        del step
        return True

    def update(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """Nothing to train besides the policy: no metrics."""
        del batch
        return {}

    def checkpoint_extra(self) -> dict[str, Any]:
        """Nothing of its own in an RL checkpoint."""
        return {}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        """Nothing to restore."""
        del extra
