"""Shared by the in-process RLTrainer tests (test_trainer.py, test_trainer_variants.py): the
smoke config's flags, test-only rewards (registered on import), and small helpers.

Rewards are chosen so that a randomly initialised model already earns them sometimes and every
group of the first batches has some variance.
"""

from __future__ import annotations

import os
import zlib

import jax
import numpy as np

from jaxrl_reason.rewards.base import register_reward
from jaxrl_reason.rl.advantages import group_advantages

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"
MAX_NEW = 16            # every trainer here samples 16 tokens, so the sampler compiles once
SHORT_CHARS = 8         # "_test_stop_early" pays for a completion of at most this many chars
BASE = (f"--config.rl.max_new_tokens={MAX_NEW}", f"--config.rl.train_length_bucket={MAX_NEW}",
        "--config.rl.warmup_steps=0", "--config.log.progress_bar=False")
# Everything README.md promises per RL step (accuracy and format_rate need the correctness
# and a format reward among the weights, as in the default config).
PROMISED = ("reward/mean", "reward/std", "accuracy", "format_rate", "kl", "entropy",
            "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max",
            "completion/length_mean", "completion/length_max", "completion/truncated_frac",
            "frac_zero_variance_groups", "time/sample_s", "time/score_s", "time/train_s",
            "grad_norm", "reward/correctness", "reward/format_strict", "reward/_test_text_length")


@register_reward("_test_stop_early")
def _stop_early(completion, example):
    """1 when the sampler stopped (EOS) after a very short text, else 0."""
    del example
    return 1.0 if len(completion) <= SHORT_CHARS else 0.0


@register_reward("_test_text_length")
def _text_length(completion, example):
    """Decoded length / 64: continuous, so every group of a random model has variance."""
    del example
    return len(completion) / 64.0


@register_reward("_test_half_constant")
def _half_constant(completion, example):
    """0 for the prompts whose example hashes even (their groups have zero variance, whatever
    is sampled), the decoded length / 64 for the others (their groups have variance): a batch
    with both kinds that does not depend on the sampler's random draws."""
    odd = zlib.crc32(repr(sorted(example.items())).encode()) % 2
    return len(completion) / 64.0 if odd else 0.0


def run_steps(trainer, n):
    return [trainer.step(next(trainer.data)) for _ in range(n)]


def series(history, key):
    return np.array([m[key] for m in history])


def tree_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def one_batch(trainer, seed=7):
    """A rollout, its rewards and the update batch (advantages from the trainer's config)."""
    rl = trainer.rl
    examples = next(trainer.data)
    rollout, host = trainer.sample(examples, jax.random.key(seed))
    rewards = trainer.score(examples, host).result()
    advantages = group_advantages(trainer.rt.put(rewards.total), rl.num_generations,
                                  estimator=rl.advantage_estimator, scale=rl.advantage_scale)
    batch = {"prompt_tokens": rollout.prompt_tokens, "prompt_valid": rollout.prompt_valid,
             "completion_tokens": rollout.completion_tokens, "mask": rollout.mask,
             "advantages": advantages}
    return rollout, rewards, batch


def logp_of(trainer, rollout):
    logp = trainer.logprob_fn(trainer.state.params, rollout.prompt_tokens, rollout.prompt_valid,
                              rollout.completion_tokens, rollout.mask)
    return np.asarray(jax.device_get(logp), np.float64)


def trainer_in(runtime, workdir, weights, *overrides):
    """(RLTrainer, MetricsWriter) of the smoke config with `overrides` and reward `weights`
    on `workdir` (two trainers on one workdir share its checkpoints), from seed-0 params."""
    import dataclasses

    from jaxrl_reason.cli import parse
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.rl.trainer import RLTrainer
    from jaxrl_reason.runtime.metrics import MetricsWriter

    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *BASE, *overrides])
    cfg = fv.config
    cfg.rewards.weights = type(cfg.rewards.weights)(weights)
    rt = dataclasses.replace(runtime, config=cfg, workdir=str(workdir))
    params = init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    writer = MetricsWriter(str(workdir), tensorboard=False, console=False)
    return RLTrainer(rt, writer, init_params=params), writer


def close_trainer(trainer, writer):
    trainer.rewards.close()
    trainer.ckpt.close()
    writer.close()


def assert_resumed_like(workdir, steps, want):
    """The RL lines of <workdir>/metrics.jsonl are steps `steps`, each equal (wall times
    aside) to the metrics dict `want` holds for it."""
    import json

    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    again = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in again] == list(steps)
    for a, b in zip(again, want):
        assert ({k: v for k, v in a.items() if k not in ("step", "phase", "time")
                 and not k.startswith("time/")}
                == {k: v for k, v in b.items() if not k.startswith("time/")})
