"""Reward results and the registry of reward functions by name.

Two kinds, one namespace of names (configs and `RewardPool` weights refer to either):

- a *reward function* scores one completion against its example on the host (no device
  code): `fn(completion: str, example: Mapping[str, Any], **options) -> RewardResult |
  float`, where `example` holds at least the str keys "prompt" and "answer". Register it
  with `@register_reward(name)`. The pool runs these on worker threads.
- a *batch reward* scores a whole batch at once from a `BatchContext` (token lengths,
  truncation, groups, the verifier's verdicts): `fn(ctx, **options) -> float array [N]`.
  Register it with `@register_batch_reward(name)`. Length shaping is built this way.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

RewardFunction = Callable[[str, Mapping[str, Any]], "RewardResult | float"]
_F = TypeVar("_F", bound=Callable[..., Any])

_LIMITS = threading.local()


def limit_scale() -> float:
    """How much longer than their defaults the calling reward's own time limits should be:
    a `RewardPool`'s `limit_scale` on its threads (an evaluation retries undecided answers
    in a pool with a larger one), 1.0 elsewhere. Rewards with an inner limit (the math
    verifier's per-comparison CPU time) multiply it by this."""
    return getattr(_LIMITS, "scale", 1.0)


def set_limit_scale(scale: float) -> None:
    """Sets `limit_scale()` for the calling thread (`RewardPool` does, on its threads)."""
    _LIMITS.scale = float(scale)


_REGISTRY: dict[str, RewardFunction] = {}
_BATCH_REGISTRY: dict[str, "BatchRewardSpec"] = {}
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RewardResult:
    """The score of one completion, with a short reason when it is 0 or the input was bad.

    Attributes:
      score: the reward (a float; pools count NaN/inf as 0 with reason "nonfinite").
      reason: a short snake_case tag such as "no_answer" or "wrong"; None for a plain success.
    """

    score: float
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class BatchContext:
    """What a batch reward sees: one scored batch of N = P * G completions (group-major).

    Attributes:
      completions: N decoded completion texts.
      examples: N example mappings (each prompt's example repeated G times).
      lengths: int [N] completion lengths in tokens.
      truncated: bool [N], True where the sampler hit the token budget before EOS.
      max_length: the sampler's token budget L.
      group_size: G, samples per prompt.
      correct: bool [N], the task verifier's verdict (score > 0.5); None unless the batch
        reward was registered with `needs_correct=True`.
      components: name -> float32 [N] unweighted scores of the per-completion rewards.
    """

    completions: Sequence[str]
    examples: Sequence[Mapping[str, Any]]
    lengths: np.ndarray
    truncated: np.ndarray
    max_length: int
    group_size: int
    correct: np.ndarray | None
    components: Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class BatchRewardSpec:
    """A registered batch reward: `fn(ctx, **options) -> float [N]`; `needs_correct` asks
    the pool to run the task verifier first and fill `ctx.correct`."""

    fn: Callable[..., np.ndarray]
    needs_correct: bool


def _same_function(a: Callable, b: Callable) -> bool:
    return (getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
            and getattr(a, "__module__", None) == getattr(b, "__module__", None))


def _register(name: str, fn: Callable, entry: Any, table: dict, overwrite: bool) -> None:
    if not callable(fn):
        raise TypeError(f"register_reward({name!r}): {fn!r} is not callable")
    with _LOCK:
        existing = _REGISTRY.get(name) or getattr(_BATCH_REGISTRY.get(name), "fn", None)
        if existing is not None and not (overwrite or _same_function(existing, fn)):
            raise ValueError(f"reward {name!r} is already registered to {existing!r}")
        _REGISTRY.pop(name, None)
        _BATCH_REGISTRY.pop(name, None)
        table[name] = entry


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"reward name must be a non-empty str without '/', got {name!r}")


def register_reward(name: str, *, overwrite: bool = False) -> Callable[[_F], _F]:
    """Decorator registering a per-completion reward function under `name` (returns it
    unchanged).

    Raises ValueError for an empty name or a name already taken by another function
    (unless `overwrite`), TypeError when the decorated object is not callable.
    """
    _check_name(name)

    def decorator(fn: _F) -> _F:
        _register(name, fn, fn, _REGISTRY, overwrite)
        return fn

    return decorator


def register_batch_reward(name: str, *, needs_correct: bool = False,
                          overwrite: bool = False) -> Callable[[_F], _F]:
    """Decorator registering a batch reward `fn(ctx: BatchContext, **options) -> [N]`.

    `needs_correct`: the reward reads `ctx.correct`, the task verifier's verdicts. Same
    errors as `register_reward`; batch and per-completion rewards share one namespace.
    """
    _check_name(name)

    def decorator(fn: _F) -> _F:
        _register(name, fn, BatchRewardSpec(fn, bool(needs_correct)), _BATCH_REGISTRY,
                  overwrite)
        return fn

    return decorator


def get_reward(name: str) -> RewardFunction:
    """The per-completion reward function registered as `name`; ValueError otherwise."""
    with _LOCK:
        fn = _REGISTRY.get(name)
        if fn is None:
            kind = " (a batch reward)" if name in _BATCH_REGISTRY else ""
            raise ValueError(f"unknown reward {name!r}{kind}; known rewards: "
                             f"{sorted(_REGISTRY)}")
        return fn


def get_batch_reward(name: str) -> BatchRewardSpec | None:
    """The batch reward registered as `name`, or None when `name` is not one."""
    with _LOCK:
        return _BATCH_REGISTRY.get(name)


def available_rewards() -> list[str]:
    """Sorted names of all registered rewards (per-completion and batch)."""
    with _LOCK:
        return sorted(set(_REGISTRY) | set(_BATCH_REGISTRY))
