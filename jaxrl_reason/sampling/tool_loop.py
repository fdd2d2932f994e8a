"""Tool-use rollouts: the KV-cached sampler pauses rows at a tool call, the host runs the tool,
and decoding continues with the cache kept.

    sampler = ToolSampler(Sampler(model, eos_ids=tok.eos_ids, pad_id=tok.pad_id),
                          ToolRunner({"search": BM25Retriever(docs), "calc": calculate}),
                          tok, max_calls=2, max_result_tokens=48)
    out = sampler(params, prompt_tokens, prompt_valid, rng, num_samples=G, max_new_tokens=L)
    out.tool_mask   # bool [N, L]: result tokens (written by the host, not sampled)

One decode step writes one column of every row, as in `Sampler`, so every row's sequence
stays compact (prompt, generated and result tokens side by side, no holes) and the cache
slot of column t is Tp + t for all rows:

    prefill (Sampler.prefill) -> first token
    for each decode stage (caches sized to the stage's end, as in Sampler):
      while_loop: one column per row per iteration; a row that is replaying result tokens
        takes its next result token instead of sampling (log-prob 0, tool_mask 1); a row
        whose newest sampled tokens spell a closing tag (`</search>`) is marked paused,
        and the loop exits at the end of that iteration when any row paused
      host: decode each paused row's text, run the tool (`ToolRunner.run`), tokenize
        `<result>...</result>` (cut to max_result_tokens) and hand it back as the row's
        result tokens; re-enter the loop (the same compiled program) with the cache kept

Result tokens thus extend the cache at each row's own position, one per step, through the
same decode step that samples the other rows: nothing is re-prefilled, rows without a
call keep generating meanwhile, and the total decode steps stay <= L (result tokens count
toward the budget L). Rows that stopped write pads and wait. The only cost of a call is
one host round trip per decode step at which some row closed a call.

Static shapes: the result buffer is [N, max_result_tokens]; a run compiles the start
(prefill) once per prompt bucket, one decode program per stage and one cache-growing
program per stage. A row makes at most `max_calls` calls: later closing tags are text.
Sampling keys are those of `Sampler` (fold_in(rng, step)), so without any call the output
equals `Sampler`'s for the same key.

What the trainer needs: `ToolSampleOutput` adds `tool_mask` (exclude these tokens from the
policy loss and KL: the policy did not choose them) and `tool_calls` [N]. The log-prob
passes score the very sequence the sampler produced, result tokens in place.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.params import cache_length, pad_cache
from jaxrl_reason.sampling.filters import per_row_keys, select_tokens, step_keys
from jaxrl_reason.sampling.sampler import SampleOutput, Sampler, stage_ends
from jaxrl_reason.tools.runner import RESULT_CLOSE, ToolRunner


@flax.struct.dataclass
class ToolSampleOutput(SampleOutput):
    """`SampleOutput` of a tool-use rollout (tokens hold the result tokens in place).

    tool_mask:  bool  [N, L] True on result tokens (logprobs are 0 there).
    tool_calls: int32 [N]    tool calls the row made (closing tags answered by a result).
    """
    tool_mask: jax.Array
    tool_calls: jax.Array


@flax.struct.dataclass
class ToolDecodeState:
    """A paused decode: everything the loop continues from (N rows, L columns, R result
    slots). Column `step` is the next one written; its token goes to cache slot Tp + step.

    step: int32 []; tokens int32 [N, L]; logprobs f32 [N, L]; tool_mask bool [N, L];
    done bool [N] (emitted a stop id); lengths int32 [N] (tokens incl. the stop);
    paused bool [N] (the row's newest token closed a call: its result is due);
    calls int32 [N]; forced int32 [N, R] (the row's current result tokens), forced_len
    int32 [N], forced_next int32 [N] (the next of them to write); cache (Sampler's layout,
    Tp + stage end - 1 slots); prompt_valid bool [N, Tp]; next_position int32 [N] (RoPE
    position of column 0).
    """
    step: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    tool_mask: jax.Array
    done: jax.Array
    lengths: jax.Array
    paused: jax.Array
    calls: jax.Array
    forced: jax.Array
    forced_len: jax.Array
    forced_next: jax.Array
    cache: Any
    prompt_valid: jax.Array
    next_position: jax.Array


@functools.partial(jax.jit, static_argnums=1)
def _replicate(tree, sharding):
    return jax.lax.with_sharding_constraint(tree, sharding)


def tail_matches(tokens: jax.Array, step: jax.Array, sequence: Sequence[int]) -> jax.Array:
    """bool [N]: columns step - len(sequence) + 1 .. step of int32 [N, L] `tokens` hold
    `sequence` (a static tuple of ids)."""
    k = len(sequence)
    match = jnp.full(tokens.shape[:1], step >= k - 1)
    for j, token in enumerate(reversed(sequence)):
        column = jax.lax.dynamic_index_in_dim(tokens, jnp.maximum(step - j, 0), axis=1,
                                              keepdims=False)
        match = match & (column == token)
    return match


def tool_loss_mask(lengths, length: int, tool_mask=None) -> np.ndarray:
    """f32 [N, length]: 1.0 on the tokens the policy sampled, i.e. the first `lengths` int [N]
    columns minus the result tokens of bool [N, >= length] `tool_mask` (None: no tools).
    The policy loss, its KL term and the token counts use this mask; the log-prob passes
    still read the whole sequence."""
    lengths = np.asarray(lengths)
    mask = np.arange(length)[None, :] < lengths[:, None]
    if tool_mask is not None:
        mask = mask & ~np.asarray(tool_mask, bool)[:, :length]
    return mask.astype(np.float32)


def result_token_ids(text: str, tokenizer, max_tokens: int, close_ids: Sequence[int]):
    """The ids of a result block, cut to `max_tokens` so that it still ends with the
    result closing tag's ids `close_ids` (list of python ints)."""
    ids = tokenizer.encode(text)
    if len(ids) > max_tokens:
        ids = ids[:max_tokens - len(close_ids)] + list(close_ids)
    return ids


class ToolSampler:
    """A `Sampler` whose rows may call tools mid-completion (see the module docstring).

    Args:
      sampler: the plain sampler (model, stop ids, pad id, mesh, cache dtype, stages).
      runner: the host-side tools (`jaxrl_reason.tools.ToolRunner`).
      tokenizer: decodes paused rows and encodes results; each closing tag must encode to
        the ids the model emits for it (make tags single tokens: tokenizers trained here
        add them as symbols when `config.tools` is enabled).
      max_calls: tool calls per row; closing tags after that are plain text.
      max_result_tokens: R, a result block is cut to this many tokens.
    """

    def __init__(self, sampler: Sampler, runner: ToolRunner, tokenizer, *, max_calls: int = 2,
                 max_result_tokens: int = 48):
        self.sampler, self.runner, self.tokenizer = sampler, runner, tokenizer
        self.max_calls, self.max_result_tokens = int(max_calls), int(max_result_tokens)
        self.closers = tuple(tuple(tokenizer.encode(tag)) for tag in runner.closing_tags)
        self.result_close = tuple(tokenizer.encode(RESULT_CLOSE))
        for tag, ids in zip(runner.closing_tags, self.closers):
            if not ids:
                raise ValueError(f"tool tag {tag!r} encodes to no tokens")
        if self.max_result_tokens <= len(self.result_close):
            raise ValueError(f"max_result_tokens={max_result_tokens} cannot hold the result "
                             f"closing tag ({len(self.result_close)} tokens)")
        self.eos_ids, self.pad_id = sampler.eos_ids, sampler.pad_id
        self.mesh, self.rules = sampler.mesh, sampler.rules
        wrap = functools.partial(shd.with_activation_sharding, mesh=self.mesh, rules=self.rules)
        self._start = jax.jit(wrap(self._start_impl),
                              static_argnames=("num_samples", "max_new_tokens"))
        self._grow = jax.jit(self._grow_impl, static_argnames=("length",))
        self._decode = jax.jit(wrap(self._decode_impl), static_argnames=("end",),
                               donate_argnums=1)
        self.last_stats: dict[str, int] = {}

    # ------------------------------------------------------------------ host loop

    def __call__(self, params, prompt_tokens, prompt_valid, rng, *, num_samples: int = 1,
                 max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, max_calls: int | None = None) -> ToolSampleOutput:
        """Samples `num_samples` completions per prompt, running tool calls on the host.

        Args and rows as `Sampler.__call__` (prompt_tokens int32 [P, Tp] left-padded,
        prompt_valid bool [P, Tp]; N = P * G rows, group-major; L = max_new_tokens counts
        result tokens too); max_calls overrides the constructor's (a traced value: no
        recompile). Returns ToolSampleOutput; `last_stats` then holds the number of host
        round trips ("rounds"), calls run ("calls") and failed ("errors").
        """
        params, pt, pv, rng, temp, top_p, top_k = Sampler.call_args(
            params, prompt_tokens, prompt_valid, rng, temperature, top_p, top_k)
        calls = jnp.int32(self.max_calls if max_calls is None else max_calls)
        sampling = (rng, temp, top_p, top_k, calls)
        state = self._start(params, pt, pv, *sampling, num_samples=num_samples,
                            max_new_tokens=max_new_tokens)
        stats = {"rounds": 0, "calls": 0, "errors": 0}
        pending = self._results(state, stats)
        prompt_len = pt.shape[1]
        for end in stage_ends(max_new_tokens, self.sampler.decode_stages):
            state = self._grow(state, length=prompt_len + end - 1)
            while pending["step"] < end and not pending["all_done"]:
                state = self._decode(params, state, *pending["inject"], *sampling, end=end)
                pending = self._results(state, stats)
        self.last_stats = stats
        out = ToolSampleOutput(tokens=state.tokens, logprobs=state.logprobs,
                               lengths=state.lengths, truncated=~state.done,
                               tool_mask=state.tool_mask, tool_calls=state.calls)
        if self.mesh is not None and jax.process_count() > 1:  # every process reads every row
            out = _replicate(out, shd.replicated(self.mesh))
        return out

    def _results(self, state: ToolDecodeState, stats: dict[str, int]) -> dict[str, Any]:
        """Host side of one pause: the results of the paused rows as the next decode call's
        injection (mask bool [N], tokens int32 [N, R], lengths int32 [N]), plus the step
        and whether every row is done."""
        step, paused, done = distributed.to_host((state.step, state.paused, state.done))
        step, rows = int(step), np.flatnonzero(paused)
        n, r = paused.shape[0], self.max_result_tokens
        mask, lengths = np.zeros(n, bool), np.zeros(n, np.int32)
        tokens = np.zeros((n, r), np.int32)
        if rows.size:
            stats["rounds"] += 1
            all_tokens = distributed.to_host(state.tokens)
            for row in rows:
                result = self.runner.run(self.tokenizer.decode(all_tokens[row, :step]))
                ids = result_token_ids(result.text, self.tokenizer, r, self.result_close)
                mask[row], lengths[row] = True, len(ids)
                tokens[row, :len(ids)] = ids
                stats["calls"] += 1
                stats["errors"] += result.error is not None
        inject = tuple(self._put(x) for x in (mask, tokens, lengths))
        return {"step": step, "all_done": bool(done.all()), "inject": inject}

    def _put(self, array: np.ndarray) -> jax.Array:
        if self.mesh is None:
            return jnp.asarray(array)
        return shd.put_replicated(self.mesh, array)

    # ------------------------------------------------------------------ device programs

    def _is_stop(self, tokens: jax.Array) -> jax.Array:
        stop = jnp.zeros(tokens.shape, bool)
        for i in self.eos_ids:
            stop = stop | (tokens == i)
        return stop

    def _closes_call(self, tokens: jax.Array, step: jax.Array) -> jax.Array:
        """bool [N]: the row's columns up to `step` end with a closing tool tag."""
        closes = jnp.zeros(tokens.shape[:1], bool)
        for ids in self.closers:
            closes = closes | tail_matches(tokens, step, ids)
        return closes

    def _start_impl(self, params, prompt_tokens, prompt_valid, rng, temperature, top_p, top_k,
                    max_calls, *, num_samples, max_new_tokens):
        row_keys = per_row_keys(rng, jnp.arange(prompt_tokens.shape[0] * num_samples,
                                                dtype=jnp.int32))
        start = self.sampler.prefill(params, prompt_tokens, prompt_valid, row_keys,
                                     temperature, top_p, top_k, num_samples=num_samples)
        rows, length = start.first.shape[0], max_new_tokens
        tokens = jnp.full((rows, length), self.pad_id, jnp.int32).at[:, 0].set(start.first)
        done = self._is_stop(start.first)
        paused = (~done & self._closes_call(tokens, jnp.int32(0)) & (max_calls > 0)
                  & (length > 1))
        zeros = jnp.zeros((rows,), jnp.int32)
        return self._constrain(ToolDecodeState(
            step=jnp.int32(1), tokens=tokens,
            logprobs=jnp.zeros((rows, length), jnp.float32).at[:, 0].set(start.first_logprob),
            tool_mask=jnp.zeros((rows, length), bool), done=done,
            lengths=jnp.ones((rows,), jnp.int32), paused=paused, calls=paused.astype(jnp.int32),
            forced=jnp.zeros((rows, self.max_result_tokens), jnp.int32), forced_len=zeros,
            forced_next=zeros, cache=start.cache, prompt_valid=start.prompt_valid,
            next_position=start.next_position))

    def _constrain(self, state: ToolDecodeState) -> ToolDecodeState:
        """The state in one layout (rows over the batch axes, the cache by its logical axes,
        the step replicated), so that every program sees the same input shardings and the
        decode program compiles once per stage."""
        if self.mesh is None:
            return state
        rows = state.tokens.shape[0]

        def rows_sharded(x):
            if x.ndim == 0:
                return jax.lax.with_sharding_constraint(x, shd.replicated(self.mesh))
            return jax.lax.with_sharding_constraint(
                x, shd.batch_sharding(self.mesh, self.rules, x.ndim, rows))

        cache = self.sampler.constrain_cache(state.cache, rows, cache_length(state.cache))
        return jax.tree.map(rows_sharded, state.replace(cache=None)).replace(cache=cache)

    def _grow_impl(self, state: ToolDecodeState, *, length: int) -> ToolDecodeState:
        """The state with its cache grown to `length` slots (a no-op when it has them)."""
        return self._constrain(state.replace(
            cache=pad_cache(state.cache, length - cache_length(state.cache))))

    def _decode_impl(self, params, state: ToolDecodeState, inject, inject_tokens, inject_len,
                     rng, temperature, top_p, top_k, max_calls, *, end):
        """Takes the injected results (rows `inject` replay `inject_tokens[:inject_len]`),
        then decodes until column `end` is reached, every row is done, or a row paused."""
        apply = functools.partial(self.sampler.model.apply, {"params": params})
        rows, prompt_len = state.prompt_valid.shape
        state = state.replace(
            paused=jnp.zeros_like(state.paused),
            forced=jnp.where(inject[:, None], inject_tokens, state.forced),
            forced_len=jnp.where(inject, inject_len, state.forced_len),
            forced_next=jnp.where(inject, 0, state.forced_next))
        # Generated slots are all valid keys (causality hides the ones not written yet).
        key_valid = jnp.concatenate(
            [state.prompt_valid, jnp.ones((rows, cache_length(state.cache) - prompt_len), bool)],
            axis=1)
        last = self.max_result_tokens - 1
        row_keys = per_row_keys(rng, jnp.arange(rows, dtype=jnp.int32))  # as Sampler's

        def body(s: ToolDecodeState) -> ToolDecodeState:
            step = s.step
            feed = jax.lax.dynamic_slice_in_dim(s.tokens, step - 1, 1, axis=1)
            logits, cache = apply(feed, (s.next_position + step - 1)[:, None], key_valid,
                                  s.cache, prompt_len + step - 1)
            new, new_lp = select_tokens(step_keys(row_keys, step), logits[:, 0],
                                        temperature, top_k, top_p)
            forcing = (s.forced_next < s.forced_len) & ~s.done
            result_token = jnp.take_along_axis(
                s.forced, jnp.minimum(s.forced_next, last)[:, None], axis=1)[:, 0]
            new = jnp.where(s.done, self.pad_id, jnp.where(forcing, result_token, new))
            new_lp = jnp.where(s.done | forcing, 0.0, new_lp)
            put = lambda buf, col: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                buf, col[:, None], step, axis=1)
            tokens = put(s.tokens, new)
            sampled = ~s.done & ~forcing
            room = step + 1 < tokens.shape[1]  # a result needs at least one column
            closes = sampled & self._closes_call(tokens, step) & (s.calls < max_calls) & room
            return s.replace(
                step=step + 1, tokens=tokens, logprobs=put(s.logprobs, new_lp),
                tool_mask=put(s.tool_mask, forcing), lengths=s.lengths + (~s.done),
                done=s.done | (sampled & self._is_stop(new)), paused=closes,
                calls=s.calls + closes, forced_next=s.forced_next + forcing, cache=cache)

        def cond(s: ToolDecodeState):
            return (s.step < end) & ~jnp.all(s.done) & ~jnp.any(s.paused)

        return self._constrain(jax.lax.while_loop(cond, body, state))
