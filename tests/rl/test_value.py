"""PPO critic pieces: GAE, reward shaping, value loss and whitening against explicit-loop NumPy
references; the value model's params, readout positions and a few steps of value regression."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.models.value_head import (abstract_value_params, trunk_config,
                                            value_param_logical_axes, value_param_shardings)
from jaxrl_reason.rl.value import gae, init_value_params, token_rewards, value_loss, whiten
from jaxrl_reason.rl.value_passes import make_value_fn, make_value_update_fn
from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer
from numerics import f32_tolerance

RULES = shd.DEFAULT_RULES
LENGTHS = (7, 3, 0, 1, 5)  # right-padded rows of different lengths, one empty
L = 7


def _mask(lengths=LENGTHS, length=L):
    return (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def _batch(seed=0, lengths=LENGTHS, length=L):
    """Random float64 rewards / values / old values / returns with NaN at masked positions."""
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, length)
    out = {k: rng.normal(size=mask.shape) for k in ("rewards", "values", "old_values",
                                                      "returns", "kl")}
    for k in out:
        out[k] = np.where(mask > 0, out[k], np.nan)
    return out, mask


# ----------------------------------------------------------------------------- references


def gae_reference(rewards, values, lengths, gamma, lam):
    """Textbook GAE, one row and one token at a time (float64)."""
    adv = np.zeros(rewards.shape)
    for b, n in enumerate(lengths):
        last = 0.0
        for t in reversed(range(n)):
            next_value = values[b, t + 1] if t + 1 < n else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lam * last
            adv[b, t] = last
    ret = np.zeros(rewards.shape)
    for b, n in enumerate(lengths):
        for t in range(n):
            ret[b, t] = adv[b, t] + values[b, t]
    return adv, ret


def value_loss_reference(values, old, returns, lengths, clip):
    """(loss, metrics, d loss / d values) with the token-mean aggregation, token by token."""
    total, clipped, n, grad = 0.0, 0, 0, np.zeros(values.shape)
    for b, nb in enumerate(lengths):
        for t in range(nb):
            v, o, r = values[b, t], old[b, t], returns[b, t]
            e1 = (v - r) ** 2
            if clip is None:
                e2 = -1.0
            else:
                v_clip = min(max(v, o - clip), o + clip)
                e2 = (v_clip - r) ** 2
            total += 0.5 * max(e1, e2)
            clipped += e2 > e1
            grad[b, t] = (v - r) if e1 >= e2 else 0.0  # the clipped branch is flat in v
            n += 1
    grad /= max(n, 1)
    vals = [values[b, t] for b, nb in enumerate(lengths) for t in range(nb)]
    rets = [returns[b, t] for b, nb in enumerate(lengths) for t in range(nb)]
    res = [r - v for r, v in zip(rets, vals)]
    ev = 1.0 - np.var(res) / np.var(rets) if n and np.var(rets) > 0 else 0.0
    metrics = {"value_loss": total / max(n, 1), "value_clip_frac": clipped / max(n, 1),
               "value_mean": sum(vals) / max(n, 1), "explained_variance": ev}
    return total / max(n, 1), metrics, grad


def _gae_atol(data, gamma, lam, lengths=LENGTHS):
    """The float32 bound of GAE against the float64 reference (tests/numerics.py): adv_t is
    the length-(n - t) discounted sum of delta_k = r_k + gamma v_k+1 - v_k, whose terms sum
    |(gamma lam)^(k-t)| (|r_k| + gamma |v_k+1| + |v_k|); three steps round (the inputs cast
    to float32, delta's two adds, the sum). The returns add |v_t|."""
    r, v = np.nan_to_num(np.abs(data["rewards"])), np.nan_to_num(np.abs(data["values"]))
    worst = 0.0
    for b, n in enumerate(lengths):
        for t in range(n):
            terms = sum((gamma * lam) ** (k - t) * (
                r[b, k] + gamma * (v[b, k + 1] if k + 1 < n else 0.0) + v[b, k])
                for k in range(t, n))
            worst = max(worst, terms + v[b, t])
    return f32_tolerance(max(max(lengths), 2), worst, chain=3, orders=1)


# ----------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (1.0, 0.95), (0.99, 0.9), (0.9, 0.0),
                                        (0.5, 1.0)])
