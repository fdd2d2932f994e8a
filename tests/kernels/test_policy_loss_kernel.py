"""Pallas policy loss (interpret mode) against jaxrl_reason.rl.losses.policy_loss: values,
metrics and gradients, for every registered loss aggregation and KL estimator the kernel
declares in its SUPPORTS (test_extension_points.py covers names outside it)."""
import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from numerics import f32_tolerance, policy_loss_magnitudes, policy_loss_tolerances

from jaxrl_reason.kernels.policy_loss import SUPPORTS, BlockSizes, policy_loss
from jaxrl_reason.rl import backends
from jaxrl_reason.rl.advantages import ADVANTAGE_ESTIMATORS, group_advantages
from jaxrl_reason.rl.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSS_MODES
from jaxrl_reason.rl.losses import policy_loss as policy_loss_reference

LOSS_TYPES = sorted(LOSS_AGGREGATIONS)
KL_NAMES = sorted(KL_ESTIMATORS)
FUSED = [(t, k) for t, k in itertools.product(LOSS_TYPES, KL_NAMES)
         if t in SUPPORTS["loss_type"] and k in SUPPORTS["kl_estimator"]]
SMALL = BlockSizes(block_b=8, block_l=128)  # several blocks along B and L for small shapes
EPS = dict(epsilon_low=0.2, epsilon_high=0.28)


def _inputs(seed, b, length, *, spread=0.5, density=0.7, token_adv=False, dtype=jnp.float32,
            with_ref=True, with_entropy=True):
    """Random [B, L] inputs; padding positions hold -inf/NaN that must never leak."""
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.01, 4.0, (b, length))
    mask = rng.uniform(size=(b, length)) < density
    x = {
        "logp": logp,
        "old_logp": logp + rng.uniform(-spread, spread, (b, length)),
        "advantages": rng.normal(size=(b, length) if token_adv else (b,)),
        "mask": mask,
        "ref_logp": logp + rng.normal(0.0, 0.5, (b, length)) if with_ref else None,
        "entropy": rng.uniform(0.0, 3.0, (b, length)) if with_entropy else None,
    }
    x["logp"] = np.where(mask, x["logp"], -np.inf)
    x["old_logp"] = np.where(mask, x["old_logp"], np.nan)
    return {k: None if v is None else jnp.asarray(v, jnp.float32 if k == "advantages" else (
        jnp.bool_ if k == "mask" else dtype)) for k, v in x.items()}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _loss_and_grads(fn, x, diff, static):
    """One jitted program per (fn, options, shapes): loops over data do not recompile."""
    def f(d):
        return fn(d["logp"], x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                  entropy=d.get("entropy"), beta=d.get("beta", 0.0), **dict(static))

    return jax.value_and_grad(f, has_aux=True)(diff)


def _run(fn, x, beta, entropy_coef, **kw):
    """(loss, metrics, grads) with gradients to logp, entropy and an array beta."""
    diff = {"logp": x["logp"]}
    if x["entropy"] is not None:
        diff["entropy"] = x["entropy"]
    if x["ref_logp"] is not None:
        diff["beta"] = jnp.float32(beta)
    kw["entropy_coef"] = entropy_coef if x["entropy"] is not None else 0.0
    (loss, metrics), grads = _loss_and_grads(fn, x, diff, tuple(sorted(kw.items())))
    return loss, metrics, grads


def _assert_matches(x, *, beta=0.05, entropy_coef=0.01, grad_rtol=None,
                    kernel_options=(("block_sizes", SMALL), ("interpret", True)), **kw):
    """Kernel (with ``kernel_options`` added) vs reference on ``x``; returns the kernel's.

    grad_rtol=None: float32 inputs, gradients within the float32 bound, norm-wise (relative
    to their largest entry; beta's, a sum of n KL terms, to the largest KL term); else (bf16
    inputs, whose rounding is not float32's) rtol=grad_rtol.
    """
    loss, metrics, grads = _run(policy_loss, x, beta, entropy_coef, **dict(kernel_options),
                                **kw)
    ref_loss, ref_metrics, ref_grads = _run(policy_loss_reference, x, beta, entropy_coef, **kw)
    clip = {k: kw[k] for k in ("epsilon_high", "clip_ratio_c") if k in kw}
    n, magnitudes = policy_loss_magnitudes(x, beta, entropy_coef, **clip)
    atols = policy_loss_tolerances(x, beta, entropy_coef, **clip)
    assert loss.dtype == jnp.float32 and loss.shape == ()
    assert set(metrics) == set(ref_metrics)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=atols["loss"])
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=0,
                                   atol=atols.get(k, atols["default"]), err_msg=k)
    for k in ref_grads:
        assert grads[k].dtype == ref_grads[k].dtype, k
        assert bool(jnp.all(jnp.isfinite(grads[k]))), k
        largest = float(np.abs(np.asarray(ref_grads[k], np.float64)).max(initial=0.0))
        if grad_rtol is None:
            grad_kw = dict(rtol=0, atol=f32_tolerance(n, max(largest, magnitudes["kl"])
                                                      if k == "beta" else largest, chain=3))
        else:
            ratio_scale = 1.0 + float(jnp.max(jnp.where(x["mask"], jnp.exp(jnp.abs(
                x["logp"].astype(jnp.float32) - x["old_logp"].astype(jnp.float32))), 0.0)))
            grad_kw = dict(rtol=grad_rtol, atol=1e-3 * grad_rtol * ratio_scale)
        np.testing.assert_allclose(np.asarray(grads[k], np.float32),
                                   np.asarray(ref_grads[k], np.float32), err_msg=k, **grad_kw)
    return loss, metrics, grads


@pytest.mark.parametrize("loss_type,kl_estimator", FUSED)
def test_every_loss_type_estimator_and_kl(loss_type, kl_estimator):
    """Each fused loss_type x KL estimator, fed the advantages of each advantage estimator."""
    b, g, length = 12, 4, 140
    x = _inputs(3 * LOSS_TYPES.index(loss_type) + KL_NAMES.index(kl_estimator), b, length)
    rewards = jnp.asarray(np.random.default_rng(0).integers(0, 3, b), jnp.float32)
    clip_ratio_c = 3.0 if kl_estimator == "k2" else None
    for estimator in sorted(ADVANTAGE_ESTIMATORS):  # same shapes: one compile per test
        k = {"passk_k": 2} if estimator == "passk" else {}  # the one estimator with a k
        x["advantages"] = group_advantages(rewards, g, estimator=estimator, scale="group", **k)
        _assert_matches(x, loss_type=loss_type, kl_estimator=kl_estimator,
                        max_completion_length=length, clip_ratio_c=clip_ratio_c, **EPS)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 20), length=st.integers(1, 300), seed=st.integers(0, 2**16),
       loss_type=st.sampled_from(sorted(SUPPORTS["loss_type"])),
       kl_estimator=st.sampled_from(sorted(SUPPORTS["kl_estimator"])),
       spread=st.sampled_from([0.1, 1.0, 20.0]), density=st.sampled_from([0.0, 0.3, 1.0]),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
       bf16=st.booleans())
def test_generated_shapes(b, length, seed, loss_type, kl_estimator, spread, density, flags,
                          bf16):
    dual, with_ref, with_entropy, token_adv = flags
    x = _inputs(seed, b, length, spread=spread, density=density, token_adv=token_adv,
                dtype=jnp.bfloat16 if bf16 else jnp.float32, with_ref=with_ref,
                with_entropy=with_entropy)
    _assert_matches(x, loss_type=loss_type, kl_estimator=kl_estimator,
                    max_completion_length=length + 3, clip_ratio_c=2.5 if dual else None,
                    grad_rtol=2e-2 if bf16 else None, num_sequences=b + seed % 3, **EPS)


def test_empty_rows_and_empty_batch():
    x = _inputs(7, 9, 130)
    x["mask"] = x["mask"].at[::2].set(False)  # rows without a single token
    x["logp"] = jnp.where(x["mask"], x["logp"], -jnp.inf)
    _assert_matches(x, loss_type="grpo", kl_estimator="k3", **EPS)
    x["mask"] = jnp.zeros_like(x["mask"])  # no token at all: everything 0, nothing NaN
    x["logp"] = jnp.full_like(x["logp"], -jnp.inf)
    loss, metrics, grads = _assert_matches(x, loss_type="grpo", kl_estimator="k3", **EPS)
    assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values())
    assert all(not jnp.any(v) for v in jax.tree.leaves(grads))


