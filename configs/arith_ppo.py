"""PPO with a learned critic (Schulman et al. 2017; InstructGPT, Ouyang et al. 2022) on the
default task.

    jaxrl-reason train --config configs/arith_ppo.py
    jaxrl-reason train --config configs/arith_ppo.py:smoke

A value model (the policy's trunk with a scalar head, initialized from the SFT policy, its
own AdamW) estimates V(s_t) per completion token; advantages are GAE (gamma 1, lambda 0.95)
over InstructGPT token rewards (the verifier's reward at the last token, minus
beta * KL(policy || SFT reference) at every token), whitened over the batch; the policy
takes the clipped token-level loss (token mean) and the critic the clipped value loss, two
epochs per batch (num_iterations = 2, so the clip binds).
Departures: 4 samples per prompt (PPO needs no group, but our prompts are cheap to repeat,
which keeps the batch shape of the GRPO configs); the critic trains on the same batch right
after each policy epoch (verl trains it before); no critic warm-up by default.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_ppo"
    c.rl.algorithm = "ppo"
    c.rl.advantage_estimator = "gae"        # per-token advantages from the critic
    c.rl.gamma = 1.0
    c.rl.lam = 0.95
    c.rl.whiten_advantages = True
    c.rl.loss_type = "bnpo"                 # token mean over the batch
    c.rl.num_iterations = 2                 # PPO epochs per batch
    c.rl.beta = 0.02                        # KL coefficient of the token rewards
    c.rl.kl_in_reward = True                # InstructGPT: KL shapes the reward, not the loss
    c.rl.kl_estimator = "k1"                # log pi - log pi_ref per token
    c.rl.skip_zero_advantage_rows = False   # per-token advantages are never all zero
    c.rl.value.init = "policy"
    c.rl.value.learning_rate = 2e-4
    c.rl.value.clip_range = 0.2
    return c