def test_gae_matches_reference(gamma, lam):
    data, mask = _batch(0)
    adv, ret = jax.jit(gae)(
        jnp.asarray(data["rewards"]), jnp.asarray(data["values"]), jnp.asarray(mask),
        gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(data["rewards"], data["values"], LENGTHS, gamma, lam)
    assert adv.dtype == ret.dtype == jnp.float32
    atol = _gae_atol(data, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=atol)
    np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=atol)
    assert not np.any(np.isnan(adv)) and not np.any(np.isnan(ret))
    np.testing.assert_array_equal(np.asarray(adv)[2], 0.0)  # the all-masked row


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    data, mask = _batch(1)
    adv, ret = gae(data["rewards"], data["values"], mask, gamma=1.0, lam=1.0)
    atol = _gae_atol(data, 1.0, 1.0)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            to_go = sum(data["rewards"][b, t:n])
            assert adv[b, t] == pytest.approx(to_go - data["values"][b, t], abs=atol)
            assert ret[b, t] == pytest.approx(to_go, abs=atol)


def test_gae_lam_zero_is_one_step_td():
    data, mask = _batch(2)
    adv, _ = gae(data["rewards"], data["values"], mask, gamma=0.9, lam=0.0)
    r, v = data["rewards"], data["values"]
    atol = _gae_atol(data, 0.9, 0.0)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            nxt = v[b, t + 1] if t + 1 < n else 0.0
            assert adv[b, t] == pytest.approx(r[b, t] + 0.9 * nxt - v[b, t], abs=atol)


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_token_rewards_matches_reference(kl_coef):
    data, mask = _batch(3)
    seq = np.random.default_rng(3).normal(size=len(LENGTHS))
    out = token_rewards(jnp.asarray(seq), jnp.asarray(mask), kl=jnp.asarray(data["kl"]),
                        kl_coef=kl_coef)
    ref = np.zeros(mask.shape)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            ref[b, t] = -kl_coef * data["kl"][b, t] + (seq[b] if t == n - 1 else 0.0)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_token_rewards_without_kl_and_bool_mask():
    out = token_rewards(jnp.array([1.0, 2.0]), jnp.array([[1, 1, 0], [0, 0, 0]], bool))
    np.testing.assert_array_equal(out, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


# ----------------------------------------------------------------------------- value loss


@pytest.mark.parametrize("clip", [None, 0.2, 1.0])
def test_value_loss_and_gradient_match_reference(clip):
    data, mask = _batch(4)
    args = [jnp.asarray(data[k], jnp.float32) for k in ("values", "old_values", "returns")]

    def f(v):
        return value_loss(v, args[1], args[2], jnp.asarray(mask), clip_range=clip)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(args[0])
    ref_loss, ref_metrics, ref_grad = value_loss_reference(
        *(np.asarray(a, np.float64) for a in args), LENGTHS, clip)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for k, v in ref_metrics.items():
        assert float(metrics[k]) == pytest.approx(v, rel=1e-4, abs=1e-6), k
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    if clip == 0.2:
        assert 0 < float(metrics["value_clip_frac"]) < 1


def test_value_loss_edge_cases():
    zeros = jnp.zeros((2, 3))
    loss, metrics = value_loss(zeros + jnp.nan, zeros, zeros, zeros, clip_range=0.2)
    assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values())
    # Constant returns: explained variance is 0, not NaN / inf.
    values = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    _, metrics = value_loss(values, values, jnp.full((2, 3), 0.1), jnp.ones((2, 3)),
                            clip_range=None)
    assert float(metrics["explained_variance"]) == 0.0
    # Perfect predictions: explained variance 1.
    _, metrics = value_loss(values, values, values, jnp.ones((2, 3)), clip_range=None)
    assert float(metrics["explained_variance"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="clip_range"):
        value_loss(values, values, values, jnp.ones((2, 3)), clip_range=0.0)
    with pytest.raises(ValueError, match="unknown loss_type"):
        value_loss(values, values, values, jnp.ones((2, 3)), clip_range=None, loss_type="x")


# ----------------------------------------------------------------------------- whiten


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_reference(shift_mean):
    data, mask = _batch(5)
    out = whiten(jnp.asarray(data["values"]), jnp.asarray(mask), shift_mean)
    vals = [data["values"][b, t] for b, n in enumerate(LENGTHS) for t in range(n)]
    mean, var = np.mean(vals), np.var(vals, ddof=1)
    ref = np.zeros(mask.shape)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            ref[b, t] = (data["values"][b, t] - mean) / np.sqrt(var + 1e-8) + (
                0.0 if shift_mean else mean)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_whiten_empty_and_single_token():
    np.testing.assert_array_equal(whiten(jnp.full((2, 3), jnp.nan), jnp.zeros((2, 3))), 0.0)
    one = whiten(jnp.array([[3.0, jnp.nan]]), jnp.array([[1.0, 0.0]]))
    np.testing.assert_array_equal(one, [[0.0, 0.0]])


# ----------------------------------------------------------------------------- value model


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def policy(mesh1):
    """An untied policy (so copying must drop its lm_head) and its params."""
    cfg = models.get_preset("test", init_std=0.2, tie_embeddings=False)
    return Transformer(cfg), models.init_params(cfg, jax.random.key(0), mesh1, RULES)


@pytest.fixture(scope="module")
def value_params(mesh1, policy):
    model, params = policy
    return init_value_params(model.cfg, jax.random.key(6), mesh1, RULES, from_params=params,
                             head_init_std=0.1)


@pytest.fixture(scope="module")
def value_fn(policy):
    return make_value_fn(policy[0])


def _rollout(seed=0, batch=4, prompt_len=5, length=6):
    """Left-padded prompts and right-padded completions of different lengths."""
    rng = np.random.default_rng(seed)
    prompt_lengths = rng.integers(1, prompt_len + 1, size=batch)
    prompt_lengths[0] = prompt_len
    lengths = rng.integers(1, length + 1, size=batch)
    lengths[0] = length
    prompt_valid = np.arange(prompt_len)[None, :] >= (prompt_len - prompt_lengths)[:, None]
    prompt_tokens = np.where(prompt_valid, rng.integers(1, 128, size=(batch, prompt_len)), 0)
    mask = _mask(lengths, length)
    completion_tokens = np.where(mask > 0, rng.integers(1, 128, size=(batch, length)), 0)
    return (jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(prompt_valid),
            jnp.asarray(completion_tokens, jnp.int32), jnp.asarray(mask)), lengths


def test_value_params_layout_axes_and_sharding():
    cfg = models.get_preset("test", tie_embeddings=False)
    axes = value_param_logical_axes(cfg)
    assert set(axes) == {"trunk", "head"}
    assert axes["head"] == {"kernel": ("embed", None), "bias": (None,)}
    assert axes["trunk"] == models.param_logical_axes(trunk_config(cfg))
    assert "lm_head" not in axes["trunk"]
    shapes = abstract_value_params(cfg)["head"]
    assert shapes["kernel"].shape == (cfg.d_model, 1) and shapes["bias"].shape == (1,)
    mesh8 = shd.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    spec = value_param_shardings(cfg, mesh8, RULES)["head"]["kernel"].spec
    assert spec == jax.sharding.PartitionSpec("fsdp")  # canonical: no trailing None


def test_init_from_params_copies_trunk_without_aliasing(mesh1, policy):
    model, params = policy
    src = jax.tree.map(jnp.copy, params)  # deleted below: keep the fixture's params alive
    vp = init_value_params(model.cfg, jax.random.key(4), mesh1, RULES, from_params=src)
    assert set(vp) == {"trunk", "head"}
    assert set(vp["trunk"]) == set(src) - {"lm_head"}
    trunk_src = {k: v for k, v in src.items() if k != "lm_head"}
    expected = jax.device_get(trunk_src)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(vp["trunk"]), expected)
    for a, b in zip(jax.tree.leaves(vp["trunk"]), jax.tree.leaves(trunk_src)):
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()
    np.testing.assert_array_equal(vp["head"]["kernel"], 0.0)  # zero-init head by default
    np.testing.assert_array_equal(vp["head"]["bias"], 0.0)
    for x in jax.tree.leaves(src):  # what donating the policy's buffers does
        x.delete()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(vp["trunk"]), expected)


