"""The log-prob passes of `RLTrainer` (reference, old policy), padded or packed.

With `rl.packing` the reference pass, the old-log-prob pass and the update read the step's
packs (`rl/packing.py`: the host packer; `rl/update.py`: `packed_logprobs`) instead of rows
padded to the longest completion; the loss still runs on the [N, L] rows.

  LogprobPasses    of_step(params, got, ...) / of_batch(params, rollout, batch): the padded
                   pass on the rows, or the packed one on their packs
  PackedPasses     rl.packing's part: packs(host, lengths, keep) (`Packs.arrays()` on the
                   mesh), all_packs(got, lengths) (made once, `got.packs`),
                   batch_packs(got, lengths, keep), logprobs(params, packs)
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import numpy as np

from jaxrl_reason.rl.batches import Collected, Rollout
from jaxrl_reason.rl.packing import Packer, packer_for
from jaxrl_reason.rl.update import PACK_KEYS, make_logprob_fn, make_packed_logprob_fn
from jaxrl_reason.runtime import sharding as shd


class PackedPasses:
    """The run's packer (`packing.Packer`: T, pack counts, prompt sharing) and its jitted
    packed log-prob pass. `put` places a host array on the mesh (batch-sharded)."""

    def __init__(self, packer: Packer, model, temperature: float, put, mesh=None, rules=()):
        self.packer, self.put = packer, put
        self.share_prompts = packer.share_prompts
        self.logprob_fn = make_packed_logprob_fn(model, temperature, packer.share_prompts,
                                                 mesh, rules, packer.packs_per_micro)

    def packs(self, host: Mapping[str, np.ndarray], lengths: np.ndarray,
              keep: np.ndarray | None = None) -> dict[str, jax.Array]:
        """The packs of `generate`'s rows (`host`: prompt_tokens int32 [P, Tp], prompt_valid
        bool [P, Tp], tokens int32 [N, >= length], length) reading `lengths` int [N]
        completion tokens each; rows whose `keep` (bool [N]) is False read nothing. Returns
        the `update.PACK_KEYS` arrays on the mesh (pack_* [K, T], pack_index [N, length])."""
        if keep is not None:
            lengths = np.where(keep, lengths, 0)
        packs = self.packer(host["prompt_tokens"], host["prompt_valid"],
                            host["tokens"][:, :host["length"]], lengths)
        return {name: self.put(x) for name, x in packs.arrays().items()}

    def all_packs(self, got: Collected, lengths: np.ndarray) -> dict[str, jax.Array]:
        """The packs of all N rows of `got` (`packs` with `lengths`), made once and kept in
        `got.packs`."""
        if got.packs is None:
            got.packs = self.packs(got.host, lengths)
        return got.packs

    def batch_packs(self, got: Collected, lengths: np.ndarray,
                    keep: np.ndarray | None) -> dict[str, jax.Array]:
        """An update batch's packs: `all_packs` of `got`, or with `keep` (bool [N]) the
        `packs` in which the rows not kept read nothing."""
        return self.all_packs(got, lengths) if keep is None else self.packs(got.host, lengths,
                                                                            keep)

    def logprobs(self, params, packs: Mapping[str, jax.Array]) -> jax.Array:
        """Log-probs f32 [N, L] of the packed rows under `params` (0 where a row reads no
        token); `packs` may hold other keys (an update batch), only `PACK_KEYS` are read."""
        return self.logprob_fn(params, {k: packs[k] for k in PACK_KEYS})


def packed_passes_for(rt, rl) -> PackedPasses | None:
    """`PackedPasses` for a `Runtime` with `rl.packing` on (pack counts multiples of the
    mesh's data-parallel size; with rl.micro_batches > 1, of the packs of a micro-batch,
    which the log-prob pass runs at a time), None without."""
    packer = packer_for(rt.config, rt.model_cfg, shd.data_parallel_size(rt.mesh, rt.rules))
    if packer is None:
        return None
    return PackedPasses(packer, rt.model, rl.temperature, rt.put, rt.mesh, rt.rules)


class LogprobPasses:
    """A run's log-prob passes: the padded one (`update.make_logprob_fn`, `rl.micro_batches`
    slices) and, with `rl.packing`, `packed` (a `PackedPasses`, else None)."""

    def __init__(self, rt, rl):
        self.padded_fn = make_logprob_fn(rt.model, rl.temperature, rl.micro_batches, rt.mesh,
                                         rt.rules)
        self.packed = packed_passes_for(rt, rl)

    def of_step(self, params, got: Collected, rollout: Callable[[], Rollout],
                lengths: np.ndarray) -> jax.Array:
        """Log-probs f32 [N, L] of all rows of `got` under `params`: the padded pass on
        `rollout()` (the update batch of all rows), or the packed pass on the packs of
        `lengths` int [N] tokens a row (`PackedPasses.all_packs`)."""
        if self.packed is None:
            return self.padded_fn(params, *rollout().scoring_args())
        return self.packed.logprobs(params, self.packed.all_packs(got, lengths))

    def of_batch(self, params, rollout: Rollout, batch: Mapping) -> jax.Array:
        """Log-probs f32 [M, L] of an update batch's rows: the padded pass on `rollout`, or
        the packed one on the batch's packs (its `update.PACK_KEYS`)."""
        if self.packed is None:
            return self.padded_fn(params, *rollout.scoring_args())
        return self.packed.logprobs(params, batch)
