"""Bounded staleness: batches sampled ahead of the update (`rl.max_staleness = k`).

With k > 0 the trainer keeps up to k scored batches sampled ahead of the one it trains on,
so that sampling batch n + k can overlap the update on batch n. Which policy version samples
which batch is fixed by the step number and k, never by timing:

    batch n (1-based) is sampled by the policy after max(0, n - 1 - k) updates

(`behaviour_version`). Batches 1 .. k + 1 are sampled by the initial policy; at step n the
trainer samples batch n + k (if n + k <= rl.steps) with the current policy, then trains on
batch n. k = 0 is the synchronous loop (the trainer keeps its own code path for it).

The update treats a stale batch with the decoupled PPO objective (Hilton et al. 2022; AReaL,
Fu et al. 2025): the clipped ratio is taken against the proximal policy (the parameters at
the start of the update: `old_logp`, recomputed when rl.num_iterations > 1, else the
current log-probs under stop-gradient) and the behaviour policy enters through the truncated
importance weight min(pi_prox / pi_behaviour, rl.tis_cap) on each token (`losses.
sampler_mismatch`), with the sampler's log-probs as the behaviour's. This is why k > 0
requires rl.tis_cap > 0.

The batches in flight are part of the checkpoint (`checkpoint_arrays`, `checkpoint_meta`):
tokens, behaviour log-probs, lengths and verdicts exactly as sampled and scored, so a resumed
run trains on the same rollouts as an uninterrupted one.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any, Callable

import numpy as np

from jaxrl_reason.rewards.pool import BatchRewards

__all__ = ["behaviour_version", "check_resume_bound", "Sampled", "RolloutQueue"]


def behaviour_version(batch: int, k: int) -> int:
    """The policy version (updates applied) that samples batch `batch` (1-based) when the
    staleness bound is `k` >= 0: max(0, batch - 1 - k). The trainer trains on it at version
    batch - 1, so its staleness is min(batch - 1, k)."""
    if batch < 1 or k < 0:
        raise ValueError(f"behaviour_version: batch must be >= 1 and k >= 0, got {batch}, {k}")
    return max(0, batch - 1 - k)


def check_resume_bound(meta: dict, queue: "RolloutQueue | None", where) -> None:
    """Refuse to resume from a checkpoint (its metadata `meta`, in `where`) written with
    another rl.max_staleness than this run's (`queue`, None for 0): the arrays of its
    batches in flight are shaped by k."""
    saved = int(meta.get("in_flight", {}).get("k", 0))
    wanted = queue.k if queue is not None else 0
    if saved != wanted:
        raise ValueError(f"the RL checkpoint in {where} was written with rl.max_staleness="
                         f"{saved}, this run has {wanted}: resume with the same value (its "
                         f"batches in flight are part of the checkpoint)")


@dataclasses.dataclass
class Sampled:
    """One scored batch in flight: `examples` (B dicts), `host` (`RLTrainer.generate`'s
    numpy dict: tokens int32 [N, W], sampler_logp f32 [N, W], lengths int32 [N],
    truncated bool [N], prompt_tokens, prompt_valid, `length`), its `rewards` (or a future
    of them while host threads score it) and the policy `version` that sampled it."""
    examples: list
    host: dict
    rewards: Any
    version: int


def _floats(a) -> list[str]:
    """Exact, JSON-safe float spellings (hex; 'nan' and 'inf' included)."""
    return [float(x).hex() for x in np.asarray(a, np.float64).reshape(-1)]


def _unfloats(xs: list[str]) -> np.ndarray:
    return np.asarray([float.fromhex(x) for x in xs], np.float32)


def rewards_to_json(r: BatchRewards) -> dict:
    """A BatchRewards as JSON (floats exact, non-finite ones kept)."""
    return {"total": _floats(r.total),
            "components": {k: _floats(v) for k, v in r.components.items()},
            "reasons": dict(r.reasons), "seconds": float(r.seconds),
            "unscored": {k: np.asarray(v, bool).tolist() for k, v in r.unscored.items()},
            "timed_out": {k: np.asarray(v, bool).tolist() for k, v in r.timed_out.items()}}


def rewards_from_json(d: dict) -> BatchRewards:
    """The inverse of `rewards_to_json`."""
    return BatchRewards(
        total=_unfloats(d["total"]),
        components={k: _unfloats(v) for k, v in d["components"].items()},
        reasons=collections.Counter(d["reasons"]), seconds=float(d["seconds"]),
        unscored={k: np.asarray(v, bool) for k, v in d["unscored"].items()},
        timed_out={k: np.asarray(v, bool) for k, v in d["timed_out"].items()})


class RolloutQueue:
    """The batches sampled ahead of the update, oldest first (at most k + 1 while a step
    fills it, k after it trains).

    Args:
      k: rl.max_staleness >= 1.
      rows: N = rl.batch_prompts x rl.num_generations, the rows of a batch.
      width: the widest completion buffer, rl.max_new_tokens.
    """

    def __init__(self, k: int, rows: int, width: int) -> None:
        if k < 1:
            raise ValueError(f"RolloutQueue: k must be >= 1, got {k}")
        self.k, self.rows, self.width = int(k), int(rows), int(width)
        self.entries: collections.deque[Sampled] = collections.deque()

    def __len__(self) -> int:
        return len(self.entries)

    def wanted(self, step: int, steps: int) -> list[int]:
        """The batch numbers still to sample before training step `step` (1-based) of a
        run of `steps`: up to batch min(step + k, steps), given that batches up to
        step - 1 + len(self) were sampled."""
        have = step - 1 + len(self.entries)
        return list(range(have + 1, min(step + self.k, steps) + 1))

    def push(self, sampled: Sampled) -> None:
        self.entries.append(sampled)

    def pop(self) -> Sampled:
        return self.entries.popleft()

    @staticmethod
    def settled(sampled: Sampled, agree: Callable[[BatchRewards], BatchRewards]
                ) -> BatchRewards:
        """`sampled`'s rewards, waiting for its scoring future if it is one (then passed
        through `agree`, the trainer's agreement across processes, and kept)."""
        if not isinstance(sampled.rewards, BatchRewards):
            sampled.rewards = agree(sampled.rewards.result())
        return sampled.rewards

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        """The batches in flight as fixed-shape arrays for k batches (the restore template
        has the same shapes): tokens int32 [k, N, W], logp f32 [k, N, W], lengths int32
        [k, N], truncated int32 [k, N]; batches past len(self) are zeros."""
        k, n, w = self.k, self.rows, self.width
        out = {"tokens": np.zeros((k, n, w), np.int32), "logp": np.zeros((k, n, w), np.float32),
               "lengths": np.zeros((k, n), np.int32), "truncated": np.zeros((k, n), np.int32)}
        if len(self.entries) > k:
            raise ValueError(f"RolloutQueue: {len(self.entries)} batches in flight at a "
                             f"checkpoint, more than k = {k}")
        for i, s in enumerate(self.entries):
            rows, width = s.host["tokens"].shape
            if rows != n or width > w:
                raise ValueError(f"RolloutQueue: a batch of {rows} x {width} tokens does not "
                                 f"fit the checkpoint's {n} x {w}")
            out["tokens"][i, :, :width] = s.host["tokens"]
            out["logp"][i, :, :width] = s.host["sampler_logp"]
            out["lengths"][i] = s.host["lengths"]
            out["truncated"][i] = s.host["truncated"]
        return out

    def checkpoint_meta(self, agree: Callable[[BatchRewards], BatchRewards] = lambda r: r
                        ) -> dict[str, Any]:
        """What the arrays do not hold, as JSON: per batch its examples, width, training
        length, rewards (waited for: `settled`) and version."""
        for s in self.entries:
            self.settled(s, agree)
        meta = {"k": self.k, "batches": [{"examples": s.examples, "width": int(s.host["tokens"].shape[1]),
                             "length": int(s.host["length"]), "version": int(s.version),
                             "rewards": rewards_to_json(s.rewards)} for s in self.entries]}
        try:
            return json.loads(json.dumps(meta))
        except (TypeError, ValueError) as err:
            raise ValueError(f"rl.max_staleness: the examples in flight cannot be saved in the "
                             f"checkpoint's metadata as JSON ({err})") from err

    def restore(self, arrays: dict, meta: dict,
                encode_prompts: Callable[[list], tuple[np.ndarray, np.ndarray]]) -> None:
        """The batches of `checkpoint_arrays` / `checkpoint_meta` (host numpy arrays);
        prompts are encoded again from the examples (`encode_prompts`, deterministic)."""
        self.entries.clear()
        for i, b in enumerate(meta["batches"]):
            width = int(b["width"])
            prompts, valid = encode_prompts(b["examples"])
            host = {"tokens": np.asarray(arrays["tokens"][i, :, :width], np.int32),
                    "sampler_logp": np.asarray(arrays["logp"][i, :, :width], np.float32),
                    "lengths": np.asarray(arrays["lengths"][i], np.int32),
                    "truncated": np.asarray(arrays["truncated"][i]).astype(bool),
                    "prompt_tokens": prompts, "prompt_valid": valid,
                    "length": int(b["length"])}
            self.entries.append(Sampled(list(b["examples"]), host,
                                        rewards_from_json(b["rewards"]), int(b["version"])))
