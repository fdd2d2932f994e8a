"""Reward models (RLHF step 2): our decoder with a scalar head, trained on preference pairs.

A reward model is the PPO critic's architecture (`models.value_head.ValueModel`: the decoder
trunk + a linear head [D] -> 1) read at ONE position, the last real token of prompt +
response, in the sampler's layout (prompt left-padded to a bucket, response right-padded):

    r(x, y) = head(h_T),  T = the position of y's last token (its EOS when it has one)

It is trained with the Bradley-Terry loss on (prompt, chosen, rejected) pairs read from a
local JSONL file (`data.preferences`), and then scores rollouts on device, on the RL run's
mesh, as a reward component: `make_score_fn(model_cfg)(rm_params, *rollout.scoring_args())`
-> f32 [N] (`rl.rm_reward` does that inside `RLTrainer.score` when
`config.rewards.reward_model_dir` is set; `jaxrl-reason reward-model` trains and saves one
from a JSONL file).

    pairs = preferences.read_preference_pairs("prefs.jsonl")   # jaxrl_reason.data.preferences
    params, history = train_reward_model(model_cfg, tokenizer, pairs, mesh=mesh, rules=rules,
                                         train_cfg=RewardTrainConfig(steps=200))
    pairwise_accuracy(model_cfg, params, tokenizer, held_out, mesh=mesh, rules=rules)
    save_reward_model(directory, params, model_cfg, tokenizer, step=200)

Params layout (that of `ValueModel`, built by `rl.value.init_value_params`, optionally with
the trunk copied from policy/SFT params as InstructGPT does):

    {"trunk": <Transformer params without "lm_head">,
     "head":  {"kernel": f32 [D, 1] logical ("embed", None), "bias": f32 [1] logical (None,)}}

Departures from InstructGPT (Ouyang et al., 2022) and Llama 2 (Touvron et al., 2023), on
purpose:

- One comparison per pair, not all K-choose-2 rankings of K responses in one batch
  element; a ranking is given as its pairs.
- The optional per-pair "margin" (Llama 2's m(r)) and the reward-centering term
  `center_coef * mean((r_c + r_r)^2)` (Eisenstein et al., 2023) follow TRL's RewardTrainer
  (`margin` column, `center_rewards_coefficient`). InstructGPT normalizes the reward after
  training by a bias so that demonstrations score 0 on average; here the mean and std of
  the scores on the evaluated pairs are reported (`pairwise_accuracy`) and saved in the
  checkpoint metadata, for the RL side to use or ignore.
- The head reads the final (RMS-normed) hidden state and is zero-initialised by default
  (`head_init_std`), as the critic's; the response ends with the tokenizer's EOS, so the
  reward is read at the EOS token (as OpenRLHF does). A sampled completion that hit the
  token budget has no EOS and is scored at its last token.
- `pairwise_accuracy` counts a tie (r_c == r_r) as half right, so a constant reward model
  scores exactly chance (0.5).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.data.pipeline import example_iterator
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.scoring import sequence_inputs
from jaxrl_reason.models.value_head import (ValueModel, abstract_value_params,
                                            value_param_shardings)
from jaxrl_reason.rl.value import init_value_params
from jaxrl_reason.sampling.sampler import left_pad, pick_bucket, right_pad, round_up
from jaxrl_reason.tokenizers import tokenizer_from_serialized
from jaxrl_reason.runtime.train_state import (TrainState, apply_gradients_if_finite,
                                      create_train_state, learning_rate_schedule,
                                      make_optimizer)

CHECKPOINT_KIND = "reward_model"


# ----------------------------------------------------------------------------- tokenization


@dataclasses.dataclass(frozen=True)
class RewardTrainConfig:
    """Hyper-parameters of reward-model training and of batching pairs for it.

    Attributes:
      steps: optimizer steps.
      batch_size: pairs per step (the 2 * batch_size sequences split over the data-parallel
        shards of the mesh, so batch_size must be a multiple of them).
      learning_rate, warmup_steps: peak AdamW rate, linear warm-up then cosine decay to 10%.
      weight_decay, max_grad_norm: AdamW weight decay; global-norm clipping (0: off).
      center_coef: weight of the reward-centering term mean((r_c + r_r)^2); 0: off.
      head_init_std: std of the head kernel's normal init; 0.0: zeros.
      prompt_buckets: prompt lengths (tokens) programs are compiled for (as task.prompt_buckets).
      max_response_length: longest response in tokens (with EOS); longer ones are an error.
      length_bucket: responses are padded to a multiple of this (capped at the maximum).
      eval_every: with eval pairs, evaluate every this many steps (0: only at the end).
      seed: init of the head (and of the trunk when not copied) and the data order.
    """
    steps: int = 100
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup_steps: int = 5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    center_coef: float = 0.0
    head_init_std: float = 0.0
    prompt_buckets: tuple[int, ...] = (16, 32)
    max_response_length: int = 128
    length_bucket: int = 16
    eval_every: int = 0
    seed: int = 0


def train_config_from(config, **overrides: Any) -> RewardTrainConfig:
    """The RewardTrainConfig of a run config: the dataclass defaults, then the fields of an
    optional `config.reward_model` block, then `overrides` whose value is not None; the
    prompt buckets are the run's `task.prompt_buckets` unless given. ValueError naming an
    unknown field or a bad value."""
    fields = {f.name for f in dataclasses.fields(RewardTrainConfig)}
    values: dict[str, Any] = {"prompt_buckets": tuple(config.task.prompt_buckets)}
    block = config.get("reward_model") or {}
    values.update(dict(block.to_dict() if hasattr(block, "to_dict") else block))
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"reward model: unknown training field(s) {unknown}; known: "
                         f"{sorted(fields)}")
    values["prompt_buckets"] = tuple(values["prompt_buckets"])
    cfg = RewardTrainConfig(**values)
    for name in ("steps", "batch_size", "max_response_length", "length_bucket"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"reward model {name} must be a positive integer, got {value!r}")
    if not 0.0 < cfg.learning_rate <= 1.0:
        raise ValueError(f"reward model learning_rate must be in (0, 1], got "
                         f"{cfg.learning_rate!r}")
    return cfg


def encode_responses(tokenizer, prompts: Sequence[str], responses: Sequence[str], *,
                     prompt_buckets: Sequence[int], max_response_length: int,
                     length_bucket: int, names: Sequence[str] | None = None,
                     response_length: int | None = None) -> dict[str, np.ndarray]:
    """Tokenizes (prompt, response) rows in the sampler's layout.

    Prompts are encoded as `Runtime.encode_prompt` does (a bos first when the tokenizer
    expects one) and left-padded to the smallest fitting bucket; responses end with EOS and
    are right-padded to `response_length`, or else to the longest rounded up to
    `length_bucket`, capped at `max_response_length`.

    Returns numpy: prompt_tokens int32 [N, Tp], prompt_valid bool [N, Tp],
    completion_tokens int32 [N, L], completion_mask f32 [N, L].
    Raises ValueError naming the row (`names[i]`, else its index) whose prompt fits no bucket
    or whose response is longer than `max_response_length`.
    """
    names = names if names is not None else [str(i) for i in range(len(prompts))]
    prompt_ids = [tokenizer.encode(p, add_bos=tokenizer.add_bos_token) for p in prompts]
    for name, ids in zip(names, prompt_ids):
        if len(ids) > max(prompt_buckets):
            raise ValueError(f"prompt of {name!r} has {len(ids)} tokens, longer than the "
                             f"largest prompt bucket {max(prompt_buckets)}")
    prompt_tokens, prompt_valid = left_pad(
        prompt_ids, pick_bucket((len(r) for r in prompt_ids), prompt_buckets),
        tokenizer.pad_id)
    encoded = [tokenizer.encode(r, add_eos=True) for r in responses]
    for name, ids in zip(names, encoded):
        if len(ids) > max_response_length:
            raise ValueError(f"response of {name!r} has {len(ids)} tokens, more than "
                             f"max_response_length={max_response_length}")
    if response_length is None:
        longest = max((len(ids) for ids in encoded), default=1)
        response_length = min(round_up(longest, length_bucket), max_response_length)
    tokens, mask = right_pad(encoded, response_length, tokenizer.pad_id)
    return {"prompt_tokens": prompt_tokens, "prompt_valid": prompt_valid,
            "completion_tokens": tokens, "completion_mask": mask}


def encode_pairs(tokenizer, pairs: Sequence[Mapping[str, Any]],
                 train_cfg: RewardTrainConfig) -> dict[str, np.ndarray]:
    """The padded batch of `pairs`: prompt_tokens int32 [B, Tp], prompt_valid bool [B, Tp],
    chosen_tokens / rejected_tokens int32 [B, L], chosen_mask / rejected_mask f32 [B, L]
    (one L for both), margin f32 [B]. ValueError naming the pair that does not fit."""
    prompts = [p["prompt"] for p in pairs]
    names = [str(p.get("id", i)) for i, p in enumerate(pairs)]
    both = encode_responses(
        tokenizer, prompts + prompts, [p["chosen"] for p in pairs] +
        [p["rejected"] for p in pairs], prompt_buckets=train_cfg.prompt_buckets,
        max_response_length=train_cfg.max_response_length,
        length_bucket=train_cfg.length_bucket, names=names + names)
    b = len(pairs)
    return {"prompt_tokens": both["prompt_tokens"][:b], "prompt_valid": both["prompt_valid"][:b],
            "chosen_tokens": both["completion_tokens"][:b],
            "chosen_mask": both["completion_mask"][:b],
            "rejected_tokens": both["completion_tokens"][b:],
            "rejected_mask": both["completion_mask"][b:],
            "margin": np.asarray([float(p.get("margin", 0.0)) for p in pairs], np.float32)}


# ----------------------------------------------------------------------------- scoring


def reward_scores(model_cfg: ModelConfig, params, prompt_tokens, prompt_valid,
                  completion_tokens, completion_mask) -> jax.Array:
    """The reward of each (prompt, completion) row, read at its last real token.

    Args:
      model_cfg: the reward model's ModelConfig (its `tie_embeddings` is ignored).
      params: reward-model params ({"trunk", "head"}).
      prompt_tokens: int32 [N, Tp] left-padded; prompt_valid: bool [N, Tp].
      completion_tokens: int32 [N, L] right-padded; completion_mask: bool/f32 [N, L], a
        prefix of ones per row (a row with no completion token is scored at its prompt's
        last token).
    Returns: float32 [N].
    """
    tokens, positions, valid = sequence_inputs(prompt_tokens, prompt_valid, completion_tokens,
                                               completion_mask)
    values = ValueModel(model_cfg).apply({"params": params}, tokens, positions, valid)
    last = prompt_tokens.shape[1] - 1 + jnp.sum(jnp.asarray(completion_mask) != 0, axis=1)
    return jnp.take_along_axis(values, last[:, None].astype(jnp.int32), axis=1)[:, 0]


@functools.lru_cache(maxsize=None)
def make_score_fn(model_cfg: ModelConfig) -> Callable[..., jax.Array]:
    """Jitted (rm_params, prompt_tokens, prompt_valid, completion_tokens, completion_mask)
    -> rewards f32 [N] (`reward_scores`; the arguments after the params are a rollout's
    `scoring_args()`). Inputs laid out on a mesh give outputs on that mesh; one program
    per input shape. Cached per config."""
    return jax.jit(functools.partial(reward_scores, model_cfg),
                   compiler_options=platform.compiler_options("dense"))


def _pad_rows(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Each array's rows padded to `rows` by repeating its last row."""
    def pad(x):
        extra = rows - len(x)
        return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
    return {k: pad(v) for k, v in batch.items()}


