"""Slot refill (continuous batching on one mesh): S slots decode, a stopped row's slot takes
the next queued row. The whole batch runs in ONE jitted call, the queue on device:

    prompts [P, Tp] --prefill once per prompt--> prompt cache [P, Tp], last logits [P, V]
    while a row is queued or a slot is busy:
        refill: every free slot takes the next queued row r (row order; larger budgets
                first when the caller set per-row budgets, see `queue_order`): the KV of
                its prompt r // G is copied into the slot's columns [0, Tp), its first
                token drawn from the prompt's last logits (repeated while a row stops at
                its first token)
        decode `chunk` steps: one token for every busy slot, each slot at its own step,
                attending over the narrowest of `decode_stages` cache widths that holds
                every busy slot's columns (`column_widths`; a copy of those columns,
                made when the width needed changes)
        shrink: once the queue is empty and no more slots are busy than the next level
                holds (`slot_levels`: 3/4 of the slots, then 3/4 of that, ... down to
                `min_slots`), the busy slots are gathered into that many

The shrink is what keeps the slots busy in the tail: a row's length is unknown until it
emits its stop id, so the last rows to start may be long ones, and without it S slots
decode for the few rows still running. Each level is its own loop in the one program, its
decode step compiled at that slot count; the cost of a step falls with it. The first level
attends over the narrowest of the cache widths it needs; the later ones, which hold the
rows that run longest, over the whole cache (one program each, not one per width).

Cache layout, per slot, Tp + L columns: the prompt in [0, Tp), generated token t (fed back
at step t + 1) in Tp + t, and a scratch column C - 1 = Tp + L - 1. The model writes a step's
key/value at one cache index shared by the batch, so every slot writes at the scratch
column and attends over its own columns (the key mask is per slot); the next step first
copies the scratch column to the slot's column Tp + t (before the model writes the scratch
again, so that XLA updates the cache in place). Slots at different steps thus share one
program with static shapes: one compile per (slots, Tp, L), none between calls.

The KV cache holds S * (Tp + L) + P * Tp slots instead of the static batch's
P * G * (Tp + L - 1): memory is set by the slots. Row r draws its t-th token with
fold_in(fold_in(rng, r), t), as the static batch does, so the output does not depend on S.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxrl_reason.models.params import init_cache
from jaxrl_reason.models.scoring import positions_from_valid
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.sampling.filters import per_row_keys, select_tokens, step_keys


def _batch_axis(x: jax.Array) -> int:
    """The batch axis of a cache leaf ([B, K, S, hd] or [layers, B, K, S, hd])."""
    return x.ndim - 4


def copy_prompts(cache, prompt_cache, prompt_ids: jax.Array, take: jax.Array):
    """The slots' cache with each taken slot's prompt columns replaced by its prompt's.

    One gather of the prompts' KV and one scatter into the taken slots (the others'
    indices are out of range and dropped).

    Args:
      cache: slot cache, leaves [..., S, K, C, hd]; prompt_cache: leaves [..., P, K, Tp, hd].
      prompt_ids: int32 [S] prompt of each slot (any value in [0, P) where not taken).
      take: bool [S] slots that take a new row.
    Returns: the cache, columns [0, Tp) of the taken slots overwritten.
    """
    def one(x, p):
        axis = _batch_axis(p)
        new = jnp.take(p, prompt_ids, axis=axis).astype(x.dtype)
        target = jnp.where(take, jnp.arange(take.shape[0]), take.shape[0])
        index = (slice(None),) * axis + (target, slice(None), slice(None, p.shape[-2]))
        return x.at[index].set(new, mode="drop")
    return jax.tree.map(one, cache, prompt_cache)


def move_scratch(cache, columns: jax.Array):
    """Copies each slot's scratch column (the last) to its column `columns[s]`.

    One scatter per leaf, of the scratch columns materialized first (a scatter whose
    updates are read from its own operand makes XLA copy the whole cache). Columns out of
    range (>= C) are dropped: a slot with nothing to move passes C.

    Args: cache leaves [..., S, K, C, hd]; columns int32 [S], each in [0, C - 1) or >= C.
    Returns: the cache with those columns written (the scratch column unchanged).
    """
    def one(x):
        axis = _batch_axis(x)
        scratch = jax.lax.optimization_barrier(jnp.moveaxis(x[..., -1, :], axis, 0))
        index = (slice(None),) * axis + (jnp.arange(x.shape[axis]), slice(None), columns)
        # The advanced indices lead the indexed shape: [S, ..., K, hd], as `scratch`.
        return x.at[index].set(scratch.astype(x.dtype), mode="drop")
    return jax.tree.map(one, cache)


def slot_key_valid(prompt_valid: jax.Array, step: jax.Array, length: int) -> jax.Array:
    """The keys a slot's query attends to at decode step `step` (feeding token step - 1).

    Args: prompt_valid bool [S, Tp]; step int32 [S] (>= 1); length: C, the cache columns.
    Returns: bool [S, C]: valid prompt columns, generated columns Tp .. Tp + step - 2, and
    the scratch column C - 1, where the fed token's key is written.
    """
    prompt_len = prompt_valid.shape[1]
    col = jnp.arange(length)[None, :]
    generated = (col >= prompt_len) & (col < prompt_len + step[:, None] - 1)
    padded = jnp.pad(prompt_valid, ((0, 0), (0, length - prompt_len)))
    return padded | generated | (col == length - 1)


def column_widths(prompt_len: int, max_new_tokens: int, stages: int) -> tuple[int, ...]:
    """The cache widths a decode chunk may attend over: Tp + each of `stage_ends(L,
    stages)`, the last the whole cache Tp + L (ints, increasing)."""
    from jaxrl_reason.sampling.sampler import stage_ends  # the module imports this one
    return tuple(prompt_len + end for end in stage_ends(max_new_tokens, stages))


def queue_order(budgets: jax.Array) -> jax.Array:
    """The order rows enter the slots: larger budgets first (longest-processing-time first,
    which keeps the long rows out of the tail), ties in row order. With one budget for
    every row, as in an RL step where rows stop at their stop id, this is row order: nothing
    about when a row will stop is known. int32 [N] row ids from int32 budgets [N]."""
    return jnp.argsort(-budgets, stable=True).astype(jnp.int32)


def slot_levels(slots: int, shards: int = 1, min_slots: int = 4) -> tuple[int, ...]:
    """The slot counts a call decodes with: `slots`, then each level three quarters of the
    one before, rounded down to a multiple of `shards` (the cache's batch shards), while
    that is at least `min_slots` (0: `slots` alone). Each level is one more decode program
    in the call's compile, so the levels shrink geometrically. slot_levels(32) = (32, 24,
    18, 13, 9, 6, 4); ints, decreasing."""
    levels = [int(slots)]
    while min_slots:
        size = (levels[-1] * 3 // 4) // shards * shards
        if size < max(min_slots, shards, 1) or size >= levels[-1]:
            break
        levels.append(size)
    return tuple(levels)


def replay(lengths, slots: int, chunk: int, levels: tuple[int, ...] | None = None,
           order=None) -> list[tuple[int, int, int]]:
    """`generate`'s schedule replayed on the host, for plans and tests: rows that stop after
    int `lengths` [N] tokens each (by their stop id or their budget), queued in `order`
    (default: row order, as an RL step queues them), `slots` slots shrinking through
    `levels` (default: never), refilled after every `chunk` decode steps.

    Returns one (slots computed, busy slots, largest token index drawn) per decode step:
    the list's length is the call's decode steps, the sum of its first column its
    slot-steps. Pure Python; O(steps x slots)."""
    lengths = [int(x) for x in lengths]
    queue = list(range(len(lengths)) if order is None else (int(r) for r in order))
    levels = tuple(levels or (slots,))
    if slots < 1 or chunk < 1 or levels[0] != slots or min(lengths, default=1) < 1:
        raise ValueError(f"replay: need slots, chunk and lengths >= 1 and levels starting at "
                         f"slots, got {slots}, {chunk}, {levels}")
    left, index = [0] * slots, [0] * slots  # decode steps still to run; next token index
    level, queued, steps = 0, 0, []
    while True:
        for s in range(len(left)):  # refill: a row of one token stops at its first
            while left[s] == 0 and queued < len(queue):
                left[s], index[s] = lengths[queue[queued]] - 1, 1
                queued += 1
        busy = [s for s in range(len(left)) if left[s]]
        if not busy and queued == len(queue):
            return steps
        while (queued == len(queue) and level + 1 < len(levels)
               and len(busy) <= levels[level + 1]):
            level += 1
            keep = (busy + [s for s in range(len(left)) if not left[s]])[:levels[level]]
            left, index = [left[s] for s in keep], [index[s] for s in keep]
            busy = list(range(len(busy)))
        for _ in range(chunk):
            busy = [s for s in range(len(left)) if left[s]]
            if not busy:
                break
            steps.append((len(left), len(busy), max(index[s] for s in busy)))
            for s in busy:
                left[s] -= 1
                index[s] += 1


def batch_shards(mesh, rules) -> int:
    """How many shards the sampler's rows (and the slots' cache) split into on `mesh` (an
    int; 1 without a mesh): the `batch` axes of `sharding.sampling_rules`."""
    if mesh is None:
        return 1
    axes = shd.rule_axes(shd.sampling_rules(rules, mesh), "batch")
    return math.prod(mesh.shape[a] for a in axes if a in mesh.shape)


def compact_slots(slot: dict, cache, size: int) -> tuple[dict, object]:
    """The first `size` slots after moving every busy slot (row >= 0) ahead of the free
    ones, in slot order: the slot arrays [S, ...] and cache leaves [..., S, K, C, hd]
    gathered to [size, ...] and [..., size, K, C, hd]. The caller guarantees that at most
    `size` slots are busy and that no scratch column is pending."""
    keep = jnp.argsort((slot["row"] < 0).astype(jnp.int32), stable=True)[:size]
    slot = {k: jnp.take(v, keep, axis=0) for k, v in slot.items()}
    cache = jax.tree.map(lambda x: jnp.take(x, keep, axis=_batch_axis(x)), cache)
    return slot, cache


def generate(sampler, params, prompt_tokens, prompt_valid, rng, temperature, top_p, top_k,
             budgets, *, num_samples: int, max_new_tokens: int, slots: int, chunk: int):
    """Slot-refill decoding; traced inside `Sampler._refill`'s jit.

    Args:
      sampler: the Sampler (model, stop ids, pad id, cache dtype and layout, `min_slots`,
        `logits_processor`).
      params, prompt_tokens int32 [P, Tp], prompt_valid bool [P, Tp], rng, temperature,
      top_p, top_k: as `Sampler.__call__`; budgets: int32 [N] per-row token budgets.
      num_samples: G; max_new_tokens: L; slots: S; chunk: decode steps between refills.
    Returns: (SampleOutput with N = P * G rows in row order, int32 [] decode steps run,
    int32 [] slot-steps run: the sum over decode steps of the slot count at that step;
    slot occupancy = (sum(lengths) - N) / slot-steps).
    """
    from jaxrl_reason.sampling.sampler import SampleOutput  # the module imports this one

    num_prompts, prompt_len = prompt_tokens.shape
    rows, length = num_prompts * num_samples, prompt_len + max_new_tokens
    widths = column_widths(prompt_len, max_new_tokens, sampler.decode_stages)
    apply = functools.partial(sampler.model.apply, {"params": params})
    row_keys = per_row_keys(rng, jnp.arange(rows, dtype=jnp.int32))
    order = queue_order(budgets)

    def select(keys, logits, rows_, index):
        """Tokens and log-probs int32/f32 [S] for the slots' rows `rows_` at token `index`."""
        return select_tokens(keys, sampler.process(logits, rows_, index), temperature=temperature, top_k=top_k, top_p=top_p)

    prompt_cache = sampler.constrain_cache(
        init_cache(sampler.model.cfg, num_prompts, prompt_len, sampler.cache_dtype),
        num_prompts, prompt_len)
    logits, prompt_cache = apply(prompt_tokens, positions_from_valid(prompt_valid),
                                 prompt_valid, prompt_cache, 0)
    last_logits = logits[:, -1]                                              # [P, V]
    prompt_next = jnp.sum(prompt_valid, axis=1).astype(jnp.int32)            # [P]

    out = {"tokens": jnp.full((rows, max_new_tokens), sampler.pad_id, jnp.int32),
           "logprobs": jnp.zeros((rows, max_new_tokens), jnp.float32),
           "lengths": jnp.zeros((rows,), jnp.int32), "eos": jnp.zeros((rows,), bool)}
    slot = {"row": jnp.full((slots,), -1, jnp.int32), "step": jnp.ones((slots,), jnp.int32),
            "last": jnp.zeros((slots,), jnp.int32), "pos0": jnp.zeros((slots,), jnp.int32),
            "valid": jnp.zeros((slots, prompt_len), bool),
            "pending": jnp.full((slots,), length, jnp.int32)}
    cache = sampler.constrain_cache(
        init_cache(sampler.model.cfg, slots, length, sampler.cache_dtype), slots, length)

    def write(out, rows_, index, token, logprob, eos):
        """Writes a token per slot to the output rows `rows_` (rows_ == N: dropped)."""
        return {"tokens": out["tokens"].at[rows_, index].set(token, mode="drop"),
                "logprobs": out["logprobs"].at[rows_, index].set(logprob, mode="drop"),
                "lengths": out["lengths"].at[rows_].set(index + 1, mode="drop"),
                "eos": out["eos"].at[rows_].set(eos, mode="drop")}

    def refill_once(state):
        out, slot, cache, queued, steps, slot_steps = state
        free = slot["row"] < 0
        position = queued + jnp.cumsum(free.astype(jnp.int32)) - 1
        take = free & (position < rows)
        row = jnp.where(take, order[jnp.minimum(position, rows - 1)], slot["row"])
        safe_row = jnp.clip(row, 0, rows - 1)
        prompt = safe_row // num_samples
        cache = copy_prompts(cache, prompt_cache, prompt, take)
        first, first_lp = select(step_keys(row_keys[safe_row], 0), last_logits[prompt],
                                 safe_row, jnp.zeros_like(row))
        eos = sampler._is_stop(first)
        out = write(out, jnp.where(take, row, rows), jnp.zeros_like(row), first, first_lp, eos)
        stopped = take & (eos | (budgets[safe_row] <= 1))
        slot = {"row": jnp.where(stopped, -1, row),
                "step": jnp.where(take, 1, slot["step"]),
                "last": jnp.where(take, first, slot["last"]),
                "pos0": jnp.where(take, prompt_next[prompt], slot["pos0"]),
                "valid": jnp.where(take[:, None], prompt_valid[prompt], slot["valid"]),
                "pending": jnp.where(take, length, slot["pending"])}
        return (out, slot, cache, queued + jnp.sum(take.astype(jnp.int32)), steps,
                slot_steps)

    def can_refill(state):
        _, slot, _, queued, _, _ = state
        return jnp.any(slot["row"] < 0) & (queued < rows)

    def decode_step(width, state):
        """One token for every busy slot, attending over the cache's first `width` columns
        (the cache passed has that many; its last is the scratch column). The scratch
        column of the step before is first moved to its slot's column (`pending`): moving
        it before the model writes the scratch, not after the attention read it, lets XLA
        update the cache in place."""
        out, slot, cache, queued, steps, slot_steps = state
        size = slot["row"].shape[0]
        busy = slot["row"] >= 0
        row = jnp.clip(slot["row"], 0, rows - 1)
        step = slot["step"]
        cache = move_scratch(cache, slot["pending"])
        key_valid = slot_key_valid(slot["valid"], step, width)
        positions = (slot["pos0"] + step - 1)[:, None]
        logits, cache = apply(slot["last"][:, None], positions, key_valid, cache, width - 1)
        cache = sampler.constrain_cache(cache, size, width)
        new, new_lp = select(step_keys(row_keys[row], step), logits[:, 0], row, step)
        eos = sampler._is_stop(new)
        out = write(out, jnp.where(busy, row, rows), step, new, new_lp, eos)
        stopped = busy & (eos | (step + 1 >= budgets[row]))
        slot = dict(slot, row=jnp.where(stopped, -1, slot["row"]),
                    step=jnp.where(busy, step + 1, step), last=new,
                    pending=jnp.where(busy, prompt_len + step - 1, length))
        return out, slot, cache, queued, steps + 1, slot_steps + size

    def decode_chunk(width, state):
        """Up to `chunk` decode steps (fewer when every slot stops)."""
        def cond(carry):
            i, state = carry
            return (i < chunk) & jnp.any(state[1]["row"] >= 0)

        return jax.lax.while_loop(cond, lambda c: (c[0] + 1, decode_step(width, c[1])),
                                  (jnp.int32(0), state))[1]

    def width_index(state):
        """Which of `widths` the next chunk needs: the narrowest whose columns below the
        scratch hold every busy slot's columns through the chunk (a slot at step s feeds
        up to column Tp + s + chunk - 2)."""
        slot = state[1]
        need = prompt_len + jnp.max(jnp.where(slot["row"] >= 0, slot["step"], 0)) + chunk
        return jnp.minimum(jnp.sum((jnp.asarray(widths) < need).astype(jnp.int32)),
                           len(widths) - 1)

    def pending(state):
        _, slot, _, queued, _, _ = state
        return jnp.any(slot["row"] >= 0) | (queued < rows)

    def stays(next_level, state):
        """Work is left and the slots cannot shrink to `next_level` yet (0: never)."""
        _, slot, _, queued, _, _ = state
        busy = jnp.sum((slot["row"] >= 0).astype(jnp.int32))
        return pending(state) & ((queued < rows) | (busy > next_level))

    def at_width(index, next_level, state):
        """Chunks and refills on the cache's first `widths[index]` columns (a copy when
        narrower than the cache, written back after) while that width is the one needed
        (index None: the whole cache, whatever is needed) and the slots stay: the copy is
        made once per change of width, not once per chunk."""
        width = length if index is None else widths[index]
        out, slot, cache, queued, steps, slot_steps = state
        narrow = jax.tree.map(lambda x: x[..., :width, :], cache) if width < length else cache

        def cond(state):
            if index is None:
                return stays(next_level, state)
            return stays(next_level, state) & (width_index(state) == index)

        def body(state):
            return jax.lax.while_loop(can_refill, refill_once, decode_chunk(width, state))

        out, slot, narrow, queued, steps, slot_steps = jax.lax.while_loop(
            cond, body, (out, slot, narrow, queued, steps, slot_steps))
        narrow = move_scratch(narrow, slot["pending"])
        slot = dict(slot, pending=jnp.full_like(slot["pending"], length))
        if width < length:
            narrow = jax.tree.map(lambda x, n: x.at[..., :width, :].set(n), cache, narrow)
        return out, slot, narrow, queued, steps, slot_steps

    def run(next_level, staged, state):
        state = jax.lax.while_loop(can_refill, refill_once, state)
        if not staged:
            return at_width(None, next_level, state)
        return jax.lax.switch(
            width_index(state),
            [functools.partial(at_width, i, next_level) for i in range(len(widths))], state)

    shards = batch_shards(sampler.mesh, sampler.rules)
    levels = slot_levels(slots, shards, sampler.min_slots)
    state = (out, slot, cache, jnp.int32(0), jnp.int32(0), jnp.int32(0))
    for i, size in enumerate(levels):
        if i:  # the loop before left at most `size` busy slots and no pending scratch
            out, slot, cache, queued, steps, slot_steps = state
            slot, cache = compact_slots(slot, cache, size)
            cache = sampler.constrain_cache(cache, size, length)
            state = (out, slot, cache, queued, steps, slot_steps)
        next_level = levels[i + 1] if i + 1 < len(levels) else 0
        state = jax.lax.while_loop(functools.partial(stays, next_level),
                                   functools.partial(run, next_level, i == 0), state)
    out, _, _, _, steps, slot_steps = state
    return SampleOutput(tokens=out["tokens"], logprobs=out["logprobs"],
                        lengths=out["lengths"], truncated=~out["eos"]), steps, slot_steps
