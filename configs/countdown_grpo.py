"""GRPO on Countdown (reach a target with the given numbers and + - * /, each used once).

    jaxrl-reason train --config configs/countdown_grpo.py
    jaxrl-reason train --config configs/countdown_grpo.py:smoke

The recipe of configs/arith_grpo.py on the procedural Countdown task (data/countdown.py):
cold-start SFT on worked constructions, then GRPO with the `countdown` verifier (a safe
exact-arithmetic evaluator; every given number used exactly once) plus the strict format
reward; evaluation on held-out levels 1-2 and on level 3 (four numbers).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "countdown_grpo"
    c.task.name = "countdown"               # the verifier is the "countdown" reward
    c.task.train_levels = (1, 2)            # two or three numbers
    c.task.eval_levels = ((1, 2), (3,))     # held-out in-range, and four numbers
    c.task.prompt_buckets = (48, 80)        # "Using the numbers [..], make N. ..." prompts
    c.rewards.weights = ml_collections.ConfigDict({"countdown": 1.0, "format_strict": 0.1})
    return c
