"""Bounded staleness (rl.max_staleness = k) on the smoke config: batch n is sampled by the
policy after max(0, n - 1 - k) updates whatever the timing, the first step equals the
synchronous run's, two runs with one seed are identical, the batches in flight survive a
save and restore bit-identically, and bad settings are refused."""

from __future__ import annotations

import collections
import json

import jax
import numpy as np
import pytest

from cli_runs import ARITH, load_config
from trainer_support import assert_resumed_like, close_trainer, trainer_in, tree_equal
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.rewards.pool import BatchRewards
from jaxrl_reason.rl.staleness import RolloutQueue, Sampled, behaviour_version

WEIGHTS = {"_test_text_length": 1.0}
TIS = "--config.rl.tis_cap=2.0"


def stale_flags(k, steps=4):
    return (TIS, f"--config.rl.max_staleness={k}", f"--config.rl.steps={steps}")


def comparable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "async/"))}


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_each_batch_is_sampled_by_the_version_the_bound_fixes(k):
    """The queue's schedule, replayed: batch n is sampled at version max(0, n - 1 - k),
    trained at version n - 1, never more than k stale, and nothing is sampled past the
    run's last step."""
    assert [behaviour_version(n, k) for n in range(1, 8)] == [max(0, n - 1 - k)
                                                             for n in range(1, 8)]
    if k == 0:
        return
    steps, version, sampled, queue = 9, 0, [], RolloutQueue(k, rows=2, width=3)
    for step in range(1, steps + 1):
        for batch in queue.wanted(step, steps):
            sampled.append(batch)
            queue.push(Sampled([{"batch": batch}], {}, None, version))
        trained = queue.pop()
        assert trained.examples == [{"batch": step}]
        assert trained.version == behaviour_version(step, k)
        assert version - trained.version == min(step - 1, k)
        version += 1  # the update
    assert sampled == list(range(1, steps + 1)) and len(queue) == 0


def _batch(seed, rows=4, width=5, nan=False):
    rng = np.random.default_rng(seed)
    total = rng.random(rows, dtype=np.float32)
    if nan:
        total[1] = np.nan
    rewards = BatchRewards(total=total, components={"c": total * 0.5},
                           reasons=collections.Counter({"c/wrong": 2}), seconds=0.25,
                           unscored={"c": np.array([0, 1, 0, 0], bool)})
    host = {"tokens": rng.integers(0, 99, (rows, width), dtype=np.int32),
            "sampler_logp": -rng.random((rows, width), dtype=np.float32),
            "lengths": rng.integers(1, width, rows, dtype=np.int32),
            "truncated": np.array([1, 0, 0, 1], bool), "length": width}
    return Sampled([{"id": seed, "prompt": f"p{seed}"}], host, rewards, version=seed)


def test_batches_in_flight_round_trip_exactly():
    """Arrays padded to the checkpoint's width, metadata through JSON (a NaN reward and
    float32 values exact), prompts encoded again from the examples."""
    import concurrent.futures

    queue = RolloutQueue(3, rows=4, width=8)
    queue.push(_batch(1, width=5, nan=True))
    scoring = _batch(2, width=8)  # still being scored on host threads when saved
    future = concurrent.futures.Future()
    future.set_result(scoring.rewards)
    queue.push(Sampled(scoring.examples, scoring.host, future, scoring.version))
    agreed = []
    queue.checkpoint_meta(lambda r: agreed.append(r) or r)
    assert agreed == [scoring.rewards] and queue.entries[1].rewards is scoring.rewards
    arrays = queue.checkpoint_arrays()
    assert arrays["tokens"].shape == (3, 4, 8) and not arrays["tokens"][2].any()
    meta = json.loads(json.dumps(queue.checkpoint_meta()))
    encoded = lambda ex: (np.full((len(ex), 2), ex[0]["id"]), np.ones((len(ex), 2), bool))  # noqa
    again = RolloutQueue(3, rows=4, width=8)
    again.restore(arrays, meta, encoded)
    assert len(again) == 2
    for a, b in zip(queue.entries, again.entries):
        assert a.examples == b.examples and a.version == b.version
        for name in ("tokens", "sampler_logp", "lengths", "truncated"):
            assert a.host[name].dtype == b.host[name].dtype
            np.testing.assert_array_equal(a.host[name], b.host[name])
        assert b.host["length"] == a.host["length"]
        assert b.host["prompt_tokens"][0, 0] == a.examples[0]["id"]
        np.testing.assert_array_equal(a.rewards.total, b.rewards.total)  # NaN == NaN here
        np.testing.assert_array_equal(a.rewards.components["c"], b.rewards.components["c"])
        assert a.rewards.reasons == b.rewards.reasons and a.rewards.seconds == b.rewards.seconds
        np.testing.assert_array_equal(a.rewards.unscored["c"], b.rewards.unscored["c"])
    queue.push(_batch(3))
    queue.push(_batch(4))
    with pytest.raises(ValueError, match="more than k = 3"):
        queue.checkpoint_arrays()


