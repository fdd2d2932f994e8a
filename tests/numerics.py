"""Tolerances for comparing float32 results, from a rounding-error bound instead of one
machine's last digits.

Two float32 programs that compute the same value in different orders (another batching,
chunking, sharding, cache length, kernel against reference) round differently. The standard
bound for recursive summation (Higham, "Accuracy and Stability of Numerical Algorithms",
2nd ed., eqs. 3.4-3.5 and 4.4) holds for any order of the additions:

    |fl(x_1 + ... + x_n) - (x_1 + ... + x_n)| <= gamma_n * (|x_1| + ... + |x_n|)
    |fl(x . y) - x . y|                       <= gamma_n * (|x_1 y_1| + ... + |x_n y_n|)
    gamma_n = n u / (1 - n u),   u = 2**-24 (float32, round to nearest)

so it depends on the reduction length n and on the magnitude sum |x_i| of the summed
terms, not on the value itself (cancellation makes the value small, not the error).

`f32_tolerance` turns that into an absolute tolerance for `assert_allclose(atol=...)`:

    atol = orders * chain * gamma_n * magnitude

  - orders: 2 when both sides are float32 computations (each may be off by the bound, in
    opposite directions), 1 against an exact or float64 reference.
  - chain: how many such reductions the value passes through one after another (e.g. the
    layers of a network, then a logsumexp). To first order their errors add; each stage's
    error reaches the output scaled by at most the output's terms' magnitude when the
    stages in between preserve relative size (normalization, softmax, residual adds), which
    is the assumption this factor encodes.

For a value whose terms all have one sign (a softmax denominator, a sum of squares, a
norm) the magnitude is the value itself, and `f32_tolerance(n, 1.0, ...)` is a relative
tolerance for `rtol=`.

The bound is worst case (it grows like n u; random rounding errors grow like sqrt(n) u), so
a result outside it is a bug, not unlucky rounding.

Model-level helpers apply it with magnitudes read from the parameters: `rms_projection_bound`
(the terms of a projection of an RMS-normed vector, by Cauchy-Schwarz), `decoder_tolerance`
(log-probs or logits), `decoder_grad_tolerance`, `kv_cache_tolerance`,
`value_head_tolerance`, and `attention_tolerance` / `attention_loss_tolerances`;
`assert_update_metrics_close` compares two policy updates' metrics with them.
"""
from __future__ import annotations

import jax
import numpy as np
from flax.core import meta

__all__ = ["F32_UNIT_ROUNDOFF", "gamma", "f32_tolerance", "abs_matmul_magnitude",
           "logit_terms_bound", "rms_projection_bound", "decoder_tolerance",
           "decoder_grad_tolerance", "attention_tolerance", "attention_loss_tolerances",
           "kv_cache_tolerance", "value_head_tolerance",
           "group_advantage_tolerance", "policy_loss_magnitudes", "policy_loss_tolerances",
           "logprobs_tolerances", "assert_update_metrics_close"]

F32_UNIT_ROUNDOFF = 2.0 ** -24


def gamma(n: int, u: float = F32_UNIT_ROUNDOFF) -> float:
    """gamma_n = n u / (1 - n u), the relative error bound of a length-n sum or dot product.

    Args:
      n: int >= 1, the reduction length.
      u: the unit roundoff (float32 by default).
    Returns:
      python float.
    Raises:
      ValueError: n < 1, or n u >= 1 (the bound does not exist).
    """
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"gamma: reduction length must be an int >= 1, got {n!r}")
    if n * u >= 1.0:
        raise ValueError(f"gamma: n * u = {n * u} >= 1, no bound for n = {n}")
    return n * u / (1.0 - n * u)


