"""DAPO (Yu et al. 2025) on the default task.

    jaxrl-reason train --config configs/arith_dapo.py
    jaxrl-reason train --config configs/arith_dapo.py:smoke

The four DAPO techniques: clip-higher (epsilon_low 0.2, epsilon_high 0.28), dynamic
sampling (resample until every group of the batch has reward variance, at most 3 extra
rounds), token-level loss over the global batch (`loss_type="dapo"`), and the soft
overlong penalty (`overlong_dapo` reward, cache = a quarter of the budget). No KL.
Departures: a cold-start SFT first; the overlong window is scaled to our 96-token budget
(the paper: 4k of 20k tokens); dynamic sampling is capped (the paper samples until full).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_dapo"
    c.rl.algorithm = "dapo"
    c.rl.epsilon_low = 0.2
    c.rl.epsilon_high = 0.28                # clip-higher
    c.rl.loss_type = "dapo"                 # token mean over the global batch
    c.rl.dynamic_sampling = True            # keep only groups whose rewards differ
    c.rl.dynamic_sampling_max_rounds = 3
    c.rl.beta = 0.0
    c.rewards.weights = ml_collections.ConfigDict(
        {"correctness": 1.0, "format_strict": 0.1, "overlong_dapo": 1.0})
    return c
