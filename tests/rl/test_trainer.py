"""RLTrainer in-process on the smoke config (8 fake CPU devices, 4 prompts x 4 samples = 16 rows).

The runtime (tokenizer, model, sampler) is built once per module and shared, so the sampler
compiles once; each trainer compiles its own update and log-prob functions (~5 s each).
Rewards are test-only verifiers registered below, chosen so that a randomly initialised
model already earns them sometimes and every group of the first batches has some variance.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from numerics import decoder_grad_tolerance, decoder_tolerance, f32_tolerance

from jaxrl_reason.cli import parse
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.models.params import init_params
from jaxrl_reason.rewards.base import register_reward
from jaxrl_reason.rl.advantages import group_advantages
from jaxrl_reason.rl.batches import merge_groups, select_train_rows, zero_variance_groups
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.rl.critic import Critic, ppo_advantages
from jaxrl_reason.rl.update import adaptive_kl_beta, mix_reference
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.runtime.train_state import create_train_state

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


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The smoke runtime, shared by every trainer of this module (one sampler compile)."""
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *BASE])
    return build_runtime(fv.config, str(tmp_path_factory.mktemp("rt")))


@pytest.fixture(scope="module")
def make_trainer(runtime, tmp_path_factory):
    """make(*flag_overrides, weights=None, seed=0) -> (trainer, host copy of initial params).

    Trainers (reward threads, checkpointer) are closed when the module ends.
    """
    made = []

    def make(*overrides, weights=None, seed=0):
        _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *BASE, *overrides])
        cfg = fv.config
        if weights is not None:
            cfg.rewards.weights = ml_collections.ConfigDict(weights)
        workdir = str(tmp_path_factory.mktemp("run"))
        rt = dataclasses.replace(runtime, config=cfg, workdir=workdir)
        params = init_params(rt.model_cfg, jax.random.key(seed), rt.mesh, rt.rules)
        initial = jax.device_get(params)  # the trainer donates `params` on its first update
        writer = MetricsWriter(workdir, tensorboard=False, console=False)
        trainer = RLTrainer(rt, writer, init_params=params)
        made.append((trainer, writer))
        return trainer, initial

    yield make
    for trainer, writer in made:
        trainer.rewards.close()
        trainer.ckpt.close()
        writer.close()


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


# ----------------------------------------------------------------------------- learning


@pytest.mark.slow  # two 20-step runs, ~25 s
def test_rl_learns_to_stop_early_and_the_sign_of_the_reward_matters(make_trainer):
    steps = 20
    flags = ("--config.rl.learning_rate=3e-3", "--config.rl.beta=0.0")
    up, _ = make_trainer(*flags, weights={"_test_stop_early": 1.0})
    rewarded = run_steps(up, steps)
    rate = series(rewarded, "reward/_test_stop_early")
    length = series(rewarded, "completion/length_mean")
    # The random model stops early now and then, so learning has a signal.
    assert 0.0 < rate[:5].mean() < 0.3, rate
    assert rate[-5:].mean() > rate[:5].mean() + 0.2, rate
    assert length[-5:].mean() < length[:5].mean() - 3.0, length
    assert np.allclose(series(rewarded, "reward/mean"), rate)

    # The same run paying -1 for stopping early (same seeds, same first batch) must not
    # learn to stop early: the update direction follows the reward's sign.
    down, _ = make_trainer(*flags, weights={"_test_stop_early": -1.0})
    punished = run_steps(down, steps)
    rate_down = series(punished, "reward/_test_stop_early")
    assert rate_down[0] == rate[0]  # identical first rollout: only the sign differs
    assert rate_down[-5:].mean() <= rate_down[:5].mean() + 0.05, rate_down
    assert rate_down[-5:].mean() < rate[-5:].mean() - 0.2
    assert series(punished, "completion/length_mean")[-5:].mean() >= length[:5].mean() - 1.0


