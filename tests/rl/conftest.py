"""Fixtures of the in-process RLTrainer tests: the smoke runtime (built once per module, so
the sampler compiles once) and a factory of trainers on it."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import pytest

from cached_params import params_on
from trainer_support import BASE, SMOKE
from jaxrl_reason.cli import parse
from jaxrl_reason.rl.trainer import RLTrainer
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.runtime.metrics import MetricsWriter


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The smoke runtime, shared by every trainer of this module (one sampler compile)."""
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *BASE])
    return build_runtime(fv.config, str(tmp_path_factory.mktemp("rt")))


@pytest.fixture(scope="module")
def make_trainer(runtime, tmp_path_factory):
    """make(*flag_overrides, weights=None, seed=0) -> (trainer, host copy of initial params).

    Trainers (reward threads, checkpointer) are closed when the module ends.
    """
    made = []

    def make(*overrides, weights=None, seed=0):
        _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *BASE, *overrides])
        cfg = fv.config
        if weights is not None:
            cfg.rewards.weights = ml_collections.ConfigDict(weights)
        workdir = str(tmp_path_factory.mktemp("run"))
        rt = dataclasses.replace(runtime, config=cfg, workdir=workdir)
        params = params_on(rt.model_cfg, rt.mesh, rt.rules, seed)  # one init compile
        initial = jax.device_get(params)  # the trainer donates `params` on its first update
        writer = MetricsWriter(workdir, tensorboard=False, console=False)
        trainer = RLTrainer(rt, writer, init_params=params)
        made.append((trainer, writer))
        return trainer, initial

    yield make
    for trainer, writer in made:
        trainer.rewards.close()
        trainer.ckpt.close()
        writer.close()