def score_texts(model_cfg: ModelConfig, params, tokenizer, prompts: Sequence[str],
                responses: Sequence[str], *, mesh: Mesh, rules: Iterable[tuple[str, Any]],
                train_cfg: RewardTrainConfig = RewardTrainConfig()) -> np.ndarray:
    """Rewards of (prompt, response) texts: numpy float32 [N].

    Rows are encoded as in training (`encode_responses` with `train_cfg`'s buckets), scored
    `2 * train_cfg.batch_size` at a time on `mesh` (the last chunk padded, so one program
    per bucket).
    """
    rules = tuple(rules)
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    chunk = round_up(2 * train_cfg.batch_size, shd.data_parallel_size(mesh, rules))
    score = make_score_fn(model_cfg)
    out = []
    for start in range(0, len(prompts), chunk):
        p, r = prompts[start:start + chunk], responses[start:start + chunk]
        batch = _pad_rows(encode_responses(
            tokenizer, p, r, prompt_buckets=train_cfg.prompt_buckets,
            max_response_length=train_cfg.max_response_length,
            length_bucket=train_cfg.length_bucket,
            names=[str(start + i) for i in range(len(p))]), chunk)
        on_mesh = [shd.put_batch(mesh, rules, batch[k]) for k in
                   ("prompt_tokens", "prompt_valid", "completion_tokens", "completion_mask")]
        out.append(np.asarray(distributed.to_host(score(params, *on_mesh)))[:len(p)])
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0,), np.float32)