def test_one_update_moves_logprobs_in_the_advantage_direction(make_trainer):
    trainer, initial = make_trainer("--config.rl.learning_rate=1e-4", "--config.rl.beta=0.0",
                                    weights={"_test_text_length": 1.0})
    assert trainer.ref_params is None  # beta = 0: no reference copy is kept
    rollout, rewards, batch = one_batch(trainer)
    assert np.std(rewards.total) > 0
    adv = np.asarray(jax.device_get(batch["advantages"]), np.float64)
    mask = np.asarray(jax.device_get(rollout.mask), np.float64)
    assert np.count_nonzero(adv) >= len(adv) // 2

    def gain(advantages):
        """One update with `advantages` [N] from the current state; returns
        (sum_b A_b * token-mean change, sum_b A_b * token-sum change) of log pi(completion_b)."""
        before = logp_of(trainer, rollout)
        trainer.state, metrics = trainer.update_fn(trainer.state,
                                                   {**batch, "advantages": advantages})
        delta = (logp_of(trainer, rollout) - before) * mask
        assert np.isfinite(delta).all() and np.abs(delta).max() > 0
        # num_iterations = 1: old = sg(logp), exp(0) = 1 and a mean of ones are exact.
        assert float(metrics["ratio_mean"]) == 1.0
        a = np.asarray(jax.device_get(advantages), np.float64)
        per_token_mean = delta.sum(1) / np.maximum(mask.sum(1), 1.0)
        return float(np.sum(a * per_token_mean)), float(np.sum(a * delta.sum(1)))

    mean_gain, sum_gain = gain(batch["advantages"])
    assert mean_gain > 0 and sum_gain > 0, (mean_gain, sum_gain)

    # From the same initial params, negated advantages move log-probs the other way
    # (sum_b A_b * change < 0 for the original A).
    fresh = jax.device_put(initial, jax.tree.map(lambda x: x.sharding, trainer.state.params))
    trainer.state = create_train_state(fresh, trainer.optimizer)
    mean_gain, sum_gain = gain(-batch["advantages"])
    assert mean_gain > 0 and sum_gain > 0, (mean_gain, sum_gain)


# ----------------------------------------------------------------------------- reference, metrics


@pytest.fixture(scope="module")
def kl_run(make_trainer):
    """Three steps with beta > 0 and the smoke rewards plus a dense one (a random model earns
    no correctness or format reward, so alone they would give zero advantages)."""
    trainer, initial = make_trainer(
        "--config.rl.learning_rate=3e-3", "--config.rl.beta=0.05",
        weights={"correctness": 1.0, "format_strict": 0.1, "_test_text_length": 1.0})
    return trainer, initial, run_steps(trainer, 3)


def test_reference_is_a_frozen_copy_of_the_initial_params(kl_run):
    trainer, initial, history = kl_run
    assert trainer.ref_params is not None
    assert tree_equal(jax.device_get(trainer.ref_params), initial)
    assert not tree_equal(jax.device_get(trainer.state.params), initial)
    assert int(trainer.state.step) == 3
    # KL to the reference is ~0 while the policy is the reference, then grows.
    kl = series(history, "kl")
    assert abs(kl[0]) < 1e-5, kl
    assert kl[-1] > 1e-6, kl


def test_step_metrics_cover_the_readme_and_are_finite(kl_run):
    _, _, history = kl_run
    for metrics in history:
        missing = [k for k in PROMISED if k not in metrics]
        assert not missing, f"missing metrics {missing}; got {sorted(metrics)}"
        bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
        assert not bad, bad
        assert all(isinstance(v, float) for v in metrics.values())
        assert 1 <= metrics["completion/length_mean"] <= metrics["completion/length_max"] <= MAX_NEW
        assert 0 <= metrics["frac_zero_variance_groups"] <= 1
        assert metrics["reward/std"] >= 0 and metrics["entropy"] > 0
        assert metrics["ratio_mean"] == 1.0  # num_iterations = 1: exp(logp - sg(logp)), exact
        assert all(metrics[k] >= 0 for k in ("time/sample_s", "time/score_s", "time/train_s"))


# ----------------------------------------------------------------------------- num_iterations