def f32_tolerance(reduction_length: int, magnitude: float, *, chain: int = 1,
                  orders: int = 2) -> float:
    """Absolute tolerance between two float32 evaluations of one value (module docstring).

    Args:
      reduction_length: int, the longest sum or dot product in the computation.
      magnitude: float >= 0, an upper bound of sum |x_i| over the summed terms, in the units
        of the compared value (1.0 gives a relative tolerance when the terms share a sign).
      chain: int >= 1, how many reductions the value passes through one after another.
      orders: 2 if both sides are float32 computations, 1 against an exact/float64 reference.
    Returns:
      python float: orders * chain * gamma(reduction_length) * magnitude.
    Raises:
      ValueError: a negative or non-finite magnitude, chain < 1, or orders not in (1, 2).
    """
    if not np.isfinite(magnitude) or magnitude < 0:
        raise ValueError(f"f32_tolerance: magnitude must be finite and >= 0, got {magnitude!r}")
    if not isinstance(chain, (int, np.integer)) or chain < 1:
        raise ValueError(f"f32_tolerance: chain must be an int >= 1, got {chain!r}")
    if orders not in (1, 2):
        raise ValueError(f"f32_tolerance: orders must be 1 or 2, got {orders!r}")
    return float(orders * chain * gamma(reduction_length) * magnitude)


def abs_matmul_magnitude(x, w) -> float:
    """The magnitude of the terms of x @ w: max over outputs of sum_i |x_..i| |w_ij|.

    Args:
      x: array [..., n]; w: array [n, m] (any float dtype; computed in float64).
    Returns:
      python float, the `magnitude` argument of `f32_tolerance` for the entries of x @ w.
    """
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    if w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"abs_matmul_magnitude: shapes {x.shape} @ {w.shape} do not match")
    return float((np.abs(x) @ np.abs(w)).max(initial=0.0))


def logit_terms_bound(cfg, params) -> float:
    """An upper bound of sum_i |h_i W_ij| over every logit of a decoder, from its params.

    `rms_projection_bound` of the final norm and the unembedding; a final soft-cap only
    shrinks the logits.

    Args:
      cfg: the `ModelConfig`; params: its params (a dict of arrays, as `init_params` gives).
    Returns:
      python float.
    """
    params = meta.unbox(params)  # flax's LogicallyPartitioned boxes, if any
    if cfg.tie_embeddings:
        kernel = np.asarray(params["embedding"], np.float64).T  # [D, V]
    else:
        kernel = params["lm_head"]
    return rms_projection_bound(params["final_norm"]["scale"], kernel,
                                plus_one=cfg.norm_plus_one)


def rms_projection_bound(scale, kernel, *, plus_one: bool = False) -> float:
    """An upper bound of sum_i |h_i W_i...| for h = RMSNorm(x) of width d projected by W.

    ||h||_2 <= sqrt(d) * max |scale| (1 + scale with `plus_one`), and by Cauchy-Schwarz
    sum_i |h_i W_ij| <= ||h||_2 * ||W_:j||_2.

    Args:
      scale: the norm's scale [d]; kernel: [d, ...] (trailing dims are the outputs).
    Returns:
      python float.
    """
    scale = np.asarray(scale, np.float64) + (1.0 if plus_one else 0.0)
    kernel = np.asarray(kernel, np.float64)
    kernel = kernel.reshape(kernel.shape[0], -1)
    if kernel.shape[0] != scale.shape[-1]:
        raise ValueError(f"rms_projection_bound: scale {scale.shape} vs kernel {kernel.shape}")
    return float(np.sqrt(scale.shape[-1]) * np.abs(scale).max()
                 * np.sqrt((kernel ** 2).sum(0)).max())


def decoder_tolerance(cfg, params, *, tokens: int, temperature: float = 1.0,
                      orders: int = 2) -> float:
    """`f32_tolerance` for a decoder's log-probs computed in two summation orders.

    n is the longest reduction of the forward (d_model, mlp_hidden, the attention width
    n_heads * head_dim, the `tokens` attended, the vocabulary's log-softmax); the magnitude
    is `logit_terms_bound` / temperature; the chain is two reductions per layer (attention,
    MLP) plus the unembedding and the log-softmax. An entropy H = -sum_j p_j log p_j moves by
    at most max |d log p| * H <= max |d log p| * log V, so multiply by log(vocab_size) for
    entropies.

    Args:
      cfg, params: the model; tokens: int, the sequence length attended over;
      temperature: the log-softmax's temperature; orders: as in `f32_tolerance`.
    Returns:
      python float, an absolute tolerance for log-probs.
    """
    n = max(cfg.d_model, cfg.mlp_hidden, cfg.n_heads * cfg.head_dim, tokens, cfg.vocab_size)
    return f32_tolerance(n, logit_terms_bound(cfg, params) / temperature,
                         chain=2 * cfg.n_layers + 2, orders=orders)


