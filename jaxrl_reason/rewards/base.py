"""Reward results and the registry of reward functions by name.

A reward function scores one completion against its example on the host (no device code):
`fn(completion: str, example: Mapping[str, Any]) -> RewardResult | float`, where `example`
holds at least the str keys "prompt" and "answer". Register it with `@register_reward(name)`
and refer to it by that name in configs and in `RewardPool` weights.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

RewardFunction = Callable[[str, Mapping[str, Any]], "RewardResult | float"]
_F = TypeVar("_F", bound=Callable[..., Any])

_REGISTRY: dict[str, RewardFunction] = {}
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


def register_reward(name: str, *, overwrite: bool = False) -> Callable[[_F], _F]:
    """Decorator registering a reward function under `name` (returns it unchanged).

    Raises ValueError for an empty name or a name already taken by another function
    (unless `overwrite`), TypeError when the decorated object is not callable.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"reward name must be a non-empty str without '/', got {name!r}")

    def decorator(fn: _F) -> _F:
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}): {fn!r} is not callable")
        with _LOCK:
            existing = _REGISTRY.get(name)
            same = existing is not None and (
                getattr(existing, "__qualname__", None) == getattr(fn, "__qualname__", None)
                and getattr(existing, "__module__", None) == getattr(fn, "__module__", None)
            )
            if existing is not None and not (overwrite or same):
                raise ValueError(f"reward {name!r} is already registered to {existing!r}")
            _REGISTRY[name] = fn
        return fn

    return decorator


def get_reward(name: str) -> RewardFunction:
    """The reward function registered as `name`; ValueError listing known names otherwise."""
    with _LOCK:
        fn = _REGISTRY.get(name)
        if fn is None:
            raise ValueError(f"unknown reward {name!r}; known rewards: {sorted(_REGISTRY)}")
        return fn


def available_rewards() -> list[str]:
    """Sorted names of all registered reward functions."""
    with _LOCK:
        return sorted(_REGISTRY)
