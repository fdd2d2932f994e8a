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
    POLICY_LOSS_MODES,
    aggregate_loss,
    kl_penalty,
    kl_reward_penalty,
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


def _agg_weights(mask, loss_type, max_completion_length=None, num_tokens_global=None,
                 num_sequences=None):
    """d loss / d per-token value of each aggregation, one token at a time."""
    b_size, length = mask.shape
    n_total = int(sum(mask[b, t] != 0 for b in range(b_size) for t in range(length)))
    n_seq = b_size if num_sequences is None else num_sequences
    weights = np.zeros((b_size, length))
    for b in range(b_size):
        n_b = sum(1 for t in range(length) if mask[b, t])
        for t in range(length):
            if not mask[b, t]:
                continue
            if loss_type == "grpo":
                weights[b, t] = 1.0 / (max(n_b, 1) * n_seq)
            elif loss_type == "bnpo":
                weights[b, t] = 1.0 / max(n_total, 1)
            elif loss_type == "dr_grpo":
                weights[b, t] = 1.0 / (n_seq * max_completion_length)
            else:
                total = n_total if num_tokens_global is None else num_tokens_global
                weights[b, t] = 1.0 / max(total, 1)
    return weights


def _clipped_objective(x, a, c, eps):
    """(loss, d loss / d x) of the dual-clip PPO formula for one ratio x and advantage a."""
    clipped_x = min(max(x, 1 - eps[0]), 1 + eps[1])
    loss, grad = max(-x * a, -clipped_x * a), 0.0
    if -x * a >= -clipped_x * a:
        grad = -a
    if c is not None and a < 0 and -c * a < loss:
        loss, grad = -c * a, 0.0
    return loss, grad


def _pg_term(mode, lp, old, a, s_seq, c, eps):
    """(value, d value / d lp) of one token's policy-gradient term, the papers' formulas."""
    r = math.exp(lp - old)
    if mode == "ppo":       # d r / d lp = r
        loss, dx = _clipped_objective(r, a, c, eps)
        return loss, dx * r
    if mode == "gspo":      # GSPO-token: value s_i, d s_it / d lp = s_i
        loss, dx = _clipped_objective(s_seq, a, c, eps)
        return loss, dx * s_seq
    w = min(max(r, 1 - eps[0]), 1 + eps[1])  # cispo: -sg(clip(r)) * a * lp
    return -w * a * lp, -w * a