def decoder_grad_tolerance(cfg, grads, *, tokens: int, rows: int) -> float:
    """`f32_tolerance` for a decoder's parameter gradients computed in two orders.

    The backward pass runs the forward's reductions again, transposed (chain doubled), and
    sums each weight's gradient over the rows * tokens positions. Its errors are norm-wise:
    they mix across layers through the chain, so the magnitude is the largest gradient entry
    of the whole tree, not the entry itself.

    Args:
      cfg: the `ModelConfig`; grads: a pytree of gradient arrays (either side's);
      tokens: int, sequence length; rows: int, sequences in the batch.
    Returns:
      python float, an absolute tolerance for every gradient entry.
    """
    n = max(cfg.d_model, cfg.mlp_hidden, cfg.n_heads * cfg.head_dim, tokens, cfg.vocab_size,
            rows * tokens)
    largest = max(float(np.abs(np.asarray(g, np.float64)).max(initial=0.0))
                  for g in jax.tree.leaves(meta.unbox(grads)))
    return f32_tolerance(n, largest, chain=2 * (2 * cfg.n_layers + 2))



def _score_terms(q, k, scale: float) -> float:
    """An upper bound of sum_d |q_d k_d| * scale over every (query, key) pair, for any
    layout whose last dim is head_dim: sum_d max|q_.d| max|k_.d| * scale."""
    hd = np.shape(q)[-1]
    qmax = np.abs(np.asarray(q, np.float64)).reshape(-1, hd).max(0)
    kmax = np.abs(np.asarray(k, np.float64)).reshape(-1, hd).max(0)
    return float(qmax @ kmax) * scale


def attention_tolerance(q, k, v, *, keys: int, scale: float) -> float:
    """`f32_tolerance` for one entry of softmax(q k^T * scale) v computed in two orders.

    Three reductions: the scores (length head_dim, terms sum |q_d k_d| * scale, an error
    that scales v's weights: x2 through the softmax), the softmax's sum and the weighted sum
    (length `keys`, terms of at most max |v| since the weights sum to 1). A soft-cap only
    shrinks the scores.

    Args:
      q, k, v: arrays with head_dim last (any layout); keys: int, keys attended;
      scale: the scores' multiplier (head_dim ** -0.5 by default).
    Returns:
      python float.
    """
    vmax = float(np.abs(np.asarray(v, np.float64)).max())
    n = max(np.shape(q)[-1], keys)
    return f32_tolerance(n, vmax * (1.0 + 2.0 * _score_terms(q, k, scale)), chain=3)


def attention_loss_tolerances(q, k, v, cot, grads, *, keys: int, queries: int,
                              scale: float) -> tuple[float, float]:
    """Tolerances of loss = sum(attention(q, k, v) * cot) and of its gradients (q, k, v).

    The loss: each entry's `attention_tolerance` times sum |cot|, plus the final sum over
    cot.size terms. The gradients run the chain transposed (6 reductions, the longest over
    the `queries` rows summed into dk and dv); their error is norm-wise: relative to the
    largest gradient entry, times the same score factor as the values.

    Args:
      q, k, v, cot: arrays; grads: the reference's (dq, dk, dv); keys, queries: ints;
      scale: as in `attention_tolerance`.
    Returns:
      (loss atol, gradient atol), python floats.
    """
    entry = attention_tolerance(q, k, v, keys=keys, scale=scale)
    cot_sum = float(np.abs(np.asarray(cot, np.float64)).sum())
    vmax = float(np.abs(np.asarray(v, np.float64)).max())
    loss_atol = cot_sum * entry + f32_tolerance(int(np.size(cot)), cot_sum * (vmax + entry))
    largest = max(float(np.abs(np.asarray(g, np.float64)).max()) for g in grads)
    n = max(np.shape(q)[-1], keys, queries)
    grad_atol = f32_tolerance(n, largest * (1.0 + 2.0 * _score_terms(q, k, scale)), chain=6)
    return loss_atol, grad_atol