# ----------------------------------------------------------------------------- loss


def bradley_terry_loss(r_chosen, r_rejected, *, margin=None,
                       center_coef: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bradley-Terry pairwise loss: mean_i -log sigmoid(r_c,i - r_r,i - m_i)
    + center_coef * mean_i (r_c,i + r_r,i)^2.

    Args:
      r_chosen, r_rejected: float [B] rewards of the preferred and the other response.
      margin: None, or float [] / [B]: how much chosen must beat rejected by (Llama 2).
      center_coef: weight of the reward-centering term (Eisenstein et al., 2023); 0: off.
    Returns:
      (loss f32 [], metrics): "loss", "accuracy" (fraction with r_c > r_r), "margin"
      (mean r_c - r_r), "reward_chosen", "reward_rejected" (means); float32 scalars.
    """
    rc = jnp.asarray(r_chosen, jnp.float32)
    rr = jnp.asarray(r_rejected, jnp.float32)
    diff = rc - rr
    shifted = diff if margin is None else diff - jnp.asarray(margin, jnp.float32)
    loss = -jnp.mean(jax.nn.log_sigmoid(shifted))
    if center_coef:
        loss = loss + center_coef * jnp.mean(jnp.square(rc + rr))
    sg = jax.lax.stop_gradient
    metrics = {"loss": sg(loss), "accuracy": jnp.mean((diff > 0).astype(jnp.float32)),
               "margin": sg(jnp.mean(diff)), "reward_chosen": sg(jnp.mean(rc)),
               "reward_rejected": sg(jnp.mean(rr))}
    return loss, metrics


# ----------------------------------------------------------------------------- training


def pair_loss(model_cfg: ModelConfig, params, batch: Mapping[str, jax.Array], *,
              center_coef: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`bradley_terry_loss` of an `encode_pairs` batch: chosen and rejected rows are scored
    in one [2B] forward pass."""
    twice = lambda x: jnp.concatenate([x, x], axis=0)  # noqa: E731
    scores = reward_scores(
        model_cfg, params, twice(batch["prompt_tokens"]), twice(batch["prompt_valid"]),
        jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]], axis=0),
        jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0))
    b = batch["chosen_tokens"].shape[0]
    return bradley_terry_loss(scores[:b], scores[b:], margin=batch["margin"],
                              center_coef=center_coef)


