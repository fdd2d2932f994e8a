"""The reward model as an RL reward component: the mix against a hand-computed weighted sum,
the scoring layout, config validation, `jaxrl-reason reward-model` end to end, and real GRPO
and PPO steps whose rewards include the scores of the reward model that command trained."""

from __future__ import annotations

import collections
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.recipes import reward_model as rm
from jaxrl_reason.data import preferences
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.models.params import init_params
from jaxrl_reason.rewards.pool import BatchRewards
from jaxrl_reason.rl.learned_reward import (COMPONENT, load_reward_component, mix_reward_model,
                                       resolve_reward_model_dir, rollout_inputs)
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.config.validation import validate_config
from numerics import f32_tolerance, value_head_tolerance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"
PPO_SMOKE = os.path.join(REPO, "configs", "arith_ppo.py") + ":smoke"
QUIET = ("--config.log.progress_bar=False", "--config.log.tensorboard=False")
BASE = ("--config.rl.max_new_tokens=16", "--config.rl.train_length_bucket=16", *QUIET)


def run_cli(*args: str) -> int:
    try:
        return cli.main(["jaxrl-reason", *args])
    except SystemExit as e:
        return e.code


def parse(config: str, *overrides: str):
    return cli.parse(["jaxrl-reason", "train", "--config", config, *overrides])[1].config


# ----------------------------------------------------------------------------- pure parts


def _verifiable() -> BatchRewards:
    correct = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
    fmt = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    return BatchRewards(total=(correct + 0.1 * fmt).astype(np.float32),
                        components={"correctness": correct, "format_strict": fmt},
                        reasons=collections.Counter({"correctness/wrong": 2}), seconds=0.5)