def test_staleness_trains_on_batches_of_older_policies(make_trainer):
    """k = 1: step 1 is the synchronous run's step 1 (batch 1, same key, same policy);
    then each batch comes from the policy one update back. (That a run repeats itself
    exactly is the save-and-restore test's comparison.)"""
    sync, _ = make_trainer(TIS, weights=WEIGHTS)
    stale, _ = make_trainer(*stale_flags(1, steps=3), weights=WEIGHTS)
    first_sync = sync.step(next(sync.data))
    run = [stale.step_ahead(n)[0] for n in (1, 2, 3)]
    assert comparable(run[0]) == comparable(first_sync)
    assert [m["async/staleness"] for m in run] == [0.0, 1.0, 1.0]
    assert [m["async/stale_token_share"] for m in run] == [0.0, 1.0, 1.0]
    assert [m["async/in_flight"] for m in run] == [1.0, 1.0, 0.0]
    assert all("tis_weight_mean" in m and "sampler_kl" in m for m in run)
    # Batch 1 is on-policy (the sampler's and trainer's log-probs agree to rounding); batch
    # 2's tokens came from the policy one update back (seen: 0.0, then 1.2e-5).
    assert run[1]["sampler_kl"] > max(100 * run[0]["sampler_kl"], 1e-7)


def test_batches_in_flight_survive_save_and_restore_bit_identically(runtime, tmp_path):
    """k = 2, saved after step 2 with batches 3 and 4 in flight: a fresh trainer restores
    them and trains steps 3-5 exactly as the uninterrupted trainer did."""
    flags = stale_flags(2, steps=5)
    first, w1 = trainer_in(runtime, tmp_path, WEIGHTS, *flags)
    head = [first.step_ahead(n)[0] for n in (1, 2)]
    assert len(first.queue) == 2 and head[1]["async/staleness"] == 1.0
    first.save(2)
    tail = [first.step_ahead(n)[0] for n in (3, 4, 5)]
    assert [m["async/staleness"] for m in tail] == [2.0, 2.0, 2.0]
    close_trainer(first, w1)

    second, w2 = trainer_in(runtime, tmp_path, WEIGHTS, *flags)
    params = second.run()  # restores step 2 with its batches in flight, runs 3-5
    w2.flush()
    assert_resumed_like(tmp_path, [3, 4, 5], tail)
    assert tree_equal(jax.device_get(params), jax.device_get(first.state.params))
    close_trainer(second, w2)
    # Resuming with another bound is refused before any array is read, naming both values.
    other, w3 = trainer_in(runtime, tmp_path, WEIGHTS, TIS, "--config.rl.steps=6")
    with pytest.raises(ValueError, match=r"rl.max_staleness=2, this run has 0"):
        other.restore()
    close_trainer(other, w3)


@pytest.mark.parametrize("change, words", [
    ({"rl.max_staleness": -1}, "whole number of steps >= 0"),
    ({"rl.max_staleness": 1.5}, "whole number of steps >= 0"),
    ({"rl.max_staleness": 1, "rl.tis_cap": 0.0}, "rl.tis_cap > 0"),
    ({"rl.max_staleness": 1, "rl.rollout_token_budget": 8}, "partial rollouts"),
    ({"rl.max_staleness": 1, "rl.dynamic_sampling": True}, "dynamic sampling"),
    ({"rl.max_staleness": 1, "rl.advantage_estimator": "gae"}, "PPO critic"),
])
def test_bad_staleness_settings_are_refused(change, words):
    config = load_config(ARITH)
    config.rl.tis_cap = 2.0
    config.rl.max_staleness = 2
    assert validate_config(config, 8) == []
    with config.unlocked():
        for name, value in change.items():
            section, field = name.split(".")
            del config[section][field]  # a config file may give any type
            config[section][field] = value
    problems = validate_config(config, 8)
    assert any(p.startswith("rl.max_staleness:") and words in p for p in problems), problems