def make_train_step(model_cfg: ModelConfig, optimizer, *, center_coef: float = 0.0):
    """The jitted, state-donating update: (state, batch) -> (state, metrics). A non-finite
    loss or gradient leaves the state unchanged (metrics["update_skipped"] = 1)."""

    def step(state: TrainState, batch):
        grad_fn = jax.value_and_grad(
            lambda p: pair_loss(model_cfg, p, batch, center_coef=center_coef), has_aux=True)
        (loss, metrics), grads = grad_fn(state.params)
        state, grad_norm, ok = apply_gradients_if_finite(state, grads, loss, optimizer)
        return state, {**metrics, "grad_norm": grad_norm, "update_skipped": 1.0 - ok}

    return jax.jit(step, donate_argnums=0, compiler_options=platform.compiler_options("dense"))


def train_reward_model(model_cfg: ModelConfig, tokenizer, pairs: Sequence[Mapping[str, Any]],
                       *, mesh: Mesh, rules: Iterable[tuple[str, Any]],
                       train_cfg: RewardTrainConfig = RewardTrainConfig(),
                       init_params: Any = None, eval_pairs: Sequence[Mapping] | None = None,
                       log: Callable[[int, dict[str, float]], None] | None = None,
                       ) -> tuple[dict, list[dict[str, float]]]:
    """Trains a reward model on preference pairs with the Bradley-Terry loss.

    Args:
      model_cfg: decoder shape of the reward model (e.g. the policy's).
      tokenizer: the tokenizer of the policy it will score (texts are encoded with it).
      pairs: training pairs (`data.preferences`: read from a file or generated).
      mesh, rules: where params, optimizer state and batches live (as the RL run's).
      train_cfg: hyper-parameters (see RewardTrainConfig).
      init_params: policy/SFT params of `model_cfg` to copy the trunk from (InstructGPT
        starts the reward model from the SFT model); None: a random trunk.
      eval_pairs: held-out pairs; evaluated every `train_cfg.eval_every` steps and at the end.
      log: called as log(step, metrics) after each step (e.g. a MetricsWriter's write).
    Returns:
      (params, history): the trained params and one dict of float metrics per step ("loss",
      "accuracy", "margin", "reward_chosen", "reward_rejected", "grad_norm",
      "update_skipped", "step_time_s", and "eval/..." (`pairwise_accuracy`) where evaluated).
    Raises:
      ValueError: batch_size does not split over the data-parallel shards; a pair that does
        not fit the buckets.
    """
    rules = tuple(rules)
    dp = shd.data_parallel_size(mesh, rules)
    if train_cfg.batch_size % dp:
        raise ValueError(f"reward model batch_size={train_cfg.batch_size} must be a multiple "
                         f"of the {dp} data-parallel shards of the mesh")
    key = jax.random.key(train_cfg.seed)
    params = init_value_params(model_cfg, key, mesh, rules, from_params=init_params,
                               head_init_std=train_cfg.head_init_std)
    optimizer = make_optimizer(
        learning_rate_schedule(train_cfg.learning_rate, train_cfg.warmup_steps,
                               train_cfg.steps, "cosine"),
        weight_decay=train_cfg.weight_decay, max_grad_norm=train_cfg.max_grad_norm)
    state = create_train_state(params, optimizer)
    step_fn = make_train_step(model_cfg, optimizer, center_coef=train_cfg.center_coef)
    data = example_iterator(list(pairs), batch_size=train_cfg.batch_size, seed=train_cfg.seed)
    history = []
    for step in range(1, train_cfg.steps + 1):
        t0 = time.time()
        batch = encode_pairs(tokenizer, next(data), train_cfg)
        state, metrics = step_fn(state, {k: shd.put_batch(mesh, rules, v)
                                         for k, v in batch.items()})
        metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
        metrics["step_time_s"] = time.time() - t0
        last = step == train_cfg.steps
        if eval_pairs and (last or (train_cfg.eval_every and step % train_cfg.eval_every == 0)):
            result = pairwise_accuracy(model_cfg, state.params, tokenizer, eval_pairs,
                                       mesh=mesh, rules=rules, train_cfg=train_cfg)
            metrics.update({f"eval/{k}": float(v) for k, v in result.items()})
        history.append(metrics)
        if log is not None:
            log(step, metrics)
    return state.params, history