def test_extreme_ratios_and_global_normalizers():
    x = _inputs(11, 10, 257, spread=20.0)
    _assert_matches(x, loss_type="dapo", kl_estimator="k3", num_tokens_global=5000,
                    clip_ratio_c=3.0, **EPS)


def test_default_blocks_and_tpu_interpret_mode():
    """Default tiling, and the TPU interpreter (models the accumulator's block write-back)."""
    x = _inputs(2, 21, 300, token_adv=True)
    _assert_matches(x, loss_type="grpo", kl_estimator="k1", **EPS, kernel_options=(
        ("block_sizes", BlockSizes()), ("interpret", pltpu.InterpretParams())))


def test_sharded_batch_runs_per_shard():
    """Batch-sharded inputs (4 of the 8 fake CPU devices): kernels under shard_map."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (tests/conftest.py fakes 8 CPU devices)")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    x = {k: None if v is None else jax.device_put(v, rows)
         for k, v in _inputs(8, 12, 140, token_adv=True).items()}
    _assert_matches(x, loss_type="bnpo", kl_estimator="k3", clip_ratio_c=3.0, **EPS,
                    kernel_options=(("block_sizes", SMALL), ("interpret", True),
                                    ("mesh", mesh), ("batch_axes", "data")))


def test_under_jit_with_traced_scalars():
    x = _inputs(3, 6, 100)

    @jax.jit
    def step(logp, beta, num_sequences, num_tokens):
        def f(lp):
            return backends.policy_loss(
                lp, x["old_logp"], x["advantages"], x["mask"], loss_type="dapo", beta=beta,
                ref_logp=x["ref_logp"], num_sequences=num_sequences,
                num_tokens_global=num_tokens, backend="pallas", **EPS)
        return jax.value_and_grad(f, has_aux=True)(logp)

    args = (x["logp"], jnp.float32(0.1), jnp.int32(6), jnp.int32(700))
    (loss, _), grad = step(*args)
    (ref_loss, _), ref_grad = jax.value_and_grad(lambda lp: policy_loss_reference(
        lp, x["old_logp"], x["advantages"], x["mask"], loss_type="dapo", beta=args[1],
        ref_logp=x["ref_logp"], num_sequences=args[2], num_tokens_global=args[3], **EPS),
        has_aux=True)(x["logp"])
    # Kernel vs reference over 6 x 100 tokens (tests/numerics.py): values, and the per-token
    # gradient norm-wise.
    n = x["mask"].size
    np.testing.assert_allclose(loss, ref_loss, rtol=0,
                               atol=policy_loss_tolerances(x, beta=0.1)["loss"])
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=f32_tolerance(
        n, float(np.abs(np.asarray(ref_grad, np.float64)).max()), chain=3))


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_MODES))
def test_backends_fall_back_for_unfused_modes(mode):
    x = _inputs(4, 4, 20)
    common = dict(loss_type="grpo", policy_loss_mode=mode, **EPS)
    reason = backends.fallback_reason_policy_loss(x["logp"], policy_loss_mode=mode)
    assert (reason is None) == (mode in SUPPORTS["policy_loss_mode"])
    loss, metrics = backends.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                                         backend="pallas", **common)
    ref_loss, ref_metrics = policy_loss_reference(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], **common)
    assert set(metrics) == set(ref_metrics)
    if reason is None:  # the kernel: other orders over 4 x 20 tokens (tests/numerics.py)
        atol = policy_loss_tolerances(x, beta=0.0, entropy_coef=0.0)["loss"]
        np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=atol)
    else:
        assert float(loss) == float(ref_loss)


def test_backends_fall_back_for_tis_and_empty_batches():
    x = _inputs(4, 4, 20)
    common = dict(loss_type="grpo", sampler_logp=x["old_logp"], tis_cap=2.0, **EPS)
    assert "tis_cap" in backends.fallback_reason_policy_loss(x["logp"], tis_cap=2.0)
    loss, _ = backends.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                                   backend="pallas", **common)
    ref_loss, _ = policy_loss_reference(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                                        **common)
    assert float(loss) == float(ref_loss)
    assert backends.fallback_reason_policy_loss(x["logp"]) is None
    assert "empty" in backends.fallback_reason_policy_loss(jnp.zeros((0, 3)))


def test_validation_errors_match_reference():
    x = _inputs(5, 2, 8)
    with pytest.raises(ValueError, match="requires max_completion_length"):
        policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                    loss_type="dr_grpo", interpret=True, **EPS)
    with pytest.raises(ValueError, match="requires ref_logp"):
        policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"], loss_type="grpo",
                    beta=0.1, interpret=True, **EPS)
    with pytest.raises(ValueError, match="multiple of 128"):
        BlockSizes(block_l=100)


# ----------------------------------------------------------------------------- TPU (AOT)


def test_aot_compiles_for_tpu_v5e():
    """Mosaic-compiles forward + backward for v5e on this CPU: f32 on one chip, and bf16 with
    the batch sharded over a 2x2 slice (kernels per shard in shard_map, no all-gather)."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install 'jax[tpu]'): no TPU AOT compile")
    from jax.experimental import topologies

    # Another process may hold libtpu's lock file; compiling ahead of time needs no device.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
    b, length = 32, 300
    for dtype, token_adv, kl, clip_ratio_c, devices in (
            (jnp.float32, False, "k3", 3.0, topology.devices[:1]),
            (jnp.bfloat16, True, "k2", None, topology.devices)):
        mesh = jax.sharding.Mesh(np.array(devices), ("data",))
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

        def spec(shape, dt=dtype, sharding=rows):
            return jax.ShapeDtypeStruct(shape, dt, sharding=sharding)

        def loss_and_grad(logp, old, ref, adv, mask, ent, beta):
            def f(lp, e):
                return policy_loss(lp, old, adv, mask, loss_type="grpo", beta=beta,
                                   ref_logp=ref, entropy=e, entropy_coef=0.01,
                                   kl_estimator=kl, clip_ratio_c=clip_ratio_c,  # noqa: B023
                                   mesh=mesh, batch_axes="data", **EPS)  # noqa: B023
            return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(logp, ent)

        tokens = spec((b, length))
        compiled = jax.jit(loss_and_grad).lower(
            tokens, tokens, tokens, spec((b, length) if token_adv else (b,), jnp.float32),
            spec((b, length), jnp.bool_), tokens,
            spec((), jnp.float32, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
        ).compile()
        text = compiled.as_text()
        assert text.count("tpu_custom_call") == 2  # forward and backward
        assert "all-gather" not in text


def test_sampler_logp_without_a_cap_keeps_the_kernel_and_adds_the_mismatch_metrics():
    """The trainer always passes the sampler's log-probs (for the sampler_kl metric); without
    tis_cap that must not push the loss off the kernel."""
    x = _inputs(4, 4, 20)
    sampler = x["old_logp"] + 0.05 * jnp.sin(jnp.arange(20.0))
    assert backends.fallback_reason_policy_loss(x["logp"], sampler_logp=sampler) is None
    common = dict(loss_type="bnpo", sampler_logp=sampler, **EPS)
    loss, metrics = backends.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                                         backend="pallas", **common)
    ref_loss, ref_metrics = policy_loss_reference(x["logp"], x["old_logp"], x["advantages"],
                                                  x["mask"], **common)
    # Kernel vs reference over 4 x 20 tokens (tests/numerics.py); the sampler's log-probs are
    # within 0.05 of old_logp, so its KL and TIS terms are below the ratio terms.
    atols = policy_loss_tolerances(x, beta=0.0, entropy_coef=0.0)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=atols["loss"])
    assert set(metrics) == set(ref_metrics)
    for key in ("sampler_kl", "tis_weight_mean", "tis_clip_frac"):
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=0,
                                   atol=atols["default"])
    assert float(metrics["sampler_kl"]) > 0
