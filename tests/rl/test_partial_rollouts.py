"""Partial rollouts (rl.rollout_token_budget) on the smoke config (4 prompts x 4 samples,
16 new tokens): a budget that covers every row changes nothing, a paused row continues with
the tokens it would have drawn, pending rows survive a save and restore bit-identically
(in-process, and a CLI run SIGKILLed with rows pending), old rows are dropped and counted,
and bad settings are refused."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cli_runs import ARITH, final_params, load_config, metrics_by_step, train_until_killed
from trainer_support import (MAX_NEW, SMOKE, assert_resumed_like, close_trainer, trainer_in,
                             tree_equal)
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.sampling.continuation import Continuation
from jaxrl_reason.sampling.filters import per_row_keys

WEIGHTS = {"_test_text_length": 1.0}
TIS = "--config.rl.tis_cap=2.0"


def partial_flags(budget, age=4):
    return (TIS, f"--config.rl.rollout_token_budget={budget}",
            f"--config.rl.max_rollout_age={age}")


def run_loop(trainer, n):
    """`n` steps drawing examples the way `RLTrainer.run` does."""
    history = []
    for _ in range(n):
        wants = trainer.partial is None or trainer.partial.wants_examples()
        history.append(trainer.step(next(trainer.data) if wants else []))
    return history


def comparable(metrics):
    return {k: v for k, v in metrics.items()
            if not k.startswith(("time/", "rollout/"))}


def test_a_budget_covering_every_row_is_bit_identical_to_none(make_trainer):
    plain, _ = make_trainer(TIS, weights=WEIGHTS)
    covered, _ = make_trainer(*partial_flags(MAX_NEW), weights=WEIGHTS)
    ours, theirs = run_loop(covered, 3), run_loop(plain, 3)
    for a, b in zip(ours, theirs):
        assert comparable(a) == comparable(b)
        assert a["rollout/rows_continued"] == 0 and a["rollout/stale_token_share"] == 0
        assert a["rollout/groups_trained"] == 4
    assert tree_equal(jax.device_get(covered.state.params), jax.device_get(plain.state.params))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_paused_row_continues_with_the_tokens_of_an_uninterrupted_one(make_trainer,
                                                                         temperature):
    trainer, _ = make_trainer(weights=WEIGHTS)
    rt, g, first = trainer.rt, 4, 6
    params = trainer.state.params  # no update yet: the initial policy
    prompts, valid = rt.encode_prompts(next(trainer.data))
    rng = jax.random.key(11)
    sample = lambda n: jax.device_get(rt.sampler(  # noqa: E731
        params, rt.put_prompts(prompts), rt.put_prompts(valid), rng, num_samples=g,
        max_new_tokens=n, temperature=temperature))
    whole, head = sample(MAX_NEW), sample(first)
    n = len(whole.lengths)
    assert np.array_equal(whole.tokens[:, :first], head.tokens)
    rows = np.flatnonzero(head.truncated)  # not stopped within the first segment
    assert len(rows) >= n // 2
    generated = np.zeros((len(rows), MAX_NEW), np.int32)
    generated[:, :first] = head.tokens[rows]
    keys = jax.random.key_data(per_row_keys(rng, jnp.arange(n, dtype=jnp.int32)))[rows]
    rest = MAX_NEW - first
    out = jax.device_get(Continuation(rt.sampler)(
        params, prompts[rows // g], valid[rows // g], generated,
        np.full(len(rows), first, np.int32), keys, np.full(len(rows), rest, np.int32),
        segment=rest, temperature=temperature))
    assert np.array_equal(out.tokens, whole.tokens[rows, first:])
    assert np.array_equal(out.lengths, whole.lengths[rows] - first)
    assert np.array_equal(out.truncated, whole.truncated[rows])
    np.testing.assert_allclose(out.logprobs, whole.logprobs[rows, first:], atol=1e-5)


def test_pending_rows_survive_save_and_restore_bit_identically(runtime, tmp_path):
    flags = partial_flags(6)
    first, w1 = trainer_in(runtime, tmp_path, WEIGHTS, *flags)
    trained = []  # (step, pool of the groups trained)
    host = first.partial.host
    first.partial.host = lambda pool: (trained.append((first.step_count + 1, pool)),
                                       host(pool))[1]
    batch = next(first.data)  # two groups start at step 1, two at step 2: staggered
    head = [first.step(batch[:2]), first.step(batch[2:])]
    pool = first.partial.pool  # step 2's first segments, by example
    behaviour = {repr(pool.examples[k]): pool.logp[4 * k:4 * k + 4, :6].copy()
                 for k in np.flatnonzero(pool.birth == 2)}
    head += run_loop(first, 1)  # step 3 draws a batch it cannot start yet: a backlog
    pending, backlog = len(first.partial.pool.examples), len(first.partial.backlog)
    assert pending > 0 and backlog > 0 and head[1]["rollout/rows_continued"] > 0
    first.save(3)
    tail = run_loop(first, 3)
    assert sum(m["rollout/rows_continued"] for m in tail) > 0
    assert any(0 < m["rollout/stale_token_share"] < 1 for m in head + tail)
    # Groups started at step 2 and trained after an update keep the behaviour log-probs of
    # step 2's policy for their first segment (stored, not recomputed).
    updated = min(i + 1 for i, m in enumerate(head + tail) if "loss" in m)
    later = [(step, p) for step, p in trained if step > updated]
    checked = 0
    for _, p in later:
        for k in np.flatnonzero(p.birth == 2):
            assert np.array_equal(p.logp[4 * k:4 * k + 4, :6], behaviour[repr(p.examples[k])])
            assert np.all(p.version[4 * k:4 * k + 4, :6] == 2)
            checked += 1
    assert checked > 0
    close_trainer(first, w1)

    # A fresh trainer on the workdir: `run` restores step 3 and runs steps 4-6.
    second, w2 = trainer_in(runtime, tmp_path, WEIGHTS, *flags, "--config.rl.steps=6")
    assert second.restore() and second.step_count == 3
    assert len(second.partial.pool.examples) == pending
    assert len(second.partial.backlog) == backlog
    params = second.run()
    w2.flush()
    assert_resumed_like(tmp_path, [4, 5, 6], tail)
    assert tree_equal(jax.device_get(params), jax.device_get(first.state.params))
    close_trainer(second, w2)


def test_rows_older_than_the_max_age_are_dropped_and_counted(make_trainer):
    trainer, _ = make_trainer(*partial_flags(2, age=1), weights=WEIGHTS)
    partial = trainer.partial
    history = run_loop(trainer, 2)
    born_first = np.flatnonzero(partial.pool.birth == 1)
    assert len(born_first) > 0
    assert history[0]["rollout/rows_dropped"] == 0 and history[1]["rollout/rows_dropped"] == 0
    third = trainer.step(next(trainer.data) if partial.wants_examples() else [])
    assert third["rollout/rows_dropped"] == 4 * len(born_first)
    assert not np.any(partial.pool.birth == 1)
    for m in history + [third]:
        assert m["rollout/oldest_age"] <= 1


def test_row_stops_cap_each_row_and_mark_it_done(make_trainer):
    """The `row_stops` hook (a benchmark's seeded lengths): a row decodes at most its stop
    length, across segments, and is done (trainable) once it has it."""
    trainer, _ = make_trainer(*partial_flags(2), weights=WEIGHTS)
    partial = trainer.partial
    pattern = np.array([1, 3, 4, 6], np.int32)  # the 4 rows of a group; 6 takes 3 segments
    partial.row_stops = lambda examples: np.tile(pattern, len(examples))
    trained = []
    for step in range(1, 5):
        examples = next(trainer.data) if partial.wants_examples() else []
        _, host, _ = partial.collect(trainer.state.params, examples, jax.random.key(step), step)
        trained.append(host["lengths"].reshape(-1, 4))
        assert (partial.pool.lengths <= np.tile(pattern, len(partial.pool.examples))).all()
    trained = np.concatenate(trained)
    assert len(trained) > 0 and (trained <= pattern).all()
    assert (trained == pattern).any(axis=0).all()  # each stop reached (else a stop id drawn)


@pytest.mark.parametrize("change, key, words", [
    ({"rl.rollout_token_budget": -3}, "rl.rollout_token_budget", "decode steps >= 1"),
    ({"rl.rollout_token_budget": 0.5}, "rl.rollout_token_budget", "decode steps >= 1"),
    ({"rl.rollout_token_budget": 8, "rl.max_rollout_age": 0}, "rl.max_rollout_age", ">= 1"),
    ({"rl.rollout_token_budget": 8, "rl.tis_cap": 0.0}, "rl.rollout_token_budget",
     "rl.tis_cap > 0"),
    ({"rl.rollout_token_budget": 8, "rl.advantage_estimator": "gae"},
     "rl.rollout_token_budget", "PPO critic"),
    ({"rl.rollout_token_budget": 8, "rl.dynamic_sampling": True},
     "rl.rollout_token_budget", "dynamic sampling"),
])
def test_bad_partial_rollout_settings_are_refused(change, key, words):
    config = load_config(ARITH)
    config.rl.tis_cap = 2.0
    assert validate_config(config, 8) == []
    config.rl.rollout_token_budget = 8
    assert validate_config(config, 8) == []
    with config.unlocked():
        for name, value in change.items():
            section, field = name.split(".")
            del config[section][field]  # a config file may give any type
            config[section][field] = value
    problems = validate_config(config, 8)
    assert any(p.startswith(key + ":") and words in p for p in problems), problems


def _train(workdir, *extra, kill_after_checkpoint=None):
    """`jaxrl-reason train` on the smoke config with partial rollouts (one CPU device); with
    kill_after_checkpoint = k it is SIGKILLed as soon as RL checkpoint k exists. Returns the
    exit code (None when killed) and the output."""
    args = ["--config", SMOKE, "--config.log.progress_bar=False", "--config.sft.steps=2",
            "--config.rl.steps=6", "--config.checkpoint.every_steps=1",
            "--config.log.tensorboard=False", *partial_flags(8), *extra]
    if kill_after_checkpoint is None:
        return train_until_killed(workdir, args, timeout=900)
    target = os.path.join(str(workdir), "checkpoints", "rl", str(kill_after_checkpoint))
    return train_until_killed(workdir, args, kill_when=lambda: os.path.isdir(target),
                              timeout=900)


def _rl_metrics(workdir):
    """{step: RL metrics without wall times}."""
    return {step: m for (phase, step), m in metrics_by_step(workdir).items() if phase == "rl"}


@pytest.mark.slow  # two CLI runs, a few minutes
def test_sigkill_with_pending_rows_then_resume_is_bit_identical(tmp_path):
    clean, chaos = tmp_path / "clean", tmp_path / "chaos"
    rc, out = _train(clean)
    assert rc == 0, out
    want = _rl_metrics(clean)
    assert want[3]["rollout/groups_pending"] > 0  # the kill lands with rows pending
    rc, _ = _train(chaos, kill_after_checkpoint=3)
    assert rc is None, "the run finished before it could be killed"
    rc, out = _train(chaos, "--resume")
    assert rc == 0, out
    got = _rl_metrics(chaos)
    assert sorted(got) == sorted(want)
    for step in want:
        assert got[step] == want[step], step
    reports = [json.load(open(d / "eval.json"))["reports"] for d in (clean, chaos)]
    assert reports[0] == reports[1]
    assert tree_equal(*(final_params(d) for d in (clean, chaos)))