def reference(batch, loss_type, *, beta=0.0, kl_estimator="k3", max_completion_length=None,
              num_tokens_global=None, num_sequences=None, entropy_coef=0.0, use_ref=True,
              use_entropy=True, policy_loss_mode="ppo", clip_ratio_c=None, use_sampler=False,
              tis_cap=None, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH):
    """Loss, metrics, d loss / d logp and d loss / d entropy, one token at a time (float64)."""
    logp, old, adv, mask, ref, ent = (np.asarray(batch[k], np.float64) for k in
                                      ("logp", "old_logp", "advantages", "mask", "ref_logp",
                                       "entropy"))
    samp = np.asarray(batch["sampler_logp"], np.float64) if use_sampler else None
    b_size, length = logp.shape
    tok = np.zeros((b_size, length))
    pg = np.zeros((b_size, length))
    dtok = np.zeros((b_size, length))
    counts = dict(low=0, high=0, dual=0, n=0, ratio=0.0, kl=0.0, ent=0.0, skl=0.0, w=0.0,
                  capped=0)
    ratio_max, seqs = 0.0, []
    for b in range(b_size):
        a = adv[b]
        toks = [t for t in range(length) if mask[b, t]]
        s_seq = math.exp(sum(logp[b, t] - old[b, t] for t in toks) / max(len(toks), 1))
        if toks:
            seqs.append((s_seq, a))
        for t in toks:
            r = math.exp(logp[b, t] - old[b, t])
            pg[b, t], dtok[b, t] = _pg_term(policy_loss_mode, logp[b, t], old[b, t], a, s_seq,
                                            clip_ratio_c, (epsilon_low, epsilon_high))
            if use_sampler:
                d = old[b, t] - samp[b, t]
                w = math.exp(d)
                counts["skl"] += math.exp(d) - d - 1.0
                if tis_cap is not None:
                    counts["capped"] += w > tis_cap
                    w = min(w, tis_cap)
                    pg[b, t] *= w
                    dtok[b, t] *= w
                counts["w"] += w
            tok[b, t] = pg[b, t]
            if use_ref:
                kl, dkl = _kl(kl_estimator, logp[b, t], ref[b, t])
                tok[b, t] += beta * kl
                dtok[b, t] += beta * dkl
                counts["kl"] += kl
            if use_entropy:
                tok[b, t] -= entropy_coef * ent[b, t]
                counts["ent"] += ent[b, t]
            if policy_loss_mode == "ppo":
                counts["low"] += r < 1 - epsilon_low and a < 0
                counts["high"] += r > 1 + epsilon_high and a > 0
                counts["dual"] += clip_ratio_c is not None and r > clip_ratio_c and a < 0
            elif policy_loss_mode == "cispo":
                counts["low"] += r < 1 - epsilon_low
                counts["high"] += r > 1 + epsilon_high
            counts["n"] += 1
            counts["ratio"] += r
            ratio_max = max(ratio_max, r)

    weights = _agg_weights(mask, loss_type, max_completion_length, num_tokens_global,
                           num_sequences)
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
    if policy_loss_mode == "gspo":  # sequence-level ratio metrics over non-empty rows
        n_seq = max(len(seqs), 1)
        metrics.update(
            clip_frac_low=sum(s < 1 - epsilon_low and a < 0 for s, a in seqs) / n_seq,
            clip_frac_high=sum(s > 1 + epsilon_high and a > 0 for s, a in seqs) / n_seq,
            ratio_mean=sum(s for s, _ in seqs) / n_seq,
            ratio_max=max([s for s, _ in seqs], default=0.0))
        counts["dual"] = sum(clip_ratio_c is not None and s > clip_ratio_c and a < 0
                             for s, a in seqs) * n / n_seq
    if clip_ratio_c is not None:
        metrics["clip_frac_dual"] = counts["dual"] / n
    if use_sampler:
        metrics.update(sampler_kl=counts["skl"] / n, tis_weight_mean=counts["w"] / n,
                       tis_clip_frac=counts["capped"] / n)
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
    sampler = (old + rng.normal(0, 0.3, (b_size, length))).astype(np.float32)
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask, ref_logp=ref,
                entropy=entropy, sampler_logp=sampler)


def run(batch, loss_type, **kw):
    """policy_loss plus its gradients w.r.t. logp and entropy."""
    kw = {"epsilon_low": EPS_LOW, "epsilon_high": EPS_HIGH, **kw}

    def f(logp, entropy):
        return policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                           loss_type=loss_type, ref_logp=batch["ref_logp"], entropy=entropy,
                           **kw)
    (loss, metrics), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        jnp.asarray(batch["logp"]), jnp.asarray(batch["entropy"]))
    return loss, metrics, grads