def test_two_iterations_use_the_old_logprobs(make_trainer):
    trainer, initial = make_trainer("--config.rl.num_iterations=2",
                                    "--config.rl.learning_rate=3e-3",
                              "--config.rl.beta=0.0", weights={"_test_text_length": 1.0})
    rollout, _, batch = one_batch(trainer)
    batch["old_logp"] = trainer.logprob_fn(trainer.state.params, rollout.prompt_tokens,
                                           rollout.prompt_valid, rollout.completion_tokens,
                                           rollout.mask)
    trainer.state, first = trainer.update_fn(trainer.state, batch)
    trainer.state, second = trainer.update_fn(trainer.state, batch)
    # First iteration: the policy is the old policy, so every ratio is 1 and nothing clips:
    # old_logp came from another program, within the decoder's float32 bound (exp of it),
    # then a mean over the tokens.
    tol = np.expm1(decoder_tolerance(
        trainer.rt.model.cfg, initial, temperature=trainer.rl.temperature,
        tokens=rollout.prompt_tokens.shape[1] + rollout.completion_tokens.shape[1]))
    ratio_atol = tol + f32_tolerance(int(np.size(rollout.mask)), 1.0 + tol, chain=2)
    assert float(first["ratio_mean"]) == pytest.approx(1.0, abs=ratio_atol)
    assert float(first["ratio_max"]) == pytest.approx(1.0, abs=ratio_atol)
    assert float(first["clip_frac_low"]) == 0.0 and float(first["clip_frac_high"]) == 0.0
    # Second: the policy moved but the ratio is still taken against the old log-probs.
    assert abs(float(second["ratio_max"]) - 1.0) > 1e-4
    assert np.isfinite(float(second["loss"]))

    # Full steps: two optimizer updates per step, finite metrics.
    before = int(trainer.state.step)
    history = run_steps(trainer, 2)
    assert int(trainer.state.step) == before + 4
    for metrics in history:
        assert all(np.isfinite(v) for v in metrics.values()), metrics
        assert metrics["kl"] == 0.0  # beta = 0: no reference, no KL


# ----------------------------------------------------------------------------- skipped rows


def test_select_train_rows_keeps_nonzero_rows_in_buckets():
    adv = np.array([0, 1.5, 0, 0, -0.5, 0, 0, 0, 2.0, 0, 0, 0, 0, 0, 0, 0], np.float32)
    rows, real = select_train_rows(adv, num_buckets=4, multiple=2)
    assert rows.shape == (4,) and real.tolist() == [True, True, True, False]
    assert rows[:3].tolist() == [1, 4, 8]
    rows, real = select_train_rows(np.zeros(16, np.float32), num_buckets=4, multiple=8)
    assert rows.shape == (8,) and not real.any()  # smallest bucket, rounded to the mesh
    rows, real = select_train_rows(np.ones(16, np.float32), num_buckets=4, multiple=8)
    assert rows.tolist() == list(range(16)) and real.all()
    adv = np.zeros(16, np.float32)
    adv[:5] = 1.0
    rows, _ = select_train_rows(adv, num_buckets=4, multiple=8)
    assert rows.shape == (8,)


def test_skipping_zero_advantage_rows_gives_the_whole_batch_update(make_trainer):
    """Same seeds, same first rollout: the update on the nonzero rows only (plus padding)
    equals the update on all rows, for every loss aggregation."""
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        results = []
        for skip in (True, False):
            trainer, _ = make_trainer(f"--config.rl.skip_zero_advantage_rows={skip}",
                                      f"--config.rl.loss_type={loss_type}",
                                      "--config.rl.learning_rate=1e-2", "--config.rl.beta=0.0",
                                      weights={"_test_half_constant": 1.0})
            assert trainer.skip_rows == skip
            metrics = trainer.step(next(trainer.data))
            results.append((metrics, jax.device_get(trainer.state.params)))
        (skipped, p_skip), (full, p_full) = results
        assert full["train_rows_frac"] == 1.0
        # Every row of a zero-variance group is skipped (they are the only zeros).
        assert 0 < skipped["train_rows_frac"] < 1.0
        assert skipped["train_rows_frac"] == pytest.approx(
            1.0 - skipped["frac_zero_variance_groups"])
        assert skipped["loss"] == pytest.approx(full["loss"], rel=1e-4, abs=1e-7), loss_type
        assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-3), loss_type
        # Adam's first step is ~lr * sign(g): a gradient that is float noise around 0 may
        # differ between the two summation orders, so compare to 5% of lr (1e-2).
        for a, b in zip(jax.tree.leaves(p_skip), jax.tree.leaves(p_full)):
            np.testing.assert_allclose(a, b, rtol=0, atol=5e-4)


