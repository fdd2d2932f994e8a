"""Matmul helpers shared by the decoder's layers and its attention.

`einsum_f32` keeps bf16 backward matmuls in bf16 under a float32 result;
`narrow_transpose_matmul` is the CPU float32 matmul whose backward transposes the narrower
operand; `cpu_float32` says when the CPU float32 paths apply.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_reason.kernels import platform


def cpu_float32(dtype) -> bool:
    """Whether computation in `dtype` takes the CPU float32 paths measured on this project's
    CPU benchmarks: matmuls through `narrow_transpose_matmul` (MLP, LM head, attention) and
    attention in causal query blocks (`attention._causal_block`)."""
    return jnp.dtype(dtype) == jnp.float32 and platform.current() == "cpu"


def einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`jnp.einsum` with a float32 result whose backward matmuls stay in the operands' dtype.

    With bf16 operands, a plain `preferred_element_type=float32` einsum makes both transposed
    matmuls of the backward pass mix the float32 cotangent with a bf16 operand, i.e. run in
    float32. Here the cotangent is cast to the operands' dtype first, so they run in bf16 like
    every other matmul of the model. float32 operands take the plain einsum.
    """
    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    return _einsum_f32_low_precision(spec, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum_f32_low_precision(spec, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(spec, a, b):
    return _einsum_f32_low_precision(spec, a, b), (a, b)


def _einsum_f32_bwd(spec, residuals, g):
    a, b = residuals
    g = g.astype(jnp.result_type(a, b))
    (grad_a,) = jax.linear_transpose(lambda x: jnp.einsum(spec, x, b), a)(g)
    (grad_b,) = jax.linear_transpose(lambda y: jnp.einsum(spec, a, y), b)(g)
    return grad_a, grad_b


_einsum_f32_low_precision.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)


def _swap(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


@jax.custom_vjp
def narrow_transpose_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., M, K] @ w [..., K, N] (or w [K, N], shared by all rows), whose backward
    contracts the rows M with the narrower of x and the gradient transposed and materialized
    first. Same values as `jnp.matmul`, forward and backward.

    Left to itself, XLA:CPU fuses the transpose of the wider operand into the elementwise
    backward that produces it (the MLP's [T, mlp_hidden] gate gradient, the [T, vocab] logits
    gradient, the [T, S] attention probabilities): a strided write that cost 30-90 ms per
    layer in bench-tiny's update. The narrower operand's transpose is a plain copy of a
    fraction of that size.
    """
    return jnp.matmul(x, w)


def _narrow_transpose_matmul_fwd(x, w):
    return jnp.matmul(x, w), (x, w)


def _narrow_transpose_matmul_bwd(residuals, g):
    x, w = residuals
    grad_x = jnp.matmul(g, _swap(w).astype(g.dtype)).astype(x.dtype)
    if w.ndim == 2:  # one weight for every row: contract all of them
        x, g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    if x.shape[-1] <= g.shape[-1]:
        grad_w = jnp.matmul(jax.lax.optimization_barrier(_swap(x)), g.astype(x.dtype))
    else:
        grad_w = _swap(jnp.matmul(jax.lax.optimization_barrier(_swap(g)), x.astype(g.dtype)))
    return grad_x, grad_w.astype(w.dtype)


narrow_transpose_matmul.defvjp(_narrow_transpose_matmul_fwd, _narrow_transpose_matmul_bwd)