def assert_matches(got, want):
    loss, metrics, (g_logp, g_ent) = got
    w_loss, w_metrics, w_logp, w_ent = want
    np.testing.assert_allclose(loss, w_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == set(w_metrics) and set(METRICS) <= set(metrics)
    for name in w_metrics:
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


# ---------------------------------------------------------------------------- modes, dual clip, TIS

CLIP_C, TIS_CAP = 1.5, 1.2  # small enough that wide_batch hits both bounds
GSPO_EPS = dict(epsilon_low=3e-4, epsilon_high=4e-4)  # the GSPO paper's ranges


def wide_batch(seed, **kw):
    """make_batch (b_size >= 4) with twice the policy/old-policy gap, and row 0 (never empty)
    moved to log-ratios around +1 with a negative advantage: past the dual bound for tokens
    and for GSPO's sequence ratio."""
    batch = make_batch(seed=seed, **kw)
    batch["old_logp"] = 2 * batch["old_logp"] - batch["logp"]
    batch["old_logp"][0] = batch["logp"][0] - 1.0 + 0.5 * (batch["old_logp"][0]
                                                            - batch["logp"][0])
    batch["advantages"][0] = -abs(batch["advantages"][0]) - 0.1
    # Row 3: log-ratios around -0.5 with a negative advantage, below GSPO's lower bound.
    batch["old_logp"][3] = batch["logp"][3] + 0.5 + 0.5 * (batch["old_logp"][3]
                                                            - batch["logp"][3])
    batch["advantages"][3] = -abs(batch["advantages"][3]) - 0.1
    return batch


def check(batch, loss_type, *, use_sampler=False, **kw):
    """Runs policy_loss and the float64 reference with the same arguments; returns metrics."""
    extra = dict(sampler_logp=batch["sampler_logp"]) if use_sampler else {}
    got = run(batch, loss_type, **kw, **extra)
    assert_matches(got, reference(batch, loss_type, use_sampler=use_sampler, **kw))
    return got[1]


def mode_kw(mode, *, dual=True, tis=True):
    kw = dict(policy_loss_mode=mode, beta=0.1, entropy_coef=0.01, max_completion_length=9)
    if dual and mode != "cispo":
        kw["clip_ratio_c"] = CLIP_C
    if tis:
        kw["tis_cap"] = TIS_CAP
    return kw


@pytest.mark.parametrize("loss_type", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_modes_with_dual_clip_and_tis_match_reference(mode, loss_type):
    batch = wide_batch(11)
    kw = dict(mode_kw(mode), num_sequences=8,
              num_tokens_global=40 if loss_type == "dapo" else None)
    m = check(batch, loss_type, use_sampler=True, **kw)
    assert m["tis_clip_frac"] > 0 and m["sampler_kl"] > 0  # some weights are capped
    if mode != "cispo":
        assert m["clip_frac_dual"] > 0  # the dual bound is active somewhere
    assert m["clip_frac_low"] + m["clip_frac_high"] > 0


@pytest.mark.parametrize("dual,tis,use_sampler", [(True, False, False), (False, True, True),
                                                  (False, False, True)])
@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_each_option_alone_matches_reference(mode, dual, tis, use_sampler):
    batch = wide_batch(12)
    kw = mode_kw(mode, dual=dual, tis=tis)
    m = check(batch, "bnpo", use_sampler=use_sampler, **kw)
    assert ("clip_frac_dual" in m) == ("clip_ratio_c" in kw)
    assert ("sampler_kl" in m) == use_sampler


def test_gspo_with_the_papers_tiny_ranges():
    # Sequence log-ratios around +-4e-4: some sequences inside the range, some clipped.
    batch = make_batch(seed=13, b_size=8)
    rng = np.random.default_rng(13)
    shift = rng.uniform(-8e-4, 8e-4, (8, 1)).astype(np.float32)
    batch["old_logp"] = batch["logp"] - shift
    batch["advantages"] = np.where(np.arange(8) % 2 == 0, 1.0, -1.0).astype(np.float32)
    m = check(batch, "grpo", policy_loss_mode="gspo", **GSPO_EPS)
    assert 0 < m["clip_frac_low"] + m["clip_frac_high"] < 1


def test_dual_clip_known_values():
    # One token per row: ratios 4, 2, 4, 0.5 with advantages -1, -1, +1, -1; c = 3.
    old = np.zeros((4, 1), np.float32)
    logp = np.log(np.array([[4.0], [2.0], [4.0], [0.5]], np.float32))
    adv = np.array([-1.0, -1.0, 1.0, -1.0], np.float32)
    fn = functools.partial(policy_loss, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.2,
                           clip_ratio_c=3.0)
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: fn(lp, old, adv, np.ones((4, 1), bool)), has_aux=True)(jnp.asarray(logp))
    # min(max(4, 1.2), 3) = 3 (dual); max(2, 1.2) = 2; -min(4, 1.2) = -1.2; max(0.5, 0.8) = 0.8.
    np.testing.assert_allclose(loss, (3.0 + 2.0 - 1.2 + 0.8) / 4, rtol=1e-6)
    np.testing.assert_allclose(grad[:, 0], np.array([0.0, 2.0, 0.0, 0.0]) / 4, atol=1e-7)
    np.testing.assert_allclose(metrics["clip_frac_dual"], 0.25)
    np.testing.assert_allclose(metrics["clip_frac_low"], 0.25)
    np.testing.assert_allclose(metrics["clip_frac_high"], 0.25)


def _fd_grad(fn, x, h=1e-6):
    """Central finite differences of a float64 scalar function, one coordinate at a time."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (fn(up) - fn(down)) / (2 * h)
    return grad


def gspo_sequence_loss(logp, batch, loss_type):
    """The GSPO paper's sequence objective, -min(s_i A_i, clip(s_i) A_i), with s_i a function
    of logp (no token form), aggregated as the per-token values of every token of row i."""
    mask, old, adv = (batch["mask"], batch["old_logp"].astype(np.float64),
                      batch["advantages"].astype(np.float64))
    values = np.zeros(logp.shape)
    for i in range(len(adv)):
        n = mask[i].sum()
        s = math.exp(((logp[i] - old[i]) * mask[i]).sum() / max(n, 1))
        values[i] = -min(s * adv[i], min(max(s, 1 - EPS_LOW), 1 + EPS_HIGH) * adv[i])
    return float(np.sum(_agg_weights(mask, loss_type, 9) * values))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gspo_token_gradient_is_the_sequence_gradient(loss_type):
    batch = make_batch(seed=14, b_size=4, length=5)
    lp64 = batch["logp"].astype(np.float64)
    want_loss = gspo_sequence_loss(lp64, batch, loss_type)
    want_grad = _fd_grad(lambda lp: gspo_sequence_loss(lp, batch, loss_type), lp64)
    loss, _, (grad, _) = run(batch, loss_type, policy_loss_mode="gspo",
                             max_completion_length=9)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    assert np.count_nonzero(want_grad) > 0


@pytest.mark.parametrize("mode", ["ppo", "gspo"])
def test_gradient_matches_finite_difference_of_the_reference(mode):
    # The float64 reference's value differentiated numerically. Not for cispo (its value has a
    # stop-gradient weight) nor gspo with TIS (a per-token weight on the sequence objective):
    # their gradients are checked against the reference's analytic ones above.
    batch = wide_batch(15, b_size=4, length=5)
    kw = dict(mode_kw(mode, tis=mode == "ppo"), kl_estimator="k2")

    def value(lp):
        return reference(dict(batch, logp=lp), "grpo", use_sampler=True, **kw)[0]
    want = _fd_grad(value, batch["logp"].astype(np.float64))
    _, _, (grad, _) = run(batch, "grpo", sampler_logp=batch["sampler_logp"], **kw)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_single_token_gspo_equals_ppo():
    batch = make_batch(seed=16, b_size=6, length=1)
    batch["mask"][:] = True
    kw = dict(clip_ratio_c=CLIP_C, max_completion_length=1)
    ppo = run(batch, "grpo", **kw)
    gspo = run(batch, "grpo", policy_loss_mode="gspo", **kw)
    for a, b in zip(jax.tree.leaves(ppo), jax.tree.leaves(gspo)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_cispo_keeps_every_token_gradient():
    batch = wide_batch(17)
    _, m_ppo, (g_ppo, _) = run(batch, "bnpo")
    _, m_cispo, (g_cispo, _) = run(batch, "bnpo", policy_loss_mode="cispo")
    live = batch["mask"] & (batch["advantages"][:, None] != 0)
    assert np.all(np.asarray(g_cispo)[live] != 0)
    assert np.any(np.asarray(g_ppo)[live] == 0)  # PPO drops its clipped tokens
    assert m_cispo["clip_frac_low"] + m_cispo["clip_frac_high"] > 0


def test_tis_is_the_identity_without_mismatch():
    batch = make_batch(seed=18)
    plain = run(batch, "dapo", beta=0.1)
    same = run(batch, "dapo", beta=0.1, sampler_logp=batch["old_logp"], tis_cap=2.0)
    metric_only = run(batch, "dapo", beta=0.1, sampler_logp=batch["sampler_logp"])
    for got in (same, metric_only):
        np.testing.assert_allclose(got[0], plain[0], rtol=1e-6)
        for a, b in zip(got[2], plain[2]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(same[1]["sampler_kl"], 0.0, atol=1e-7)
    np.testing.assert_allclose(same[1]["tis_weight_mean"], 1.0, rtol=1e-6)
    assert same[1]["tis_clip_frac"] == 0.0 and metric_only[1]["tis_clip_frac"] == 0.0
    mask = batch["mask"]
    d = (batch["old_logp"] - batch["sampler_logp"])[mask].astype(np.float64)
    np.testing.assert_allclose(metric_only[1]["tis_weight_mean"], np.mean(np.exp(d)), rtol=1e-5)
    np.testing.assert_allclose(metric_only[1]["sampler_kl"], np.mean(np.exp(d) - d - 1),
                               rtol=1e-5)


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_skipping_zero_advantage_rows_keeps_the_loss(mode):
    batch = make_batch(seed=19, b_size=6)
    batch["advantages"][[0, 3]] = 0.0
    kw = dict(policy_loss_mode=mode, tis_cap=TIS_CAP, max_completion_length=7,
              num_sequences=6, num_tokens_global=int(batch["mask"].sum()))
    keep = np.flatnonzero(batch["advantages"] != 0)
    for loss_type in ("grpo", "dapo"):  # the sequence and the token normalizer
        whole = run(batch, loss_type, sampler_logp=batch["sampler_logp"], **kw)
        part = {k: v[keep] for k, v in batch.items()}
        sub = run(part, loss_type, sampler_logp=part["sampler_logp"], **kw)
        np.testing.assert_allclose(sub[0], whole[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(sub[2][0], np.asarray(whole[2][0])[keep], rtol=1e-5,
                                   atol=1e-8)


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_modes_garbage_padding_and_empty_batch_give_no_nan(mode):
    batch = make_batch(seed=20)
    mask = batch["mask"]
    dirty = {k: v.copy() for k, v in batch.items()}
    for key in ("logp", "old_logp", "sampler_logp"):
        dirty[key][~mask] = -np.inf
    dirty["ref_logp"][~mask] = np.nan
    dirty["entropy"][~mask] = np.nan
    kw = mode_kw(mode)
    clean = run(batch, "grpo", sampler_logp=batch["sampler_logp"], **kw)
    dirty_out = run(dirty, "grpo", sampler_logp=dirty["sampler_logp"], **kw)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty_out)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    empty = dict(batch, mask=np.zeros_like(mask))
    loss, metrics, grads = run(empty, "grpo", sampler_logp=batch["sampler_logp"], **kw)
    assert loss == 0.0 and all(v == 0.0 for v in metrics.values()), metrics
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_modes_jit_matches_eager(mode):
    batch = make_batch(seed=21)
    static = dict(loss_type="dapo", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                  policy_loss_mode=mode, tis_cap=TIS_CAP,
                  clip_ratio_c=None if mode == "cispo" else CLIP_C)

    def f(logp, old, adv, mask, sampler, n_tokens):
        return policy_loss(logp, old, adv, mask, sampler_logp=sampler,
                           num_tokens_global=n_tokens, **static)
    args = (batch["logp"], batch["old_logp"], batch["advantages"],
            batch["mask"].astype(np.float32), batch["sampler_logp"], np.int32(31))
    for a, b in zip(jax.tree.leaves(f(*args)), jax.tree.leaves(jax.jit(f)(*args))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_entropy_bonus_value_and_gradient():
    batch = make_batch(seed=22)
    mask = batch["mask"]
    for loss_type in ("grpo", "dapo"):
        base, _, _ = run(batch, loss_type, max_completion_length=7)
        loss, metrics, (_, g_ent) = run(batch, loss_type, max_completion_length=7,
                                        entropy_coef=0.05)
        weights = _agg_weights(mask, loss_type)
        np.testing.assert_allclose(loss - base, -0.05 * np.sum(weights * batch["entropy"]),
                                   rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(g_ent, -0.05 * weights, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(metrics["entropy"], batch["entropy"][mask].mean(), rtol=1e-5)


# ----------------------------------------------------------------------------- KL in the reward


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_kl_reward_penalty(estimator):
    batch = make_batch(seed=23)
    mask = batch["mask"]
    want = [0.3 * sum(_kl(estimator, float(batch["old_logp"][b, t]),
                          float(batch["ref_logp"][b, t]))[0]
                      for t in range(mask.shape[1]) if mask[b, t])
            for b in range(mask.shape[0])]
    got = kl_reward_penalty(batch["old_logp"], batch["ref_logp"], mask, beta=0.3,
                            estimator=estimator)
    assert got.shape == (mask.shape[0],) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[1] == 0.0  # the empty row
    dirty_lp, dirty_ref = batch["old_logp"].copy(), batch["ref_logp"].copy()
    dirty_lp[~mask], dirty_ref[~mask] = -np.inf, np.nan
    jitted = jax.jit(functools.partial(kl_reward_penalty, estimator=estimator))
    np.testing.assert_allclose(jitted(dirty_lp, dirty_ref, mask.astype(np.float32),
                                      beta=jnp.float32(0.3)), want, rtol=1e-5, atol=1e-6)


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
        np.testing.assert_allclose(np.asarray(a), np.asarray(t), rtol=1e-6)
        g = jax.grad(lambda x: policy_loss(x, old, per_tok, mask, **kw)[0])(logp)
        assert np.all(np.isfinite(np.asarray(g)))
    with pytest.raises(ValueError, match="gspo"):
        policy_loss(logp, old, per_tok, mask, loss_type="grpo", epsilon_low=0.2,
                    epsilon_high=0.2, policy_loss_mode="gspo")
