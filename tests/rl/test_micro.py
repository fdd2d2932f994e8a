"""rl/micro.py's accumulators against a plain numpy sum: gradients of bf16 parameters are
summed in float32 and rounded to bf16 once (not rounded at each of the k additions), the
row outputs come back in row order, and a packed batch's rows each count once."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxrl_reason.rl import micro


def _bf16_grads(k: int, size: int = 64):
    """k micro-batch gradients, bf16 [size] each: values near 1 with small spreads, whose
    bf16 running sum loses the small parts once it grows past 2**8."""
    rng = np.random.default_rng(0)
    return (1.0 + rng.uniform(0, 0.01, (k, size))).astype(ml_dtypes.bfloat16)


def test_row_accumulation_sums_bf16_gradients_in_float32():
    k, grads = 64, _bf16_grads(64)
    like = {"w": jnp.zeros(grads.shape[1], jnp.bfloat16)}
    batch = {"x": jnp.arange(k * 2, dtype=jnp.float32).reshape(k * 2, 1), "c": jnp.float32(3)}

    def grad_fn(params, mb, i):
        assert mb["x"].shape == (2, 1) and mb["c"].shape == ()
        return (jnp.float32(1.0), (mb["x"][:, 0] * 2,)), {"w": jnp.asarray(grads)[i]}

    loss, (rows,), out = jax.jit(lambda b: micro.accumulate_rows(grad_fn, None, b, k, like))(
        batch)
    want = grads.astype(np.float32).sum(0).astype(ml_dtypes.bfloat16)
    assert out["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out["w"]), want)
    running = np.zeros(grads.shape[1], ml_dtypes.bfloat16)  # what a bf16 carry gives
    for g in grads:
        running = (running + g).astype(ml_dtypes.bfloat16)
    assert np.abs(running.astype(np.float32) - want.astype(np.float32)).max() > 0.1
    assert float(loss) == k
    np.testing.assert_array_equal(np.asarray(rows), np.arange(k * 2) * 2.0)  # row order


def test_pack_accumulation_counts_each_row_once():
    """4 packs of 3 slots in 2 micro-batches (packs 0, 2 and 1, 3); 3 rows reading slots of
    different packs: each micro-batch's output has its rows, the sum all of them."""
    packs = {key: jnp.arange(12, dtype=jnp.int32).reshape(4, 3) for key in micro.PACK_KEYS[:-1]}
    index = jnp.asarray([[0, 1, -1], [3, 4, 5], [10, 11, -1]], jnp.int32)  # packs 0, 1, 3
    batch = {**packs, "pack_index": index, "mask": (index >= 0).astype(jnp.float32)}

    def grad_fn(params, mb, i):
        values = micro.slots_to_rows(mb["pack_tokens"].astype(jnp.float32), mb["pack_index"])
        return (jnp.sum(values), (values,)), {"w": jnp.sum(values)[None]}

    like = {"w": jnp.zeros(1, jnp.float32)}
    loss, (rows,), grads = micro.accumulate_packs(grad_fn, None, batch, 2, like, 1)
    want = np.where(np.asarray(index) >= 0, np.asarray(index), 0).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(rows), want)
    assert float(loss) == want.sum() == float(grads["w"][0])
