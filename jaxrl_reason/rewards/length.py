r"""Length-shaped rewards: Kimi k1.5, L1/LCPO (exact and max), cosine, DAPO overlong.

These need what a per-completion verifier does not see: the completion's length in tokens,
whether the sampler truncated it, the other samples of its group and the correctness of
each sample. So they are *batch rewards* (`register_batch_reward`): the pool calls them
once per batch with a `BatchContext`, after the per-completion components it depends on
(`correctness`) have been scored. Each formula is also a plain numpy function, tested
against the paper's equation in tests/rewards/test_length.py.

| name            | paper                        | returns                                             |
|-----------------|------------------------------|-----------------------------------------------------|
| `length_kimi`   | Kimi k1.5 (2025), sec. 2.3.3 | the length term only; add it to `correctness`       |
| `length_l1_exact` | L1 / LCPO (Aggarwal & Welleck 2025), eq. 1 | the penalty `-alpha*|n_gold - n_y|`; add to `correctness` |
| `length_l1_max` | L1 / LCPO, eq. 2             | the whole reward `correct * clip(...)`; use instead of `correctness` |
| `length_cosine` | Yeo et al. 2025 ("Demystifying long CoT"), eq. 1 | the whole length-scaled correctness reward |
| `overlong_dapo` | DAPO (Yu et al. 2025), eq. 13 | the soft overlong penalty in [-1, 0]; add it      |

Departures: lengths are completion tokens as sampled (EOS included when it was emitted);
L1's target `n_gold` comes from `example["target_length"]` (the data side writes it and
appends "Think for N tokens." to the prompt, see `jaxrl_reason.data.tasks`), or is parsed
from that sentence in the prompt when the key is missing.
"""
from __future__ import annotations

import re

import numpy as np

from jaxrl_reason.rewards.base import BatchContext, register_batch_reward

_THINK_FOR = re.compile(r"Think for (\d{1,7}) tokens")


def _groups(values: np.ndarray, group_size: int) -> np.ndarray:
    if group_size < 1 or values.shape[0] % group_size:
        raise ValueError(f"{values.shape[0]} rows do not split into groups of {group_size}")
    return values.reshape(-1, group_size)


# ------------------------------------------------------------------------------ formulas


def kimi_length_reward(lengths: np.ndarray, correct: np.ndarray, group_size: int) -> np.ndarray:
    """Kimi k1.5 length reward: per group, lambda = 0.5 - (len - min_len) / (max_len - min_len).

    A correct sample gets lambda (shorter than the group's midpoint: positive), a wrong one
    min(0, lambda) (long wrong answers are penalized, short ones not rewarded). A group whose
    samples all have one length gets 0.

    Args:
      lengths: int [N] completion lengths in tokens, rows grouped by prompt (group-major).
      correct: bool [N].
      group_size: samples per prompt G (N divisible by G).
    Returns:
      float32 [N] in [-0.5, 0.5].
    """
    lens = _groups(np.asarray(lengths, np.float64), group_size)
    lo, hi = lens.min(axis=1, keepdims=True), lens.max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    lam = np.where(hi > lo, 0.5 - (lens - lo) / span, 0.0).reshape(-1)
    ok = np.asarray(correct, bool)
    return np.where(ok, lam, np.minimum(0.0, lam)).astype(np.float32)


def l1_exact_penalty(lengths: np.ndarray, target_lengths: np.ndarray,
                     alpha: float = 0.0003) -> np.ndarray:
    """L1-Exact (LCPO) length term: -alpha * |n_gold - n_y| (float32 [N]).

    The paper's reward is `1[y correct] - alpha * |n_gold - n_y|`: weight this component
    and `correctness` both 1. `target_lengths` int [N] is n_gold per row.
    """
    diff = np.abs(np.asarray(target_lengths, np.float64) - np.asarray(lengths, np.float64))
    return (-float(alpha) * diff).astype(np.float32)


def l1_max_reward(lengths: np.ndarray, target_lengths: np.ndarray, correct: np.ndarray,
                  alpha: float = 0.0003, delta: float = 0.5) -> np.ndarray:
    """L1-Max (LCPO) reward: 1[correct] * clip(alpha * (n_gold - n_y) + delta, 0, 1).

    The whole reward (correctness included): use it in place of `correctness`. Float32 [N]
    in [0, 1]; a correct answer within budget earns at least `delta`, the score falling
    off softly past the budget.
    """
    slack = np.asarray(target_lengths, np.float64) - np.asarray(lengths, np.float64)
    shaped = np.clip(float(alpha) * slack + float(delta), 0.0, 1.0)
    return np.where(np.asarray(correct, bool), shaped, 0.0).astype(np.float32)


