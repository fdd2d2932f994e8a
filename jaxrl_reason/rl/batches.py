"""The update batch of an RL step and how it is cut: what the step collected (`Collected`),
the `Rollout` arrays, micro-batches (`to_micro` / `from_micro`), the rows worth training on
(`select_train_rows`, `zero_variance_groups`) and DAPO's merge of several sampled batches
(`merge_groups`).
Host-side functions take and return numpy arrays; `Rollout` holds arrays on the mesh."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.rewards.pool import BatchRewards
from jaxrl_reason.sampling.sampler import round_up


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The update batch of one step (M rows: all N samples or a selection of them). Arrays
    are jax arrays on the mesh.

    prompt_tokens int32 [P, Tp], prompt_valid bool [P, Tp] (P = M: a prompt per row, or
    M / G: a prompt per group of G consecutive rows), completion_tokens int32 [M, L],
    mask f32 [M, L] (the tokens the model reads: log-prob passes score the whole sequence),
    loss_mask f32 [M, L] (the tokens the policy loss and its KL term count: `mask` itself,
    the same array, unless some completion tokens were not sampled by the policy, i.e.
    tool results, which are 0 here).
    """
    prompt_tokens: jax.Array
    prompt_valid: jax.Array
    completion_tokens: jax.Array
    mask: jax.Array
    loss_mask: jax.Array

    def scoring_args(self) -> tuple[jax.Array, ...]:
        """The arguments of `completion_logprobs` after the params."""
        return self.prompt_tokens, self.prompt_valid, self.completion_tokens, self.mask


@dataclasses.dataclass
class Collected:
    """What the collect phase of an RL step gathered (B examples, N = B * G samples), and
    the device arrays made from it, each made once when a later phase first needs it.

    examples: the B example dicts. host: `RLTrainer.generate`'s numpy dict (tokens int32
    [N, Lmax], lengths int32 [N], truncated bool [N], sampler_logp f32 [N, Lmax],
    prompt_tokens int32 [B, Tp], prompt_valid bool [B, Tp], `length` int, the training
    length L). rewards: BatchRewards of the N rows (total f32 [N]), None until scored.
    metrics: dynamic sampling's ({} without it). times: the phase times in seconds.
    rollout: the update batch of all N rows, or None. ref_logp: the reference's log-probs
    f32 [N, L] on the mesh (None without a reference). sampler_logp: f32 [N, L] on the mesh,
    or None. packs: with rl.packing, the packs of all N rows on the mesh (made once), or None.
    """
    examples: list
    host: dict
    rewards: BatchRewards | None = None
    metrics: dict = dataclasses.field(default_factory=dict)
    times: dict = dataclasses.field(default_factory=dict)
    rollout: Rollout | None = None
    ref_logp: jax.Array | None = None
    sampler_logp: jax.Array | None = None
    packs: dict | None = None

    @property
    def num_rows(self) -> int:
        """N, the number of sampled rows."""
        return len(self.host["lengths"])

    def every_reward_nonfinite(self) -> bool:
        """True when every row's reward was NaN/inf (the reward pool counts them in its
        "<component>/nonfinite" reasons): there is nothing to learn from."""
        nonfinite = sum(n for reason, n in self.rewards.reasons.items()
                        if reason.endswith("/nonfinite"))
        return nonfinite >= self.num_rows


def to_micro(x: jax.Array, k: int, sharding=None) -> jax.Array:
    """[M, ...] -> [k, M/k, ...], micro-batch j holding rows j, k + j, 2k + j, ... (strided, so
    each micro-batch keeps an even share of every data-parallel shard's rows)."""
    y = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
    return y if sharding is None else jax.lax.with_sharding_constraint(y, sharding)


def from_micro(y: jax.Array) -> jax.Array:
    """Inverse of `to_micro`: [k, M/k, ...] -> [M, ...]."""
    return y.swapaxes(0, 1).reshape(y.shape[0] * y.shape[1], *y.shape[2:])


def micro_sharding(mesh, rules, ndim: int):
    """Sharding of a [k, M/k, ...] micro-batched array: rows over the batch axes."""
    if mesh is None:
        return None
    spec = shd.logical_to_spec(("batch",), rules)
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *spec))


