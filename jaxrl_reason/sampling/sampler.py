"""KV-cached sampler: prefill + decode in ONE jitted call, the loop on device.

    prompts [P, Tp] (left-padded) --prefill once per prompt--> cache [P, Tp+L]
        --repeat each prompt's cache G times--> cache [P*G, Tp+L]
        --lax.while_loop: one token per row per iteration, stop when every row hit EOS
          or L tokens are written--> tokens [P*G, L]

The sampler takes the current training params as an argument (same mesh, same arrays, no
copy) and its sampling parameters (temperature, top-p, top-k) are traced values, so a run
compiles one program per (prompt bucket, G, L) shape. Output rows are group-major: row
r = prompt r // G, sample r % G.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason import sharding as shd
from jaxrl_reason.models.params import cache_shardings, init_cache, repeat_cache
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.filters import select_tokens


@flax.struct.dataclass
class SampleOutput:
    """Completions, group-major.

    tokens:    int32 [N, L] generated tokens; pad_id after the first EOS (EOS included).
    logprobs:  f32   [N, L] log-prob of each token under the tempered policy; 0 after EOS.
    lengths:   int32 [N]    number of generated tokens including the EOS.
    truncated: bool  [N]    True when no EOS was produced within L tokens.
    """
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    truncated: jax.Array


def left_pad(token_lists: Sequence[Sequence[int]], length: int, pad_id: int):
    """Left-pads prompts to `length`.

    Returns: (tokens int32 [P, length], valid bool [P, length]) as numpy arrays.
    Raises ValueError naming the row when a prompt is longer than `length`.
    """
    tokens = np.full((len(token_lists), length), pad_id, np.int32)
    valid = np.zeros((len(token_lists), length), bool)
    for i, ids in enumerate(token_lists):
        if len(ids) > length:
            raise ValueError(f"prompt {i} has {len(ids)} tokens, longer than the prompt "
                             f"bucket of {length}; raise the bucket (data.prompt_buckets)")
        if len(ids):
            tokens[i, length - len(ids):] = ids
            valid[i, length - len(ids):] = True
    return tokens, valid


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (ints)."""
    return -(-n // multiple) * multiple


def pick_bucket(lengths: Iterable[int], buckets: Sequence[int]) -> int:
    """Smallest bucket that holds the longest of `lengths`; ValueError if none does."""
    longest = max(lengths, default=0)
    for bucket in sorted(buckets):
        if longest <= bucket:
            return bucket
    raise ValueError(f"a prompt of {longest} tokens is longer than every bucket {sorted(buckets)}")


def positions_from_valid(valid: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token.

    valid: bool [B, T] -> int32 [B, T] (pads get 0).
    """
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)


class Sampler:
    """Generates completions for a batch of prompts with a KV cache.

    Args:
      model: the Transformer module (its config fixes shapes and dtypes).
      eos_id, pad_id: token ids.
      mesh, rules: when given, the KV cache is laid out by the `cache` logical axes.
      cache_dtype: KV-cache dtype (default: the model's compute dtype).
    """

    def __init__(self, model: Transformer, *, eos_id: int, pad_id: int, mesh: Mesh | None = None,
                 rules: Iterable[tuple[str, Any]] = shd.DEFAULT_RULES, cache_dtype: Any = None):
        self.model, self.eos_id, self.pad_id = model, int(eos_id), int(pad_id)
        self.mesh, self.rules = mesh, tuple(rules)
        self.cache_dtype = cache_dtype
        self._generate = jax.jit(shd.with_activation_sharding(self._generate_impl, mesh, rules),
                                 static_argnames=("num_samples", "max_new_tokens"))

    def __call__(self, params, prompt_tokens, prompt_valid, rng, *, num_samples: int = 1,
                 max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0) -> SampleOutput:
        """Samples `num_samples` completions for each prompt.

        Args:
          params: model params (the live training arrays).
          prompt_tokens: int32 [P, Tp], left-padded; prompt_valid: bool [P, Tp].
          rng: PRNG key.
          num_samples: G, completions per prompt (static).
          max_new_tokens: L (static).
          temperature: <= 0 for greedy; top_p in (0, 1]; top_k 0 = off.
        Returns: SampleOutput with N = P * G rows.
        """
        return self._generate(params, jnp.asarray(prompt_tokens, jnp.int32),
                              jnp.asarray(prompt_valid, bool), rng,
                              jnp.float32(temperature), jnp.float32(top_p), jnp.int32(top_k),
                              num_samples=num_samples, max_new_tokens=max_new_tokens)

    def _constrain_cache(self, cache, batch, length):
        if self.mesh is None:
            return cache
        shardings = cache_shardings(self.model.cfg, self.mesh, self.rules, batch, length)
        return jax.lax.with_sharding_constraint(cache, shardings)

    def _generate_impl(self, params, prompt_tokens, prompt_valid, rng, temperature, top_p,
                       top_k, *, num_samples, max_new_tokens):
        cfg = self.model.cfg
        num_prompts, prompt_len = prompt_tokens.shape
        total = prompt_len + max_new_tokens
        rows = num_prompts * num_samples
        apply = functools.partial(self.model.apply, {"params": params})

        # Prefill once per prompt.
        cache = self._constrain_cache(init_cache(cfg, num_prompts, total, self.cache_dtype),
                                      num_prompts, total)
        key_valid = jnp.concatenate(
            [prompt_valid, jnp.zeros((num_prompts, max_new_tokens), bool)], axis=1)
        logits, cache = apply(prompt_tokens, positions_from_valid(prompt_valid), key_valid,
                              cache, 0)
        last_logits = logits[:, -1]

        # Share each prompt's cache with its G samples.
        repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731
        cache = self._constrain_cache(repeat_cache(cache, num_samples), rows, total)
        key_valid = repeat(key_valid)
        next_position = repeat(jnp.sum(prompt_valid, axis=1).astype(jnp.int32))
        first, first_lp = select_tokens(jax.random.fold_in(rng, 0), repeat(last_logits),
                                        temperature, top_k, top_p)

        tokens = jnp.full((rows, max_new_tokens), self.pad_id, jnp.int32).at[:, 0].set(first)
        logprobs = jnp.zeros((rows, max_new_tokens), jnp.float32).at[:, 0].set(first_lp)
        done = first == self.eos_id
        lengths = jnp.ones((rows,), jnp.int32)

        def cond(state):
            step, _, _, done, *_ = state
            return (step < max_new_tokens) & ~jnp.all(done)

        def body(state):
            step, tokens, logprobs, done, lengths, cache, key_valid = state
            slot = prompt_len + step - 1  # cache slot of the token being fed
            key_valid = key_valid.at[:, slot].set(True)
            feed = jax.lax.dynamic_slice_in_dim(tokens, step - 1, 1, axis=1)
            positions = (next_position + step - 1)[:, None]
            logits, cache = apply(feed, positions, key_valid, cache, slot)
            new, new_lp = select_tokens(jax.random.fold_in(rng, step), logits[:, 0],
                                        temperature, top_k, top_p)
            new = jnp.where(done, self.pad_id, new)
            new_lp = jnp.where(done, 0.0, new_lp)
            tokens = jax.lax.dynamic_update_slice_in_dim(tokens, new[:, None], step, axis=1)
            logprobs = jax.lax.dynamic_update_slice_in_dim(logprobs, new_lp[:, None], step, axis=1)
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | (new == self.eos_id)
            return step + 1, tokens, logprobs, done, lengths, cache, key_valid

        state = (jnp.int32(1), tokens, logprobs, done, lengths, cache, key_valid)
        _, tokens, logprobs, done, lengths, _, _ = jax.lax.while_loop(cond, body, state)
        return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, truncated=~done)
