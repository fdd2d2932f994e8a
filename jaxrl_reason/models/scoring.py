"""Scoring given completions: per-token log-probs and entropies of a prompt + completion batch.

Used by SFT (the loss), the RL trainer (policy, old and reference log-probs) and evaluation.
The layout is the sampler's: prompts left-padded to a bucket, completions right-padded. The
prompts come one per completion row, or one per group of G consecutive rows (the sampler's
and the RL trainer's layout): each prompt then runs once and its KV cache serves its G
completions, as in the sampler's prefill.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import platform
from jaxrl_reason.kernels.logprobs import chunked_logprobs, token_logprobs
from jaxrl_reason.models.lora import dropout_rngs
from jaxrl_reason.models.params import constrain_cache, init_cache, pad_cache, repeat_cache
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.runtime import sharding as shd


def positions_from_valid(valid: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token; a pad after
    a real token keeps the position before it.

    valid: bool [B, T] -> int32 [B, T] (leading pads get 0).
    """
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)


def sequence_inputs(prompt_tokens, prompt_valid, completion_tokens, completion_mask):
    """Concatenates prompt and completion into model inputs.

    Args:
      prompt_tokens: int32 [N, Tp] left-padded; prompt_valid: bool [N, Tp].
      completion_tokens: int32 [N, L] right-padded; completion_mask: bool/f32 [N, L].
    Returns: (tokens int32 [N, Tp+L], positions int32 [N, Tp+L], valid bool [N, Tp+L]).
    """
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    valid = jnp.concatenate([prompt_valid, completion_mask.astype(bool)], axis=1)
    return tokens, positions_from_valid(valid), valid


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
    its rows under `shard_map` (hidden/targets split over `batch_axes`, and under context
    parallelism their positions over the context axis as the activations are, so no chip
    gathers the whole sequence; the unembedding gathered, as every row needs every column).
    hidden [N, L, D], unembedding [D, V], targets int32 [N, L] -> (logp, entropy) f32 [N, L].
    """
    interpret = not platform.compiles_kernels()

    def call(h, w, y):
        return token_logprobs(h, w, y, impl="pallas", temperature=temperature, softcap=softcap,
                              with_entropy=with_entropy, interpret=interpret)

    if mesh is None or not batch_axes:
        return call(hidden, unembedding, targets)
    rows = shd.active_spec(("batch", "length"), targets.shape)
    if rows is None:  # outside an activation-sharding context: rows over the batch axes
        rows = jax.sharding.PartitionSpec(batch_axes)
    return jax.shard_map(call, mesh=mesh, in_specs=(rows, jax.sharding.PartitionSpec(), rows),
                         out_specs=(rows, rows), check_vma=False)(hidden, unembedding, targets)


def packed_hidden(module, params, packs, *, share_prompts: bool, dropout_rng=None):
    """A decoder (`Transformer`, or a value model's trunk) on padding-free packs
    (`rl/packing.py`): its final hidden states f32/bf16 [K, T, D] from the pack_* int32
    [K, T] arrays (tokens, positions restarting per sequence, segment ids; with
    `share_prompts` the prompt segment each token also attends to).
    dropout_rng: the LoRA dropout key of a training pass, or None."""
    segments = packs["pack_segments"]
    hidden, _ = module.apply(
        {"params": params}, packs["pack_tokens"], packs["pack_positions"], segments > 0,
        return_hidden=True, segment_ids=segments,
        prompt_segment_ids=packs["pack_prompt_segments"] if share_prompts else None,
        rngs=dropout_rngs(dropout_rng, 0))
    return hidden


def completion_logprobs(model: Transformer, params, prompt_tokens, prompt_valid,
                        completion_tokens, completion_mask, *, temperature: float = 1.0,
                        with_entropy: bool = True, mesh=None, batch_axes=None,
                        dropout_rng=None):
    """Log-probs (and entropies) of each completion token under the model.

    The distribution is log_softmax(logits / temperature), the same one the sampler reports,
    so that sampler and trainer log-probs are comparable.

    Args:
      model, params: the decoder and its params.
      prompt_tokens: int32 [P, Tp]; prompt_valid: bool [P, Tp] (left-padded); P = N (a
        prompt per row) or N / G (a prompt per group of G consecutive rows, run once: see
        `completion_hidden`).
      completion_tokens: int32 [N, L]; completion_mask: [N, L] (1 for real tokens).
      temperature: python float > 0.
      mesh, batch_axes: the mesh and the mesh axes of the row dim; used only by the "pallas"
        log-prob implementation (its kernels run per device under `shard_map`).
      dropout_rng: the LoRA dropout key of a training pass (`lora.dropout_key`), or None
        (every other pass: no dropout).
    Returns:
      logp f32 [N, L] (0 where masked) and entropy f32 [N, L] (zeros if not with_entropy).
    """
    hidden = completion_hidden(model, params, prompt_tokens, prompt_valid, completion_tokens,
                               completion_mask, dropout_rng=dropout_rng)
    logp, entropy = hidden_logprobs(model, params, hidden, completion_tokens,
                                    temperature=temperature, with_entropy=with_entropy,
                                    mesh=mesh, batch_axes=batch_axes)
    mask = completion_mask.astype(jnp.float32)
    return logp * mask, entropy * mask


def hidden_logprobs(model: Transformer, params, hidden, targets, *, temperature: float = 1.0,
                    with_entropy: bool = True, mesh=None, batch_axes=None):
    """Log-probs of `targets` int32 [B, T] (and entropies) from final hidden states
    [B, T, D], by `logprobs_impl(model.cfg)`; f32 [B, T] each (entropy zeros if not
    with_entropy). Unmasked: every slot is scored."""
    impl = logprobs_impl(model.cfg)
    if impl == "pallas":
        unembedding = model.apply({"params": params}, method=Transformer.unembedding)
        return _pallas_logprobs(
            hidden, unembedding, targets, temperature=float(temperature),
            softcap=model.cfg.final_logit_softcap, with_entropy=with_entropy, mesh=mesh,
            batch_axes=batch_axes)
    if impl == "chunked":  # never materializes [B, T, V] logits
        unembedding = model.apply({"params": params}, method=Transformer.unembedding)
        return chunked_logprobs(
            hidden, unembedding, targets, temperature=temperature,
            softcap=model.cfg.final_logit_softcap, with_entropy=with_entropy,
            seq_chunk=model.cfg.logprobs_seq_chunk, vocab_chunk=model.cfg.logprobs_vocab_chunk)
    logits = model.apply({"params": params}, hidden, method=Transformer.logits)
    logprobs = jax.nn.log_softmax(logits / temperature, axis=-1)
    logp = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    if with_entropy:
        entropy = -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)
    else:
        entropy = jnp.zeros_like(logp)
    return logp, entropy


def completion_hidden(model: Transformer, params, prompt_tokens, prompt_valid,
                      completion_tokens, completion_mask, dropout_rng=None) -> jax.Array:
    """Final hidden states at the positions that predict each completion token.

    Args:
      prompt_tokens: int32 [P, Tp], prompt_valid: bool [P, Tp] (left-padded), where N = P * G:
        prompt i is that of completion rows i * G ... i * G + G - 1 (G = 1: one per row).
      completion_tokens: int32 [N, L]; completion_mask: [N, L] (1 for real tokens).
      dropout_rng: the LoRA dropout key of a training pass, or None (no dropout).
    Returns: hidden [N, L, D] in the model's dtype; hidden[:, j] predicts completion token j.

    With G > 1 each prompt runs once: its KV cache, repeated for its G rows (the gradient of
    the repeat sums over them), serves the completions, which run with cache_index = Tp.
    The values are those of the per-row pass (same keys, masks and positions; only float
    summation order may differ); the work drops from N (Tp + L - 1) token passes to
    P Tp + N (L - 1).
    """
    num_prompts, prompt_len = prompt_tokens.shape
    num_rows, length = completion_tokens.shape
    if num_rows % num_prompts:
        raise ValueError(f"{num_rows} completion rows cannot share {num_prompts} prompts: "
                         "need one prompt per row or per group of consecutive rows")
    group = num_rows // num_prompts

    def apply(*args, call=0):  # each apply of a training pass draws its own dropout masks
        return model.apply({"params": params}, *args, return_hidden=True,
                           rngs=dropout_rngs(dropout_rng, call))

    if group == 1:
        tokens, positions, valid = sequence_inputs(prompt_tokens, prompt_valid,
                                                   completion_tokens, completion_mask)
        hidden, _ = apply(tokens[:, :-1], positions[:, :-1], valid[:, :-1])
        return hidden[:, prompt_len - 1: prompt_len - 1 + length]
    prompt_hidden, cache = apply(prompt_tokens, positions_from_valid(prompt_valid),
                                 prompt_valid, init_cache(model.cfg, num_prompts, prompt_len), 0)
    first = jnp.repeat(prompt_hidden[:, -1:], group, axis=0)          # predicts token 0
    if length == 1:
        return first
    cache = constrain_cache(pad_cache(repeat_cache(cache, group), length - 1))
    key_valid = jnp.concatenate([jnp.repeat(prompt_valid, group, axis=0),
                                 completion_mask[:, :-1].astype(bool)], axis=1)
    positions = positions_from_valid(key_valid)[:, prompt_len:]       # the per-row pass's
    hidden, _ = apply(completion_tokens[:, :-1], positions, key_valid, cache, prompt_len,
                      call=1)
    return jnp.concatenate([first, hidden], axis=1)


def per_row_prompts(prompt_x: jax.Array, num_rows: int) -> jax.Array:
    """[P, ...] prompt rows (one per group of N / P consecutive completion rows) -> [N, ...],
    one per row: the layout row-wise slicing (micro-batches) needs."""
    return jnp.repeat(prompt_x, num_rows // prompt_x.shape[0], axis=0)


def completion_mask_from_lengths(lengths: jax.Array, length: int) -> jax.Array:
    """lengths int32 [N] -> f32 [N, length] with 1 for the first lengths[i] tokens."""
    return (jnp.arange(length)[None, :] < lengths[:, None]).astype(jnp.float32)
