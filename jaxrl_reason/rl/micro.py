"""Micro-batches of the training passes (gradient accumulation), over padded rows or over
packs (`rl.packing`), shared by the policy update (`rl/update.py`) and the critic
(`rl/value_passes.py`).

Padded rows split into k strided micro-batches of M/k rows (`to_micro`). Packs split into
strided micro-batches of a fixed number of packs (`packing.Packer.packs_per_micro`), as many
as a batch's packs fill (`micro_batch_count`); a row lives in one pack, so it counts in
exactly one micro-batch (`packed_micro_batch`). A gradient pass returns, besides its loss and
metrics, per-row outputs ([M, L] log-probs, entropies, values) with no gradient: the
accumulators reassemble them for the whole batch, from which the caller computes the whole
batch's metrics once (`accumulate_rows`, `accumulate_packs`).

  slots_to_rows      per-slot values [K, T] -> per-row values [N, L]
  micro_batch_count  K packs / packs_per_micro
  micro_pack_index   pack_index re-addressed to micro-batch i's packs
  packed_micro_batch micro-batch i of a packed batch (masks zero on other rows)
  micro_packs        the pack arrays [K, T] -> [k, K/k, T]
  with_normalizers   the whole batch's num_sequences / num_tokens (defaults)
  accumulate_rows    lax.scan over row micro-batches: summed loss and gradients, rows
  accumulate_packs   the same over pack micro-batches
  MicroBatches       a pass's split (rows or packs): count, accumulate
  folding            a gradient pass with micro-batch i's dropout key
  map_rows           a forward pass over row micro-batches: per-row outputs [M, ...]
  map_packs          a forward pass over pack micro-batches: per-slot outputs [K, T]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrl_reason.models.scoring import per_row_prompts
from jaxrl_reason.rl.batches import from_micro, micro_sharding, to_micro

PACK_KEYS = ("pack_tokens", "pack_positions", "pack_segments", "pack_prompt_segments",
             "pack_targets", "pack_index")
"""The arrays of a packed pass (`packing.Packs.arrays()`): pack_* int32 [K, T] and
pack_index int32 [N, L]."""


def slots_to_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """Per-slot values [K, T] -> per-row values [N, L]: x.reshape(-1)[index], 0 where index
    (int32 [N, L]) is -1. The gradient scatters back to the slots."""
    return jnp.where(index >= 0, x.reshape(-1)[jnp.maximum(index, 0)], 0.0)


def micro_batch_count(packs, packs_per_micro: int | None) -> int:
    """How many micro-batches a packed batch runs: K / packs_per_micro for `pack_tokens`
    [K, T] (1 when packs_per_micro is None); ValueError when it does not divide K."""
    num = packs["pack_tokens"].shape[0]
    if packs_per_micro is None:
        return 1
    if num % packs_per_micro:
        raise ValueError(f"rl.micro_batches: {num} packs do not split into micro-batches of "
                         f"{packs_per_micro} packs (the packer's pack counts are multiples "
                         "of a micro-batch's packs)")
    return num // packs_per_micro


def micro_pack_index(index: jax.Array, i, k: int, pack_tokens: int) -> jax.Array:
    """`pack_index` int32 [N, L] (flat slots of K packs of T tokens) -> the slots of
    micro-batch i of `to_micro(packs, k)` (packs i, k + i, 2k + i, ...: pack j is its local
    pack j // k), -1 where a row's token lives in another micro-batch's packs."""
    pack, slot = index // pack_tokens, index % pack_tokens
    mine = (index >= 0) & (pack % k == i)
    return jnp.where(mine, (pack // k) * pack_tokens + slot, -1)


def packed_micro_batch(batch, packs_i, i, k: int):
    """Micro-batch i of k of a packed batch: `packs_i` (the `pack_*` arrays of micro-batch
    i, [K/k, T]) with `pack_index` re-addressed to them (`micro_pack_index`), and `mask` and
    `loss_mask` (f32 [N, L], when present) zero on the rows whose packs are elsewhere; the
    other arrays (one per row, or scalars such as the whole batch's normalizers) unchanged."""
    index = micro_pack_index(batch["pack_index"], i, k, packs_i["pack_tokens"].shape[1])
    out = {**batch, **packs_i, "pack_index": index}
    for name in ("mask", "loss_mask"):
        if name in batch:
            out[name] = jnp.where(index >= 0, batch[name], 0).astype(batch[name].dtype)
    return out


def micro_packs(packs, k: int, mesh=None, rules=()) -> dict:
    """The `pack_*` arrays [K, T] of `packs` (not `pack_index`) as [k, K/k, T] strided
    micro-batches (`to_micro`), rows over the batch axes."""
    return {key: to_micro(packs[key], k, micro_sharding(mesh, rules, 3))
            for key in PACK_KEYS[:-1]}


def with_normalizers(batch, mask_key: str = "loss_mask"):
    """`batch` with the whole batch's normalizers where it has none: num_sequences f32 []
    (its rows) and num_tokens f32 [] (its `mask_key` tokens, else `mask`'s, at least 1), so
    that each micro-batch's loss is its share of the whole batch's."""
    mask = batch.get(mask_key, batch["mask"])
    return {"num_sequences": jnp.float32(mask.shape[0]),
            "num_tokens": jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0), **batch}


GradFn = Callable[..., tuple[tuple[jax.Array, tuple], object]]
"""(params, batch, i) -> ((loss f32 [], outputs: tuple of per-row arrays, no gradient),
grads), the gradient pass of one micro-batch (i: its index, e.g. for a dropout key)."""


def _accumulator(like):
    """Zeros shaped like the gradients `like`, in float32 at least: k bf16 gradients summed
    in bf16 would lose up to log2(k) of bf16's 8 mantissa bits to rounding."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.promote_types(x.dtype, jnp.float32)),
                        like)


def _add(acc, grads):
    return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


def _cast_like(acc, like):
    """The summed gradients back in the dtypes of `like` (the one-micro-batch gradients')."""
    return jax.tree.map(lambda a, x: a.astype(x.dtype), acc, like)


def accumulate_rows(grad_fn: GradFn, params, batch, k: int, like, mesh=None, rules=()):
    """Gradient accumulation over k strided micro-batches of rows (`lax.scan`).

    Args:
      batch: arrays with a leading row axis M (split), and scalars (shared).
      like: a tree shaped like the gradients (e.g. the trainable params); the sum runs in
        float32 (at least) and comes back in its dtypes.
    Returns: (loss f32 [] summed, outputs each [M, ...] in row order, grads summed).
    """
    rows = {n: x for n, x in batch.items() if jnp.ndim(x) >= 1}
    consts = {n: x for n, x in batch.items() if jnp.ndim(x) == 0}
    micro = {n: to_micro(x, k, micro_sharding(mesh, rules, x.ndim + 1)) for n, x in rows.items()}

    def body(carry, xs):
        grads, loss = carry
        mb, i = xs
        (l, outs), g = grad_fn(params, {**mb, **consts}, i)
        return (_add(grads, g), loss + l), outs

    (grads, loss), outs = jax.lax.scan(body, (_accumulator(like), jnp.float32(0.0)),
                                       (micro, jnp.arange(k)))
    return loss, tuple(from_micro(o) for o in outs), _cast_like(grads, like)


def accumulate_packs(grad_fn: GradFn, params, batch, k: int, like, num_outputs: int,
                     mesh=None, rules=()):
    """Gradient accumulation over k strided micro-batches of packs (`lax.scan`,
    `packed_micro_batch`). Each pass's `num_outputs` outputs are f32 [N, L] (the shape of
    `pack_index`), its rows' values and 0 on the rows of other micro-batches, so their sums
    are the whole batch's. like: as in `accumulate_rows`.

    Returns: (loss f32 [] summed, outputs each f32 [N, L], grads summed).
    """
    micro = micro_packs(batch, k, mesh, rules)
    rows = (jnp.zeros(batch["pack_index"].shape, jnp.float32),) * num_outputs

    def body(carry, xs):
        grads, loss, outs = carry
        packs_i, i = xs
        (l, o), g = grad_fn(params, packed_micro_batch(batch, packs_i, i, k), i)
        return (_add(grads, g), loss + l, tuple(a + b for a, b in zip(outs, o))), None

    (grads, loss, outs), _ = jax.lax.scan(body, (_accumulator(like), jnp.float32(0.0), rows),
                                          (micro, jnp.arange(k)))
    return loss, outs, _cast_like(grads, like)


@dataclasses.dataclass(frozen=True)
class MicroBatches:
    """How a training pass splits its batch for gradient accumulation: `rows` strided
    micro-batches of padded rows, or with `packed` micro-batches of `packs_per_micro` packs
    (`packing.Packer.packs_per_micro`), as many as a batch's packs fill. `key` names the
    config knob in errors. ValueError for a packed pass asked for micro-batches without
    the packs of one (it would otherwise run them all at once)."""
    packed: bool
    rows: int = 1
    packs_per_micro: int | None = None
    mesh: Any = None
    rules: tuple = ()
    key: str = "rl.micro_batches"

    def __post_init__(self):
        if self.packed and self.rows > 1 and self.packs_per_micro is None:
            raise ValueError(f"{self.key} = {self.rows} with packing: give the pass the packs "
                             "of a micro-batch (packs_per_micro = Packer.packs_per_micro)")

    def count(self, batch) -> int:
        """How many micro-batches `batch` runs (1: no accumulation)."""
        return micro_batch_count(batch, self.packs_per_micro) if self.packed else self.rows

    def accumulate(self, grad_fn: GradFn, params, batch, like, num_outputs: int):
        """`accumulate_packs` or `accumulate_rows` (padded rows get a prompt per row first,
        `prompt_tokens` / `prompt_valid` [P, Tp] -> [M, Tp]) over `count(batch)`
        micro-batches: (loss f32 [] summed, outputs, grads summed in `like`'s dtypes)."""
        k = self.count(batch)
        if self.packed:
            return accumulate_packs(grad_fn, params, batch, k, like, num_outputs, self.mesh,
                                    self.rules)
        if "prompt_tokens" in batch:
            n = batch["completion_tokens"].shape[0]
            batch = {**batch, "prompt_tokens": per_row_prompts(batch["prompt_tokens"], n),
                     "prompt_valid": per_row_prompts(batch["prompt_valid"], n)}
        return accumulate_rows(grad_fn, params, batch, k, like, self.mesh, self.rules)


def folding(fn: Callable, rng) -> GradFn:
    """The `GradFn` of `fn(params, batch, rng) -> ((loss, outputs), grads)` with micro-batch
    i's key `fold_in(rng, i)` (LoRA dropout; None stays None)."""
    def grad_fn(params, batch, i):
        return fn(params, batch, None if rng is None else jax.random.fold_in(rng, i))
    return grad_fn


def map_rows(row_fn: Callable, rows, k: int, mesh=None, rules=()):
    """A forward pass over padded rows, k strided micro-batches at a time (`lax.map`):
    row_fn(rows dict of [M/k, ...] arrays, a prompt per row) -> [M/k, ...] -> [M, ...].
    `rows` holds prompt_tokens / prompt_valid ([P, Tp], repeated to a prompt per row) and
    other per-row arrays [M, ...]."""
    n = rows["completion_tokens"].shape[0]
    rows = {**rows, "prompt_tokens": per_row_prompts(rows["prompt_tokens"], n),
            "prompt_valid": per_row_prompts(rows["prompt_valid"], n)}
    micro = {key: to_micro(x, k, micro_sharding(mesh, rules, x.ndim + 1))
             for key, x in rows.items()}
    return from_micro(jax.lax.map(row_fn, micro))


def map_packs(slot_fn: Callable, packs, packs_per_micro: int | None, mesh=None, rules=()):
    """A forward pass over a batch's packs, `packs_per_micro` at a time (`lax.map`; None:
    all at once): slot_fn(pack_* arrays [K', T]) -> per-slot array [K', T] -> [K, T]."""
    k = micro_batch_count(packs, packs_per_micro)
    if k == 1:
        return slot_fn(packs)
    return from_micro(jax.lax.map(slot_fn, micro_packs(packs, k, mesh, rules)))
