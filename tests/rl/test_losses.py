"""policy_loss / kl_penalty / aggregate_loss against explicit-loop NumPy formulas and gradients."""
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
    policy_loss,
)

EPS_LOW, EPS_HIGH = 0.2, 0.28
METRICS = ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "kl", "entropy",
           "pg_loss")


# ----------------------------------------------------------------------------- reference


def _kl(est, lp, ref):
    """(value, d value / d lp) of one token's KL estimate."""
    if est == "k1":
        return lp - ref, 1.0
    if est == "k2":
        return 0.5 * (lp - ref) ** 2, lp - ref
    d = ref - lp
    return math.exp(d) - d - 1.0, 1.0 - math.exp(d)


def reference(batch, loss_type, *, beta=0.0, kl_estimator="k3", max_completion_length=None,
              num_tokens_global=None, entropy_coef=0.0, use_ref=True, use_entropy=True):
    """Loss, metrics, d loss / d logp and d loss / d entropy, one token at a time (float64)."""
    logp, old, adv, mask, ref, ent = (np.asarray(batch[k], np.float64) for k in
                                      ("logp", "old_logp", "advantages", "mask", "ref_logp",
                                       "entropy"))
    b_size, length = logp.shape
    tok = np.zeros((b_size, length))
    pg = np.zeros((b_size, length))
    dtok = np.zeros((b_size, length))
    counts = dict(low=0, high=0, n=0, ratio=0.0, kl=0.0, ent=0.0)
    ratio_max = 0.0
    for b in range(b_size):
        a = adv[b]
        for t in range(length):
            if mask[b, t] == 0:
                continue
            r = math.exp(logp[b, t] - old[b, t])
            clipped_r = min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
            pg[b, t] = -min(r * a, clipped_r * a)
            clipped_low = r < 1 - EPS_LOW and a < 0
            clipped_high = r > 1 + EPS_HIGH and a > 0
            dtok[b, t] = 0.0 if (clipped_low or clipped_high) else -a * r
            tok[b, t] = pg[b, t]
            if use_ref:
                kl, dkl = _kl(kl_estimator, logp[b, t], ref[b, t])
                tok[b, t] += beta * kl
                dtok[b, t] += beta * dkl
                counts["kl"] += kl
            if use_entropy:
                tok[b, t] -= entropy_coef * ent[b, t]
                counts["ent"] += ent[b, t]
            counts["low"] += clipped_low
            counts["high"] += clipped_high
            counts["n"] += 1
            counts["ratio"] += r
            ratio_max = max(ratio_max, r)

    weights = np.zeros((b_size, length))  # d loss / d per-token value
    for b in range(b_size):
        n_b = sum(1 for t in range(length) if mask[b, t])
        for t in range(length):
            if not mask[b, t]:
                continue
            if loss_type == "grpo":
                weights[b, t] = 1.0 / (max(n_b, 1) * b_size)
            elif loss_type == "bnpo":
                weights[b, t] = 1.0 / max(counts["n"], 1)
            elif loss_type == "dr_grpo":
                weights[b, t] = 1.0 / (b_size * max_completion_length)
            else:
                total = counts["n"] if num_tokens_global is None else num_tokens_global
                weights[b, t] = 1.0 / max(total, 1)
    n = max(counts["n"], 1)
    metrics = {
        "clip_frac_low": counts["low"] / n,
        "clip_frac_high": counts["high"] / n,
        "ratio_mean": counts["ratio"] / n,
        "ratio_max": ratio_max,
        "kl": counts["kl"] / n,
        "entropy": counts["ent"] / n,
        "pg_loss": float(np.sum(weights * pg)),
    }
    return (float(np.sum(weights * tok)), metrics, weights * dtok,
            -entropy_coef * weights if use_entropy else None)


def make_batch(seed=0, b_size=5, length=7):
    """Ratios spread well past both clip bounds; row 1 is empty; mixed-sign advantages."""
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.1, 3.0, (b_size, length)).astype(np.float32)
    old = (logp + rng.normal(0, 0.4, (b_size, length))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.3, (b_size, length))).astype(np.float32)
    lengths = rng.integers(1, length + 1, b_size)
    lengths[1] = 0
    mask = np.arange(length)[None, :] < lengths[:, None]
    adv = rng.normal(size=b_size).astype(np.float32)
    adv[min(2, b_size - 1)] = 0.0
    entropy = rng.uniform(0.0, 2.0, (b_size, length)).astype(np.float32)
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask, ref_logp=ref,
                entropy=entropy)


def run(batch, loss_type, **kw):
    """policy_loss plus its gradients w.r.t. logp and entropy."""
    def f(logp, entropy):
        return policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                           loss_type=loss_type, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                           ref_logp=batch["ref_logp"], entropy=entropy, **kw)
    (loss, metrics), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        jnp.asarray(batch["logp"]), jnp.asarray(batch["entropy"]))
    return loss, metrics, grads


def assert_matches(got, want):
    loss, metrics, (g_logp, g_ent) = got
    w_loss, w_metrics, w_logp, w_ent = want
    np.testing.assert_allclose(loss, w_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == set(METRICS)
    for name in METRICS:
        assert metrics[name].shape == () and metrics[name].dtype == jnp.float32, name
        np.testing.assert_allclose(metrics[name], w_metrics[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose(g_logp, w_logp, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g_ent, w_ent, rtol=1e-5, atol=1e-7)


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
    want_loss = reference(batch, loss_type, max_completion_length=7, use_ref=False,
                          use_entropy=False)[0]
    want_kl = reference(batch, loss_type, max_completion_length=7, use_entropy=False)[1]["kl"]
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["pg_loss"], loss, rtol=1e-6)
    assert metrics["kl"] == 0.0 and metrics["entropy"] == 0.0
    # ref_logp with beta=0: the KL is reported but does not enter the loss.
    loss_ref, metrics_ref = policy_loss(
        batch["logp"], batch["old_logp"], batch["advantages"], batch["mask"],
        loss_type=loss_type, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
        max_completion_length=7, ref_logp=batch["ref_logp"])
    np.testing.assert_allclose(loss_ref, loss, rtol=1e-6)
    np.testing.assert_allclose(metrics_ref["kl"], want_kl, rtol=1e-5)
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
    np.testing.assert_allclose(loss, (-1.3 + 2.0 + 0.8 - 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(grad[:, 0], np.array([0.0, 2.0, 0.0, -0.5]) / 4, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac_high"], 0.25)
    np.testing.assert_allclose(metrics["clip_frac_low"], 0.25)
    np.testing.assert_allclose(metrics["ratio_max"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.25, rtol=1e-6)


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
    np.testing.assert_allclose(total, whole, rtol=1e-5)
    np.testing.assert_allclose(whole, bnpo, rtol=1e-6)


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
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


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
    want = [[_kl(estimator, float(a), float(b))[0] for a, b in zip(ra, rb)]
            for ra, rb in zip(batch["logp"], batch["ref_logp"])]
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