def test_batch_rewards_see_the_rollout_lengths(make_trainer):
    """Length shaping in a real step: DAPO's overlong penalty and Kimi's length reward get
    the sampler's token lengths, truncation flags and groups, and are logged per component."""
    weights = {"correctness": 1.0, "format_strict": 0.1, "overlong_dapo": 1.0,
               "length_kimi": 0.5}
    trainer, _ = make_trainer(weights=weights)
    examples = next(trainer.data)
    host = trainer.generate(examples, jax.random.key(3))
    rewards = trainer.score(examples, host).result()
    cache = MAX_NEW // 4   # the config's cache_length 0 means a quarter of the budget
    want = np.where(host["truncated"], -1.0,
                    np.minimum(0.0, np.maximum(-1.0, (MAX_NEW - cache - host["lengths"]) / cache)))
    np.testing.assert_allclose(rewards.components["overlong_dapo"], want, atol=1e-6)
    g = trainer.rl.num_generations
    lengths = host["lengths"].reshape(-1, g)
    span = lengths.max(1, keepdims=True) - lengths.min(1, keepdims=True)
    lam = np.where(span > 0, 0.5 - (lengths - lengths.min(1, keepdims=True)) / np.maximum(span, 1),
                   0.0).reshape(-1)
    correct = rewards.components["correctness"] > 0.5
    np.testing.assert_allclose(rewards.components["length_kimi"],
                               np.where(correct, lam, np.minimum(0, lam)), atol=1e-6)
    total = sum(w * rewards.components[k] for k, w in weights.items())
    # A sum of 4 weighted components in two orders: magnitude sum_k |w_k c_k| per sample.
    terms = max(sum(abs(w) * np.abs(np.asarray(rewards.components[k], np.float64))
                    for k, w in weights.items()))
    np.testing.assert_allclose(rewards.total, total, atol=f32_tolerance(len(weights), terms))
    metrics = trainer.step(examples)
    assert "reward/overlong_dapo" in metrics and "reward/length_kimi" in metrics


def test_dynamic_sampling_fills_the_batch_with_informative_groups(make_trainer):
    """DAPO dynamic sampling: every kept group has reward variance (when the cap allows),
    the merged batch has exactly B groups whose rows match their prompts, and extra rounds
    and discarded groups are logged."""
    trainer, _ = make_trainer("--config.rl.dynamic_sampling=True",
                              "--config.rl.dynamic_sampling_max_rounds=4",
                              weights={"_test_stop_early": 1.0})
    rl = trainer.rl
    got = trainer.collect(next(trainer.data), jax.random.key(0))
    examples, host, rewards, m = got.examples, got.host, got.rewards, got.metrics
    assert got.ref_logp is None and set(got.times) == {"time/sample_s", "time/score_s"}
    assert len(examples) == rl.batch_prompts
    n = rl.batch_prompts * rl.num_generations
    assert host["tokens"].shape[0] == n and rewards.total.shape == (n,)
    assert host["prompt_tokens"].shape[0] == rl.batch_prompts
    zero = zero_variance_groups(rewards.total, rl.num_generations)
    assert int(zero.sum()) == m["dynamic_sampling/filled_groups"]
    assert m["dynamic_sampling/extra_rounds"] <= 4
    # Rows still belong to their prompts: re-scoring the merged batch gives the same rewards.
    again = trainer.score(examples, host).result()
    np.testing.assert_array_equal(again.total, rewards.total)
    metrics = trainer.step(next(trainer.data))
    assert "dynamic_sampling/zero_variance_groups" in metrics


