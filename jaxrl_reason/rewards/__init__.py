"""Verifiers and reward shaping: registered reward functions and the host thread pool.

Importing this package registers the built-in rewards: "correctness" (math answers),
"format_strict" and "format_lenient" (the `<think>`/`<answer>` template).
"""
from jaxrl_reason.rewards import format, math  # noqa: F401  (register the built-in rewards)
from jaxrl_reason.rewards.base import (
    RewardFunction,
    RewardResult,
    available_rewards,
    get_reward,
    register_reward,
)
from jaxrl_reason.rewards.format import format_lenient, format_strict
from jaxrl_reason.rewards.math import correctness, extract_answer, is_equivalent
from jaxrl_reason.rewards.pool import BatchRewards, RewardPool

__all__ = [
    "BatchRewards",
    "RewardFunction",
    "RewardPool",
    "RewardResult",
    "available_rewards",
    "correctness",
    "extract_answer",
    "format_lenient",
    "format_strict",
    "get_reward",
    "is_equivalent",
    "register_reward",
]
