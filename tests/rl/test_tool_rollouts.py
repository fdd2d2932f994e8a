"""Tool-use rollouts in the trainer: the update batch reads result tokens (its `mask`) but
the policy loss skips them (`loss_mask`), and the gradient is that of the loss over the
sampled tokens only."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrl_reason import models
from jaxrl_reason.models.scoring import completion_logprobs
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.rl.update import make_update_fn
from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer

CFG = models.get_preset("test")
M, TP, L = 4, 5, 8


def host_batch():
    """generate()'s host dict for 2 prompts x 2 samples with a result block in rows 0, 3."""
    rng = np.random.default_rng(0)
    tool_mask = np.zeros((M, L + 4), bool)
    tool_mask[0, 2:5] = tool_mask[3, 1:3] = True
    return {"tokens": rng.integers(3, CFG.vocab_size, (M, L + 4)).astype(np.int32),
            "lengths": np.array([7, 8, 3, 6], np.int32), "truncated": np.zeros(M, bool),
            "sampler_logp": np.zeros((M, L + 4), np.float32), "tool_mask": tool_mask,
            "tool_calls": np.array([1, 0, 0, 1], np.int32),
            "prompt_tokens": rng.integers(3, CFG.vocab_size, (2, TP)).astype(np.int32),
            "prompt_valid": np.ones((2, TP), bool), "length": L}


def stub_trainer(mask_truncated=False):
    """What `RLTrainer.rollout` reads of its trainer."""
    stub = SimpleNamespace(rl=ml_collections.ConfigDict(
        {"num_generations": 2, "mask_truncated_completions": mask_truncated}),
        rt=SimpleNamespace(put=jnp.asarray, put_prompts=jnp.asarray),
        prompt_per_row=False)
    stub.train_lengths = lambda host: RLTrainer.train_lengths(stub, host)
    return stub


def test_rollout_masks():
    host = host_batch()
    rollout = RLTrainer.rollout(stub_trainer(), host)
    valid = np.arange(L)[None] < host["lengths"][:, None]
    np.testing.assert_array_equal(np.asarray(rollout.mask), valid)
    np.testing.assert_array_equal(np.asarray(rollout.loss_mask),
                                  valid & ~host["tool_mask"][:, :L])
    assert np.asarray(rollout.loss_mask)[0, 2:5].sum() == 0 and rollout.mask[0, 2:5].all()
    # Selected rows (zero-advantage skipping): padding rows get neither mask.
    rows, real = np.array([3, 0, 0]), np.array([True, True, False])
    picked = RLTrainer.rollout(stub_trainer(), host, rows, real)
    np.testing.assert_array_equal(np.asarray(picked.loss_mask)[:2],
                                  (valid & ~host["tool_mask"][:, :L])[[3, 0]])
    assert not np.asarray(picked.loss_mask)[2].any() and not np.asarray(picked.mask)[2].any()
    # Without tools the loss mask is the mask itself.
    plain = {k: v for k, v in host.items() if k not in ("tool_mask", "tool_calls")}
    rollout = RLTrainer.rollout(stub_trainer(), plain)
    assert rollout.loss_mask is rollout.mask


def test_update_skips_result_tokens():
    """The update's gradient is the GRPO gradient over sampled tokens only (result tokens are
    read, not trained), and differs from the one that would train on the results."""
    rl = ml_collections.ConfigDict({
        "temperature": 1.0, "num_iterations": 1, "beta": 0.0, "kl_in_reward": False,
        "loss_type": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "max_new_tokens": L,
        "kl_estimator": "k3", "entropy_coef": 0.0, "policy_loss_mode": "ppo",
        "clip_ratio_c": 0.0, "tis_cap": 0.0, "micro_batches": 1})
    model = Transformer(CFG)
    params = model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32),
                        jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool))["params"]
    params = jax.tree.map(lambda x: getattr(x, "value", x), params,
                          is_leaf=lambda x: hasattr(x, "value"))
    optimizer = make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=1e9)
    update = make_update_fn(model, optimizer, rl, kernel_backend="reference")
    rollout = RLTrainer.rollout(stub_trainer(), host_batch())
    advantages = jnp.asarray([1.0, -0.5, 0.5, -1.0])
    batch = {**vars(rollout), "advantages": advantages, "num_sequences": np.float32(M),
             "num_tokens": np.float32(rollout.mask.sum()), "beta": np.float32(0.0),
             "sampler_logp": None}

    def manual(p, loss_mask):
        logp, _ = completion_logprobs(model, p, rollout.prompt_tokens, rollout.prompt_valid,
                                      rollout.completion_tokens, rollout.mask,
                                      with_entropy=False)
        per_row = jnp.sum(logp * loss_mask, 1) / jnp.maximum(jnp.sum(loss_mask, 1), 1.0)
        return -jnp.sum(advantages * per_row) / M

    @jax.jit
    def norm(loss_mask):
        grads = jax.grad(manual)(params, loss_mask)
        return jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))

    def grad_norm(loss_mask):
        return float(norm(loss_mask))

    _, metrics = update(create_train_state(jax.tree.map(jnp.copy, params), optimizer), batch)
    np.testing.assert_allclose(float(metrics["grad_norm"]), grad_norm(rollout.loss_mask),
                               rtol=1e-4)
    assert abs(grad_norm(rollout.mask) - grad_norm(rollout.loss_mask)) > 1e-3