def test_merge_groups_pads_prompts_and_keeps_rows():
    from jaxrl_reason.rewards.pool import BatchRewards
    import collections

    def part(tp, base):
        host = {"tokens": np.arange(4 * 3).reshape(4, 3) + base, "lengths": np.array([1, 2, 3, 3]),
                "truncated": np.array([0, 0, 0, 1], bool),
                "sampler_logp": np.zeros((4, 3), np.float32),
                "prompt_tokens": np.full((2, tp), base), "prompt_valid": np.ones((2, tp), bool)}
        r = BatchRewards(total=np.array([0, 1, 1, 1], np.float32) + base,
                         components={"c": np.array([0, 1, 1, 1], np.float32)},
                         reasons=collections.Counter({"c/wrong": 1}), seconds=0.5)
        return [{"id": f"{base}-0"}, {"id": f"{base}-1"}], host, r

    ex, host, r = merge_groups([part(2, 0), part(4, 100)], [(1, 0), (0, 0)], 2, 4, 3)
    assert [e["id"] for e in ex] == ["100-0", "0-0"]
    np.testing.assert_array_equal(host["tokens"][:2], np.arange(6).reshape(2, 3) + 100)
    np.testing.assert_array_equal(host["prompt_valid"][1], [False, False, True, True])
    np.testing.assert_array_equal(r.total, [100, 101, 0, 1])
    assert r.reasons["c/wrong"] == 2 and host["length"] == 3
    assert "tool_mask" not in host

    # Tool-use rollouts: each kept row brings its result-token mask and call count.
    parts = [part(2, 0), part(4, 100)]
    for (_, h, _), base in zip(parts, (0, 100)):
        h["tool_mask"] = (np.arange(4 * 3).reshape(4, 3) + base) % 2 == 0
        h["tool_calls"] = np.arange(4, dtype=np.int32) + base
    _, host, _ = merge_groups(parts, [(1, 1), (0, 0)], 2, 4, 3)
    np.testing.assert_array_equal(host["tool_calls"], [102, 103, 0, 1])
    np.testing.assert_array_equal(
        host["tool_mask"], np.concatenate([parts[1][1]["tool_mask"][2:],
                                           parts[0][1]["tool_mask"][:2]]))


def test_adaptive_kl_and_reference_mixing():
    assert adaptive_kl_beta(0.1, kl=0.2, target=0.1, horizon=100, batch_size=10) \
        == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    assert adaptive_kl_beta(0.1, kl=0.09, target=0.1, horizon=100, batch_size=10) \
        == pytest.approx(0.1 * (1 - 0.1 * 10 / 100))
    ref = {"w": jnp.zeros(3)}
    mixed = mix_reference(ref, {"w": jnp.ones(3)}, 0.25)
    np.testing.assert_allclose(mixed["w"], 0.25)


def test_truncated_rows_are_masked_out(make_trainer):
    trainer, _ = make_trainer("--config.rl.mask_truncated_completions=True")
    host = trainer.generate(next(trainer.data), jax.random.key(1))
    host["truncated"] = np.arange(len(host["lengths"])) < 3  # a random model rarely stops
    rollout = trainer.rollout(host)
    mask = np.asarray(jax.device_get(rollout.mask))
    assert mask[:3].sum() == 0 and mask[3:].sum() > 0