def cosine_length_reward(lengths: np.ndarray, correct: np.ndarray, truncated: np.ndarray,
                         max_length: int, *, correct_short: float = 2.0,
                         correct_long: float = 1.0, wrong_short: float = -10.0,
                         wrong_long: float = 0.0, exceed: float = -10.0) -> np.ndarray:
    """Cosine length-scaled correctness reward (Yeo et al. 2025, eq. 1).

    CosFn(t, T, r0, rT) = rT + (r0 - rT) * (1 + cos(t * pi / T)) / 2 interpolates from r0
    at length 0 to rT at the budget T = `max_length`: correct answers earn more when short
    (r0 = `correct_short` > rT = `correct_long`), wrong answers are penalized less when
    long (`wrong_short` < `wrong_long`), so the model thinks longer when it is wrong. A
    truncated completion (no answer within the budget) gets `exceed`. Float32 [N].
    """
    if max_length <= 0:
        raise ValueError(f"cosine length reward: max_length must be positive, got {max_length}")
    t = np.clip(np.asarray(lengths, np.float64), 0, max_length)
    wave = (1.0 + np.cos(t * np.pi / max_length)) / 2.0
    ok = np.asarray(correct, bool)
    r0 = np.where(ok, correct_short, wrong_short)
    r_t = np.where(ok, correct_long, wrong_long)
    out = r_t + (r0 - r_t) * wave
    return np.where(np.asarray(truncated, bool), exceed, out).astype(np.float32)


def dapo_overlong_penalty(lengths: np.ndarray, truncated: np.ndarray, max_length: int,
                          cache_length: int) -> np.ndarray:
    """DAPO soft overlong punishment (eq. 13), float32 [N] in [-1, 0].

    0 up to L_max - L_cache tokens, then falls linearly to -1 at L_max = `max_length`;
    -1 for a truncated completion (longer than L_max). `cache_length` = L_cache < L_max.
    """
    if not 0 < cache_length < max_length:
        raise ValueError(f"DAPO overlong penalty: need 0 < cache_length ({cache_length}) < "
                         f"max_length ({max_length})")
    lens = np.asarray(lengths, np.float64)
    soft = max_length - cache_length
    out = np.where(lens <= soft, 0.0, (soft - lens) / cache_length)
    out = np.maximum(out, -1.0)
    return np.where(np.asarray(truncated, bool), -1.0, out).astype(np.float32)


# ------------------------------------------------------------------- batch rewards


def target_lengths(examples) -> np.ndarray:
    """int64 [N] L1 targets: example["target_length"], else "Think for N tokens." in the
    prompt. Raises ValueError naming the example id when neither exists."""
    out = []
    for ex in examples:
        value = ex.get("target_length")
        if value is None:
            m = _THINK_FOR.search(str(ex.get("prompt", "")))
            value = int(m.group(1)) if m else None
        if value is None or isinstance(value, bool) or int(value) < 0:
            raise ValueError(
                f"L1 length reward: example {ex.get('id', '?')!r} has no target length (no "
                "'target_length' key and no 'Think for N tokens.' in its prompt); set "
                "task.length_targets in the config")
        out.append(int(value))
    return np.asarray(out, np.int64)


@register_batch_reward("length_kimi", needs_correct=True)
def length_kimi(ctx: BatchContext) -> np.ndarray:
    """`kimi_length_reward` over the batch's groups."""
    return kimi_length_reward(ctx.lengths, ctx.correct, ctx.group_size)


@register_batch_reward("length_l1_exact")
def length_l1_exact(ctx: BatchContext, alpha: float = 0.0003) -> np.ndarray:
    """`l1_exact_penalty` with each example's target length."""
    return l1_exact_penalty(ctx.lengths, target_lengths(ctx.examples), alpha)


@register_batch_reward("length_l1_max", needs_correct=True)
def length_l1_max(ctx: BatchContext, alpha: float = 0.0003, delta: float = 0.5) -> np.ndarray:
    """`l1_max_reward` with each example's target length."""
    return l1_max_reward(ctx.lengths, target_lengths(ctx.examples), ctx.correct, alpha, delta)


@register_batch_reward("length_cosine", needs_correct=True)
def length_cosine(ctx: BatchContext, correct_short: float = 2.0, correct_long: float = 1.0,
                  wrong_short: float = -10.0, wrong_long: float = 0.0,
                  exceed: float = -10.0) -> np.ndarray:
    """`cosine_length_reward` with T = the rollout budget (`ctx.max_length`)."""
    return cosine_length_reward(ctx.lengths, ctx.correct, ctx.truncated,
                                ctx.max_length, correct_short=correct_short,
                                correct_long=correct_long, wrong_short=wrong_short,
                                wrong_long=wrong_long, exceed=exceed)


@register_batch_reward("overlong_dapo")
def overlong_dapo(ctx: BatchContext, cache_length: int = 0) -> np.ndarray:
    """`dapo_overlong_penalty` with L_max = the rollout budget; `cache_length` 0 means a
    quarter of it (DAPO used 4k of 20k tokens)."""
    cache = int(cache_length) or max(1, ctx.max_length // 4)
    return dapo_overlong_penalty(ctx.lengths, ctx.truncated, ctx.max_length, cache)
