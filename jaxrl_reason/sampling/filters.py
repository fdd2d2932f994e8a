"""Token selection: temperature, top-k, top-p and greedy, all with traced parameters.

The parameters are ordinary (traced) arrays, so changing them never recompiles the sampler;
`lax.cond`s on them skip the work a setting does not need (the vocabulary sort when top-k and
top-p are off, the sampling when greedy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -1e30


def scaled_logprobs(logits: jax.Array, temperature) -> jax.Array:
    """log_softmax(logits / T) in float32; T <= 0 (greedy) uses T = 1.

    Args:
      logits: [N, V] float.
      temperature: f32 scalar.
    Returns: f32 [N, V], the distribution the policy's log-probs are measured in.
    """
    t = jnp.where(temperature > 0, temperature, 1.0)
    return jax.nn.log_softmax(logits.astype(jnp.float32) / t, axis=-1)


def filter_logprobs(logprobs: jax.Array, top_k, top_p) -> jax.Array:
    """Masks tokens outside the top-k and the top-p nucleus (to -inf-like values).

    Args:
      logprobs: f32 [N, V] normalized log-probs.
      top_k: int32 scalar; 0 disables.
      top_p: f32 scalar in (0, 1]; 1 disables. The most likely token is always kept.
    Returns: f32 [N, V] unnormalized filtered log-probs.
    """
    vocab = logprobs.shape[-1]
    sorted_lp = jnp.sort(logprobs, axis=-1)[:, ::-1]  # descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_lp, jnp.broadcast_to(k - 1, (logprobs.shape[0], 1)), axis=-1)
    probs = jnp.exp(sorted_lp)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    in_nucleus = mass_before < top_p
    # Smallest log-prob still inside the nucleus, per row.
    nucleus_min = jnp.min(jnp.where(in_nucleus, sorted_lp, jnp.inf), axis=-1, keepdims=True)
    threshold = jnp.maximum(kth, nucleus_min)
    return jnp.where(logprobs >= threshold, logprobs, _NEG_INF)


def _filter_if_enabled(logprobs: jax.Array, top_k, top_p) -> jax.Array:
    """`filter_logprobs`, or `logprobs` unchanged (no sort) when top-k and top-p are off.

    The test is on traced values (one `lax.cond`), so switching the filters on and off does
    not recompile; with both off the full-vocabulary sort is skipped, which on CPU is the
    most expensive operation of a decode step at V = 8192.
    """
    enabled = (top_k > 0) | (top_p < 1.0)
    return jax.lax.cond(enabled, lambda lp: filter_logprobs(lp, top_k, top_p),
                        lambda lp: lp, logprobs)


def sample_inverse_cdf(rng: jax.Array, logprobs: jax.Array) -> jax.Array:
    """One token per row, drawn with probability proportional to exp(logprobs).

    Inverse-CDF sampling: one uniform per row against the running sum of the probabilities,
    instead of `jax.random.categorical`'s Gumbel noise for every vocabulary entry (4x cheaper
    on CPU at V = 8192: one random number per row instead of V). Entries at -inf-like values
    (filtered out) have probability 0 and are never drawn.

    Args:
      rng: PRNG key.
      logprobs: f32 [N, V] (log-probs, normalized or not; the row maximum must be finite).
    Returns: int32 [N].
    """
    probs = jnp.exp(logprobs - jnp.max(logprobs, axis=-1, keepdims=True))
    cdf = jnp.cumsum(probs, axis=-1)
    u = jax.random.uniform(rng, (logprobs.shape[0], 1), jnp.float32) * cdf[:, -1:]
    # The first index whose running sum exceeds u (a zero-probability entry never does).
    index = jnp.sum((cdf <= u).astype(jnp.int32), axis=-1)
    return jnp.minimum(index, logprobs.shape[-1] - 1).astype(jnp.int32)


def select_tokens(rng: jax.Array, logits: jax.Array, temperature, top_k, top_p):
    """Chooses one token per row.

    Args:
      rng: PRNG key.
      logits: [N, V].
      temperature: f32 scalar; <= 0 means greedy (argmax).
      top_k, top_p: see `filter_logprobs`.
    Returns:
      tokens int32 [N] and their log-probs f32 [N] under `scaled_logprobs` (the unfiltered
      tempered policy, which is what the trainer recomputes).
    """
    logprobs = scaled_logprobs(logits, temperature)

    def sample():
        return sample_inverse_cdf(rng, _filter_if_enabled(logprobs, top_k, top_p))

    def greedy():
        return jnp.argmax(logprobs, axis=-1).astype(jnp.int32)

    tokens = jax.lax.cond(temperature > 0, sample, greedy)
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen
