"""The float32 tolerance helper (tests/numerics.py): its bound holds for real float32 sums
in several orders, and bad arguments are refused."""
import numpy as np
import pytest

from numerics import (F32_UNIT_ROUNDOFF, abs_matmul_magnitude, attention_tolerance,
                      f32_tolerance, gamma, rms_projection_bound)


def test_gamma_values():
    assert gamma(1) == pytest.approx(2.0 ** -24, rel=1e-12)
    assert gamma(1000) == pytest.approx(1000 * F32_UNIT_ROUNDOFF / (1 - 1000 * F32_UNIT_ROUNDOFF))
    for bad in (0, -3, 2.5, True, 2 ** 24):
        with pytest.raises(ValueError):
            gamma(bad)


@pytest.mark.parametrize("n", [7, 300, 4096])
def test_bound_holds_for_float32_sums_in_different_orders(n):
    """Forward, reverse, pairwise and blocked float32 sums of cancelling terms stay within
    the tolerance of each other and (orders=1) of the float64 sum."""
    rng = np.random.default_rng(n)
    x = (rng.normal(size=n) * 10.0 ** rng.uniform(-3, 3, size=n)).astype(np.float32)
    exact = float(np.sum(x.astype(np.float64)))
    sums = [np.float32(0.0), np.float32(0.0)]
    for a, b in zip(x, x[::-1]):  # recursive, both directions
        sums[0] = np.float32(sums[0] + a)
        sums[1] = np.float32(sums[1] + b)
    sums.append(np.sum(x))  # numpy's pairwise
    sums.append(np.sum([np.sum(c) for c in np.array_split(x, 5)], dtype=np.float32))
    magnitude = float(np.sum(np.abs(x.astype(np.float64))))
    for s in sums:
        assert abs(float(s) - exact) <= f32_tolerance(n, magnitude, orders=1)
        for t in sums:
            assert abs(float(s) - float(t)) <= f32_tolerance(n, magnitude)
    # The bound is not vacuous: it is far below the size of the terms.
    assert f32_tolerance(n, magnitude) < 1e-3 * magnitude


def test_f32_tolerance_formula_and_errors():
    assert f32_tolerance(64, 3.0, chain=5) == pytest.approx(2 * 5 * gamma(64) * 3.0)
    assert f32_tolerance(64, 3.0, orders=1) == pytest.approx(gamma(64) * 3.0)
    for kwargs in ({"magnitude": -1.0}, {"magnitude": float("nan")}, {"chain": 0},
                   {"orders": 3}):
        args = {"magnitude": 1.0, **kwargs}
        with pytest.raises(ValueError):
            f32_tolerance(8, args.pop("magnitude"), **args)


def test_abs_matmul_magnitude():
    x = np.array([[1.0, -2.0]])
    w = np.array([[3.0, 0.0], [-1.0, 4.0]])
    assert abs_matmul_magnitude(x, w) == 8.0  # columns: |3| + |2| = 5, |0| + |-8| = 8
    # Cancelling terms: x @ w is 0, the terms' magnitude is 2.
    assert abs_matmul_magnitude(np.array([[1.0, -1.0]]), np.array([[1.0], [1.0]])) == 2.0
    with pytest.raises(ValueError, match="do not match"):
        abs_matmul_magnitude(x, w[:1])


def test_rms_projection_bound_bounds_the_terms():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 16)) * rng.uniform(0.1, 10, size=(50, 1))
    scale, w = rng.normal(size=16), rng.normal(size=(16, 2, 3))
    h = x / np.sqrt(np.mean(x ** 2, -1, keepdims=True)) * scale
    terms = np.abs(h) @ np.abs(w.reshape(16, -1))
    bound = rms_projection_bound(scale, w)
    assert terms.max() <= bound < 10 * terms.max()  # holds, and is not vacuous
    assert rms_projection_bound(scale - 1.0, w, plus_one=True) == pytest.approx(bound)
    with pytest.raises(ValueError, match="scale"):
        rms_projection_bound(scale[:3], w)


def test_attention_tolerance_holds_against_float64():
    """float32 attention (two summation orders: jnp and numpy) vs float64."""
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=shape) * 3 for shape in ((4, 16), (40, 16), (40, 16)))
    scale = 16 ** -0.5

    def attend(q, k, v, xp):
        s = (q @ k.T) * scale
        p = xp.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    exact = attend(q, k, v, np)
    tol = attention_tolerance(q, k, v, keys=40, scale=scale)
    for got in (np.asarray(attend(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), jnp)),
                attend(*(a.astype(np.float32) for a in (q, k, v)), np)):
        assert np.abs(got - exact).max() <= tol
    assert tol < 0.01 * np.abs(v).max()