def test_init_random_and_mismatched_params(mesh1, policy):
    cfg = models.get_preset("test")
    vp = init_value_params(cfg, jax.random.key(5), mesh1, RULES, head_init_std=0.1)
    assert jax.tree.structure(vp) == jax.tree.structure(abstract_value_params(cfg))
    kernel = np.asarray(vp["head"]["kernel"])
    assert kernel.shape == (cfg.d_model, 1) and 0.05 < kernel.std() < 0.2
    with pytest.raises(ValueError, match="do not match"):
        init_value_params(models.get_preset("test", d_model=32), jax.random.key(0), mesh1,
                          RULES, from_params=policy[1])


def test_completion_values_read_at_logit_positions(policy, value_params, value_fn):
    model, vp = policy[0], value_params
    args, lengths = _rollout()
    values = np.asarray(value_fn(vp, *args))
    assert values.shape == args[2].shape and values.dtype == np.float32
    prompt_tokens, prompt_valid, completion_tokens, _ = (np.asarray(a) for a in args)
    width = prompt_tokens.shape[1] + completion_tokens.shape[1]
    # No left padding: the sequence starts at slot 0 / position 0; the tail after it is
    # invalid (and causally invisible), so one compiled program serves every row.
    trunk = jax.jit(lambda p, x, n: Transformer(trunk_config(model.cfg)).apply(
        {"params": p}, x, jnp.arange(width)[None], jnp.arange(width)[None] < n,
        return_hidden=True)[0])
    kernel, bias = np.asarray(vp["head"]["kernel"]), np.asarray(vp["head"]["bias"])
    for b, n in enumerate(lengths):
        prompt = prompt_tokens[b][prompt_valid[b]]
        seq = np.concatenate([prompt, completion_tokens[b, :n]])
        padded = np.zeros((1, width), np.int32)
        padded[0, :len(seq)] = seq
        hidden = np.asarray(trunk(vp["trunk"], jnp.asarray(padded), len(seq)))[0]
        # V(s_t): s_t = prompt + completion[:t] ends at index len(prompt) - 1 + t.
        ref = hidden[len(prompt) - 1: len(prompt) - 1 + n] @ kernel[:, 0] + bias[0]
        np.testing.assert_allclose(values[b, :n], ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(values[b, n:], 0.0)
    assert np.std(values[0]) > 0  # the head really reads the trunk


def test_value_regression_reduces_loss(mesh1, policy, value_params, value_fn):
    model = policy[0]
    args, _ = _rollout(seed=1)
    prompt_tokens, prompt_valid, completion_tokens, mask = args
    rewards = token_rewards(jnp.asarray(np.random.default_rng(1).uniform(size=4), jnp.float32),
                            mask)
    old_values = value_fn(value_params, *args)
    _, returns = gae(rewards, old_values, mask, gamma=1.0, lam=0.95)
    batch = {"prompt_tokens": prompt_tokens, "prompt_valid": prompt_valid,
             "completion_tokens": completion_tokens, "mask": mask,
             "old_values": old_values, "returns": returns, "advantages": jnp.zeros(4)}
    optimizer = make_optimizer(3e-3, weight_decay=0.0, max_grad_norm=1.0)
    state = create_train_state(jax.tree.map(jnp.copy, value_params), optimizer)
    # Scalars (step, Adam count) on the mesh like the update's outputs: compiles once.
    state = jax.device_put(state, shd.replicated(mesh1))
    update = make_value_update_fn(model, optimizer, clip_range=0.5)
    losses = []
    for _ in range(12):
        state, metrics = update(state, batch)
        losses.append(float(metrics["value_loss"]))
    assert set(metrics) == {"value_loss", "value_clip_frac", "value_mean",
                            "explained_variance", "value_grad_norm"}
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(state.step) == 12
