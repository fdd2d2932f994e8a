"""Policy-loss modes (PPO token ratio, GSPO sequence ratio, CISPO), the dual clip and
truncated importance sampling, each against the float64 reference of
tests/rl/loss_reference.py, values and gradients."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import f32_tolerance

from jaxrl_reason.rl.losses import LOSS_AGGREGATIONS, POLICY_LOSS_MODES, policy_loss
from loss_reference import (EPS_HIGH, EPS_LOW, assert_matches, make_batch, ref_agg_weights,
                            reference, run)


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


def _atol(batch, loss_type, *, orders=2, values=(), **kw):
    """float32 bound of a loss over batch's n = B * L tokens (as loss_reference.assert_matches:
    chain 3, magnitude the float64 reference's sum of |weight * term|, or any larger |value|
    in `values`, e.g. a metric's)."""
    mags = reference(batch, loss_type, **kw)[4]
    magnitude = max([mags["loss"], *(abs(float(v)) for v in values)])
    return f32_tolerance(batch["mask"].size, magnitude, chain=3, orders=orders)


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
    # vs exact values: 4 terms, magnitude (3 + 2 + 1.2 + 0.8) / 4; the ratios rounded.
    np.testing.assert_allclose(loss, (3.0 + 2.0 - 1.2 + 0.8) / 4, rtol=0,
                               atol=f32_tolerance(4, 7.0 / 4, chain=3, orders=1))
    np.testing.assert_allclose(grad[:, 0], np.array([0.0, 2.0, 0.0, 0.0]) / 4, rtol=0,
                               atol=f32_tolerance(4, 2.0 / 4, chain=3, orders=1))
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
    return float(np.sum(ref_agg_weights(mask, loss_type, 9) * values))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gspo_token_gradient_is_the_sequence_gradient(loss_type):
    batch = make_batch(seed=14, b_size=4, length=5)
    lp64 = batch["logp"].astype(np.float64)
    want_loss = gspo_sequence_loss(lp64, batch, loss_type)
    want_grad = _fd_grad(lambda lp: gspo_sequence_loss(lp, batch, loss_type), lp64)
    loss, _, (grad, _) = run(batch, loss_type, policy_loss_mode="gspo",
                             max_completion_length=9)
    # vs float64 (finite differences of step 1e-6: truncation ~1e-12, far below): the loss
    # over 4 * 5 tokens, the gradient norm-wise (GSPO's row means: length 5).
    np.testing.assert_allclose(loss, want_loss, rtol=0, atol=_atol(
        batch, loss_type, orders=1, policy_loss_mode="gspo", max_completion_length=9))
    np.testing.assert_allclose(grad, want_grad, rtol=0, atol=f32_tolerance(
        batch["mask"].size, float(np.abs(want_grad).max()), chain=3, orders=1))
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
    # vs float64, norm-wise over 4 * 5 tokens (finite-difference truncation ~1e-12).
    np.testing.assert_allclose(grad, want, rtol=0, atol=f32_tolerance(
        batch["mask"].size, float(np.abs(want).max()), chain=3, orders=1))


def test_single_token_gspo_equals_ppo():
    batch = make_batch(seed=16, b_size=6, length=1)
    batch["mask"][:] = True
    kw = dict(clip_ratio_c=CLIP_C, max_completion_length=1)
    ppo = run(batch, "grpo", **kw)
    gspo = run(batch, "grpo", policy_loss_mode="gspo", **kw)
    # Two programs (GSPO's row mean of one token): 6 tokens, values up to the ratios.
    atol = _atol(batch, "grpo", values=ppo[1].values(), **kw)
    for a, b in zip(jax.tree.leaves(ppo), jax.tree.leaves(gspo)):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


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
    # Other programs over 5 * 7 tokens: the loss's bound; the gradients norm-wise.
    atol = _atol(batch, "dapo", beta=0.1)
    for got in (same, metric_only):
        np.testing.assert_allclose(got[0], plain[0], rtol=0, atol=atol)
        for a, b in zip(got[2], plain[2]):
            np.testing.assert_allclose(a, b, rtol=0, atol=f32_tolerance(
                batch["mask"].size, float(np.abs(np.asarray(b)).max()), chain=3))
    n = batch["mask"].size
    np.testing.assert_allclose(same[1]["sampler_kl"], 0.0, atol=f32_tolerance(n, 1.0, orders=1))
    np.testing.assert_allclose(same[1]["tis_weight_mean"], 1.0, rtol=0,
                               atol=f32_tolerance(n, 1.0, chain=2, orders=1))
    assert same[1]["tis_clip_frac"] == 0.0 and metric_only[1]["tis_clip_frac"] == 0.0
    mask = batch["mask"]
    d = (batch["old_logp"] - batch["sampler_logp"])[mask].astype(np.float64)
    # Means of positive terms vs float64 (orders=1): their own magnitude, chain exp + sum.
    for key, terms in (("tis_weight_mean", np.exp(d)), ("sampler_kl", np.exp(d) - d - 1)):
        np.testing.assert_allclose(metric_only[1][key], np.mean(terms), rtol=0, atol=f32_tolerance(
            n, float(np.mean(np.exp(d) + np.abs(d) + 1)), chain=2, orders=1))


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
        # Fewer rows, other orders: the loss's bound over the whole 6 * 7 tokens; the
        # gradient norm-wise.
        atol = _atol(batch, loss_type, use_sampler=True, **kw)
        np.testing.assert_allclose(sub[0], whole[0], rtol=0, atol=atol)
        want = np.asarray(whole[2][0])[keep]
        np.testing.assert_allclose(sub[2][0], want, rtol=0, atol=f32_tolerance(
            batch["mask"].size, float(np.abs(want).max()), chain=3))


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
    eager = f(*args)
    # XLA fuses and reorders: the float32 bound over 5 * 7 tokens, values up to the metrics'.
    ref_kw = {k: v for k, v in static.items() if k != "loss_type"}
    atol = _atol(batch, "dapo", values=eager[1].values(), use_sampler=True, use_ref=False,
                 use_entropy=False, num_tokens_global=31, **ref_kw)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jax.jit(f)(*args))):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def test_entropy_bonus_value_and_gradient():
    batch = make_batch(seed=22)
    mask = batch["mask"]
    for loss_type in ("grpo", "dapo"):
        base, _, _ = run(batch, loss_type, max_completion_length=7)
        loss, metrics, (_, g_ent) = run(batch, loss_type, max_completion_length=7,
                                        entropy_coef=0.05)
        weights = ref_agg_weights(mask, loss_type)
        # Two float32 losses, each within its bound of the exact value (5 * 7 tokens).
        atol = _atol(batch, loss_type, max_completion_length=7, entropy_coef=0.05,
                     use_ref=False)
        np.testing.assert_allclose(loss - base, -0.05 * np.sum(weights * batch["entropy"]),
                                   rtol=0, atol=atol)
        # Elementwise: 0.05 over a token count, two roundings.
        np.testing.assert_allclose(g_ent, -0.05 * weights, rtol=0,
                                   atol=f32_tolerance(1, 0.05 * float(weights.max()), chain=2))
        # vs numpy's float32 mean: two orders over 5 * 7 terms in [0, 2].
        np.testing.assert_allclose(metrics["entropy"], batch["entropy"][mask].mean(), rtol=0,
                                   atol=f32_tolerance(mask.size, 2.0, chain=2))
