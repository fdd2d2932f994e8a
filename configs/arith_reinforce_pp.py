"""REINFORCE++ (Hu 2025) on the default task.

    jaxrl-reason train --config configs/arith_reinforce_pp.py
    jaxrl-reason train --config configs/arith_reinforce_pp.py:smoke

No critic and no per-prompt baseline: the reward minus the global batch mean, divided by the
batch std (`advantage_estimator="reinforce_pp"`, `advantage_scale="batch"`), PPO-clipped
token loss averaged over the batch's tokens.
Departures: the paper subtracts a per-token KL penalty from the reward; this config keeps
beta = 0 like the other critic-free ones (set rl.beta > 0 for a KL term in the loss).
"""

import importlib.util
import os

import ml_collections

_HERE = os.path.dirname(os.path.abspath(__file__))


def _arith_grpo():
    """configs/arith_grpo.py, loaded by path (configs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("arith_grpo", os.path.join(_HERE, "arith_grpo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = _arith_grpo().get_config(arg)
    c.name = "arith_reinforce_pp"
    c.rl.algorithm = "reinforce_pp"
    c.rl.advantage_estimator = "reinforce_pp"  # global batch baseline
    c.rl.advantage_scale = "batch"            # global batch std
    c.rl.loss_type = "bnpo"                   # token mean over the batch
    c.rl.beta = 0.0
    return c
