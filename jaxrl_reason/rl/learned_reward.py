"""A trained reward model as an RL reward component, scored on device on the policy's mesh.

RLHF's use of the reward model (Ouyang et al., 2022): every sampled row of an RL step is
scored by the Bradley-Terry model of `jaxrl_reason.recipes.reward_model` and the score joins the
verifiable rewards as the component "reward_model" (logged as `reward/reward_model`):

    total = sum_k w_k * verifier_k  +  rewards.reward_model_weight * (r(x, y) - mu) / sigma

with mu, sigma the held-out reward mean and std saved with the model when
`rewards.reward_model_normalize` (else 0 and 1). The reward model's params live on the RL
run's mesh (laid out by the run's rules) and its scores are dispatched on the device right
after sampling, while the host threads verify the same rows; `RLTrainer.score` returns a
`PendingRewards` whose `result()` joins the two. GRPO and PPO both read the total.

Departures from InstructGPT: the reward is read at the completion's last token (its EOS, or
the last sampled token of a truncated row, where InstructGPT gives truncated samples a
fixed penalty; add `overlong_dapo` for that); no KL term is added here (that is
`rl.kl_in_reward`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import paths
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.recipes.reward_model import CHECKPOINT_KIND, load_reward_model, make_score_fn
from jaxrl_reason.rewards.pool import BatchRewards

COMPONENT = "reward_model"  # the component's name in BatchRewards and the metrics


def rollout_inputs(host: Mapping[str, Any], group_size: int) -> dict[str, np.ndarray]:
    """The reward model's inputs for every sampled row of an RL step (host numpy).

    Args:
      host: `RLTrainer.generate`'s dict: tokens int32 [N, Lmax], lengths int32 [N],
        prompt_tokens int32 [P, Tp], prompt_valid bool [P, Tp] (one row per prompt, N = P * G
        group-major) and `length` (int, covers every row's length).
      group_size: G, samples per prompt.
    Returns:
      prompt_tokens int32 [N, Tp], prompt_valid bool [N, Tp], completion_tokens int32
      [N, length], completion_mask f32 [N, length]: ones over each row's sampled tokens (its
      EOS included; a truncated row is scored at its last token, whatever the RL loss masks).
    """
    lengths = np.asarray(host["lengths"])
    length = int(host["length"])
    prompt_rows = np.arange(len(lengths)) // group_size
    return {"prompt_tokens": np.asarray(host["prompt_tokens"])[prompt_rows],
            "prompt_valid": np.asarray(host["prompt_valid"])[prompt_rows],
            "completion_tokens": np.asarray(host["tokens"])[:, :length],
            "completion_mask": (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)}


def mix_reward_model(rewards: BatchRewards, scores, weight: float, *, shift: float = 0.0,
                     scale: float = 1.0) -> BatchRewards:
    """`rewards` with the reward model as one more component (pure host code).

    Args:
      rewards: the verifiable rewards of N rows (`RewardPool` output).
      scores: f32 [N] raw reward-model scores.
      weight: the component's weight in the total (0: logged only).
      shift, scale: the logged component is (scores - shift) / scale (a standardization by
        the held-out statistics saved with the model; 0 and 1 leave it raw).
    Returns:
      BatchRewards whose components gain COMPONENT = (scores - shift) / scale, f32 [N], and
      whose total is rewards.total + weight * that component (float64 sum, as the pool's).
      A non-finite score counts 0 with the reason "reward_model/nonfinite".
    """
    values = (np.asarray(scores, np.float64).reshape(-1) - shift) / scale
    if values.shape != rewards.total.shape:
        raise ValueError(f"reward model scored {values.shape[0]} rows, the batch has "
                         f"{rewards.total.shape[0]}")
    bad = ~np.isfinite(values)
    values = np.where(bad, 0.0, values)
    reasons = rewards.reasons.copy()
    if bad.any():
        reasons[f"{COMPONENT}/nonfinite"] += int(bad.sum())
    total = rewards.total.astype(np.float64) + float(weight) * values
    return BatchRewards(total=total.astype(np.float32),
                        components={**rewards.components, COMPONENT: values.astype(np.float32)},
                        reasons=reasons, seconds=rewards.seconds)


class PendingRewards:
    """A future of BatchRewards: the host pool's verdicts plus the reward model's scores,
    already dispatched on the device. `result()` waits for both and mixes them (on
    multi-host it all-gathers the scores: every process calls it at the same point)."""

    def __init__(self, future, scores: jax.Array, component: "RewardModelComponent"):
        self.future, self.scores, self.component = future, scores, component

    def result(self, timeout: float | None = None) -> BatchRewards:
        rewards = self.future.result(timeout)
        scores = np.asarray(distributed.to_host(self.scores), np.float32)
        return self.component.mix(rewards, scores)


@dataclasses.dataclass(frozen=True)
class RewardModelComponent:
    """A trained reward model used as an RL reward component, on the policy's mesh.

    Attributes:
      params: reward-model params ({"trunk", "head"}) laid out on the RL run's mesh.
      model_cfg: its ModelConfig (need not be the policy's; the tokenizer must be).
      weight: weight of its score in the reward total.
      shift, scale: standardization of the raw score (see `mix_reward_model`).
    """
    params: Any
    model_cfg: ModelConfig
    weight: float
    shift: float = 0.0
    scale: float = 1.0

    def dispatch(self, put: Callable[[np.ndarray], jax.Array], host: Mapping[str, Any],
                 group_size: int) -> jax.Array:
        """Starts scoring every row of `host` on the device (asynchronous): f32 [N] on the
        mesh. `put` places a host batch on the mesh (`Runtime.put`)."""
        batch = rollout_inputs(host, group_size)
        return make_score_fn(self.model_cfg)(self.params, *(
            put(batch[k]) for k in ("prompt_tokens", "prompt_valid", "completion_tokens",
                                    "completion_mask")))

    def submit(self, future, put, host: Mapping[str, Any], group_size: int) -> PendingRewards:
        """`future` (of the host pool's BatchRewards) joined with this model's scores."""
        return PendingRewards(future, self.dispatch(put, host, group_size), self)

    def mix(self, rewards: BatchRewards, scores: np.ndarray) -> BatchRewards:
        return mix_reward_model(rewards, scores, self.weight, shift=self.shift,
                                scale=self.scale)


def resolve_reward_model_dir(directory: str) -> str:
    """The checkpoint directory of a reward model: `directory` itself, or its
    `reward_model/` subdirectory (a `jaxrl-reason reward-model` workdir)."""
    nested = paths.join(directory, CHECKPOINT_KIND)
    return nested if paths.as_path(nested).is_dir() else directory


def load_reward_component(config, mesh: Mesh, rules: Iterable[tuple[str, Any]],
                          tokenizer) -> RewardModelComponent | None:
    """The reward model of a run config on `mesh`, or None without `rewards.reward_model_dir`.

    Reads `rewards.reward_model_dir`, `rewards.reward_model_weight` and
    `rewards.reward_model_normalize` (standardize by the held-out reward mean/std saved with
    the model). Raises ValueError when the model's tokenizer is not the run's (it must read
    the policy's token ids), or when normalization is asked for and the checkpoint has no
    held-out statistics; FileNotFoundError when the directory holds no checkpoint.
    """
    block = config.rewards
    directory = block.get("reward_model_dir", "")
    if not directory:
        return None
    directory = resolve_reward_model_dir(directory)
    params, model_cfg, rm_tokenizer, meta = load_reward_model(directory, mesh, rules)
    if rm_tokenizer.serialized != tokenizer.serialized:
        raise ValueError(f"rewards.reward_model_dir={directory!r}: the reward model was trained "
                         f"with another tokenizer than this run's; train it with this run's "
                         f"config or checkpoint (jaxrl-reason reward-model --init_checkpoint)")
    shift, scale = 0.0, 1.0
    if block.get("reward_model_normalize", False):
        stats = meta.get("eval") or {}
        if "reward_mean" not in stats or not stats.get("reward_std"):
            raise ValueError(f"rewards.reward_model_normalize: {directory!r} holds no held-out "
                             f"reward mean/std (train it with held-out pairs); set "
                             f"--config.rewards.reward_model_normalize=False")
        shift, scale = float(stats["reward_mean"]), float(stats["reward_std"])
    return RewardModelComponent(params=params, model_cfg=model_cfg,
                                weight=float(block.get("reward_model_weight", 0.0)),
                                shift=shift, scale=scale)