def test_mix_is_the_weighted_sum_by_hand():
    rewards = _verifiable()
    scores = np.array([2.0, -1.0, 0.5, np.nan], np.float32)
    mixed = mix_reward_model(rewards, scores, 0.5, shift=0.5, scale=2.0)
    standardized = [0.75, -0.75, 0.0, 0.0]  # (s - 0.5) / 2; NaN scores 0
    by_hand = [1 + 0.1 * 1 + 0.5 * 0.75, 0 + 0.1 * 1 + 0.5 * -0.75, 1 + 0 + 0.0, 0 + 0 + 0.0]
    np.testing.assert_allclose(mixed.total, by_hand, rtol=1e-6)
    np.testing.assert_allclose(mixed.components[COMPONENT], standardized)
    assert mixed.components[COMPONENT].dtype == mixed.total.dtype == np.float32
    assert mixed.components["correctness"] is rewards.components["correctness"]
    assert mixed.reasons == {"correctness/wrong": 2, "reward_model/nonfinite": 1}
    assert rewards.reasons == {"correctness/wrong": 2}  # the input is not modified
    assert COMPONENT not in rewards.components
    # The reward model alone: every verifier weighted 0 (still scored for the metrics).
    alone = dataclasses.replace(rewards, total=np.zeros(4, np.float32))
    raw = mix_reward_model(alone, scores[:3].tolist() + [1.0], 1.0)
    np.testing.assert_allclose(raw.total, [2.0, -1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="scored 3 rows, the batch has 4"):
        mix_reward_model(rewards, scores[:3], 1.0)


def test_rollout_inputs_repeat_prompts_per_group_and_mask_lengths():
    host = {"prompt_tokens": np.array([[0, 5, 6], [7, 8, 9]], np.int32),
            "prompt_valid": np.array([[0, 1, 1], [1, 1, 1]], bool),
            "tokens": np.arange(24, dtype=np.int32).reshape(4, 6),
            "lengths": np.array([1, 3, 4, 0], np.int32), "length": 4}
    batch = rollout_inputs(host, group_size=2)
    np.testing.assert_array_equal(batch["prompt_tokens"], host["prompt_tokens"][[0, 0, 1, 1]])
    np.testing.assert_array_equal(batch["prompt_valid"], host["prompt_valid"][[0, 0, 1, 1]])
    np.testing.assert_array_equal(batch["completion_tokens"], host["tokens"][:, :4])
    np.testing.assert_array_equal(batch["completion_mask"], [[1, 0, 0, 0], [1, 1, 1, 0],
                                                             [1, 1, 1, 1], [0, 0, 0, 0]])
    assert batch["completion_mask"].dtype == np.float32


def test_config_validation(tmp_path):
    config = parse(SMOKE)
    assert validate_config(config, 8) == []
    with config.unlocked():
        config.rewards.reward_model_weight = 0.5
    assert validate_config(config, 8) == [
        "rewards.reward_model_weight: a nonzero weight needs rewards.reward_model_dir (the "
        "reward model to score with)"]
    with config.unlocked():
        config.rewards.reward_model_dir = str(tmp_path / "missing")
        config.rewards.reward_model_weight = float("inf")
    problems = validate_config(config, 8)
    assert problems[0] == "config.rewards.reward_model_weight = inf: must be a finite number"
    assert problems[1:] == [  # the first line is the generic non-finite check of every float
        f"rewards.reward_model_dir: {str(tmp_path / 'missing')!r} is not a directory (train "
        f"one with `jaxrl-reason reward-model`)",
        "rewards.reward_model_weight: must be a finite number, got inf"]
    assert load_reward_component(parse(SMOKE), None, (), None) is None  # no directory: off


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def rm_workdir(tmp_path_factory):
    """A `jaxrl-reason reward-model` workdir: 4 steps on 96 generated arithmetic pairs of
    the smoke config (its tokenizer is the one the smoke RL runs train)."""
    root = tmp_path_factory.mktemp("rm")
    data = root / "pairs.jsonl"
    preferences.write_preference_pairs(data, preferences.arithmetic_preference_pairs(
        96, levels=(1,), corruption=("answer", "truncated")))
    workdir = root / "run"
    assert run_cli("reward-model", "--config", SMOKE, "--data", str(data), "--workdir",
                   str(workdir), "--steps", "4", "--max_response_length", "64",
                   *QUIET) == 0
    return str(workdir), str(data)


@pytest.mark.slow
def test_reward_model_command_reports_and_saves(rm_workdir, tmp_path, capsys):
    workdir, data = rm_workdir
    with open(os.path.join(workdir, "reward_model.json")) as f:
        report = json.load(f)
    pairs = report["pairs"]  # --eval_fraction 0.1 of the distinct prompts held out
    assert pairs["train"] + pairs["held_out"] == 96 and 8 <= pairs["held_out"] <= 10
    assert 0.0 <= report["held_out"]["accuracy"] <= 1.0
    assert report["held_out"]["pairs"] == pairs["held_out"]
    assert report["train_config"]["steps"] == 4
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert {m["phase"] for m in lines} == {"reward_model"}
    # The same workdir again: refused rather than overwritten.
    assert run_cli("reward-model", "--config", SMOKE, "--data", data, "--workdir", workdir,
                   *QUIET) == 1
    assert "already holds a reward model" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "chosen": "a"}\n')
    assert run_cli("reward-model", "--config", SMOKE, "--data", str(bad), "--workdir",
                   str(tmp_path / "w"), *QUIET) == 1
    assert "bad.jsonl:1: missing field 'rejected'" in capsys.readouterr().err
    assert resolve_reward_model_dir(workdir) == os.path.join(workdir, "reward_model")


