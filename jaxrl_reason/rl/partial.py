"""Partial rollouts (Kimi k1.5): a cap on the tokens a row decodes in one RL step, and the
rows that are not done when it is spent kept to continue in later steps.

With `rl.rollout_token_budget` = S (> 0), every row decodes at most S = min(S, L) tokens a
step (a static batch then runs at most S decode steps). At most B groups (B =
`rl.batch_prompts`, G rows each) are in flight. Each step, in order:

  drop      groups whose age (this step - the step they started) exceeds
            `rl.max_rollout_age`: all G rows, counted in rollout/rows_dropped
  continue  the rows of the pending groups that are not done decode up to S more tokens from
            where they stopped (`sampling/continuation.py`: their prompt and tokens so far are
            prefilled, token k drawn with the row's own key fold_in(row key, k))
  start     new prompts fill the free group places (B - pending groups), from a backlog of
            drawn examples first; each decodes up to S tokens (the sampler, its row keys kept)
  train     the groups whose G rows are all done (EOS or L tokens), oldest first: a group's
            advantage needs every one of its rewards, so a group is scored and trained only
            once complete; the others stay pending. A step may train 0 to B groups.

Each token keeps the behaviour log-prob of the policy that drew it (the `sampler_logp` the
loss reads) and that policy's step; the loss corrects tokens from older policies with the
truncated per-token importance weight min(exp(logp_old - logp_behaviour), rl.tis_cap)
(`rl/losses.py`), which is why partial rollouts need `rl.tis_cap` > 0.

The pending groups and the backlog are part of the RL checkpoint: fixed-shape arrays for B
groups (`checkpoint_arrays`) and the examples in the metadata (`checkpoint_meta`), so a
resumed run continues bit-identically. With S >= L no row is ever pending and a step is the
same computation as without partial rollouts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.sampling.continuation import Continuation
from jaxrl_reason.sampling.filters import per_row_keys
from jaxrl_reason.sampling.sampler import round_up


@dataclasses.dataclass
class Pool:
    """The groups in flight (K groups of G rows, row k * G + j = sample j of group k), host
    numpy. examples: K dicts; birth int32 [K] the step each group started; keys uint32
    [K*G, W] each row's PRNG key data; tokens int32 [K*G, L] (pad after the last); logp f32
    [K*G, L] behaviour log-probs (0 after the last); version int32 [K*G, L] the step whose
    policy drew each token; lengths int32 [K*G]; eos bool [K*G] (a stop id was drawn)."""
    examples: list
    birth: np.ndarray
    keys: np.ndarray
    tokens: np.ndarray
    logp: np.ndarray
    version: np.ndarray
    lengths: np.ndarray
    eos: np.ndarray

    @staticmethod
    def empty(length: int, key_words: int, pad_id: int, groups: int = 0,
              group_size: int = 1) -> "Pool":
        """A pool of `groups` groups with no token yet (pad tokens, zero log-probs)."""
        n = groups * group_size
        return Pool([], np.zeros(groups, np.int32), np.zeros((n, key_words), np.uint32),
                    np.full((n, length), pad_id, np.int32), np.zeros((n, length), np.float32),
                    np.zeros((n, length), np.int32), np.zeros(n, np.int32),
                    np.zeros(n, bool))

    def done(self, max_len: int) -> np.ndarray:
        """bool [K*G]: the row stopped (a stop id, or L tokens)."""
        return self.eos | (self.lengths >= max_len)

    def take(self, groups: np.ndarray, group_size: int) -> "Pool":
        """The pool of `groups` (int [k] group indices), in that order."""
        rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)).reshape(-1)
        return Pool([self.examples[k] for k in groups], self.birth[groups], self.keys[rows],
                    self.tokens[rows], self.logp[rows], self.version[rows], self.lengths[rows],
                    self.eos[rows])

    def concat(self, other: "Pool") -> "Pool":
        """This pool's groups, then `other`'s."""
        cat = lambda a, b: np.concatenate([a, b], axis=0)  # noqa: E731
        return Pool(self.examples + other.examples, cat(self.birth, other.birth),
                    cat(self.keys, other.keys), cat(self.tokens, other.tokens),
                    cat(self.logp, other.logp), cat(self.version, other.version),
                    cat(self.lengths, other.lengths), cat(self.eos, other.eos))


def write_segment(pool: Pool, rows: np.ndarray, out: dict, step: int) -> None:
    """Appends each row's new tokens (host `out`: tokens int32 [M, S], logprobs f32 [M, S],
    lengths int32 [M], truncated bool [M]; row i of `out` continues pool row rows[i]) in
    place, tagged with `step`."""
    for i, r in enumerate(rows):
        n, start = int(out["lengths"][i]), int(pool.lengths[r])
        pool.tokens[r, start:start + n] = out["tokens"][i, :n]
        pool.logp[r, start:start + n] = out["logprobs"][i, :n]
        pool.version[r, start:start + n] = step
        pool.lengths[r] = start + n
        pool.eos[r] = not bool(out["truncated"][i])


def mark_stopped(pool: Pool, stops: np.ndarray | None) -> None:
    """Marks done (`eos`) the rows of `pool` that have their stop length, int32 [K*G]
    `stops` from `PartialRollouts.row_stops` (None: nothing to mark), in place."""
    if stops is not None:
        if len(stops) != len(pool.lengths):
            raise ValueError(f"row_stops: {len(stops)} stop lengths for a pool of "
                             f"{len(pool.lengths)} rows")
        pool.eos |= pool.lengths >= stops


def length_stats(prefix: str, lengths: np.ndarray) -> dict[str, float]:
    """{prefix}_mean / _p50 / _max of int lengths [n] (nothing when n = 0)."""
    if len(lengths) == 0:
        return {}
    return {f"{prefix}_mean": float(np.mean(lengths)),
            f"{prefix}_p50": float(np.median(lengths)),
            f"{prefix}_max": float(np.max(lengths))}


class PartialRollouts:
    """The pending groups of an RL trainer with `rl.rollout_token_budget` > 0; see the
    module docstring. `collect` is the trainer's sampling phase."""

    def __init__(self, rt, rl):
        self.rt, self.rl = rt, rl
        self.group, self.groups = int(rl.num_generations), int(rl.batch_prompts)
        self.max_len = int(rl.max_new_tokens)
        self.segment = min(int(rl.rollout_token_budget), self.max_len)
        self.max_age = int(rl.max_rollout_age)
        self.pad_id = rt.sampler.pad_id
        self.key_words = int(jax.random.key_data(jax.random.key(0)).shape[-1])
        self.pool = Pool.empty(self.max_len, self.key_words, self.pad_id)
        self.backlog: list = []  # examples drawn but not started yet
        self.continuation = Continuation(rt.sampler)

    def wants_examples(self) -> bool:
        """Whether the next step needs a new batch of examples: fewer are waiting than the
        groups it may start (the backlog then stays below 2 B)."""
        return len(self.backlog) < self.groups

    # ------------------------------------------------------------------ one step

    def collect(self, params, examples: Sequence[dict], rng, step: int):
        """Drops, continues, starts and pops the complete groups (module docstring).

        Args: params (the live policy), `examples` (appended to the backlog), rng (the
        new rows' sampling key: row r of this step's new rows has key fold_in(rng, r)),
        step (this RL step's number, >= 1).
        Returns (examples [k], host dict as `RLTrainer.generate`'s for the k complete groups
        (N = k * G rows; no rows when k = 0), metrics: rollout/*).
        """
        g = self.group
        self.backlog.extend(examples)
        age = step - self.pool.birth
        old = age > self.max_age
        dropped = int(old.sum()) * g
        self.pool = self.pool.take(np.flatnonzero(~old), g)
        was_done = self.pool.done(self.max_len)
        continued = self.continue_rows(params, step)
        fresh = self.backlog[:self.groups - len(self.pool.examples)]
        del self.backlog[:len(fresh)]
        if fresh:
            self.pool = self.pool.concat(self.start(params, fresh, rng, step))
        done = self.pool.done(self.max_len)
        finished_now = done & ~np.concatenate([was_done, np.zeros(len(done) - len(was_done),
                                                                  bool)])
        generated = self.pool.lengths[finished_now]
        complete = done.reshape(-1, g).all(axis=1)
        trained = self.pool.take(np.flatnonzero(complete), g)
        self.pool = self.pool.take(np.flatnonzero(~complete), g)
        in_len = np.arange(self.max_len)[None, :] < trained.lengths[:, None]
        tokens = max(1, int(trained.lengths.sum()))
        metrics = {
            "rollout/rows_continued": float(continued),
            "rollout/rows_dropped": float(dropped),
            "rollout/groups_trained": float(len(trained.examples)),
            "rollout/groups_pending": float(len(self.pool.examples)),
            "rollout/oldest_age": float(np.max(step - trained.birth, initial=0)),
            "rollout/stale_token_share": float(
                np.sum(in_len & (trained.version < step)) / tokens),
            **length_stats("rollout/trained_length", trained.lengths),
            **length_stats("rollout/generated_length", generated),
        }
        return trained.examples, self.host(trained), metrics

    def continue_rows(self, params, step: int) -> int:
        """Decodes up to S more tokens for every pending row that is not done; returns how
        many rows that was. Rows are padded to a multiple of the data-parallel size (a power
        of two times it, so that a run compiles a few programs)."""
        rows = np.flatnonzero(~self.pool.done(self.max_len))
        if len(rows) == 0:
            return 0
        dp = shd.data_parallel_size(self.rt.mesh, self.rt.rules)
        size = dp
        while size < len(rows):
            size *= 2
        padded = np.concatenate([rows, np.full(size - len(rows), rows[0])])
        prompts, valid = self.rt.encode_prompts(self.pool.examples)
        p = padded // self.group
        stops = self.row_stops(self.pool.examples)
        limit = self.max_len if stops is None else stops[padded]
        budgets = np.minimum(self.segment, limit - self.pool.lengths[padded])
        rl = self.rl
        out = self.continuation(
            params, prompts[p], valid[p], self.pool.tokens[padded],
            self.pool.lengths[padded], self.pool.keys[padded], budgets.astype(np.int32),
            segment=self.segment, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
        host = distributed.to_host(vars(out))
        write_segment(self.pool, rows, {k: v[:len(rows)] for k, v in host.items()}, step)
        mark_stopped(self.pool, stops)
        return len(rows)

    def start(self, params, examples: list, rng, step: int) -> Pool:
        """The pool of new groups for `examples`, each row's first segment sampled (at most
        its `row_stops` tokens when those are given)."""
        rt, rl, g = self.rt, self.rl, self.group
        stops = self.row_stops(examples)
        budget = self.segment if stops is None else np.minimum(self.segment, stops)
        prompt_tokens, prompt_valid = rt.encode_prompts(examples)
        out = rt.sampler(params, rt.put_prompts(prompt_tokens), rt.put_prompts(prompt_valid),
                         rng, num_samples=g, max_new_tokens=budget, max_len=self.segment,
                         temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
        host = distributed.to_host({"tokens": out.tokens, "logprobs": out.logprobs,
                                    "lengths": out.lengths, "truncated": out.truncated})
        pool = self.new_pool(examples, rng, host, step)
        mark_stopped(pool, stops)
        return pool

    def row_stops(self, examples: list) -> np.ndarray | None:
        """Each row's stop length, int32 [len(examples) * G], or None (the default: rows
        stop at a stop id or after L tokens). A subclass that knows when each row stops (a
        benchmark's seeded lengths, as if each row drew its stop id there) returns them: a
        row then decodes at most that many tokens and is done once it has them."""
        return None

    def new_pool(self, examples: list, rng, first: dict, step: int) -> Pool:
        """The pool of `examples`' groups holding their first segments `first` (host arrays
        tokens/logprobs [N, S], lengths int32 [N], truncated bool [N], N = len(examples) *
        G), each row's key derived from `rng` as the sampler derives it."""
        n = len(examples) * self.group
        pool = Pool.empty(self.max_len, self.key_words, self.pad_id, len(examples), self.group)
        pool.examples = list(examples)
        pool.birth[:] = step
        pool.keys[:] = np.asarray(jax.random.key_data(
            per_row_keys(rng, jnp.arange(n, dtype=jnp.int32))))
        write_segment(pool, np.arange(n), first, step)
        return pool

    def host(self, trained: Pool) -> dict[str, np.ndarray]:
        """`RLTrainer.generate`'s host dict of the complete groups `trained`."""
        prompt_tokens, prompt_valid = (self.rt.encode_prompts(trained.examples)
                                       if trained.examples else
                                       (np.zeros((0, 1), np.int32), np.zeros((0, 1), bool)))
        longest = int(trained.lengths.max(initial=1))
        return {"tokens": trained.tokens, "lengths": trained.lengths,
                "truncated": ~trained.eos, "sampler_logp": trained.logp,
                "prompt_tokens": prompt_tokens, "prompt_valid": prompt_valid,
                "length": min(round_up(longest, self.rl.train_length_bucket), self.max_len)}

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        """The pending groups as fixed-shape arrays for B groups (the restore template has
        the same shapes): tokens, logp, version [B*G, L], lengths, eos [B*G], keys [B*G, W],
        birth [B]; rows past the K pending groups are padding."""
        full = Pool.empty(self.max_len, self.key_words, self.pad_id, self.groups, self.group)
        n, k = len(self.pool.lengths), len(self.pool.examples)
        arrays = {}
        for name in ("tokens", "logp", "version", "lengths", "eos", "keys"):
            a = getattr(full, name)
            a[:n] = getattr(self.pool, name)
            arrays[name] = a.astype(np.int32) if a.dtype == bool else a
        full.birth[:k] = self.pool.birth
        arrays["birth"] = full.birth
        return arrays

    def checkpoint_meta(self) -> dict[str, Any]:
        """The pending groups' and the backlog's examples (JSON), and the group count."""
        meta = {"groups": len(self.pool.examples), "examples": self.pool.examples,
                "backlog": self.backlog}
        try:
            return json.loads(json.dumps(meta))
        except (TypeError, ValueError) as err:
            raise ValueError(f"partial rollouts: the pending examples cannot be saved in the "
                             f"checkpoint's metadata as JSON ({err})") from err

    def restore(self, arrays: dict, meta: dict) -> None:
        """The pool and backlog of `checkpoint_arrays` / `checkpoint_meta`."""
        arrays = {k: np.asarray(v) for k, v in distributed.to_host(arrays).items()}
        k = int(meta["groups"])
        n = k * self.group
        self.pool = Pool(list(meta["examples"]), arrays["birth"][:k].astype(np.int32),
                         arrays["keys"][:n].astype(np.uint32), arrays["tokens"][:n],
                         arrays["logp"][:n], arrays["version"][:n], arrays["lengths"][:n],
                         arrays["eos"][:n].astype(bool))
        self.backlog = list(meta["backlog"])

