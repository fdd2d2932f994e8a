"""The rollout's metrics of an RL step: rewards, verdicts, lengths, per domain."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_reason.evaluation.pass_at_k import domain_metrics
from jaxrl_reason.rewards.pool import BatchRewards
from jaxrl_reason.rl.batches import zero_variance_groups


def rollout_metrics(rewards: BatchRewards, host: Mapping[str, np.ndarray],
                    num_generations: int, verifier: str,
                    examples: Sequence[Mapping[str, Any]] = ()) -> dict[str, float]:
    """Batch means of rewards, lengths and verdicts of N = B * G group-major rows.

    `rewards.total` float [N]; `host["lengths"]` int [N] and `host["truncated"]` bool [N];
    `examples` the B prompts' rows (a "domain" key adds per-domain metrics). Returns floats:
    `rewards/unscored`, the reward calls the pool's wall-clock backstop left without a
    verdict (scored 0, not wrong); reward mean/std and per component; the share of groups
    whose rewards are all equal; completion length mean/max and truncated share;
    `accuracy` (the verifier's component) and `format_rate`; for a task mixture
    `accuracy/<domain>`, `reward/<domain>`, `length/<domain>`, `frac/<domain>`."""
    zero_variance = zero_variance_groups(rewards.total, num_generations)
    lengths = host["lengths"]
    out = {
        "rewards/unscored": float(sum(count for tag, count in rewards.reasons.items()
                                      if tag.endswith("/unscored"))),
        "reward/mean": float(np.mean(rewards.total)),
        "reward/std": float(np.std(rewards.total)),
        "frac_zero_variance_groups": float(np.mean(zero_variance)),
        "completion/length_mean": float(np.mean(lengths)),
        "completion/length_max": float(np.max(lengths)),
        "completion/truncated_frac": float(np.mean(host["truncated"])),
    }
    for name, values in rewards.components.items():
        out[f"reward/{name}"] = float(np.mean(values))
    if verifier in rewards.components:
        out["accuracy"] = out[f"reward/{verifier}"]
    for name in ("format_strict", "format_lenient"):
        if name in rewards.components:
            out["format_rate"] = out[f"reward/{name}"]
    domains = [e.get("domain") for e in examples for _ in range(num_generations)]
    if any(domains) and len(domains) == len(rewards.total):
        out.update(domain_metrics(domains, rewards.total, rewards.components.get(verifier),
                                  lengths))
    return out
