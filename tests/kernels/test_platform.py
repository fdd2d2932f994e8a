"""kernels/platform.py: the platform programs are built for, and the XLA options per program."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import abs_matmul_magnitude, f32_tolerance

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform


def test_dense_programs_turn_ynnpack_dots_off_on_cpu_only():
    mesh = shd.make_mesh({"data": 2}, devices=jax.devices()[:2])
    assert platform.compiler_options("dense", mesh) == {
        "xla_cpu_experimental_ynn_fusion_type": ""}
    assert platform.compiler_options("dense") == platform.compiler_options("dense", mesh)
    assert platform.compiler_options("decode", mesh) is None
    with platform.target("tpu"):  # an ahead-of-time TPU build gets no CPU options
        assert platform.compiler_options("dense") is None
        assert platform.compiler_options("dense", mesh) is None
    with pytest.raises(ValueError, match="program must be one of"):
        platform.compiler_options("training")


def test_dense_options_change_the_compiled_dots_not_the_values():
    x = jax.random.normal(jax.random.key(0), (256, 64))
    w = jax.random.normal(jax.random.key(1), (64, 96))
    f = lambda a, b: jnp.tanh(a @ b)  # noqa: E731
    default = jax.jit(f).lower(x, w).compile()
    dense = jax.jit(f, compiler_options=platform.compiler_options("dense")).lower(x, w).compile()
    assert "__ynn_fusion" in default.as_text()
    assert "__ynn_fusion" not in dense.as_text()
    # Other dot kernels, other orders: length-64 dots with terms summing to
    # abs_matmul_magnitude(x, w) (~70), then tanh (|slope| <= 1, its own rounding): chain 2.
    atol = f32_tolerance(64, abs_matmul_magnitude(x, w), chain=2)
    np.testing.assert_allclose(np.asarray(dense(x, w)), np.asarray(default(x, w)),
                               rtol=0, atol=atol)
