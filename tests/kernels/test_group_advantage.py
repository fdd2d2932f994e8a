"""Pallas group-advantage kernel (interpret mode) against jaxrl_reason.rl.advantages, for every
registered estimator and scale: the kernel's values where it declares support, a refusal (and
the backends' fallback to the reference) where it does not."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from numerics import group_advantage_tolerance

from jaxrl_reason.kernels.group_advantage import SUPPORTS, BlockSizes, group_advantage
from jaxrl_reason.rl import backends
from jaxrl_reason.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    group_advantages,
    group_stats,
)

ESTIMATORS = sorted(ADVANTAGE_ESTIMATORS)
SCALES = sorted(ADVANTAGE_SCALES)
SMALL = BlockSizes(block_groups=8)  # several row blocks even for a few groups


@functools.partial(jax.jit, static_argnames=("group_size", "estimator", "scale", "eps", "ddof"))
def _reference(rewards, group_size, *, estimator="grpo", scale="group", eps=1e-6, ddof=0):
    """(advantages, stats) of the jnp reference, as the kernel returns them."""
    adv = group_advantages(rewards, group_size, estimator=estimator, scale=scale, eps=eps,
                           ddof=ddof)
    return adv, group_stats(rewards, group_size, ddof=ddof)


def _supported(estimator, scale):
    return estimator in SUPPORTS["estimator"] and scale in SUPPORTS["scale"]


def _rewards(seed, num_groups, group_size, *, constant_groups=0.3):
    """Rewards on a coarse grid (as verifiers give), some groups all equal."""
    rng = np.random.default_rng(seed)
    r = rng.integers(-2, 3, (num_groups, group_size)).astype(np.float32) * 0.5
    r[rng.uniform(size=num_groups) < constant_groups] = 1.0
    return r.reshape(-1)


def _assert_matches(rewards, group_size, block_sizes=SMALL, interpret=True, **kw):
    adv, stats = group_advantage(rewards, group_size, block_sizes=block_sizes,
                                 interpret=interpret, **kw)
    ref_adv, ref_stats = _reference(rewards, group_size, **kw)
    assert adv.shape == ref_adv.shape and adv.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(adv)))
    # Kernel vs jnp: other summation orders over G (or the N of the batch) rewards of size
    # max |r|; the float32 bound of tests/numerics.py, far below a wrong formula's O(|adv|).
    tol = group_advantage_tolerance(rewards, group_size, **kw)
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=tol["advantages"])
    np.testing.assert_allclose(stats["mean"], ref_stats["mean"], rtol=0, atol=tol["mean"])
    np.testing.assert_allclose(stats["std"], ref_stats["std"], rtol=0, atol=tol["std"])
    np.testing.assert_array_equal(stats["zero_variance"], ref_stats["zero_variance"])
    assert stats["zero_variance"].dtype == jnp.bool_
    return adv, stats


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("scale", SCALES)
def test_every_estimator_and_scale(estimator, scale):
    # 21 groups of 6 -> 3 row blocks of 8 groups, lanes padded 6 -> 128.
    rewards = _rewards(0, 21, 6)
    if not _supported(estimator, scale):  # registered, not implemented: refused, not guessed
        with pytest.raises(ValueError, match="does not implement"):
            group_advantage(rewards, 6, estimator=estimator, scale=scale, interpret=True)
        k = {"passk_k": 2} if estimator == "passk" else {}  # the one estimator with a k
        np.testing.assert_array_equal(
            backends.group_advantages(rewards, 6, estimator=estimator, scale=scale,
                                      backend="pallas", **k),
            group_advantages(rewards, 6, estimator=estimator, scale=scale, **k))
        return
    _assert_matches(rewards, 6, estimator=estimator, scale=scale)
    # Same shapes (no recompile): a constant batch, every group zero-variance.
    adv, stats = _assert_matches(np.full(21 * 6, 0.25, np.float32), 6, estimator=estimator,
                                 scale=scale)
    assert bool(jnp.all(stats["zero_variance"]))
    np.testing.assert_array_equal(adv, 0.0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_groups=st.integers(1, 19), group_size=st.sampled_from([1, 2, 3, 5, 8, 16, 130]),
       estimator=st.sampled_from(sorted(SUPPORTS["estimator"])),
       scale=st.sampled_from(sorted(SUPPORTS["scale"])),
       ddof=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_generated_shapes(num_groups, group_size, estimator, scale, ddof, seed):
    if estimator == "rloo" and group_size < 2:
        estimator = "grpo"
    rewards = _rewards(seed, num_groups, group_size)
    _assert_matches(rewards, group_size, estimator=estimator, scale=scale, ddof=ddof,
                    eps=1e-4)


def test_continuous_rewards_default_blocks_and_ddof():
    rewards = np.random.default_rng(3).normal(size=37 * 8).astype(np.float32)
    _assert_matches(rewards, 8, block_sizes=BlockSizes(), estimator="reinforce_pp",
                    scale="batch", ddof=1)


def test_tpu_interpret_mode_semantics():
    """The TPU interpreter models block write-back: the multi-phase grid must still hold."""
    rewards = _rewards(5, 19, 4)
    _assert_matches(rewards, 4, interpret=pltpu.InterpretParams(), estimator="reinforce_pp",
                    scale="batch")


def test_jit_and_backends():
    rewards = jnp.asarray(_rewards(1, 10, 4))
    expected = _reference(rewards, 4, estimator="rloo", scale="batch")[0]

    @jax.jit
    def f(r):
        return backends.group_advantages(r, 4, estimator="rloo", scale="batch",
                                         backend="pallas")

    # Kernel (or auto's choice) vs jnp: G = 4, N = 40 rewards (tests/numerics.py).
    tol = group_advantage_tolerance(rewards, 4, estimator="rloo", scale="batch")
    np.testing.assert_allclose(f(rewards), expected, rtol=0, atol=tol["advantages"])
    np.testing.assert_allclose(
        backends.group_advantages(rewards, 4, estimator="rloo", scale="batch", backend="auto"),
        expected, rtol=0, atol=tol["advantages"])
    stats = backends.group_stats(rewards, 4, backend="pallas")
    np.testing.assert_allclose(stats["std"], _reference(rewards, 4)[1]["std"], rtol=0,
                               atol=group_advantage_tolerance(rewards, 4)["std"])


def test_resolve_backend():
    assert backends.resolve_backend("reference") == "reference"
    assert backends.resolve_backend("pallas") == "pallas"
    expected = "pallas" if jax.default_backend() in ("tpu", "gpu") else "reference"
    assert backends.resolve_backend("auto") == expected
    with pytest.raises(ValueError, match="unknown kernel backend"):
        backends.resolve_backend("triton")


def test_errors_match_reference():
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        group_advantage(jnp.ones(4), 1, estimator="rloo", interpret=True)
    with pytest.raises(ValueError, match="estimator='ppo'"):
        group_advantage(jnp.ones(4), 2, estimator="ppo", interpret=True)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        group_advantage(jnp.ones(4), 2, eps=-1.0, interpret=True)
    with pytest.raises(ValueError, match="positive multiple of group_size"):
        group_advantage(jnp.ones(5), 2, interpret=True)
    with pytest.raises(ValueError, match="multiple of 8"):
        BlockSizes(block_groups=12)


# ----------------------------------------------------------------------------- TPU (AOT)


def _tpu_topology():
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install 'jax[tpu]'): no TPU AOT compile")
    from jax.experimental import topologies

    # Another process may hold libtpu's lock file; compiling ahead of time needs no device.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")


def test_aot_compiles_for_tpu_v5e():
    """Mosaic-compiles every phase layout of the kernel for a v5e chip on this CPU."""
    topology = _tpu_topology()
    mesh = jax.sharding.Mesh(np.array(topology.devices[:1]), ("data",))
    spec = jax.ShapeDtypeStruct((37 * 8,), jnp.float32, sharding=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    for estimator, scale, group_size in (("grpo", "group", 8), ("rloo", "batch", 8),
                                         ("reinforce_pp", "batch", 37),
                                         ("reinforce_pp", "none", 8)):
        compiled = jax.jit(lambda r: group_advantage(  # noqa: B023
            r, group_size, estimator=estimator, scale=scale)).lower(spec).compile()
        assert "tpu_custom_call" in compiled.as_text()
