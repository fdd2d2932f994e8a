"""Continuing rows from saved state (partial rollouts): prefill each row's prompt and the
tokens it already generated, then decode more, in ONE jitted call, a static batch:

    context [M, Tp + Lg] = prompt (left-padded, Tp) ++ generated so far (right-padded, Lg)
        --prefill, padding masked--> cache; the logits after each row's last real token
        --draw token n_r with the row's own key, then decode up to `segment` tokens each-->
    tokens [M, segment]

Row r's k-th token overall is drawn with fold_in(row_key_r, k), the key the sampler used
(row_key_r = fold_in(rng of its first call, row id)), at RoPE position
sum(prompt_valid_r) + k, so a row paused after n_r tokens and continued draws token n_r
exactly as the uninterrupted row would (the logits equal up to float summation order: a
prefill computes over the context in one pass what the decode loop computed token by token;
at T = 0 the tokens are the same).

Cache layout, per row, Tp + Lg + segment columns: the context in [0, Tp + Lg) (padding and
the unwritten generated columns masked), the fed new token i in Tp + Lg + i.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.params import init_cache
from jaxrl_reason.models.scoring import positions_from_valid
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.sampling.filters import select_tokens, step_keys


class Continuation:
    """Continues rows of a `Sampler` (its model, stop ids, pad id, cache dtype and layout)
    from their prompt and generated tokens; one compile per (rows, Tp, Lg, segment)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self._run = jax.jit(shd.with_activation_sharding(self._impl, sampler.mesh,
                                                         sampler.rules),
                            static_argnames=("segment",))

    def __call__(self, params, prompt_tokens, prompt_valid, generated, generated_lengths,
                 row_keys, budgets, *, segment: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0):
        """Decodes up to `budgets[r]` more tokens for each row.

        Args:
          params: model params (the live training arrays).
          prompt_tokens: int32 [M, Tp] left-padded, one prompt per row; prompt_valid bool.
          generated: int32 [M, Lg] tokens each row generated so far (right-padded);
          generated_lengths: int32 [M] how many (each in [1, Lg]; none has stopped).
          row_keys: the rows' PRNG keys, typed [M] or raw uint32 key data [M, 2].
          budgets: int32 [M] more tokens each row may draw, each in [1, segment].
          segment: the output width (static); temperature, top_p, top_k: as the sampler.
        Returns: SampleOutput of the new tokens only: tokens int32 [M, segment] (pad after
        a stop), logprobs f32 [M, segment], lengths int32 [M] (new tokens, stop included),
        truncated bool [M] (no stop id among them).
        Raises ValueError naming the first bad row for lengths or budgets out of range.
        """
        lengths, budgets = np.asarray(generated_lengths), np.asarray(budgets)
        width = np.shape(generated)[1]
        for bad, what in (((lengths < 1) | (lengths > width), f"a generated length outside "
                           f"[1, {width}]"),
                          ((budgets < 1) | (budgets > segment), f"a budget outside "
                           f"[1, {segment}]")):
            if bad.any():
                r = int(np.argmax(bad))
                raise ValueError(f"continuation: row {r} has {what} (generated length "
                                 f"{lengths[r]}, budget {budgets[r]})")
        keys = jnp.asarray(row_keys)
        if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
            keys = jax.random.wrap_key_data(keys)
        return self._run(params, jnp.asarray(prompt_tokens, jnp.int32),
                         jnp.asarray(prompt_valid, bool), jnp.asarray(generated, jnp.int32),
                         jnp.asarray(lengths, jnp.int32), keys,
                         jnp.asarray(budgets, jnp.int32), jnp.asarray(temperature, jnp.float32),
                         jnp.asarray(top_p, jnp.float32), jnp.asarray(top_k, jnp.int32),
                         segment=int(segment))

    def _impl(self, params, prompt_tokens, prompt_valid, generated, generated_lengths,
              row_keys, budgets, temperature, top_p, top_k, *, segment):
        from jaxrl_reason.sampling.sampler import SampleOutput  # it imports this package
        sampler = self.sampler
        rows, prompt_len = prompt_tokens.shape
        gen_width = generated.shape[1]
        context_len = prompt_len + gen_width
        length = context_len + segment
        apply = functools.partial(sampler.model.apply, {"params": params})
        select = functools.partial(select_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p)

        gen_valid = jnp.arange(gen_width)[None, :] < generated_lengths[:, None]
        context = jnp.concatenate([prompt_tokens, jnp.where(gen_valid, generated,
                                                            sampler.pad_id)], axis=1)
        context_valid = jnp.concatenate([prompt_valid, gen_valid], axis=1)
        cache = sampler.constrain_cache(
            init_cache(sampler.model.cfg, rows, length, sampler.cache_dtype), rows, length)
        # Keys: the real context, and the new columns (causality hides the unwritten ones).
        key_valid = jnp.concatenate([context_valid, jnp.ones((rows, segment), bool)], axis=1)
        logits, cache = apply(context, positions_from_valid(context_valid), key_valid,
                              cache, 0)
        last = prompt_len + generated_lengths - 1                          # [M]
        last_logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
        first, first_lp = select(step_keys(row_keys, generated_lengths), last_logits)
        next_position = (jnp.sum(prompt_valid, axis=1).astype(jnp.int32) + generated_lengths)

        tokens = jnp.full((rows, segment), sampler.pad_id, jnp.int32).at[:, 0].set(first)
        logprobs = jnp.zeros((rows, segment), jnp.float32).at[:, 0].set(first_lp)
        eos = sampler._is_stop(first)
        lengths = jnp.ones((rows,), jnp.int32)
        done = eos | (lengths >= budgets)

        def body(state):
            step, tokens, logprobs, done, eos, lengths, cache = state
            feed = jax.lax.dynamic_slice_in_dim(tokens, step - 1, 1, axis=1)
            positions = (next_position + step - 1)[:, None]
            logits, cache = apply(feed, positions, key_valid, cache, context_len + step - 1)
            new, new_lp = select(step_keys(row_keys, generated_lengths + step), logits[:, 0])
            new = jnp.where(done, sampler.pad_id, new)
            new_lp = jnp.where(done, 0.0, new_lp)
            tokens = jax.lax.dynamic_update_slice_in_dim(tokens, new[:, None], step, axis=1)
            logprobs = jax.lax.dynamic_update_slice_in_dim(logprobs, new_lp[:, None], step,
                                                           axis=1)
            lengths = lengths + (~done).astype(jnp.int32)
            eos = eos | (~done & sampler._is_stop(new))
            done = done | eos | (lengths >= budgets)
            return step + 1, tokens, logprobs, done, eos, lengths, cache

        def cond(state):
            step, _, _, done, *_ = state
            return (step < segment) & ~jnp.all(done)

        state = (jnp.int32(1), tokens, logprobs, done, eos, lengths, cache)
        _, tokens, logprobs, _, eos, lengths, _ = jax.lax.while_loop(cond, body, state)
        return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, truncated=~eos)