def pairwise_accuracy(model_cfg: ModelConfig, params, tokenizer,
                      pairs: Sequence[Mapping[str, Any]], *, mesh: Mesh,
                      rules: Iterable[tuple[str, Any]],
                      train_cfg: RewardTrainConfig = RewardTrainConfig()) -> dict[str, float]:
    """How often the reward model prefers the chosen response of held-out pairs.

    Returns floats: "accuracy" (fraction of pairs with r_c > r_r, a tie counting 1/2),
    "margin" (mean r_c - r_r), "reward_mean" / "reward_std" (over all 2N scores: the
    normalization an RL run may apply), "pairs" (N); when pairs carry a "kind" field (the
    generated pairs' corruption, or a user's category), "accuracy/<kind>" for each kind.
    """
    scores = score_texts(model_cfg, params, tokenizer,
                         [p["prompt"] for p in pairs] * 2,
                         [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs],
                         mesh=mesh, rules=rules, train_cfg=train_cfg)
    rc, rr = scores[:len(pairs)], scores[len(pairs):]
    wins = np.where(rc > rr, 1.0, np.where(rc == rr, 0.5, 0.0))
    result = {"accuracy": float(np.mean(wins)), "margin": float(np.mean(rc - rr)),
              "reward_mean": float(np.mean(scores)), "reward_std": float(np.std(scores)),
              "pairs": float(len(pairs))}
    kinds = np.array([str(p.get("kind", "")) for p in pairs])
    for kind in sorted(set(kinds) - {""}):
        result[f"accuracy/{kind}"] = float(np.mean(wins[kinds == kind]))
    return result


