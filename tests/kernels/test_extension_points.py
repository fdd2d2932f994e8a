"""Extension points cannot lie: an advantage estimator, a loss aggregation, a KL estimator and a
policy-loss mode that exist only in this test, registered with the public functions, give the
reference's values on every backend
(reference; Pallas, interpreted on CPU; "auto" for a TPU and a GPU target, whose kernels this
host cannot run) by falling back to the jnp reference with a log line once per (kernel,
reason), and every kernel called directly refuses them instead of computing a neighbour."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import group_advantage_tolerance

from jaxrl_reason.kernels import group_advantage, group_advantage_gpu, platform
from jaxrl_reason.kernels import policy_loss as policy_loss_kernel
from jaxrl_reason.kernels import policy_loss_gpu
from jaxrl_reason.rl import backends
from jaxrl_reason.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    group_advantages,
    register_advantage_estimator,
)
from jaxrl_reason.rl.loss_modes import POLICY_LOSS_MODES, register_policy_loss_mode
from jaxrl_reason.rl.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    policy_loss,
    register_kl_estimator,
    register_loss_aggregation,
)

ESTIMATOR = "test_only_median_baseline"
AGGREGATION = "test_only_sum_over_rows"
KL = "test_only_abs_log_ratio"
MODE = "test_only_reinforce"
EPS = dict(epsilon_low=0.2, epsilon_high=0.28)
LOGGER = "jaxrl_reason.rl.backends"
# (backend, platform target or None): every way a request can reach a kernel.
ROUTES = [("reference", None), ("pallas", None), ("auto", "tpu"), ("auto", "gpu")]


def _median_center(grouped):
    """r - the median of its group (a robust baseline no kernel implements)."""
    return grouped - jnp.median(grouped, axis=1, keepdims=True)


def _sum_over_rows(values, mask, max_completion_length, num_tokens_global, num_sequences):
    """Token sum / B: every sequence weighs by its length (no kernel implements it)."""
    del max_completion_length, num_tokens_global, num_sequences
    return jnp.sum(values * mask) / mask.shape[0]


def _abs_log_ratio(logp, ref_logp):
    """|logp - ref_logp| per token (no kernel implements it)."""
    return jnp.abs(logp - ref_logp)


def _reinforce(logp, old_logp, adv, mask, *, epsilon_low, epsilon_high, clip_ratio_c):
    """Plain REINFORCE, -A * logp per token, no ratio metrics (no kernel implements it)."""
    del old_logp, mask, epsilon_low, epsilon_high, clip_ratio_c
    return -adv * logp, {}


@pytest.fixture
def test_only_names():
    register_advantage_estimator(ESTIMATOR, _median_center)
    register_loss_aggregation(AGGREGATION, _sum_over_rows)
    register_kl_estimator(KL, _abs_log_ratio)
    register_policy_loss_mode(MODE, _reinforce)
    yield
    del ADVANTAGE_ESTIMATORS[ESTIMATOR], LOSS_AGGREGATIONS[AGGREGATION]
    del KL_ESTIMATORS[KL], POLICY_LOSS_MODES[MODE]


def _route(backend, target, fn):
    """Runs ``fn(backend)`` as it would run when built for ``target`` (None: this host)."""
    if target is None:
        return fn(backend)
    with platform.target(target):
        return fn(backend)


def _fallback_lines(caplog, name):
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and name in r.getMessage()]


def test_registered_estimator_gives_the_reference_on_every_backend(test_only_names, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    rewards = jnp.asarray(np.random.default_rng(0).integers(0, 4, 24), jnp.float32)
    want = group_advantages(rewards, 6, estimator=ESTIMATOR, scale="batch")
    for neighbour in ("grpo", "rloo", "reinforce_pp"):  # a kernel guessing would be caught
        assert not np.allclose(want, group_advantages(rewards, 6, estimator=neighbour,
                                                      scale="batch"))
    for backend, target in ROUTES:
        got = _route(backend, target, lambda b: backends.group_advantages(
            rewards, 6, estimator=ESTIMATOR, scale="batch", backend=b))
        np.testing.assert_array_equal(got, want, err_msg=f"{backend} / {target}")

    lines = _fallback_lines(caplog, ESTIMATOR)
    # The interpreted Pallas route and the TPU target share the Mosaic kernel: one line; the
    # GPU target's Triton kernel: a second one. Repeats log nothing.
    assert len(lines) == 2, lines
    assert lines[0].startswith("group_advantage falls back to the jnp reference")
    assert lines[1].startswith("group_advantage_gpu falls back to the jnp reference")
    assert f"estimator={ESTIMATOR!r}" in lines[0]
    backends.group_advantages(rewards, 6, estimator=ESTIMATOR, backend="pallas")
    assert len(_fallback_lines(caplog, ESTIMATOR)) == 2

    for kernel in (group_advantage, group_advantage_gpu):  # called directly: refused
        with pytest.raises(ValueError, match=f"does not implement estimator='{ESTIMATOR}'"):
            kernel.group_advantage(rewards, 6, estimator=ESTIMATOR, interpret=True)


def test_supported_requests_stay_on_the_kernel(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    rewards = jnp.asarray(np.random.default_rng(1).integers(0, 4, 24), jnp.float32)
    for estimator in sorted(group_advantage.SUPPORTS["estimator"]):
        assert backends.fallback_reason_group_advantages(estimator=estimator) is None
        got = backends.group_advantages(rewards, 6, estimator=estimator, backend="pallas")
        # The kernel, not the reference's program: other orders over G = 6 rewards in [0, 3]
        # (tests/numerics.py). The fallback routes above run the same program: bit-exact.
        atol = group_advantage_tolerance(rewards, 6, estimator=estimator)["advantages"]
        np.testing.assert_allclose(got, group_advantages(rewards, 6, estimator=estimator),
                                   rtol=0, atol=atol)
    assert not [r for r in caplog.records if r.name == LOGGER]


def _loss_inputs(seed, b=6, length=24):
    rng = np.random.default_rng(seed)
    mask = rng.uniform(size=(b, length)) < 0.7
    logp = -rng.uniform(0.1, 3.0, (b, length))
    return dict(logp=jnp.asarray(logp, jnp.float32),
                old_logp=jnp.asarray(logp + rng.uniform(-0.3, 0.3, (b, length)), jnp.float32),
                advantages=jnp.asarray(rng.normal(size=b), jnp.float32),
                mask=jnp.asarray(mask),
                ref_logp=jnp.asarray(logp + rng.normal(0, 0.3, (b, length)), jnp.float32))


@pytest.mark.parametrize("option,name", [("loss_type", AGGREGATION), ("kl_estimator", KL),
                                         ("policy_loss_mode", MODE)])
def test_registered_loss_options_give_the_reference_on_every_backend(test_only_names, caplog,
                                                                     option, name):
    caplog.set_level(logging.INFO, logger=LOGGER)
    x = _loss_inputs(0)
    options = {"loss_type": "grpo", "beta": 0.05, "kl_estimator": "k3", **EPS, option: name}

    def loss_and_grad(fn, **extra):
        def f(logp):
            return fn(logp, x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                      max_completion_length=24, **{**options, **extra})
        return jax.value_and_grad(f, has_aux=True)(x["logp"])

    (want, want_metrics), want_grad = loss_and_grad(policy_loss)
    for neighbour in sorted(policy_loss_kernel.SUPPORTS[option]):
        (other, _), _ = loss_and_grad(policy_loss, **{option: neighbour})
        assert not np.isclose(other, want), neighbour  # a kernel guessing would be caught
    for backend, target in ROUTES:
        (got, metrics), grad = _route(backend, target, lambda b: loss_and_grad(
            backends.policy_loss, backend=b))
        assert float(got) == float(want), (backend, target)
        assert set(metrics) == set(want_metrics)
        np.testing.assert_array_equal(grad, want_grad, err_msg=f"{backend} / {target}")

    lines = _fallback_lines(caplog, name)
    assert len(lines) == 2, lines
    assert lines[0].startswith("policy_loss falls back to the jnp reference")
    assert lines[1].startswith("policy_loss_gpu falls back to the jnp reference")
    assert f"{option}={name!r}" in lines[0]

    if option == "policy_loss_mode":  # the kernels take no mode: they are "ppo" by signature
        return
    for kernel in (policy_loss_kernel, policy_loss_gpu):  # called directly: refused
        with pytest.raises(ValueError, match=f"does not implement {option}='{name}'"):
            kernel.policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                               ref_logp=x["ref_logp"], interpret=True, **options)


def test_registries_refuse_to_replace_a_name():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo", _median_center)
    with pytest.raises(ValueError, match="already registered"):
        register_loss_aggregation("dapo", _sum_over_rows)
    with pytest.raises(TypeError, match="expected a function"):
        register_loss_aggregation("test_only_not_callable", 3.0)
    assert "test_only_not_callable" not in LOSS_AGGREGATIONS
