"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") on the default task.

    jaxrl-reason train --config configs/arith_dr_grpo.py
    jaxrl-reason train --config configs/arith_dr_grpo.py:smoke

GRPO without its two biases: advantages are reward minus the group mean, not divided by the
group std (`advantage_scale="none"`), and the token sum is divided by the constant
B x max_completion_length instead of each sequence's own length (`loss_type="dr_grpo"`).
Departures from the paper: a cold-start SFT first (the paper starts from a base model),
no KL (as the paper), one update per batch.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_dr_grpo"
    c.rl.algorithm = "dr_grpo"
    c.rl.advantage_estimator = "grpo"       # group-mean baseline ...
    c.rl.advantage_scale = "none"           # ... without the std division
    c.rl.loss_type = "dr_grpo"              # sum / (B * max_completion_length)
    c.rl.beta = 0.0
    return c