def test_adaptive_kl_and_reference_sync_in_the_loop(make_trainer):
    """kl_target moves beta by the controller's rule from the logged KL; ref_sync_every=1
    with alpha=1 makes the reference equal the policy after each step."""
    trainer, initial = make_trainer(
        "--config.rl.learning_rate=3e-3", "--config.rl.beta=0.05", "--config.rl.kl_target=1e-6",
        "--config.rl.kl_horizon=100", "--config.rl.ref_sync_every=1",
        "--config.rl.ref_sync_alpha=1.0", weights={"_test_text_length": 1.0})
    m1, m2 = run_steps(trainer, 2)
    n = trainer.rl.batch_prompts * trainer.rl.num_generations
    assert m1["beta"] == pytest.approx(adaptive_kl_beta(0.05, m1["kl"], 1e-6, 100, n))
    assert m2["beta"] == pytest.approx(adaptive_kl_beta(m1["beta"], m2["kl"], 1e-6, 100, n))
    assert tree_equal(jax.device_get(trainer.ref_params), jax.device_get(trainer.state.params))
    assert not tree_equal(jax.device_get(trainer.ref_params), initial)


def memory_kinds(tree) -> set[str]:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


def test_host_offload_keeps_reference_and_optimizer_off_the_chips_with_the_same_steps(
        kl_run, make_trainer, tmp_path):
    """rl.offload_reference / rl.offload_optimizer: between their uses the reference and the
    optimizer state live in host memory (pinned_host), the steps are bit-identical to
    kl_run's, and a checkpoint round trip brings them back to host memory."""
    trainer, _, history = kl_run
    off, _ = make_trainer(
        "--config.rl.learning_rate=3e-3", "--config.rl.beta=0.05",
        "--config.rl.offload_reference=True", "--config.rl.offload_optimizer=True",
        weights={"correctness": 1.0, "format_strict": 0.1, "_test_text_length": 1.0})
    assert memory_kinds(off.ref_params) == {"pinned_host"}
    assert memory_kinds(off.state.opt_state) == {"pinned_host"}
    off_history = run_steps(off, 3)
    assert memory_kinds(off.ref_params) == {"pinned_host"}
    assert memory_kinds(off.state.opt_state) == {"pinned_host"}
    assert memory_kinds(off.state.params) == {"device"}
    for ours, theirs in zip(off_history, history):
        for key in ("loss", "kl", "grad_norm", "reward/mean"):
            assert ours[key] == theirs[key], key
    assert tree_equal(jax.device_get(off.state.params), jax.device_get(trainer.state.params))
    assert tree_equal(jax.device_get(off.state.opt_state),
                      jax.device_get(trainer.state.opt_state))
    off.save(3)
    saved = jax.device_get((off.state, off.ref_params))
    assert off.restore()
    assert memory_kinds(off.ref_params) == {"pinned_host"}
    assert memory_kinds(off.state.opt_state) == {"pinned_host"}
    assert tree_equal(jax.device_get((off.state, off.ref_params)), saved)


def test_ppo_with_a_critic_runs_and_the_critic_learns(make_trainer):
    """advantage_estimator='gae': per-token advantages from the critic, KL in the token
    rewards, policy and critic both updated; the value loss falls on a repeated batch."""
    trainer, _ = make_trainer(
        "--config.rl.advantage_estimator=gae", "--config.rl.beta=0.02",
        "--config.rl.kl_in_reward=True", "--config.rl.kl_estimator=k1",
        "--config.rl.loss_type=bnpo", "--config.rl.num_iterations=2",
        "--config.rl.value.learning_rate=3e-3", weights={"_test_text_length": 1.0})
    assert isinstance(trainer.advantage_source, Critic) and not trainer.skip_rows
    assert trainer.kl_in_reward == "token" and trainer.prompt_per_row
    history = run_steps(trainer, 3)
    for m in history:
        for key in ("value_loss", "explained_variance", "value_clip_frac", "kl", "sampler_kl"):
            assert key in m and np.isfinite(m[key]), (key, m)
    assert int(trainer.advantage_source.state.step) == 6  # two critic epochs per step
    # The critic regresses toward the returns: repeated updates on one batch reduce its loss.
    examples = next(trainer.data)
    host = trainer.generate(examples, jax.random.key(11))
    rollout = trainer.rollout(host)
    rewards = jnp.asarray(trainer.score(examples, host).result().total)
    critic = trainer.advantage_source
    values = critic.values_fn(critic.state.params, *rollout.scoring_args())
    adv, returns = ppo_advantages(trainer.rt.put(np.asarray(rewards)), rollout.mask, values,
                                  None, jnp.float32(0.0), gamma=1.0, lam=0.95,
                                  whiten_advantages=True)
    # Targets half a unit above the returns: the loss starts far above what a few Adam steps
    # move (with the returns themselves it was ~6e-4, and whether it fell depended on the
    # sampled batch).
    batch = {**vars(rollout), "old_values": values, "returns": returns + 0.5}
    losses = []
    for _ in range(5):
        losses.append(float(trainer.advantage_source.update(batch)["value_loss"]))
    # It falls until the values reach the clip range around old_values, then holds there.
    assert losses[0] > 0.05 and losses[-1] < 0.5 * losses[0], losses
    assert all(b <= a for a, b in zip(losses, losses[1:])), losses