def select_train_rows(advantages: np.ndarray, num_buckets: int, multiple: int):
    """Rows with a nonzero advantage, padded to a bucket size.

    Args:
      advantages: f32 [N] (host).
      num_buckets: bucket sizes are ceil(N * k / num_buckets) for k = 1..num_buckets, each
        rounded up to a multiple of `multiple` (the data-parallel size) and capped at N.
      multiple: int >= 1.
    Returns:
      (rows int32 [M], real bool [M]): indices into the N rows (padding repeats row 0) and
      which of them are real; M is the smallest bucket holding every nonzero row (at least
      the smallest bucket, so an all-zero batch still runs the optimizer's update).
    """
    n = len(advantages)
    keep = np.flatnonzero(np.asarray(advantages) != 0)
    sizes = sorted({min(round_up(-(-n * k // num_buckets), multiple), n)
                    for k in range(1, num_buckets + 1)})
    size = next(b for b in sizes if b >= len(keep))
    rows = np.zeros(size, np.int32)
    rows[:len(keep)] = keep
    real = np.arange(size) < len(keep)
    return rows, real


def zero_variance_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """bool [P]: groups (consecutive `group_size` rows of f32 [N] rewards) whose rewards are
    all equal, so that their group-relative advantages are all 0."""
    grouped = np.asarray(rewards).reshape(-1, group_size)
    return np.all(grouped == grouped[:, :1], axis=1)


def merge_groups(parts, keep, group_size: int, length_bucket: int, max_length: int):
    """One batch from groups of several sampled-and-scored batches (DAPO dynamic sampling).

    Args:
      parts: [(examples [P_i], host dict of `RLTrainer.generate`, BatchRewards)].
      keep: [(part index, group index)] in the order the merged batch holds them.
    Returns:
      (examples, host, rewards) of the kept groups: prompts left-padded to the longest
      prompt bucket among them, the training length re-derived, reward reasons summed over
      every part (they describe all scored samples); with tools, each row keeps its
      tool_mask (result tokens) and tool_calls.
    """
    g = group_size
    examples = [parts[p][0][k] for p, k in keep]
    rows = [(p, k * g + j) for p, k in keep for j in range(g)]
    tp = max(parts[p][1]["prompt_tokens"].shape[1] for p, _ in keep)

    def left_pad(a, fill):
        return np.pad(a, ((0, 0), (tp - a.shape[1], 0)), constant_values=fill)

    per_row = ("tokens", "lengths", "truncated", "sampler_logp",
               *(("tool_mask", "tool_calls") if "tool_mask" in parts[0][1] else ()))
    host = {name: np.stack([parts[p][1][name][r] for p, r in rows]) for name in per_row}
    host["prompt_tokens"] = np.stack(
        [left_pad(parts[p][1]["prompt_tokens"], 0)[k] for p, k in keep])
    host["prompt_valid"] = np.stack(
        [left_pad(parts[p][1]["prompt_valid"], False)[k] for p, k in keep])
    host["length"] = min(round_up(int(host["lengths"].max()), length_bucket), max_length)
    names = parts[0][2].components
    reasons = sum((r.reasons for _, _, r in parts), type(parts[0][2].reasons)())
    rewards = BatchRewards(
        total=np.array([parts[p][2].total[r] for p, r in rows], np.float32),
        components={n: np.array([parts[p][2].components[n][r] for p, r in rows], np.float32)
                    for n in names},
        reasons=reasons, seconds=sum(r.seconds for _, _, r in parts))
    return examples, host, rewards


def dynamic_sampling(examples, rng, rl, draw, sample_scored):
    """DAPO's dynamic sampling: samples and scores `examples`; with `rl.dynamic_sampling`
    keeps drawing batches of prompts (`draw()`, B examples) until B groups have rewards that
    are not all equal, or `rl.dynamic_sampling_max_rounds` extra rounds were drawn (the batch
    is then topped up with zero-variance groups, which add nothing to the loss).

    Args: `rng` the collect phase's key (round r samples with fold_in(rng, r));
    `sample_scored(examples, key) -> (host dict of RLTrainer.generate, BatchRewards)`.
    Returns (the B examples, their host arrays, rewards, the dynamic-sampling metrics)."""
    host, rewards = sample_scored(examples, rng)
    if not rl.dynamic_sampling:
        return list(examples), host, rewards, {}
    g, b = rl.num_generations, rl.batch_prompts
    parts = [(list(examples), host, rewards)]
    rounds = 0

    def informative():
        return sum(int((~zero_variance_groups(r.total, g)).sum()) for _, _, r in parts)

    while informative() < b and rounds < rl.dynamic_sampling_max_rounds:
        rounds += 1
        more = draw()
        parts.append((list(more), *sample_scored(more, jax.random.fold_in(rng, rounds))))
    flat = [(part, k) for part, (_, _, r) in enumerate(parts)
            for k in np.flatnonzero(~zero_variance_groups(r.total, g))]
    informative = len(flat)
    if informative < b:  # the cap was hit: top up with zero-variance groups
        flat += [(0, k) for k in np.flatnonzero(zero_variance_groups(parts[0][2].total, g))]
    drawn = sum(len(e) for e, _, _ in parts)
    metrics = {"dynamic_sampling/extra_rounds": float(rounds),
               "dynamic_sampling/zero_variance_groups": float(drawn - informative),
               "dynamic_sampling/filled_groups": float(max(0, b - informative))}
    return (*merge_groups(parts, flat[:b], g, rl.train_length_bucket, rl.max_new_tokens),
            metrics)