# ----------------------------------------------------------------------------- RL steps


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The smoke runtime (its tokenizer trained from the config, as the RM command's was)."""
    return build_runtime(parse(SMOKE, *BASE), str(tmp_path_factory.mktemp("rt")))


def _trainer(runtime, config, workdir):
    rt = dataclasses.replace(runtime, config=config, workdir=workdir)
    params = init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    return RLTrainer(rt, MetricsWriter(workdir, tensorboard=False, console=False),
                     init_params=params)


@pytest.mark.slow
def test_grpo_rewards_include_the_reward_model(rm_workdir, runtime, tmp_path):
    """Verifiers + 0.5 x the standardized RM score: the component equals the RM scored by
    hand on the rollout, the total equals the pool's total plus 0.5 x it, and a full step
    logs reward/reward_model."""
    workdir, _ = rm_workdir
    config = parse(SMOKE, *BASE, f"--config.rewards.reward_model_dir={workdir}",
                   "--config.rewards.reward_model_weight=0.5")
    trainer = _trainer(runtime, config, str(tmp_path))
    try:
        component = trainer.reward_model
        meta_eval = rm.load_reward_model(resolve_reward_model_dir(workdir), runtime.mesh,
                                         runtime.rules)[3]["eval"]
        assert (component.weight, component.shift, component.scale) == \
            (0.5, meta_eval["reward_mean"], meta_eval["reward_std"])
        examples = next(trainer.data)
        host = trainer.generate(examples, jax.random.key(3))
        rewards = trainer.score(examples, host).result()
        batch = rollout_inputs(host, trainer.rl.num_generations)
        raw = rm.make_score_fn(component.model_cfg)(component.params, *(
            runtime.put(batch[k]) for k in ("prompt_tokens", "prompt_valid",
                                            "completion_tokens", "completion_mask")))
        want = (np.asarray(raw) - component.shift) / component.scale
        # The trainer scores on its own mesh and batching: the value model's float32 bound
        # (tests/numerics.py), divided by the standardization's scale.
        tokens = batch["prompt_tokens"].shape[1] + batch["completion_tokens"].shape[1]
        atol = value_head_tolerance(component.model_cfg, component.params,
                                    tokens=tokens) / component.scale
        np.testing.assert_allclose(rewards.components[COMPONENT], want, rtol=0, atol=atol)
        verifiable = rewards.components["correctness"] + 0.1 * rewards.components["format_strict"]
        np.testing.assert_allclose(rewards.total, verifiable + 0.5 * want, rtol=0,
                                   atol=0.5 * atol + f32_tolerance(3, np.abs(verifiable).max()
                                                                   + 0.5 * np.abs(want).max()))

        metrics = trainer.step(next(trainer.data))
        assert np.isfinite(metrics["reward/reward_model"])
        assert np.isfinite(metrics["loss"]) and "reward/correctness" in metrics
    finally:
        trainer.rewards.close()
        trainer.ckpt.close()


@pytest.mark.slow
def test_ppo_with_the_reward_model_alone(rm_workdir, runtime, tmp_path):
    """PPO (critic, GAE) whose only weighted reward is the raw RM score."""
    workdir, _ = rm_workdir
    config = parse(PPO_SMOKE, *BASE, f"--config.rewards.reward_model_dir={workdir}",
                   "--config.rewards.reward_model_weight=1.0",
                   "--config.rewards.reward_model_normalize=False",
                   "--config.rewards.weights.correctness=0.0",
                   "--config.rewards.weights.format_strict=0.0")
    trainer = _trainer(runtime, config, str(tmp_path))
    try:
        assert (trainer.reward_model.shift, trainer.reward_model.scale) == (0.0, 1.0)
        examples = next(trainer.data)
        host = trainer.generate(examples, jax.random.key(4))
        rewards = trainer.score(examples, host).result()
        np.testing.assert_array_equal(rewards.total, rewards.components[COMPONENT])
        metrics = trainer.step(next(trainer.data))
        assert metrics["reward/mean"] == pytest.approx(metrics["reward/reward_model"], rel=1e-5)
        assert np.isfinite(metrics["loss"])
    finally:
        trainer.rewards.close()
        trainer.ckpt.close()


@pytest.mark.slow
def test_a_reward_model_of_another_tokenizer_is_refused(rm_workdir, runtime, tmp_path):
    workdir, _ = rm_workdir
    other = build_runtime(parse(SMOKE, "--config.tokenizer.vocab_size=300"), str(tmp_path))
    config = parse(SMOKE, f"--config.rewards.reward_model_dir={workdir}")
    with pytest.raises(ValueError, match="trained with another tokenizer"):
        load_reward_component(config, runtime.mesh, runtime.rules, other.tokenizer)
    # Normalization needs the held-out statistics saved with the model.
    params, model_cfg, tokenizer, _ = rm.load_reward_model(
        resolve_reward_model_dir(workdir), runtime.mesh, runtime.rules)
    rm.save_reward_model(str(tmp_path / "bare"), params, model_cfg, tokenizer, step=1)
    config = parse(SMOKE, f"--config.rewards.reward_model_dir={tmp_path / 'bare'}")
    with pytest.raises(ValueError, match="holds no held-out reward mean/std"):
        load_reward_component(config, runtime.mesh, runtime.rules, runtime.tokenizer)
