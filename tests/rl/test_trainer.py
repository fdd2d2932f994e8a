"""RLTrainer in-process on the smoke config (8 fake CPU devices, 4 prompts x 4 samples = 16 rows):
learning, the reference and KL, metrics, multiple iterations, row skipping, dynamic sampling,
truncation masks, adaptive KL and reference sync, host offload.

The runtime (tokenizer, model, sampler) is built once per module and shared (conftest.py), so
the sampler compiles once; each trainer compiles its own update and log-prob functions (~5 s
each). The test-only rewards and helpers are in trainer_support.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import decoder_tolerance, f32_tolerance
from trainer_support import MAX_NEW, PROMISED, logp_of, one_batch, run_steps, series, tree_equal
from jaxrl_reason.rl.batches import merge_groups, select_train_rows, zero_variance_groups
from jaxrl_reason.rl.update import adaptive_kl_beta, mix_reference
from jaxrl_reason.runtime.train_state import create_train_state


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
        assert metrics["rewards/unscored"] == 0.0  # every reward call got a verdict


def test_rollout_metrics_count_unscored_reward_calls():
    """`rewards/unscored` counts the calls the pool's backstop left without a verdict, over
    all components, apart from wrong answers and CPU timeouts."""
    import collections

    from jaxrl_reason.rewards import BatchRewards
    from jaxrl_reason.rl.rollout_metrics import rollout_metrics

    rewards = BatchRewards(
        total=np.zeros(4, np.float32),
        components={"correctness": np.zeros(4, np.float32)},
        reasons=collections.Counter({"correctness/unscored": 2, "format_strict/unscored": 1,
                                     "correctness/wrong": 1, "correctness/timeout": 1}),
        seconds=0.0)
    host = {"lengths": np.array([3, 4, 5, 6]), "truncated": np.zeros(4, bool)}
    metrics = rollout_metrics(rewards, host, num_generations=2, verifier="correctness")
    assert metrics["rewards/unscored"] == 3.0
    assert metrics["accuracy"] == 0.0


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


def test_a_batch_without_finite_rewards_is_skipped_with_its_rollout_metrics():
    """Every reward non-finite: no update, `update_skipped` 1, the batch named for the skip
    guard, and the rollout's metrics still logged."""
    import collections
    import types

    from jaxrl_reason.rewards import BatchRewards
    from jaxrl_reason.rl.trainer import RLTrainer

    rewards = BatchRewards(total=np.full(4, np.nan, np.float32),
                           components={"correctness": np.zeros(4, np.float32)},
                           reasons=collections.Counter(), seconds=0.0)
    got = types.SimpleNamespace(
        rewards=rewards, examples=[{"id": 7}, {"id": 9}], metrics={}, times={},
        host={"lengths": np.array([3, 4, 5, 6]), "truncated": np.zeros(4, bool)})
    fake = types.SimpleNamespace(rl=types.SimpleNamespace(num_generations=2),
                                 verifier="correctness", step_count=3, skipped_batch=None)
    metrics = RLTrainer._skip_update(fake, got, t0=0.0)
    assert metrics["update_skipped"] == 1.0 and fake.step_count == 4
    assert fake.skipped_batch == ("every reward non-finite", [7, 9])
    assert metrics["completion/length_mean"] == 4.5 and metrics["accuracy"] == 0.0
    assert "time/train_s" in metrics