def test_ppo_resume_restores_the_critic_exactly(make_trainer):
    """The critic's params, optimizer state and step are in the RL checkpoint ("value_state"):
    a step taken after restoring equals the step taken before, bit for bit."""
    trainer, _ = make_trainer(
        "--config.rl.advantage_estimator=gae", "--config.rl.beta=0.02",
        "--config.rl.kl_in_reward=True", "--config.rl.kl_estimator=k1",
        "--config.rl.loss_type=bnpo", "--config.rl.value.learning_rate=3e-3",
        weights={"_test_text_length": 1.0})
    run_steps(trainer, 1)
    trainer.save(1)
    saved = jax.device_get(trainer.advantage_source.checkpoint_tree())
    (first,) = run_steps(trainer, 1)
    after = jax.device_get((trainer.state.params, trainer.advantage_source.checkpoint_tree()))
    assert not tree_equal(saved["params"], after[1]["params"])  # the critic moved
    assert trainer.restore() and trainer.step_count == 1
    assert tree_equal(jax.device_get(trainer.advantage_source.checkpoint_tree()), saved)
    (again,) = run_steps(trainer, 1)
    for key in first:
        if not key.startswith("time/"):
            assert first[key] == again[key], key
    critic = trainer.advantage_source
    assert tree_equal(jax.device_get((trainer.state.params, critic.checkpoint_tree())),
                      after)


@pytest.mark.parametrize("overrides", [
    ("--config.rl.policy_loss_mode=gspo", "--config.rl.clip_ratio_c=3.0",
     "--config.rl.tis_cap=2.0"),
    ("--config.rl.policy_loss_mode=cispo", "--config.rl.epsilon_high=4.0",
     "--config.rl.beta=0.05", "--config.rl.kl_in_reward=True"),
])
def test_loss_modes_run_in_the_loop(make_trainer, overrides):
    trainer, _ = make_trainer(*overrides, weights={"_test_text_length": 1.0})
    (m,) = run_steps(trainer, 1)
    assert np.isfinite(m["loss"]) and "sampler_kl" in m
    assert m["sampler_kl"] < 1e-3  # the sampler and the trainer score tokens alike
    if trainer.rl.kl_in_reward:
        assert "reward/kl_penalty" in m
    if trainer.rl.clip_ratio_c:
        assert "clip_frac_dual" in m