# ----------------------------------------------------------------------------- checkpoints


def save_reward_model(directory: str, params, model_cfg: ModelConfig, tokenizer, *,
                      step: int, metadata: Mapping[str, Any] | None = None) -> None:
    """Saves reward-model params with what is needed to use them alone.

    Layout: `<directory>/<step>/` (a `checkpointing.Checkpointer` step) whose state is
    {"params": {"trunk", "head"}} and whose metadata holds "kind" ("reward_model"),
    "model_config", "tokenizer" (serialized) and `metadata` (e.g. the train config and the
    held-out `pairwise_accuracy`). Every process calls it on multi-host.
    """
    meta = {"kind": CHECKPOINT_KIND, "model_config": dataclasses.asdict(model_cfg),
            "tokenizer": tokenizer.serialized, **dict(metadata or {})}
    with Checkpointer(directory, max_to_keep=1) as ckpt:
        ckpt.save(step, {"params": params}, meta, force=True)


def load_reward_model(directory: str, mesh: Mesh, rules: Iterable[tuple[str, Any]], *,
                      step: int | None = None) -> tuple[dict, ModelConfig, Any, dict]:
    """Loads a `save_reward_model` checkpoint onto `mesh` (laid out by `rules`).

    Returns (params, ModelConfig, tokenizer, metadata). Raises FileNotFoundError when there
    is no complete step, ValueError when the checkpoint is not a reward model's.
    """
    rules = tuple(rules)

    def target(meta):
        if meta.get("kind") != CHECKPOINT_KIND:
            raise ValueError(f"{directory} holds a {meta.get('kind', 'policy')!r} checkpoint, "
                             f"not a reward model")
        model_cfg = ModelConfig(**meta["model_config"])
        shardings = value_param_shardings(model_cfg, mesh, rules)
        params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract_value_params(model_cfg), shardings)
        return {"params": params}

    with Checkpointer(directory) as ckpt:
        tree, meta = ckpt.restore(step, abstract_state_fn=target)
    return (tree["params"], ModelConfig(**meta["model_config"]),
            tokenizer_from_serialized(meta["tokenizer"]), meta)

