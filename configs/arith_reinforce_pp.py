"""REINFORCE++ (Hu 2025) on the default task.

    jaxrl-reason train --config configs/arith_reinforce_pp.py
    jaxrl-reason train --config configs/arith_reinforce_pp.py:smoke

No critic and no per-prompt baseline: the reward minus the global batch mean, divided by the
batch std (`advantage_estimator="reinforce_pp"`, `advantage_scale="batch"`), PPO-clipped
token loss averaged over the batch's tokens.
Departures: the paper subtracts a per-token KL penalty from the reward; this config keeps
beta = 0 like the other critic-free ones (set rl.beta > 0 for a KL term in the loss).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_reinforce_pp"
    c.rl.algorithm = "reinforce_pp"
    c.rl.advantage_estimator = "reinforce_pp"  # global batch baseline
    c.rl.advantage_scale = "batch"            # global batch std
    c.rl.loss_type = "bnpo"                   # token mean over the batch
    c.rl.beta = 0.0
    return c