def kv_cache_tolerance(cfg, params, *, tokens: int) -> float:
    """`f32_tolerance` for a decoder's cached keys and values computed in two orders.

    Per layer, k = k_proj(attn_norm(x)) (or k_norm's output, of width head_dim) rotated by
    RoPE, whose entries mix two (x2), and v = v_proj(attn_norm(x)): `rms_projection_bound`
    of each; the chain runs through every layer before the last.

    Args:
      cfg: the `ModelConfig` (unscanned params: `layer_<i>` entries); params: its params;
      tokens: int, the sequence length attended over.
    Returns:
      python float, an absolute tolerance for every cache entry.
    """
    params = meta.unbox(params)
    bounds = []
    for layer in range(cfg.n_layers):
        p = params[f"layer_{layer}"]
        norm = p["attn_norm"]["scale"]
        bounds.append(rms_projection_bound(norm, p["attn"]["v_proj"]["kernel"],
                                           plus_one=cfg.norm_plus_one))
        if cfg.qk_norm:
            scale = np.asarray(p["attn"]["k_norm"]["scale"], np.float64) + cfg.norm_plus_one
            bounds.append(2.0 * np.sqrt(cfg.head_dim) * float(np.abs(scale).max()))
        else:
            bounds.append(2.0 * rms_projection_bound(norm, p["attn"]["k_proj"]["kernel"],
                                                     plus_one=cfg.norm_plus_one))
    n = max(cfg.d_model, cfg.mlp_hidden, cfg.n_heads * cfg.head_dim, tokens)
    return f32_tolerance(n, max(bounds), chain=2 * cfg.n_layers)


def value_head_tolerance(cfg, params, *, tokens: int) -> float:
    """`f32_tolerance` for a value model's outputs (trunk + linear head [D] -> 1) in two
    orders: the head's terms by `rms_projection_bound` of the trunk's final norm and the head
    kernel (plus |bias|), the chain through every layer and the head.

    Args:
      cfg: the policy's `ModelConfig`; params: {"trunk": ..., "head": {"kernel", "bias"}};
      tokens: int, the sequence length attended over.
    Returns:
      python float.
    """
    params = meta.unbox(params)
    head = params["head"]
    magnitude = rms_projection_bound(params["trunk"]["final_norm"]["scale"], head["kernel"],
                                     plus_one=cfg.norm_plus_one)
    magnitude += float(np.abs(np.asarray(head["bias"], np.float64)).max())
    n = max(cfg.d_model, cfg.mlp_hidden, cfg.n_heads * cfg.head_dim, tokens)
    return f32_tolerance(n, magnitude, chain=2 * cfg.n_layers + 1)


def group_advantage_tolerance(rewards, group_size: int, *, estimator: str = "grpo",
                              scale: str = "group", eps: float = 1e-6, ddof: int = 0,
                              orders: int = 2) -> dict:
    """`f32_tolerance`s for `group_advantages` / `group_stats` computed in two orders.

    R = max |r|. Per side: the group mean is a sum of G terms and a division (gamma_G R
    + u R); the centered value c (group mean, leave-one-out mean with its G/(G-1) <= 2,
    or the batch mean over N) is off by dc = 3 gamma_n 2R; a std over n values of size <= X
    by 3 gamma_n X (its mean, its sum of squares, the sqrt and the division), plus dc when
    it is the std of the centered values ("batch" scale, X = 2R). The advantage
    a = c / (s + eps) is then off by (dc + |a| ds) / (s + eps) + u |a|, taken at the float64
    s and a of every sample. Zero-variance groups give exactly 0 on both sides.

    Args:
      rewards: float array [N]; group_size: int G dividing N; estimator, scale, eps, ddof:
        as `group_advantages` takes them; orders: as in `f32_tolerance`.
    Returns:
      dict of python floats: "advantages", "mean" and "std" (of `group_stats`) atols.
    """
    r = np.asarray(rewards, np.float64).reshape(-1, group_size)
    big_r, n_all = float(np.abs(r).max(initial=0.0)), r.size
    u = F32_UNIT_ROUNDOFF

    def std(x, axis):
        n = x.size if axis is None else x.shape[axis]
        d = x - x.mean(axis=axis, keepdims=True)
        return np.sqrt((d * d).sum(axis=axis) / max(n - ddof, 1))

    n_c = n_all if estimator == "reinforce_pp" else group_size
    if estimator == "rloo":
        c = (r - (r.sum(1, keepdims=True) - r) / max(group_size - 1, 1))
    elif estimator == "reinforce_pp":
        c = r - r.mean()
    else:
        c = r - r.mean(1, keepdims=True)
    dc = 3 * gamma(n_c) * 2 * big_r
    if scale == "group":
        s = np.broadcast_to(std(r, 1)[:, None], r.shape)
        ds = 3 * gamma(group_size) * big_r
    elif scale == "batch":
        s = np.full(r.shape, std(c, None))
        ds = dc + 3 * gamma(n_all) * 2 * big_r
    else:  # no scaling: a = c
        s, ds, eps = np.ones(r.shape), 0.0, 0.0
    live = s > 0  # elsewhere both sides give exactly 0
    a = np.where(live, c / np.where(live, s + eps, 1.0), 0.0)
    adv = np.where(live, (dc + np.abs(a) * ds) / np.where(live, s + eps, 1.0) + u * np.abs(a),
                   0.0)
    return {"advantages": float(orders * adv.max(initial=0.0)),
            "mean": f32_tolerance(group_size, big_r, chain=2, orders=orders),
            "std": f32_tolerance(group_size, big_r, chain=3, orders=orders)}


