"""The loss family's float64 reference: `reference(batch, loss_type, ...)` computes
policy_loss's value and metrics from the papers' formulas with explicit NumPy loops, for
tests/rl/test_losses.py and test_loss_modes.py to check the jnp implementation against; with
the shared batch builder (`make_batch`), the runner (`run`) and the comparison
(`assert_matches`)."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from numerics import f32_tolerance

from jaxrl_reason.rl.losses import policy_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28
METRICS = ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "kl", "entropy",
           "pg_loss")


# ----------------------------------------------------------------------------- reference


def ref_kl(est, lp, ref):
    """(value, d value / d lp) of one token's KL estimate."""
    if est == "k1":
        return lp - ref, 1.0
    if est == "k2":
        return 0.5 * (lp - ref) ** 2, lp - ref
    d = ref - lp
    return math.exp(d) - d - 1.0, 1.0 - math.exp(d)


def ref_agg_weights(mask, loss_type, max_completion_length=None, num_tokens_global=None,
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
    """Loss, metrics, d loss / d logp, d loss / d entropy, one token at a time (float64), and
    the magnitudes for `assert_matches`' float32 bound: {"n": B * L, "loss", "pg_loss":
    sum of |weight * term| over the terms, "kl": mean |kl|}."""
    logp, old, adv, mask, ref, ent = (np.asarray(batch[k], np.float64) for k in
                                      ("logp", "old_logp", "advantages", "mask", "ref_logp",
                                       "entropy"))
    samp = np.asarray(batch["sampler_logp"], np.float64) if use_sampler else None
    b_size, length = logp.shape
    tok = np.zeros((b_size, length))
    pg = np.zeros((b_size, length))
    dtok = np.zeros((b_size, length))
    counts = dict(low=0, high=0, dual=0, n=0, ratio=0.0, kl=0.0, ent=0.0, skl=0.0, w=0.0,
                  capped=0, abs_kl=0.0)
    tok_abs = np.zeros((b_size, length))  # |pg| + beta |kl| + entropy_coef |entropy|
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
            tok_abs[b, t] = abs(pg[b, t])
            if use_ref:
                kl, dkl = ref_kl(kl_estimator, logp[b, t], ref[b, t])
                tok[b, t] += beta * kl
                tok_abs[b, t] += abs(beta * kl)
                dtok[b, t] += beta * dkl
                counts["kl"] += kl
                counts["abs_kl"] += abs(kl)
            if use_entropy:
                tok[b, t] -= entropy_coef * ent[b, t]
                tok_abs[b, t] += abs(entropy_coef * ent[b, t])
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

    weights = ref_agg_weights(mask, loss_type, max_completion_length, num_tokens_global,
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
    magnitudes = {"n": b_size * length, "loss": float(np.sum(np.abs(weights) * tok_abs)),
                  "pg_loss": float(np.sum(np.abs(weights * pg))), "kl": counts["abs_kl"] / n}
    return (float(np.sum(weights * tok)), metrics, weights * dtok,
            -entropy_coef * weights if use_entropy else None, magnitudes)


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
    """float32 `run` output vs the float64 `reference` (orders=1): every value is a weighted
    sum of n = B * L token terms (chain 3: elementwise exp/clip ops, the row sums, the
    normalization); its magnitude is the sum of |weight * term| (`reference`'s magnitudes;
    a mean of terms of one sign, as most metrics are, is its own magnitude). The gradients
    are elementwise but for the normalizers and GSPO's row mean: norm-wise, relative to
    their largest entry."""
    loss, metrics, (g_logp, g_ent) = got
    w_loss, w_metrics, w_logp, w_ent, mags = want

    def atol(magnitude):
        return f32_tolerance(mags["n"], magnitude, chain=3, orders=1)

    np.testing.assert_allclose(loss, w_loss, rtol=0, atol=atol(mags["loss"]))
    assert set(metrics) == set(w_metrics) and set(METRICS) <= set(metrics)
    for name in w_metrics:
        assert metrics[name].shape == () and metrics[name].dtype == jnp.float32, name
        np.testing.assert_allclose(metrics[name], w_metrics[name], rtol=0,
                                   atol=atol(mags.get(name, abs(w_metrics[name]))),
                                   err_msg=name)
    for g, w in ((g_logp, w_logp), (g_ent, w_ent)):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol(float(np.abs(w).max())))
