"""Scoring given completions: per-token log-probs and entropies of a prompt + completion batch.

Used by SFT (the loss), the RL trainer (policy, old and reference log-probs) and evaluation.
The layout is the sampler's: prompts left-padded to a bucket, completions right-padded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import platform
from jaxrl_reason.kernels.logprobs import chunked_logprobs, token_logprobs
from jaxrl_reason.models.transformer import Transformer


def sequence_inputs(prompt_tokens, prompt_valid, completion_tokens, completion_mask):
    """Concatenates prompt and completion into model inputs.

    Args:
      prompt_tokens: int32 [N, Tp] left-padded; prompt_valid: bool [N, Tp].
      completion_tokens: int32 [N, L] right-padded; completion_mask: bool/f32 [N, L].
    Returns: (tokens int32 [N, Tp+L], positions int32 [N, Tp+L], valid bool [N, Tp+L]).
    """
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    valid = jnp.concatenate([prompt_valid, completion_mask.astype(bool)], axis=1)
    positions = jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
    return tokens, positions, valid


def logprobs_impl(cfg) -> str:
    """"full", "chunked" or "pallas" for a ModelConfig ("auto": chunked on TPU/GPU, full on
    CPU)."""
    if cfg.logprobs_impl != "auto":
        return cfg.logprobs_impl
    return "chunked" if platform.compiles_kernels() else "full"


def _pallas_logprobs(hidden, unembedding, targets, *, temperature, softcap, with_entropy,
                     mesh, batch_axes):
    """The Pallas log-prob kernels (Mosaic on TPU, Triton on GPU, interpreted elsewhere).

    Pallas kernels are not partitioned automatically: with a mesh, each device runs them on
    its rows under `shard_map` (hidden/targets split over `batch_axes`; the unembedding
    gathered, as every row needs every column).
    hidden [N, L, D], unembedding [D, V], targets int32 [N, L] -> (logp, entropy) f32 [N, L].
    """
    interpret = not platform.compiles_kernels()

    def call(h, w, y):
        return token_logprobs(h, w, y, impl="pallas", temperature=temperature, softcap=softcap,
                              with_entropy=with_entropy, interpret=interpret)

    if mesh is None or not batch_axes:
        return call(hidden, unembedding, targets)
    rows = jax.sharding.PartitionSpec(batch_axes)
    return jax.shard_map(call, mesh=mesh, in_specs=(rows, jax.sharding.PartitionSpec(), rows),
                         out_specs=(rows, rows), check_vma=False)(hidden, unembedding, targets)


def completion_logprobs(model: Transformer, params, prompt_tokens, prompt_valid,
                        completion_tokens, completion_mask, *, temperature: float = 1.0,
                        with_entropy: bool = True, mesh=None, batch_axes=None):
    """Log-probs (and entropies) of each completion token under the model.

    The distribution is log_softmax(logits / temperature), the same one the sampler reports,
    so that sampler and trainer log-probs are comparable.

    Args:
      model, params: the decoder and its params.
      prompt_tokens: int32 [N, Tp]; prompt_valid: bool [N, Tp] (left-padded).
      completion_tokens: int32 [N, L]; completion_mask: [N, L] (1 for real tokens).
      temperature: python float > 0.
      mesh, batch_axes: the mesh and the mesh axes of the row dim; used only by the "pallas"
        log-prob implementation (its kernels run per device under `shard_map`).
    Returns:
      logp f32 [N, L] (0 where masked) and entropy f32 [N, L] (zeros if not with_entropy).
    """
    tokens, positions, valid = sequence_inputs(prompt_tokens, prompt_valid, completion_tokens,
                                               completion_mask)
    prompt_len, length = prompt_tokens.shape[1], completion_tokens.shape[1]
    # Hidden states at the positions that predict the completion tokens.
    hidden, _ = model.apply({"params": params}, tokens[:, :-1], positions[:, :-1],
                            valid[:, :-1], return_hidden=True)
    hidden = hidden[:, prompt_len - 1: prompt_len - 1 + length]
    mask = completion_mask.astype(jnp.float32)
    impl = logprobs_impl(model.cfg)
    if impl == "pallas":
        unembedding = model.apply({"params": params}, method=Transformer.unembedding)
        logp, entropy = _pallas_logprobs(
            hidden, unembedding, completion_tokens, temperature=float(temperature),
            softcap=model.cfg.final_logit_softcap, with_entropy=with_entropy, mesh=mesh,
            batch_axes=batch_axes)
        return logp * mask, entropy * mask
    if impl == "chunked":  # never materializes [N, L, V] logits
        unembedding = model.apply({"params": params}, method=Transformer.unembedding)
        logp, entropy = chunked_logprobs(
            hidden, unembedding, completion_tokens, temperature=temperature,
            softcap=model.cfg.final_logit_softcap, with_entropy=with_entropy,
            seq_chunk=model.cfg.logprobs_seq_chunk, vocab_chunk=model.cfg.logprobs_vocab_chunk)
        return logp * mask, entropy * mask
    logits = model.apply({"params": params}, hidden, method=Transformer.logits)
    logprobs = jax.nn.log_softmax(logits / temperature, axis=-1)
    logp = jnp.take_along_axis(logprobs, completion_tokens[..., None], axis=-1)[..., 0]
    if with_entropy:
        entropy = -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)
    else:
        entropy = jnp.zeros_like(logp)
    return logp * mask, entropy * mask


def completion_mask_from_lengths(lengths: jax.Array, length: int) -> jax.Array:
    """lengths int32 [N] -> f32 [N, length] with 1 for the first lengths[i] tokens."""
    return (jnp.arange(length)[None, :] < lengths[:, None]).astype(jnp.float32)
