"""PPO's critic with a LoRA policy: its own adapters and the value head on the policy's frozen
(here int8) base, no copy of the base; values against the merged-weights value model; a
few updates train head and adapters and leave the base alone; the configs it refuses."""
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import lora as lora_lib, lora_params
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl.critic import Critic
from jaxrl_reason.rl.value import (gae, init_lora_value_params, init_value_params,
                                   lora_value_params, token_rewards)
from jaxrl_reason.rl.value_passes import make_value_fn, make_value_update_fn
from jaxrl_reason.runtime.train_state import make_optimizer
from jaxrl_reason.rl.value import create_critic_state
from numerics import value_head_tolerance

RULES = shd.DEFAULT_RULES
LORA = {"r": 4, "lora_alpha": 8.0, "target_modules": "all-linear", "base_quant": "int8"}


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def policy(mesh1):
    """An untied LoRA policy over an int8 base, its adapters' B nonzero."""
    cfg = models.get_preset("test", init_std=0.2, tie_embeddings=False, lora=LORA)
    params = models.init_params(cfg, jax.random.key(0), mesh1, RULES)
    adapters, base = lora_lib.split_adapters(params)
    adapters = jax.tree.map(lambda x: x + 0.1, adapters)
    return Transformer(cfg), lora_lib.merge_trees(adapters, base)


def _rows(cfg, batch=4, prompt_len=5, length=6):
    rng = np.random.default_rng(0)
    prompt_valid = np.arange(prompt_len)[None] >= np.array([0, 2, 1, 3])[:, None]
    prompt_tokens = np.where(prompt_valid, rng.integers(1, cfg.vocab_size, (batch, prompt_len)),
                             0)
    mask = (np.arange(length)[None] < np.array([6, 3, 5, 1])[:, None]).astype(np.float32)
    completion = np.where(mask > 0, rng.integers(1, cfg.vocab_size, (batch, length)), 0)
    return (jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(prompt_valid),
            jnp.asarray(completion, jnp.int32), jnp.asarray(mask))


def test_critic_params_are_adapters_and_head_only(mesh1, policy):
    model, params = policy
    vp = init_lora_value_params(model.cfg, jax.random.key(1), mesh1, RULES, from_params=params)
    assert set(vp) == {"trunk", "head"}
    assert not lora_lib.split_adapters(vp["trunk"])[1]  # no base leaf in the critic
    adapters = lora_lib.split_adapters(params)[0]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(vp["trunk"]),
                 jax.device_get(adapters))  # copied from the policy's adapters...
    for a, b in zip(jax.tree.leaves(vp["trunk"]), jax.tree.leaves(adapters)):
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()  # ...into new buffers
    np.testing.assert_array_equal(vp["head"]["kernel"], 0.0)
    fresh = init_lora_value_params(model.cfg, jax.random.key(1), mesh1, RULES)
    b = fresh["trunk"]["layer_0"]["attn"]["q_proj"]["lora_b"]
    assert float(jnp.abs(b).max()) == 0.0  # fresh adapters: the trunk starts as the base


def test_values_equal_the_merged_value_model(mesh1, policy):
    """The LoRA critic's values (adapters unmerged on the int8 base) equal those of a plain
    value model whose trunk has the merged weights, to the float32 value-head bound."""
    model, params = policy
    vp = init_lora_value_params(model.cfg, jax.random.key(1), mesh1, RULES, from_params=params,
                                head_init_std=0.1)
    rows = _rows(model.cfg)
    values = make_value_fn(model, mesh1, RULES, lora=True)(
        vp, lora_lib.without_adapters(params), *rows)
    plain_cfg = model.cfg.replace(lora=None)
    merged = lora_params.merged_params(model.cfg, lora_value_params(vp, lora_lib.without_adapters(
        params))["trunk"])
    plain = init_value_params(plain_cfg, jax.random.key(1), mesh1, RULES, from_params=merged)
    plain = {**plain, "head": vp["head"]}
    want = make_value_fn(Transformer(plain_cfg), mesh1, RULES)(plain, *rows)
    bound = value_head_tolerance(plain_cfg, plain, tokens=11)
    np.testing.assert_allclose(np.asarray(values), np.asarray(want), rtol=0, atol=bound)
    assert float(jnp.abs(values).max()) > 10 * bound  # not trivially zero


def test_updates_train_head_and_adapters_not_the_base(mesh1, policy):
    model, params = policy
    base = lora_lib.without_adapters(params)
    base_before = jax.device_get(base)
    vp = init_lora_value_params(model.cfg, jax.random.key(1), mesh1, RULES, from_params=params)
    optimizer = make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=1.0)
    state = create_critic_state(jax.tree.map(jnp.copy, vp), optimizer)
    rows = _rows(model.cfg)
    old = make_value_fn(model, mesh1, RULES, lora=True)(vp, base, *rows)
    rewards = token_rewards(jnp.asarray([1.0, 0.0, 1.0, 0.5]), rows[3])
    _, returns = gae(rewards, old, rows[3], gamma=1.0, lam=0.95)
    batch = dict(zip(("prompt_tokens", "prompt_valid", "completion_tokens", "mask"), rows),
                 old_values=old, returns=returns)
    update = make_value_update_fn(model, optimizer, clip_range=None, mesh=mesh1, rules=RULES,
                                  lora=True)
    losses = []
    for _ in range(8):
        state, metrics = update(state, base, batch)
        losses.append(float(metrics["value_loss"]))
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(state.step) == 8
    assert float(jnp.abs(state.params["head"]["kernel"]).max()) > 0
    b_new = state.params["trunk"]["layer_0"]["attn"]["q_proj"]["lora_b"]
    b_old = vp["trunk"]["layer_0"]["attn"]["q_proj"]["lora_b"]
    assert float(jnp.abs(b_new - b_old).max()) > 0  # the critic's adapters learn
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(base), base_before)
    mu = state.opt_state[1][0].mu  # Adam moments for adapters and head, none for the base
    assert jax.tree.structure(mu) == jax.tree.structure(vp)


