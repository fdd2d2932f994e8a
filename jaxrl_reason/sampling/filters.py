"""Token selection: temperature, top-k, top-p and greedy, all with traced parameters.

The parameters are ordinary (traced) arrays, so changing them never recompiles the sampler.
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
    filtered = filter_logprobs(logprobs, top_k, top_p)
    sampled = jax.random.categorical(rng, filtered, axis=-1)
    greedy = jnp.argmax(logprobs, axis=-1)
    tokens = jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen
