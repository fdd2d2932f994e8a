"""Pallas Triton (GPU) kernels against their jnp references: values and gradients in interpret
mode on CPU, and lowering-only checks that each kernel lowers to Triton for CUDA.

The lowering checks need no GPU: ``jax.export`` for ``platforms=["cuda"]`` runs the Pallas
Triton lowering on this CPU, the Triton module must pass its MLIR verifiers, and the exported
program must call it (``__gpu$xla.gpu.triton``). Nothing is compiled to PTX or run there.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numerics import (f32_tolerance, group_advantage_tolerance, logprobs_tolerances,
                      policy_loss_magnitudes, policy_loss_tolerances)

from jaxrl_reason.kernels import group_advantage_gpu as ga
from jaxrl_reason.kernels import logprobs_gpu as lp
from jaxrl_reason.kernels import policy_loss_gpu as pl
from jaxrl_reason.kernels.logprobs import logprobs_reference
from jaxrl_reason.rl.advantages import group_advantages, group_stats
from jaxrl_reason.rl.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS
from jaxrl_reason.rl.losses import policy_loss as policy_loss_reference

EPS = dict(epsilon_low=0.2, epsilon_high=0.28)
LOSS_TYPES = sorted(set(LOSS_AGGREGATIONS) & pl.SUPPORTS["loss_type"])
KL_NAMES = sorted(set(KL_ESTIMATORS) & pl.SUPPORTS["kl_estimator"])
ESTIMATORS = sorted(ga.SUPPORTS["estimator"])
SCALES = sorted(ga.SUPPORTS["scale"])
ON_GPU = jax.default_backend() == "gpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="runs the compiled Triton kernels: needs a GPU")


# ----------------------------------------------------------------------------- group advantage

GA_SMALL = ga.BlockSizes(block_groups=4)  # several programs even for a few groups


@functools.partial(jax.jit, static_argnames=("group_size", "estimator", "scale", "eps", "ddof"))
def _ga_reference(rewards, group_size, *, estimator="grpo", scale="group", eps=1e-6, ddof=0):
    """(advantages, stats) of the jnp reference, as the kernel returns them."""
    adv = group_advantages(rewards, group_size, estimator=estimator, scale=scale, eps=eps,
                           ddof=ddof)
    return adv, group_stats(rewards, group_size, ddof=ddof)


def _rewards(seed, num_groups, group_size):
    """Rewards on a coarse grid (as verifiers give), about a third of the groups all equal."""
    rng = np.random.default_rng(seed)
    r = rng.integers(-2, 3, (num_groups, group_size)).astype(np.float32) * 0.5
    r[rng.uniform(size=num_groups) < 0.3] = 1.0
    return r.reshape(-1)


def _assert_advantages_match(rewards, group_size, *, interpret=True, **kw):
    adv, stats = ga.group_advantage(rewards, group_size, block_sizes=GA_SMALL,
                                    interpret=interpret, **kw)
    ref_adv, ref_stats = _ga_reference(rewards, group_size, **kw)
    assert adv.shape == ref_adv.shape and adv.dtype == jnp.float32
    # Kernel vs jnp: other orders over G (or the batch's N) rewards (tests/numerics.py).
    tol = group_advantage_tolerance(rewards, group_size, **kw)
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=tol["advantages"])
    np.testing.assert_allclose(stats["mean"], ref_stats["mean"], rtol=0, atol=tol["mean"])
    np.testing.assert_allclose(stats["std"], ref_stats["std"], rtol=0, atol=tol["std"])
    assert stats["zero_variance"].dtype == jnp.bool_
    np.testing.assert_array_equal(stats["zero_variance"], ref_stats["zero_variance"])
    return adv, stats


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("scale", SCALES)
def test_group_advantage_every_estimator_and_scale(estimator, scale):
    # 11 groups of 6: 3 programs of 4 groups (the last one partial), 8 lanes for 6 rewards.
    _assert_advantages_match(_rewards(0, 11, 6), 6, estimator=estimator, scale=scale)
    # All rewards equal (same shapes, no recompile): zero-variance everywhere, advantages 0.
    adv, stats = _assert_advantages_match(np.full(66, 0.25, np.float32), 6,
                                          estimator=estimator, scale=scale)
    assert bool(jnp.all(stats["zero_variance"])) and not bool(jnp.any(adv))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_groups=st.integers(1, 13), group_size=st.sampled_from([1, 2, 3, 5, 16, 33]),
       estimator=st.sampled_from(ESTIMATORS), scale=st.sampled_from(SCALES),
       ddof=st.integers(0, 1),
       seed=st.integers(0, 2**16))
def test_group_advantage_generated_shapes(num_groups, group_size, estimator, scale, ddof, seed):
    if estimator == "rloo" and group_size < 2:
        estimator = "grpo"
    _assert_advantages_match(_rewards(seed, num_groups, group_size), group_size,
                             estimator=estimator, scale=scale, ddof=ddof, eps=1e-4)


def test_group_advantage_errors():
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        ga.group_advantage(jnp.ones(4), 1, estimator="rloo", interpret=True)
    with pytest.raises(ValueError, match="positive multiple of group_size"):
        ga.group_advantage(jnp.ones(5), 2, interpret=True)
    with pytest.raises(ValueError, match="power of two"):
        ga.BlockSizes(block_groups=12)


# ----------------------------------------------------------------------------- policy loss

PL_SMALL = pl.BlockSizes(block_b=4, block_l=32)  # several programs and L steps


def _loss_inputs(seed, b, length, *, spread=0.5, density=0.7, token_adv=False,
                 dtype=jnp.float32, with_ref=True, with_entropy=True):
    """Random [B, L] inputs; masked-out positions hold -inf/NaN that must never leak."""
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.01, 4.0, (b, length))
    mask = rng.uniform(size=(b, length)) < density
    x = {
        "logp": np.where(mask, logp, -np.inf),
        "old_logp": np.where(mask, logp + rng.uniform(-spread, spread, (b, length)), np.nan),
        "advantages": rng.normal(size=(b, length) if token_adv else (b,)),
        "mask": mask,
        "ref_logp": logp + rng.normal(0.0, 0.5, (b, length)) if with_ref else None,
        "entropy": rng.uniform(0.0, 3.0, (b, length)) if with_entropy else None,
    }
    dtypes = {"advantages": jnp.float32, "mask": jnp.bool_}
    return {k: None if v is None else jnp.asarray(v, dtypes.get(k, dtype))
            for k, v in x.items()}


@functools.partial(jax.jit, static_argnums=(0, 3))
def _loss_and_grads(fn, x, diff, static):
    """value_and_grad w.r.t. logp, entropy and an array beta; one compile per options."""
    def f(d):
        return fn(d["logp"], x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                  entropy=d.get("entropy"), beta=d.get("beta", 0.0), **dict(static))

    return jax.value_and_grad(f, has_aux=True)(diff)


def _assert_loss_matches(x, *, grad_rtol=None, kernel_options=(), **kw):
    """Kernel (interpret mode, small blocks) vs reference: loss, metrics and gradients.

    Values within the float32 bound of weighted sums over B * L tokens (tests/numerics.py);
    gradients norm-wise (relative to their largest entry, beta's to the largest KL term),
    or, for bf16 inputs (grad_rtol given), rtol=grad_rtol."""
    diff = {"logp": x["logp"]}
    if x["entropy"] is not None:
        diff["entropy"] = x["entropy"]
        kw["entropy_coef"] = 0.01
    if x["ref_logp"] is not None:
        diff["beta"] = jnp.float32(0.05)
    kernel_options = dict((("block_sizes", PL_SMALL), ("interpret", True)) + kernel_options)
    (loss, metrics), grads = _loss_and_grads(pl.policy_loss, x, diff, tuple(sorted(
        {**kw, **kernel_options}.items())))
    (ref_loss, ref_metrics), ref_grads = _loss_and_grads(policy_loss_reference, x, diff,
                                                         tuple(sorted(kw.items())))
    clip = {k: kw[k] for k in ("epsilon_high", "clip_ratio_c") if k in kw}
    beta, coef = (0.05 if "beta" in diff else 0.0), kw.get("entropy_coef", 0.0)
    atols = policy_loss_tolerances(x, beta, coef, **clip)
    assert loss.dtype == jnp.float32 and loss.shape == () and set(metrics) == set(ref_metrics)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=atols["loss"])
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=0,
                                   atol=atols.get(k, atols["default"]), err_msg=k)
    for k in ref_grads:
        assert grads[k].dtype == ref_grads[k].dtype, k
        assert bool(jnp.all(jnp.isfinite(grads[k]))), k
        largest = float(np.abs(np.asarray(ref_grads[k], np.float64)).max(initial=0.0))
        if grad_rtol is None:
            kl_terms = policy_loss_magnitudes(x, beta, coef, **clip)[1]["kl"]
            grad_kw = dict(rtol=0, atol=f32_tolerance(
                x["mask"].size, max(largest, kl_terms) if k == "beta" else largest, chain=3))
        else:
            ratio_scale = 1.0 + float(jnp.max(jnp.where(x["mask"], jnp.exp(jnp.abs(
                x["logp"].astype(jnp.float32) - x["old_logp"].astype(jnp.float32))), 0.0)))
            grad_kw = dict(rtol=grad_rtol, atol=1e-3 * grad_rtol * ratio_scale)
        np.testing.assert_allclose(np.asarray(grads[k], np.float32),
                                   np.asarray(ref_grads[k], np.float32), err_msg=k, **grad_kw)
    return loss, metrics, grads


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_every_loss_type(loss_type):
    """Every fused loss_type, cycling through the KL estimators, the dual clip and per-token
    advantages; B = 10 and L = 77 divide no block."""
    i = LOSS_TYPES.index(loss_type)
    kl_estimator = KL_NAMES[i % len(KL_NAMES)]
    clip_ratio_c, token_adv = (None, 3.0)[i % 2], bool(i // 2 % 2)
    x = _loss_inputs(i, 10, 77, token_adv=token_adv)
    _assert_loss_matches(x, loss_type=loss_type, kl_estimator=kl_estimator,
                         max_completion_length=80, clip_ratio_c=clip_ratio_c, **EPS)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 9), length=st.integers(1, 70), seed=st.integers(0, 2**16),
       loss_type=st.sampled_from(LOSS_TYPES), kl_estimator=st.sampled_from(KL_NAMES),
       spread=st.sampled_from([0.1, 1.0, 20.0]), density=st.sampled_from([0.0, 0.3, 1.0]),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
       bf16=st.booleans())
def test_policy_loss_generated_shapes(b, length, seed, loss_type, kl_estimator, spread, density,
                                      flags, bf16):
    dual, with_ref, with_entropy, token_adv = flags
    x = _loss_inputs(seed, b, length, spread=spread, density=density, token_adv=token_adv,
                     dtype=jnp.bfloat16 if bf16 else jnp.float32, with_ref=with_ref,
                     with_entropy=with_entropy)
    _assert_loss_matches(x, loss_type=loss_type, kl_estimator=kl_estimator,
                         max_completion_length=length + 3, clip_ratio_c=2.5 if dual else None,
                         grad_rtol=2e-2 if bf16 else None, num_sequences=b + seed % 3, **EPS)


def test_policy_loss_extreme_ratios_and_empty_masks():
    """One compile: ratios up to e^20 with a global token count, rows without tokens, and a
    batch without any token (everything 0, nothing NaN)."""
    options = dict(loss_type="dapo", kl_estimator="k3", num_tokens_global=5000,
                   clip_ratio_c=3.0, **EPS)
    x = _loss_inputs(11, 9, 130, spread=20.0)
    _assert_loss_matches(x, **options)
    x["mask"] = x["mask"].at[::2].set(False)
    x["logp"] = jnp.where(x["mask"], x["logp"], -jnp.inf)
    _assert_loss_matches(x, **options)
    x["mask"] = jnp.zeros_like(x["mask"])
    x["logp"] = jnp.full_like(x["logp"], -jnp.inf)
    loss, metrics, grads = _assert_loss_matches(x, **options)
    assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values())
    assert all(not jnp.any(v) for v in jax.tree.leaves(grads))


def test_policy_loss_sharded_batch_runs_per_shard():
    """B = 10 over 4 of the 8 fake CPU devices: padded to 12 rows, kernels under shard_map."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (tests/conftest.py fakes 8 CPU devices)")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    x = _loss_inputs(8, 10, 70, token_adv=True)
    _assert_loss_matches(x, loss_type="bnpo", kl_estimator="k3", clip_ratio_c=3.0, **EPS,
                         kernel_options=(("mesh", mesh), ("batch_axes", "data")))


def test_policy_loss_validation():
    x = _loss_inputs(5, 2, 8)
    with pytest.raises(ValueError, match="requires max_completion_length"):
        pl.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                       loss_type="dr_grpo", interpret=True, **EPS)
    with pytest.raises(ValueError, match="power of two"):
        pl.BlockSizes(block_l=100)


# ----------------------------------------------------------------------------- log-probs

LP_SMALL = lp.BlockSizes(block_rows=16, block_vocab=16, block_dim=16)


def _lp_inputs(seed, batch, length, dim, vocab, dtype=jnp.float32, w_dtype=None):
    k = jax.random.split(jax.random.key(seed), 5)
    hidden = jax.random.normal(k[0], (batch, length, dim), jnp.float32).astype(dtype)
    w = (0.5 * jax.random.normal(k[1], (dim, vocab), jnp.float32)).astype(w_dtype or dtype)
    targets = jax.random.randint(k[2], (batch, length), 0, vocab)
    cotangents = (jax.random.normal(k[3], (batch, length)),
                  jax.random.normal(k[4], (batch, length)))
    return hidden, w, targets, cotangents


@functools.partial(jax.jit, static_argnums=(0,))
def _lp_values_and_grads(fn, hidden, w, targets, cotangents):
    """(logp, entropy, d hidden, d unembedding) for random cotangents of both outputs."""
    out, vjp = jax.vjp(lambda h, u: fn(h, u, targets), hidden, w)
    return (*out, *vjp(cotangents))


def _assert_logprobs_match(shape, *, temperature=1.0, softcap=None, with_entropy=True,
                           dtype=jnp.float32, w_dtype=None, rel=None, seed=0):
    """Kernel vs full-logits reference: rel=None (float32 inputs), within the float32 bound
    of tests/numerics.py; else (bf16 inputs), within rel * the largest reference entry."""
    hidden, w, targets, cotangents = _lp_inputs(seed, *shape, dtype=dtype, w_dtype=w_dtype)

    def kernel(h, u, y):
        return lp.pallas_logprobs(h, u, y, temperature=temperature, softcap=softcap,
                                  with_entropy=with_entropy, block_sizes=LP_SMALL,
                                  interpret=True)

    def reference(h, u, y):
        logp, entropy = logprobs_reference(h, u, y, temperature, softcap=softcap)
        return logp, (entropy if with_entropy else jnp.zeros_like(entropy))

    got = _lp_values_and_grads(kernel, hidden, w, targets, cotangents)
    want = _lp_values_and_grads(reference, hidden, w, targets, cotangents)
    if rel is None:
        atols = logprobs_tolerances(hidden, w, temperature, want)
    else:
        atols = [rel * float(np.abs(np.asarray(b, np.float32)).max()) for b in want]
    for name, a, b, atol in zip(("logp", "entropy", "d_hidden", "d_unembedding"), got, want,
                                atols):
        assert a.dtype == b.dtype, name
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape == b.shape and np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=name)


def test_logprobs_matches_reference():
    """14 rows, D = 24, V = 100: no block divides anything; Gemma-2 soft-capping."""
    _assert_logprobs_match((2, 7, 24, 100), temperature=0.9, softcap=2.5)


def test_logprobs_bf16_inputs_without_entropy():
    """bf16 hidden states with f32 (master) weights cast per block; entropy off."""
    _assert_logprobs_match((2, 7, 16, 50), temperature=0.8, dtype=jnp.bfloat16,
                           w_dtype=jnp.float32, with_entropy=False, rel=2e-2)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), length=st.integers(1, 9), dim=st.sampled_from([8, 20]),
       vocab=st.integers(1, 70), temperature=st.sampled_from([0.5, 1.0, 1.7]),
       softcap=st.sampled_from([None, 3.0]), seed=st.integers(0, 2**16))
def test_logprobs_generated_shapes(batch, length, dim, vocab, temperature, softcap, seed):
    """D below one block (8) or not a multiple of it (20); V from a single word up."""
    _assert_logprobs_match((batch, length, dim, vocab), temperature=temperature,
                           softcap=softcap, seed=seed)


def test_logprobs_block_sizes_validation():
    with pytest.raises(ValueError, match="block_vocab"):
        lp.BlockSizes(block_vocab=8)
    with pytest.raises(ValueError, match="block_rows"):
        lp.BlockSizes(block_rows=48)


# ----------------------------------------------------------------------------- CUDA lowering


def _triton_calls(fn, *args, monkeypatch):
    """Exports ``jit(fn)`` for CUDA on this machine (lowering only: nothing is compiled to PTX
    nor run); returns the number of Triton custom calls and checks that every Triton module
    the Pallas lowering produced passes the MLIR verifiers (Triton's op constraints)."""
    from jax._src.pallas.triton import lowering as triton_lowering

    lower = triton_lowering.lower_jaxpr_to_triton_module
    modules = []

    def verified(*a, **k):
        result = lower(*a, **k)
        modules.append(result.module.operation)
        return result

    monkeypatch.setattr(triton_lowering, "lower_jaxpr_to_triton_module", verified)
    exported = jax.export.export(
        jax.jit(fn), platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*args)
    assert modules and all(module.verify() for module in modules)
    return exported.mlir_module().count("__gpu$xla.gpu.triton")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lowers_for_cuda_group_advantage(dtype, monkeypatch):
    """Lowering-only. All three phases (mean, var, write). Forward only: as on TPU the
    advantages are constants of the update and the kernel has no gradient."""
    def adv(rewards):
        return ga.group_advantage(rewards, 8, estimator="reinforce_pp", scale="batch")

    assert _triton_calls(adv, jax.ShapeDtypeStruct((37 * 8,), dtype),
                         monkeypatch=monkeypatch) == 3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lowers_for_cuda_policy_loss(dtype, monkeypatch):
    """Lowering-only: the forward kernel, and forward + backward kernels under jax.grad."""
    b, length = 33, 300
    token_adv = dtype == jnp.bfloat16

    def loss(logp, old, ref, adv, mask, entropy, beta):
        return pl.policy_loss(logp, old, adv, mask, loss_type="grpo", beta=beta, ref_logp=ref,
                              entropy=entropy, entropy_coef=0.01, clip_ratio_c=3.0, **EPS)[0]

    spec = jax.ShapeDtypeStruct
    args = ((spec((b, length), dtype),) * 3
            + (spec((b, length) if token_adv else (b,), jnp.float32),
               spec((b, length), jnp.bool_), spec((b, length), dtype), spec((), jnp.float32)))
    assert _triton_calls(loss, *args, monkeypatch=monkeypatch) == 1
    grad = jax.grad(loss, argnums=(0, 5, 6))
    assert _triton_calls(grad, *args, monkeypatch=monkeypatch) == 2


@pytest.mark.parametrize("dtype, w_dtype, softcap", [
    (jnp.float32, jnp.float32, None), (jnp.bfloat16, jnp.float32, 30.0),
    (jnp.bfloat16, jnp.bfloat16, None)])
def test_lowers_for_cuda_logprobs(dtype, w_dtype, softcap, monkeypatch):
    """Lowering-only: the forward kernel, and forward + dh + dW kernels under jax.grad.
    D = 200 and V = 1000 are not powers of two."""
    def loss(hidden, w, targets):
        logp, entropy = lp.pallas_logprobs(hidden, w, targets, temperature=0.9, softcap=softcap)
        return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

    spec = jax.ShapeDtypeStruct
    args = (spec((3, 100, 200), dtype), spec((200, 1000), w_dtype), spec((3, 100), jnp.int32))
    assert _triton_calls(loss, *args, monkeypatch=monkeypatch) == 1
    assert _triton_calls(jax.grad(loss, argnums=(0, 1)), *args, monkeypatch=monkeypatch) == 3


# ----------------------------------------------------------------------------- GPU (compiled)


@gpu_only
def test_compiled_on_gpu_matches_reference():
    """On a GPU: the compiled Triton kernels (no interpreter) against the references."""
    rewards = _rewards(1, 300, 8)
    adv, _ = ga.group_advantage(rewards, 8, estimator="rloo", scale="batch")
    np.testing.assert_allclose(adv, _ga_reference(rewards, 8, estimator="rloo",
                                                  scale="batch")[0], rtol=0,
                               atol=group_advantage_tolerance(rewards, 8, estimator="rloo",
                                                              scale="batch")["advantages"])

    x = _loss_inputs(3, 64, 1000, token_adv=True)
    options = dict(loss_type="grpo", kl_estimator="k3", ref_logp=x["ref_logp"], beta=0.05,
                   clip_ratio_c=3.0, **EPS)
    args = (x["old_logp"], x["advantages"], x["mask"])
    got = jax.value_and_grad(lambda v: pl.policy_loss(v, *args, **options)[0])(x["logp"])
    want = jax.value_and_grad(lambda v: policy_loss_reference(v, *args, **options)[0])(
        x["logp"])
    # Over 64 x 1000 tokens (tests/numerics.py): the loss, then its gradient norm-wise.
    atols = (policy_loss_tolerances(x, 0.05, 0.0, epsilon_high=EPS["epsilon_high"],
                                    clip_ratio_c=3.0)["loss"],
             f32_tolerance(x["mask"].size, float(jnp.abs(want[1]).max()), chain=3))
    for a, b, atol in zip(got, want, atols):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)

    hidden, w, targets, cotangents = _lp_inputs(0, 4, 100, 256, 3000)
    got = _lp_values_and_grads(lambda h, u, y: lp.pallas_logprobs(h, u, y),
                               hidden, w, targets, cotangents)
    want = _lp_values_and_grads(lambda h, u, y: logprobs_reference(h, u, y),
                                hidden, w, targets, cotangents)
    # f32 matmuls may run as TF32 (u = 2^-11) in the reference: not float32's bound.
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-2 * float(jnp.abs(b).max()) + 1e-5, rtol=0)
