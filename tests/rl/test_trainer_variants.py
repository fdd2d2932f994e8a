"""RLTrainer variants in-process on the smoke config: PPO with a critic (learning, exact
resume), the loss modes, micro-batches, and the Pallas backend against the reference
(fixtures in conftest.py, helpers in trainer_support.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from numerics import decoder_grad_tolerance, decoder_tolerance, f32_tolerance
from trainer_support import one_batch, run_steps, tree_equal
from jaxrl_reason.rl.critic import Critic, ppo_advantages


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
