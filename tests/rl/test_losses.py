"""policy_loss / kl_penalty / aggregate_loss against explicit-loop NumPy formulas and
gradients (the reference is tests/rl/loss_reference.py), and the KL-in-the-reward penalty."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.rl.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    aggregate_loss,
    kl_penalty,
    kl_reward_penalty,
    policy_loss,
)
from numerics import f32_tolerance

from loss_reference import EPS_HIGH, EPS_LOW, assert_matches, make_batch, ref_kl, reference, run


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("kl_estimator", sorted(KL_ESTIMATORS))
def test_matches_reference(loss_type, kl_estimator):
    batch = make_batch(seed=1)
    kw = dict(beta=0.1, kl_estimator=kl_estimator, max_completion_length=9,
              num_tokens_global=40 if loss_type == "dapo" else None, entropy_coef=0.01)
    got = run(batch, loss_type, **kw)
    assert_matches(got, reference(batch, loss_type, **kw))
    m = got[1]
    assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0  # the data clips both ways


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
def test_without_kl_and_entropy(loss_type):
    batch = make_batch(seed=2)
    loss, metrics = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"],
                                batch["mask"], loss_type=loss_type, epsilon_low=EPS_LOW,
                                epsilon_high=EPS_HIGH, max_completion_length=7)
    want_loss, _, _, _, mags = reference(batch, loss_type, max_completion_length=7,
                                         use_ref=False, use_entropy=False)
    want = reference(batch, loss_type, max_completion_length=7, use_entropy=False)
    want_kl, kl_terms = want[1]["kl"], want[4]["kl"]
    # vs float64: weighted sums of n = 5 * 7 token terms (loss_reference.assert_matches).
    n = batch["mask"].size
    np.testing.assert_allclose(loss, want_loss, rtol=0,
                               atol=f32_tolerance(n, mags["loss"], chain=3, orders=1))
    # The same terms, summed by two float32 expressions.
    np.testing.assert_allclose(metrics["pg_loss"], loss, rtol=0,
                               atol=f32_tolerance(n, mags["loss"], chain=3))
    assert metrics["kl"] == 0.0 and metrics["entropy"] == 0.0
    # ref_logp with beta=0: the KL is reported but does not enter the loss.
    loss_ref, metrics_ref = policy_loss(
        batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"],
        loss_type=loss_type, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
        max_completion_length=7, ref_logp=batch["ref_logp"])
    np.testing.assert_allclose(loss_ref, loss, rtol=0,
                               atol=f32_tolerance(n, mags["loss"], chain=3))
    np.testing.assert_allclose(metrics_ref["kl"], want_kl, rtol=0,
                               atol=f32_tolerance(n, kl_terms, chain=3, orders=1))
    assert want_kl > 0


def test_clipping_both_directions():
    # One token per row: ratios 2, 2, 0.5, 0.5 with advantages +1, -1, -1, +1.
    old = np.zeros((4, 1), np.float32)
    logp = np.log(np.array([[2.0], [2.0], [0.5], [0.5]], np.float32))
    adv = np.array([1.0, -1.0, -1.0, 1.0], np.float32)
    mask = np.ones((4, 1), bool)
    fn = functools.partial(policy_loss, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.3)
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: fn(lp, old, adv, mask), has_aux=True)(jnp.asarray(logp))
    # per token: -min(2, 1.3) = -1.3 (clipped), -min(-2, -1.3) = 2, -min(-0.5, -0.8) = 0.8
    # (clipped), -min(0.5, 0.8) = -0.5.
    # vs exact values: 4 terms of |term| <= 2 (magnitude 4.6 / 4), the ratios rounded.
    np.testing.assert_allclose(loss, (-1.3 + 2.0 + 0.8 - 0.5) / 4, rtol=0,
                               atol=f32_tolerance(4, 4.6 / 4, chain=3, orders=1))
    np.testing.assert_allclose(grad[:, 0], np.array([0.0, 2.0, 0.0, -0.5]) / 4, rtol=0,
                               atol=f32_tolerance(4, 2.0 / 4, chain=3, orders=1))
    np.testing.assert_allclose(metrics["clip_frac_high"], 0.25)
    np.testing.assert_allclose(metrics["clip_frac_low"], 0.25)
    np.testing.assert_allclose(metrics["ratio_max"], 2.0, rtol=0,
                               atol=f32_tolerance(1, 2.0, chain=2, orders=1))  # exp(log 2)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.25, rtol=0,
                               atol=f32_tolerance(4, 1.25, chain=3, orders=1))


def test_aggregations_on_known_values():
    values = np.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]],
                      np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    agg = functools.partial(aggregate_loss, values, mask, max_completion_length=5)
    np.testing.assert_allclose(agg(loss_type="grpo"), (2.0 + 4.0 + 0.0) / 3)  # empty row: 0
    np.testing.assert_allclose(agg(loss_type="bnpo"), 10.0 / 4)
    np.testing.assert_allclose(agg(loss_type="dr_grpo"), 10.0 / (3 * 5))
    np.testing.assert_allclose(agg(loss_type="dapo"), 10.0 / 4)
    np.testing.assert_allclose(agg(loss_type="dapo", num_tokens_global=20), 10.0 / 20)


def test_dapo_micro_batches_sum_to_global_token_mean():
    batch = make_batch(seed=3, b_size=6)
    n_global = int(batch["mask"].sum())
    kw = dict(loss_type="dapo", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.05,
              ref_logp=None)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
        part = {k: v[rows] for k, v in batch.items()}
        kw["ref_logp"] = part["ref_logp"]
        total += policy_loss(part["logp"], part["old_logp"], part["advantages"], part["mask"],
                             num_tokens_global=n_global, **kw)[0]
    kw["ref_logp"] = batch["ref_logp"]
    whole = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"],
                        **kw)[0]
    bnpo = policy_loss(batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"],
                       **{**kw, "loss_type": "bnpo"})[0]
    # Three micro-batch sums vs one: other orders over n = 6 * 7 tokens (chain 3, as in
    # loss_reference.assert_matches), terms of at most |ratio| |A| + beta kl.
    mags = reference(batch, "bnpo", beta=0.05, use_entropy=False)[4]
    atol = f32_tolerance(batch["mask"].size, mags["loss"], chain=3)
    np.testing.assert_allclose(total, whole, rtol=0, atol=atol)
    np.testing.assert_allclose(whole, bnpo, rtol=0, atol=atol)


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
def test_garbage_padding_and_empty_batch_give_no_nan(loss_type):
    batch = make_batch(seed=4)
    mask = batch["mask"]
    dirty = {k: v.copy() for k, v in batch.items()}
    dirty["logp"][~mask] = -np.inf
    dirty["old_logp"][~mask] = -np.inf
    dirty["ref_logp"][~mask] = np.nan
    dirty["entropy"][~mask] = np.nan
    kw = dict(beta=0.1, max_completion_length=7, entropy_coef=0.01)
    clean, dirty_out = run(batch, loss_type, **kw), run(dirty, loss_type, **kw)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty_out)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    empty = dict(batch, mask=np.zeros_like(mask))
    loss, metrics, grads = run(empty, loss_type, **kw)
    assert loss == 0.0 and all(v == 0.0 for v in metrics.values())
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)


def test_only_logp_and_entropy_get_gradients():
    batch = make_batch(seed=5)

    def f(old, adv, ref):
        return policy_loss(batch["logp"], old, adv, batch["mask"], loss_type="grpo",
                           epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.1,
                           ref_logp=ref)[0]
    grads = jax.grad(f, argnums=(0, 1, 2))(batch["old_logp"], batch["advantages"],
                                            batch["ref_logp"])
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)


def test_gradient_matches_finite_difference():
    batch = make_batch(seed=6, b_size=3, length=4)
    rng = np.random.default_rng(0)
    direction = rng.normal(size=batch["logp"].shape).astype(np.float32) * batch["mask"]

    def f(lp):
        return policy_loss(lp, batch["old_logp"], batch["advantages"], batch["mask"],
                           loss_type="grpo", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                           beta=0.1, ref_logp=batch["ref_logp"])[0]
    lp = jnp.asarray(batch["logp"])
    h = 1e-3
    fd = (f(lp + h * direction) - f(lp - h * direction)) / (2 * h)
    analytic = jnp.vdot(jax.grad(f)(lp), direction)
    np.testing.assert_allclose(fd, analytic, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
def test_jit_matches_eager(loss_type):
    batch = make_batch(seed=7)
    static = dict(loss_type=loss_type, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                  max_completion_length=8, kl_estimator="k2")

    def f(logp, old, adv, mask, ref, ent, beta, coef, n_tokens):
        return policy_loss(logp, old, adv, mask, ref_logp=ref, entropy=ent, beta=beta,
                           entropy_coef=coef, num_tokens_global=n_tokens, **static)
    args = (batch["logp"], batch["old_logp"], batch["advantages"],
            batch["mask"].astype(np.float32), batch["ref_logp"], batch["entropy"],
            np.float32(0.1), np.float32(0.01), np.int32(31))
    eager = f(*args)
    jitted = jax.jit(f)(*args)
    # XLA fuses and reorders: each output within the float32 bound of its n = 5 * 7 terms.
    want = reference(batch, loss_type, beta=0.1, entropy_coef=0.01, max_completion_length=8,
                     kl_estimator="k2", num_tokens_global=31)
    atol = f32_tolerance(batch["mask"].size, max(want[4]["loss"], *map(abs, want[1].values())),
                         chain=3)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def test_bool_float_and_bf16_inputs_agree():
    batch = make_batch(seed=8)
    kw = dict(loss_type="bnpo", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    args = (batch["logp"], batch["old_logp"], batch["advantages"])
    bool_loss = policy_loss(*args, batch["mask"], **kw)[0]
    float_loss = policy_loss(*args, batch["mask"].astype(np.float32), **kw)[0]
    assert bool_loss == float_loss
    bf16 = [jnp.asarray(a, jnp.bfloat16) for a in args]
    bf16_loss = policy_loss(*bf16, batch["mask"], **kw)[0]
    assert bf16_loss.dtype == jnp.float32
    np.testing.assert_allclose(bf16_loss, bool_loss, rtol=5e-2, atol=1e-2)


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_kl_penalty(estimator):
    batch = make_batch(seed=9, b_size=3, length=3)
    got = kl_penalty(batch["logp"], batch["ref_logp"], estimator=estimator)
    want = [[ref_kl(estimator, float(a), float(b))[0] for a, b in zip(ra, rb)]
            for ra, rb in zip(batch["logp"], batch["ref_logp"])]
    # Elementwise (no reduction) against float64: a few roundings of each value.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    same = kl_penalty(batch["logp"], batch["logp"], estimator=estimator)
    np.testing.assert_array_equal(same, 0.0)
    if estimator != "k1":
        assert np.all(np.asarray(got) >= 0)


def test_bad_arguments():
    b = make_batch(seed=10)
    args = (b["logp"], b["old_logp"], b["advantages"], b["mask"])
    ok = dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2)
    cases = [
        (dict(ok, loss_type="ppo"), "unknown loss_type 'ppo'.*dapo"),
        (dict(ok, epsilon_low=0.0), "epsilon_low"),
        (dict(ok, epsilon_low=1.0), "epsilon_low"),
        (dict(ok, epsilon_high=0.0), "epsilon_high"),
        (dict(ok, beta=0.1), "beta=0.1 > 0 requires ref_logp"),
        (dict(ok, beta=-0.1, ref_logp=b["ref_logp"]), "beta must be >= 0"),
        (dict(ok, loss_type="dr_grpo"), "dr_grpo.*max_completion_length"),
        (dict(ok, loss_type="dr_grpo", max_completion_length=0), "max_completion_length"),
        (dict(ok, kl_estimator="k4"), "unknown kl_estimator 'k4'.*k3"),
        (dict(ok, entropy_coef=0.1), "entropy_coef=0.1 != 0 requires entropy"),
        (dict(ok, ref_logp=b["ref_logp"][:, :3]), "ref_logp shape"),
        (dict(ok, entropy=b["entropy"][:2]), "entropy shape"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            policy_loss(*args, **kwargs)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(b["logp"], b["old_logp"], b["advantages"][:, None], b["mask"], **ok)
    with pytest.raises(ValueError, match="logp must be"):
        policy_loss(b["logp"][0], b["old_logp"][0], b["advantages"], b["mask"][0], **ok)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"][:, :2], **ok)
    with pytest.raises(TypeError, match="epsilon_low"):
        policy_loss(*args, **dict(ok, epsilon_low=jnp.float32(0.2)))
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        kl_penalty(b["logp"], b["ref_logp"], estimator="k9")
    with pytest.raises(ValueError, match="unknown loss_type"):
        aggregate_loss(b["logp"], b["mask"], loss_type="sum")


# ----------------------------------------------------------------------------- KL in the reward


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_kl_reward_penalty(estimator):
    batch = make_batch(seed=23)
    mask = batch["mask"]
    want = [0.3 * sum(ref_kl(estimator, float(batch["old_logp"][b, t]),
                          float(batch["ref_logp"][b, t]))[0]
                      for t in range(mask.shape[1]) if mask[b, t])
            for b in range(mask.shape[0])]
    got = kl_reward_penalty(batch["old_logp"], batch["ref_logp"], mask, beta=0.3,
                            estimator=estimator)
    assert got.shape == (mask.shape[0],) and got.dtype == jnp.float32
    # Row sums of L = 7 terms vs float64 (orders=1): magnitude 0.3 * sum |kl| per row, the
    # chain the elementwise estimate and the sum.
    terms = max(0.3 * sum(abs(ref_kl(estimator, float(a), float(r))[0])
                          for a, r, m in zip(la, lr, lm) if m)
                for la, lr, lm in zip(batch["old_logp"], batch["ref_logp"], mask))
    atol = f32_tolerance(mask.shape[1], terms, chain=2, orders=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    assert got[1] == 0.0  # the empty row
    dirty_lp, dirty_ref = batch["old_logp"].copy(), batch["ref_logp"].copy()
    dirty_lp[~mask], dirty_ref[~mask] = -np.inf, np.nan
    jitted = jax.jit(functools.partial(kl_reward_penalty, estimator=estimator))
    np.testing.assert_allclose(jitted(dirty_lp, dirty_ref, mask.astype(np.float32),
                                      beta=jnp.float32(0.3)), want, rtol=0, atol=atol)


def test_kl_reward_penalty_default_is_summed_k1():
    lp = np.log(np.array([[0.5, 0.25, 0.9]], np.float32))
    ref = np.log(np.array([[0.25, 0.5, 0.1]], np.float32))
    mask = np.array([[1, 1, 0]], bool)
    got = kl_reward_penalty(lp, ref, mask, beta=2.0)
    np.testing.assert_allclose(got, [2.0 * (math.log(2.0) + math.log(0.5))], atol=1e-6)


def test_bad_new_arguments():
    b = make_batch(seed=24)
    args = (b["logp"], b["old_logp"], b["advantages"], b["mask"])
    ok = dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2)
    cases = [
        (dict(ok, policy_loss_mode="trpo"), "unknown policy_loss_mode 'trpo'.*gspo"),
        (dict(ok, clip_ratio_c=1.0), "clip_ratio_c must be > 1"),
        (dict(ok, clip_ratio_c=3.0, policy_loss_mode="cispo"), "does not apply.*cispo"),
        (dict(ok, tis_cap=0.0, sampler_logp=b["sampler_logp"]), "tis_cap must be > 0"),
        (dict(ok, tis_cap=2.0), "tis_cap requires sampler_logp"),
        (dict(ok, sampler_logp=b["sampler_logp"][:, :2]), "sampler_logp shape"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            policy_loss(*args, **kwargs)
    with pytest.raises(TypeError, match="clip_ratio_c"):
        policy_loss(*args, **dict(ok, clip_ratio_c=jnp.float32(3.0)))
    with pytest.raises(TypeError, match="tis_cap"):
        policy_loss(*args, **dict(ok, tis_cap=True, sampler_logp=b["sampler_logp"]))
    with pytest.raises(ValueError, match="beta must be >= 0"):
        kl_reward_penalty(b["logp"], b["ref_logp"], b["mask"], beta=-1.0)
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        kl_reward_penalty(b["logp"], b["ref_logp"], b["mask"], beta=1.0, estimator="k5")
    with pytest.raises(ValueError, match="one shape"):
        kl_reward_penalty(b["logp"], b["ref_logp"], b["mask"][:, :2], beta=1.0)


def test_per_token_advantages_equal_broadcast_sequence_advantages():
    """[B, L] advantages (GAE) give the [B] loss when every token carries its row's value,
    and masked positions of a [B, L] advantage never leak (NaN there is harmless)."""
    rng = np.random.default_rng(5)
    b, l = 3, 6
    logp = jnp.asarray(rng.normal(-1.0, 0.3, (b, l)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.1, (b, l)), jnp.float32)
    mask = jnp.asarray(np.arange(l)[None, :] < np.array([[6], [2], [0]]), jnp.float32)
    adv = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    per_tok = jnp.where(mask > 0, adv[:, None], jnp.nan)
    for mode in ("ppo", "cispo"):
        kw = dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2, policy_loss_mode=mode)
        a, _ = policy_loss(logp, old, adv, mask, **kw)
        t, _ = policy_loss(logp, old, per_tok, mask, **kw)
        # [B] vs [B, L] advantages: other programs, other orders over 3 * 6 tokens with terms
        # of at most ratio (<= e^0.5) * |A| (<= 2).
        np.testing.assert_allclose(np.asarray(a), np.asarray(t), rtol=0,
                                   atol=f32_tolerance(18, 2.0 * np.e ** 0.5, chain=3))
        g = jax.grad(lambda x: policy_loss(x, old, per_tok, mask, **kw)[0])(logp)
        assert np.all(np.isfinite(np.asarray(g)))
    with pytest.raises(ValueError, match="gspo"):
        policy_loss(logp, old, per_tok, mask, loss_type="grpo", epsilon_low=0.2,
                    epsilon_high=0.2, policy_loss_mode="gspo")
