"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE ...") on the default task.

    jaxrl-reason train --config configs/arith_rloo.py
    jaxrl-reason train --config configs/arith_rloo.py:smoke

REINFORCE with the leave-one-out baseline: A_i = r_i - mean_{j != i} r_j, no std scaling,
one on-policy update per batch (the ratio is 1, so clipping never binds).
Departures: the per-token loss is averaged per sequence then over sequences (the paper
uses sequence log-likelihoods, i.e. a token sum); no KL in the reward by default.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_rloo"
    c.rl.algorithm = "rloo"
    c.rl.advantage_estimator = "rloo"       # leave-one-out baseline
    c.rl.advantage_scale = "none"
    c.rl.beta = 0.0
    return c