def _runtime(model, mesh):
    config = ml_collections.ConfigDict({"seed": 0})
    return types.SimpleNamespace(model_cfg=model.cfg, model=model, mesh=mesh, rules=RULES,
                                 config=config, put=lambda x: jnp.asarray(x))


def _rl(init="policy"):
    return ml_collections.ConfigDict({
        "value": {"init": init, "learning_rate": 1e-3, "clip_range": 0.2, "warmup_steps": 0,
                  "weight_decay": 0.0, "max_grad_norm": 1.0},
        "warmup_steps": 0, "steps": 4, "max_new_tokens": 6, "gamma": 1.0, "lam": 0.95,
        "whiten_advantages": True})


def test_a_lora_critic_without_the_base_or_with_a_random_trunk_is_refused(mesh1, policy):
    model, params = policy
    with pytest.raises(ValueError, match="LoRA with a critic that has no adapters"):
        Critic(_runtime(model, mesh1), _rl(), params)
    with pytest.raises(ValueError, match="rl.value.init='random' with model.lora"):
        Critic(_runtime(model, mesh1), _rl("random"), params, policy_params=lambda: params)


# ----------------------------------------------------------------------------- a PPO run


PPO_LORA = ("--config.rl.advantage_estimator=gae", "--config.rl.algorithm=ppo",
            "--config.rl.loss_type=bnpo", "--config.rl.num_iterations=2",
            "--config.rl.beta=0.02", "--config.rl.kl_in_reward=True",
            "--config.rl.kl_estimator=k1", "--config.rl.skip_zero_advantage_rows=False",
            "--config.rl.value.learning_rate=1e-3", "--config.model.lora.dropout=0.1",
            "--config.model.lora.base_quant=int8", "--config.eval.seeds=(0,)",
            "--config.eval.num_problems=8", "--config.eval.batch_prompts=8",
            "--config.log.tensorboard=False")


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    """configs/arith_grpo_lora.py:smoke as PPO (LoRA dropout 0.1, int8 base): 4 steps in
    one go, and 2 steps then resumed to 4."""
    from cli_runs import QUIET, REPO, run_cli
    import os
    import shutil
    config = os.path.join(REPO, "configs", "arith_grpo_lora.py") + ":smoke"
    root = tmp_path_factory.mktemp("lora_ppo")

    def train(workdir, *extra):
        assert run_cli("train", "--config", config, "--workdir", str(workdir), *PPO_LORA,
                       *QUIET, *extra) == 0
        return workdir

    full = train(root / "full", "--config.rl.steps=4")
    resumed = train(root / "resumed", "--config.rl.steps=2")
    shutil.copy(os.path.join(resumed, "metrics.jsonl"), root / "metrics_2.jsonl")
    train(resumed, "--config.rl.steps=4", "--resume")
    return {"full": full, "resumed": resumed}


def test_ppo_with_lora_trains_and_resumes_exactly(ppo_runs):
    from cli_runs import phase, read_metrics
    full = phase(read_metrics(ppo_runs["full"]), "rl")
    resumed = phase(read_metrics(ppo_runs["resumed"]), "rl")
    assert [m["step"] for m in full] == [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert all(m["update_skipped"] == 0 for m in full)
    assert any(abs(m["value_grad_norm"]) > 0 for m in full)
    for key in ("loss", "kl", "grad_norm", "value_loss", "value_mean", "value_grad_norm",
                "reward/mean", "completion/length_mean"):
        np.testing.assert_allclose([m[key] for m in resumed], [m[key] for m in full],
                                   rtol=1e-6, atol=1e-9, err_msg=key)


def test_ppo_checkpoint_holds_adapters_and_head_only(ppo_runs):
    import json
    import os
    from jaxrl_reason.checkpoints.phases import phase_dir
    directory = phase_dir(str(ppo_runs["full"]), "rl")
    with open(os.path.join(directory, "4", "state", "_METADATA")) as f:
        saved = list(json.load(f)["tree_metadata"])
    arrays = [k for k in saved if "'params'" in k or "'mu'" in k or "'nu'" in k]
    value = [k for k in arrays if "value_state" in k]
    assert value and all("'lora_a'" in k or "'lora_b'" in k or "'head'" in k for k in value)
    assert any("'head'" in k for k in value)
    assert not any("kernel_int8" in k or "embedding" in k or "'kernel'" in k and
                   "'head'" not in k for k in saved), [k for k in saved if "embedding" in k]