def policy_loss_magnitudes(x, beta=0.05, entropy_coef=0.01, *, epsilon_high=0.28,
                           clip_ratio_c=None):
    """For a policy loss's inputs x (a dict of [B, L] "logp", "old_logp", "mask", optional
    "ref_logp" and "entropy", and "advantages" [B] or [B, L]):
    (n, magnitudes): the token count B * L and, per output ("loss", "pg_loss", each
    metric, "default" for the rest), an upper bound of |term| over the masked tokens, in
    float64: every aggregation weighs the tokens by weights summing to at most 1 (a metric
    is a mean), so that is the magnitude (sum of |weight * term|) of the weighted sum.

    pg term: (1 + epsilon_high) * A where A > 0; max(ratio, 1) * |A| where A < 0, capped
    at clip_ratio_c * |A| with the dual clip (ratio = exp(logp - old_logp)). The loss adds
    beta * kl + entropy_coef * entropy, every KL estimator below exp|d| + |d| + d^2 / 2 + 1
    (d = ref_logp - logp). The clip fractions count tokens (terms 0 or 1).
    """
    mask = np.asarray(x["mask"])
    f64 = lambda k: np.where(mask, np.asarray(x[k], np.float64), 0.0)  # noqa: E731
    ratio = np.where(mask, np.exp(f64("logp") - f64("old_logp")), 0.0)
    adv = np.broadcast_to(np.asarray(x["advantages"], np.float64).reshape(
        mask.shape[0], -1), mask.shape)
    neg = np.maximum(ratio, 1.0) if clip_ratio_c is None else np.clip(ratio, 1.0, clip_ratio_c)
    pg = np.where(mask, np.abs(adv) * np.where(adv > 0, 1.0 + epsilon_high, neg), 0.0)
    kl = ent = 0.0
    if x["ref_logp"] is not None:
        d = np.abs(f64("ref_logp") - f64("logp"))
        kl = float(np.where(mask, np.exp(d) + d + d * d / 2 + 1, 0.0).max(initial=0.0))
    if x["entropy"] is not None:
        ent = float(np.abs(f64("entropy")).max(initial=0.0))
    pg, ratio = float(pg.max(initial=0.0)), float(ratio.max(initial=1.0))
    loss = pg + abs(float(beta)) * kl + entropy_coef * ent
    return mask.size, {"loss": loss, "pg_loss": pg, "ratio_mean": ratio, "ratio_max": ratio,
                       "kl": kl, "entropy": ent, "clip_frac_low": 1.0, "clip_frac_high": 1.0,
                       "clip_frac_dual": 1.0, "default": max(loss, ratio, kl, ent)}


