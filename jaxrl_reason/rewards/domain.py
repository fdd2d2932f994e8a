"""The `domain_verifier` reward: each row of a task mixture scored by its own domain's verifier.

A mixture's examples carry "verifier", the registered reward of their domain ("correctness"
for arithmetic, "countdown", "knights_knaves", "code"; see `data/mixture.py`). This reward
looks it up per row and returns its result, so one weight in `config.rewards.weights`
(`{"domain_verifier": 1.0, "format_strict": 0.1}`) scores a batch that mixes domains, and
the pool's verdicts (`accuracy`, length shaping, evaluation) are each row's own domain's.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards.base import RewardResult, get_reward, register_reward

NAME = "domain_verifier"


@register_reward(NAME)
def domain_verifier(completion: str, example: Mapping[str, Any], *,
                    verifier_options: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> RewardResult | float:
    """The score of `example["verifier"]`'s reward on this completion.

    Args:
      completion: the decoded completion.
      example: the row's example; "verifier" names a registered per-completion reward.
      verifier_options: keyword options per verifier name, e.g.
        `{"code": {"limits": {"wall_s": 2.0}}}` (config:
        `rewards.options.domain_verifier.verifier_options`).
    Returns:
      the verifier's RewardResult or float; RewardResult(0, "no_verifier") when the example
      names none (an example from outside a mixture).
    Raises:
      ValueError: the named verifier is unknown, or is `domain_verifier` itself (the pool
        scores it 0 with reason "domain_verifier/exception").
    """
    name = example.get("verifier")
    if not isinstance(name, str) or not name:
        return RewardResult(0.0, "no_verifier")
    if name == NAME:
        raise ValueError(f"example {example.get('id', '?')!r} names {NAME!r} as its own "
                         "verifier")
    fn = get_reward(name)
    options = dict((verifier_options or {}).get(name) or {})
    return fn(completion, example, **options)
