"""Model params initialized once per test process and laid out on any mesh.

Each `init_params` call jits and compiles its own init program (one to two seconds on a
CPU even for the "test" preset), so a file that compares one model on several meshes, or
runs many parametrized cases of one model, takes the same values from here instead: one
init compile per (config, seed), and every mesh of a comparison gets identical params."""
from __future__ import annotations

import functools

import jax

from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.params import init_params, param_shardings
from jaxrl_reason.runtime import sharding as shd

__all__ = ["host_params", "params_on"]


@functools.lru_cache(maxsize=None)
def host_params(cfg: ModelConfig, seed: int = 0):
    """`init_params(cfg, jax.random.key(seed))` as host arrays, computed once per
    (cfg, seed) on one device.

    Args:
      cfg: a (hashable, frozen) `ModelConfig`; seed: int, the init key's seed.
    Returns:
      the nested dict of numpy arrays of `cfg.param_dtype`; shared by every caller, so
      read-only.
    """
    mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
    return jax.device_get(init_params(cfg, jax.random.key(seed), mesh, shd.DEFAULT_RULES))


def params_on(cfg: ModelConfig, mesh, rules=shd.DEFAULT_RULES, seed: int = 0):
    """`host_params(cfg, seed)` in fresh device buffers laid out on `mesh` by `rules`, as
    `init_params` lays them out (an update may donate them).

    Args:
      cfg: the `ModelConfig`; mesh: a `jax.sharding.Mesh`; rules: logical-axis rules;
      seed: int.
    Returns:
      the params pytree of `jax.Array`s.
    """
    return jax.device_put(host_params(cfg, seed), param_shardings(cfg, mesh, rules))
