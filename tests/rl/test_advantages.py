"""group_advantages / group_stats against an explicit-loop NumPy computation of the formulas.

The reference below covers the centering estimators on real-valued rewards; "passk" (defined
on 0/1 rewards, with its own std) has its own reference in test_passk_advantage.py."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import F32_UNIT_ROUNDOFF, f32_tolerance, group_advantage_tolerance

from jaxrl_reason.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    group_advantages,
    group_stats,
)


# The estimators `reference_advantages` implements (every registered one but "passk").
CENTERING = sorted(set(ADVANTAGE_ESTIMATORS) - {"passk"})


def _std(values, ddof):
    n = len(values)
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - ddof, 1))


def reference_advantages(rewards, group_size, estimator, scale, eps, ddof=0):
    """The documented formulas, one sample at a time, in float64."""
    rewards = [float(r) for r in rewards]
    n = len(rewards)
    groups = [rewards[g:g + group_size] for g in range(0, n, group_size)]
    batch_mean = sum(rewards) / n
    centered = []
    for group in groups:
        constant = max(group) == min(group)
        for i, r in enumerate(group):
            if estimator == "grpo":
                c = 0.0 if constant else r - sum(group) / group_size
            elif estimator == "rloo":
                others = group[:i] + group[i + 1:]
                c = 0.0 if constant else r - sum(others) / len(others)
            else:  # reinforce_pp
                c = 0.0 if max(rewards) == min(rewards) else r - batch_mean
            centered.append(c)
    out = []
    for k, c in enumerate(centered):
        group = groups[k // group_size]
        if scale == "group":
            out.append(0.0 if max(group) == min(group) else c / (_std(group, ddof) + eps))
        elif scale == "batch":
            std = _std(centered, ddof)
            out.append(c / (std + eps) if std > 0 else 0.0)
        else:
            out.append(c)
    return np.array(out)


def _rewards(num_groups, group_size, seed, constant_groups=()):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(num_groups, group_size)).astype(np.float32)
    rewards[:, : group_size // 2] = np.round(rewards[:, : group_size // 2])  # some ties
    for g in constant_groups:
        rewards[g] = 0.1  # float32 mean of 3 or 6 copies is not exactly 0.1: no round-off leak
    return rewards.reshape(-1)


@pytest.mark.parametrize("estimator", CENTERING)
@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
@pytest.mark.parametrize("ddof", [0, 1])
def test_matches_reference(estimator, scale, ddof):
    rewards = _rewards(num_groups=5, group_size=3, seed=0, constant_groups=(1,))
    got = group_advantages(rewards, 3, estimator=estimator, scale=scale, eps=1e-6, ddof=ddof)
    want = reference_advantages(rewards, 3, estimator, scale, 1e-6, ddof)
    assert got.shape == (15,) and got.dtype == jnp.float32
    # float32 vs a float64 reference: G = 3, N = 15 rewards of size max |r| (orders=1).
    atol = group_advantage_tolerance(rewards, 3, estimator=estimator, scale=scale, eps=1e-6,
                                     ddof=ddof, orders=1)["advantages"]
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=atol)


def test_known_values():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], np.float32)  # G=3

    def tol(**kw):  # float32 vs exact values: G = 3, N = 6 rewards in [0, 1] (orders=1)
        return group_advantage_tolerance(rewards, 3, orders=1, **kw)["advantages"]

    grpo = group_advantages(rewards, 3, scale="none")
    np.testing.assert_allclose(grpo, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0], atol=tol(scale="none"))
    rloo = group_advantages(rewards, 3, estimator="rloo", scale="none")
    np.testing.assert_allclose(rloo, [1.0, -0.5, -0.5, 0, 0, 0],
                               atol=tol(estimator="rloo", scale="none"))
    rpp = group_advantages(rewards, 3, estimator="reinforce_pp", scale="none")
    np.testing.assert_allclose(rpp, rewards - 4 / 6,
                               atol=tol(estimator="reinforce_pp", scale="none"))
    # Population std of [1, 0, 0] is sqrt(2)/3; Bessel-corrected is sqrt(1/3).
    pop = group_advantages(rewards, 3, eps=0.0)
    np.testing.assert_allclose(pop[:3], np.array([2, -1, -1]) / 3 / (math.sqrt(2) / 3),
                               atol=tol(eps=0.0))
    bessel = group_advantages(rewards, 3, eps=0.0, ddof=1)
    np.testing.assert_allclose(bessel[:3], np.array([2, -1, -1]) / 3 / math.sqrt(1 / 3),
                               atol=tol(eps=0.0, ddof=1))


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_equal_reward_groups_are_exactly_zero(estimator, scale):
    rewards = _rewards(num_groups=3, group_size=6, seed=1, constant_groups=(0, 2))
    adv = np.asarray(group_advantages(rewards, 6, estimator=estimator, scale=scale))
    assert np.all(np.isfinite(adv))
    assert np.all(adv[0:6] == 0.0) and np.all(adv[12:18] == 0.0)
    assert np.any(adv[6:12] != 0.0)


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_all_equal_batch_is_zero_not_nan(estimator, scale):
    k = {"passk_k": 2} if estimator == "passk" else {}  # the one estimator with a k
    adv = group_advantages(np.full(12, 0.1, np.float32), 6, estimator=estimator, scale=scale,
                           **k)
    assert np.all(np.asarray(adv) == 0.0)


def test_reinforce_pp_keeps_global_signal_of_constant_groups():
    rewards = np.array([1, 1, 0, 0, 1, 0], np.float32)  # group 0 all correct, group 1 wrong
    adv = np.asarray(group_advantages(rewards, 2, estimator="reinforce_pp", scale="none"))
    np.testing.assert_allclose(adv, rewards - 0.5)
    # scale="group" has a zero std there: those groups get 0, not r/eps.
    adv = np.asarray(group_advantages(rewards, 2, estimator="reinforce_pp", scale="group"))
    np.testing.assert_array_equal(adv[:4], 0.0)
    assert np.all(np.abs(adv) < 10)


def test_batch_scale_gives_unit_std():
    rewards = _rewards(num_groups=4, group_size=4, seed=2)
    for estimator in CENTERING:
        adv = np.asarray(group_advantages(rewards, 4, estimator=estimator, scale="batch", eps=0))
        # Exactly 1 in exact arithmetic: each advantage's float32 bound (N = 16, orders=1),
        # plus numpy's float32 std of 16 values of size max |adv| (mean, squares, sqrt).
        atol = (group_advantage_tolerance(rewards, 4, estimator=estimator, scale="batch",
                                          eps=0.0, orders=1)["advantages"]
                + f32_tolerance(16, float(np.abs(adv).max()), chain=3, orders=1))
        np.testing.assert_allclose(adv.std(), 1.0, rtol=0, atol=atol)


def test_rloo_is_rescaled_grpo():
    rewards = _rewards(num_groups=3, group_size=4, seed=3)
    grpo = group_advantages(rewards, 4, estimator="grpo", scale="none")
    rloo = group_advantages(rewards, 4, estimator="rloo", scale="none")
    # Two float32 formulas (G = 4): each within its bound of the exact value, plus the two
    # roundings of grpo * 4 / 3.
    atol = (group_advantage_tolerance(rewards, 4, estimator="rloo", scale="none",
                                      orders=1)["advantages"]
            + 4 / 3 * group_advantage_tolerance(rewards, 4, scale="none", orders=1)["advantages"]
            + 2 * F32_UNIT_ROUNDOFF * float(np.abs(rloo).max()))
    np.testing.assert_allclose(rloo, grpo * 4 / 3, rtol=0, atol=atol)


def test_group_size_one():
    rewards = np.array([0.0, 1.0, 0.5], np.float32)
    for scale in ADVANTAGE_SCALES:
        adv = group_advantages(rewards, 1, scale=scale, ddof=1)
        np.testing.assert_array_equal(adv, 0.0)
    with pytest.raises(ValueError, match="rloo.*group_size >= 2"):
        group_advantages(rewards, 1, estimator="rloo")


def test_jit_and_no_nan_gradient():
    rewards = jnp.asarray(_rewards(num_groups=2, group_size=4, seed=4, constant_groups=(0,)))
    for estimator in CENTERING:
        for scale in ADVANTAGE_SCALES:
            fn = functools.partial(group_advantages, group_size=4, estimator=estimator,
                                   scale=scale)
            # jit vs eager: XLA may fuse and reorder the sums (G = 4, N = 8 rewards).
            atol = group_advantage_tolerance(rewards, 4, estimator=estimator,
                                             scale=scale)["advantages"]
            np.testing.assert_allclose(jax.jit(fn)(rewards), fn(rewards), rtol=0, atol=atol)
            grad = jax.grad(lambda r: jnp.sum(fn(r) ** 2))(rewards)
            assert np.all(np.isfinite(np.asarray(grad)))


def test_group_stats():
    rewards = _rewards(num_groups=3, group_size=4, seed=5, constant_groups=(1,))
    for ddof in (0, 1):
        stats = jax.jit(functools.partial(group_stats, group_size=4, ddof=ddof))(rewards)
        groups = rewards.reshape(3, 4).astype(np.float64)
        tol = group_advantage_tolerance(rewards, 4, ddof=ddof, orders=1)  # vs float64, G = 4
        np.testing.assert_allclose(stats["mean"], [sum(g) / 4 for g in groups], rtol=0,
                                   atol=tol["mean"])
        np.testing.assert_allclose(stats["std"], [_std(list(g), ddof) for g in groups],
                                   rtol=0, atol=tol["std"])
        np.testing.assert_array_equal(stats["zero_variance"], [False, True, False])
        assert stats["zero_variance"].dtype == jnp.bool_
        assert stats["std"][1] == 0.0


def test_bad_arguments():
    rewards = np.zeros(6, np.float32)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        group_advantages(rewards, 3, estimator="ppo")
    with pytest.raises(ValueError, match="unknown advantage scale 'std'.*batch"):
        group_advantages(rewards, 3, scale="std")
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        group_advantages(rewards, 4)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(rewards.reshape(2, 3), 3)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        group_advantages(rewards, 0)
    with pytest.raises(TypeError, match="group_size must be a Python int"):
        group_advantages(rewards, 3.0)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        group_advantages(rewards, 3, eps=-1.0)
    with pytest.raises(ValueError, match="ddof"):
        group_advantages(rewards, 3, ddof=2)
    with pytest.raises(ValueError, match="multiple"):
        group_stats(rewards, 5)