def policy_loss_tolerances(x, beta=0.05, entropy_coef=0.01, **clip) -> dict:
    """{output: float32 bound} of the loss and metrics, kernel vs reference: weighted sums of
    n terms (`policy_loss_magnitudes`), chain 3 (per row, over rows, the normalization and the
    elementwise ops); far below a wrong formula's change (the size of the terms)."""
    n, magnitudes = policy_loss_magnitudes(x, beta, entropy_coef, **clip)
    return {k: f32_tolerance(n, m, chain=3) for k, m in magnitudes.items()}


def logprobs_tolerances(hidden, w, temperature, want) -> list:
    """`f32_tolerance`s of (logp, entropy, d hidden, d unembedding) of log-probs from
    hidden [B, L, D] and an unembedding w [D, V] at `temperature`, computed in two orders;
    want: the reference's four arrays (their largest entries scale the gradients' bounds).

    Logits: a length-D dot product whose terms sum to at most abs_matmul_magnitude(h, W) / T
    (a soft-cap only shrinks them), then the length-V log-softmax (the log of a sum of
    positive terms, off by gamma_V absolute): chain 2, n = max(D, V).
    The entropy moves by at most log V times that. The gradients run those reductions again,
    transposed, and dW sums over the B * L rows: chain 4, n = max(D, V, B * L), norm-wise
    relative to the largest entry (x (1 + 2 logit terms): a logit error scales p).
    """
    batch, length, dim = hidden.shape
    vocab = w.shape[1]
    terms = abs_matmul_magnitude(np.asarray(hidden, np.float32).reshape(-1, dim),
                                 np.asarray(w, np.float32)) / temperature
    logp = f32_tolerance(max(dim, vocab), terms + 1.0, chain=2)  # + 1: log of the sum
    n_grad = max(dim, vocab, batch * length)
    grads = [f32_tolerance(n_grad, float(np.abs(np.asarray(g, np.float64)).max())
                           * (1.0 + 2.0 * terms), chain=4) for g in want[2:]]
    return [logp, logp * max(1.0, float(np.log(vocab))), *grads]


def assert_update_metrics_close(want: dict, got: dict, x: dict, *, beta: float,
                                entropy_coef: float, epsilon_high: float, logp_atol: float,
                                grad_norm_atol: float | None = None) -> None:
    """Assert two policy updates of one batch (e.g. padded and packed, context 1 and 4) give
    the same metrics within float32 reordering bounds.

    The two sides' log-probs differ by at most `logp_atol`; each loss/metric term moves by at
    most its `policy_loss_magnitudes` magnitude (a bound of |d term / d logp| too) times
    that (x4: the ratio, the KL and the entropy each see the log-prob change), plus the
    loss's own summation-order bound (`policy_loss_tolerances`). The clip fractions and
    "update_skipped" count tokens and are not compared; "grad_norm" is compared at
    `grad_norm_atol`, or not at all when it is None. Also asserts both sides report the
    same metric names and that the loss is not ~0 (so the comparison is a real one).

    Args:
      want, got: {metric name: scalar} of the two updates (host values).
      x: the loss's inputs as `policy_loss_magnitudes` takes them ([B, L] float32 "logp",
        "old_logp", "ref_logp", "mask", [B] "advantages", "entropy" or None).
      beta, entropy_coef, epsilon_high: the loss's coefficients (rl config).
      logp_atol: python float, the bound on the two sides' log-prob difference.
      grad_norm_atol: python float or None.
    Raises:
      AssertionError: naming the metric that differs, or the metric names that differ.
    """
    assert set(got) == set(want), f"metric names differ: {sorted(set(got) ^ set(want))}"
    assert abs(float(want["loss"])) > 1e-3, f"loss {float(want['loss'])} is ~0"
    _, magnitudes = policy_loss_magnitudes(x, beta, entropy_coef, epsilon_high=epsilon_high)
    sums = policy_loss_tolerances(x, beta, entropy_coef, epsilon_high=epsilon_high)
    for name in want:
        if name.startswith("clip_frac") or name == "update_skipped":  # counts of tokens
            continue
        if name == "grad_norm":
            if grad_norm_atol is not None:
                np.testing.assert_allclose(got[name], want[name], rtol=0,
                                           atol=grad_norm_atol, err_msg=name)
            continue
        key = name if name in magnitudes else "default"
        atol = sums[key] + (magnitudes[key] + 1.0) * logp_atol * 4
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=atol, err_msg=name)
