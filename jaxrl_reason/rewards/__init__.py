"""Verifiers and reward shaping: registered reward functions and the host thread pool.

Importing this package registers the built-in rewards: "correctness" (math answers),
"format_strict" and "format_lenient" (the `<think>`/`<answer>` template), "countdown",
"knights_knaves", "code" (sandboxed Python against test cases), "domain_verifier"
(a task mixture's rows, each by its own domain's verifier), and the length
shaping batch rewards "length_kimi", "length_l1_exact", "length_l1_max", "length_cosine",
"overlong_dapo".
"""
from jaxrl_reason.rewards import (  # noqa: F401  (register the built-in rewards)
    code,
    countdown,
    domain,
    format,
    length,
    logic,
    math,
)
from jaxrl_reason.rewards.base import (
    BatchContext,
    RewardFunction,
    RewardResult,
    available_rewards,
    get_batch_reward,
    get_reward,
    register_batch_reward,
    register_reward,
)
from jaxrl_reason.rewards.format import format_lenient, format_strict
from jaxrl_reason.rewards.math import correctness, extract_answer, is_equivalent
from jaxrl_reason.rewards.pool import BatchRewards, RewardPool

__all__ = [
    "BatchContext",
    "BatchRewards",
    "RewardFunction",
    "RewardPool",
    "RewardResult",
    "available_rewards",
    "correctness",
    "extract_answer",
    "format_lenient",
    "format_strict",
    "get_batch_reward",
    "get_reward",
    "is_equivalent",
    "register_batch_reward",
    "register_reward",
]