def test_micro_batches_give_the_full_batch_gradient(make_trainer):
    """Gradient accumulation over 2 strided micro-batches (scan) = the full-batch gradient:
    with plain SGD (lr 1) the parameter change is minus the gradient, so the two updates'
    parameter changes must agree to float summation order; the loss too."""
    import optax

    from jaxrl_reason.rl.update import make_update_fn
    from jaxrl_reason.runtime.train_state import create_train_state

    trainer, initial = make_trainer("--config.rl.micro_batches=2",
                                    weights={"_test_text_length": 1.0})
    _, _, batch = one_batch(trainer)
    n = batch["advantages"].shape[0]
    batch.update(num_sequences=np.float32(n), beta=np.float32(0.0),
                 num_tokens=np.float32(np.asarray(jax.device_get(batch["mask"])).sum()))
    rt, rl = trainer.rt, trainer.rl
    sgd = optax.sgd(1.0)
    out = {}
    for k in (1, 2):
        cfg = rl.copy_and_resolve_references()
        cfg.micro_batches = k
        update = make_update_fn(rt.model, sgd, cfg, rt.mesh, rt.rules)
        params = jax.device_put(initial, jax.tree.map(lambda x: x.sharding,
                                                      trainer.state.params))
        state, metrics = update(create_train_state(params, sgd), batch)
        out[k] = (jax.device_get(state.params), float(metrics["loss"]))
    # Other summation orders. The loss: every ratio is exactly 1 (old = sg(logp)), so the
    # sums over the tokens (terms |A| with weights summing to 1) are all that differ. The
    # update is minus the gradient: the decoder's gradient bound over n rows.
    tokens = batch["prompt_tokens"].shape[1] + batch["completion_tokens"].shape[1]
    adv = float(np.abs(np.asarray(jax.device_get(batch["advantages"]))).max())
    assert out[2][1] == pytest.approx(out[1][1], abs=f32_tolerance(
        int(np.size(batch["mask"])), adv, chain=3))
    delta = jax.tree.map(lambda a, p0: np.asarray(a, np.float64) - p0, out[1][0], initial)
    atol = decoder_grad_tolerance(rt.model.cfg, delta, tokens=tokens, rows=n)
    for a, b, p0 in zip(*(jax.tree.leaves(out[k][0]) for k in (1, 2)), jax.tree.leaves(initial)):
        np.testing.assert_allclose(a - p0, b - p0, atol=atol)


def test_micro_batched_logprob_pass_and_loop(make_trainer):
    """The micro-batched log-prob pass returns the full pass's values in row order, and a
    step with micro-batches and a KL term runs end to end."""
    from jaxrl_reason.rl.update import make_logprob_fn

    trainer, _ = make_trainer("--config.rl.micro_batches=2", "--config.rl.beta=0.05",
                              weights={"_test_text_length": 1.0})
    rollout, _, _ = one_batch(trainer)
    full = make_logprob_fn(trainer.rt.model, trainer.rl.temperature)
    got = trainer.logprob_fn(trainer.state.params, *rollout.scoring_args())
    want = full(trainer.state.params, *rollout.scoring_args())
    # Micro-batched vs whole pass: the decoder's float32 bound over prompt + completion.
    atol = decoder_tolerance(trainer.rt.model.cfg, trainer.state.params,
                             tokens=rollout.prompt_tokens.shape[1]
                             + rollout.completion_tokens.shape[1],
                             temperature=trainer.rl.temperature)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol)
    (m,) = run_steps(trainer, 1)
    assert np.isfinite(m["loss"]) and m["kl"] >= 0


@pytest.mark.slow  # the Pallas kernels run in the interpreter on CPU (~1 min)
def test_pallas_and_reference_backends_give_the_same_step(make_trainer):
    """config.kernels.backend and model.logprobs_impl: the fused Pallas advantage, loss and
    log-prob kernels (interpret mode on CPU; the log-probs per device under shard_map) give
    the reference's loss, metrics and updated params for the same step."""
    weights = {"_test_text_length": 1.0}
    out = {}
    for backend, logprobs in (("reference", "full"), ("pallas", "pallas")):
        trainer, _ = make_trainer(f"--config.kernels.backend={backend}",
                                  f"--config.model.logprobs_impl={logprobs}",
                                  "--config.rl.beta=0.05", weights=weights)
        (m,) = run_steps(trainer, 1)
        out[backend] = (m, jax.device_get(trainer.state.params))
    (ref, ref_params), (pal, pal_params) = out["reference"], out["pallas"]
    for key in ("loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "grad_norm"):
        assert pal[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(pal_params)):
        np.testing.assert_allclose(a, b, atol=2e-4)


def test_critic_rejects_an_unknown_value_init():
    cfg = ml_collections.ConfigDict({"value": {"init": "pretrained"}})
    with pytest.raises(ValueError, match=r"rl.value.init must be one of .*'pretrained'"):
        Critic(None, cfg, init_params=None)
