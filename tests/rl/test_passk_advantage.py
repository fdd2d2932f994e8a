"""The pass@k advantage ("passk", Chen et al. 2025, arXiv 2508.10751, analytical variant)
against a float64 Python computation of the paper's formulas with exact binomials, on its
own and through the trainer's path (GroupEstimator -> rl/backends.py)."""
import functools
import math

import jax
import ml_collections
import numpy as np
import pytest

from cli_runs import ARITH, load_config
from numerics import F32_UNIT_ROUNDOFF, group_advantage_tolerance

from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.kernels import group_advantage as group_advantage_kernel
from jaxrl_reason.rl import backends
from jaxrl_reason.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    group_advantages,
)
from jaxrl_reason.rl.group_estimator import GroupEstimator

# (N, k): group sizes and ks from pass@1 to k = N, the small ones exhaustively below.
SIZES = [(2, 1), (2, 2), (4, 2), (4, 3), (5, 4), (8, 1), (8, 4), (8, 8), (16, 3), (16, 8)]


def passk_reference(rewards, group_size, k, scale="group", eps=1e-6, ddof=0):
    """The paper's analytical advantages, one group at a time, in float64 with math.comb.

    R = 1 - C(N-c, k) / C(N, k), s = sqrt(R (1 - R)); a correct sample (reward 1) gets
    (1 - R), a wrong one (1 - R - C(N-c-1, k-1) / C(N-1, k-1)); scale "group" divides by
    s + eps (0 where s = 0), "batch" by the std of all those values + eps, "none" not at all.
    """
    n = group_size
    centered, stds = [], []
    for g in range(0, len(rewards), n):
        group = [float(r) for r in rewards[g:g + n]]
        assert all(r in (0.0, 1.0) for r in group)
        c = int(sum(group))
        mean = 1 - math.comb(n - c, k) / math.comb(n, k)
        std = math.sqrt(mean * (1 - mean))
        for r in group:
            if r == 1.0:
                centered.append(1 - mean)
            else:  # there is a wrong sample, so n - c - 1 >= 0
                centered.append(1 - mean - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1))
            stds.append(std)
    centered = np.array(centered)
    if scale == "group":
        return np.array([a / (s + eps) if s > 0 else 0.0 for a, s in zip(centered, stds)])
    if scale == "batch":
        std = centered.std(ddof=ddof) if len(centered) > ddof else 0.0
        return centered / (std + eps) if std > 0 else np.zeros_like(centered)
    return centered


def passk_tolerance(want, group_size, k):
    """float32 vs float64: the ratio C(N-c-1,k-1)/C(N-1,k-1) is a product of k - 1 quotients
    (2 roundings each), 1 - R one more product and a subtraction whose error, relative to
    R >= 1/N (the smallest nonzero mean), grows by N; the std (product, sqrt) and the final
    quotient add a few. 4 (N + k + 4) u relative, taken at each exact advantage; 0 stays 0."""
    return 4 * (group_size + k + 4) * F32_UNIT_ROUNDOFF * np.abs(want) + 1e-30


def _binary(num_groups, group_size, seed):
    """0/1 rewards whose groups' success rates spread over [0, 1] (so every c occurs)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=(num_groups, 1))
    return (rng.uniform(size=(num_groups, group_size)) < p).astype(np.float32).reshape(-1)


def _assert_reference(rewards, n, k, scale, **kw):
    got = np.asarray(group_advantages(rewards, n, estimator="passk", scale=scale, passk_k=k,
                                      **kw))
    want = passk_reference(rewards, n, k, scale, **kw)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got == 0, want == 0)  # zeros exactly where the paper's are
    assert np.all(np.abs(got - want) <= passk_tolerance(want, n, k)), (
        n, k, scale, np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))


def test_registered():
    assert "passk" in ADVANTAGE_ESTIMATORS


@pytest.mark.parametrize("n,k", SIZES)
@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_matches_paper_on_random_groups(n, k, scale):
    rewards = _binary(num_groups=200, group_size=n, seed=n * 100 + k)
    _assert_reference(rewards, n, k, scale)
    if scale == "batch":
        _assert_reference(rewards, n, k, scale, ddof=1, eps=0.0)


@pytest.mark.parametrize("n,k", [(n, k) for n in range(1, 7) for k in range(1, n + 1)])
def test_matches_paper_for_every_count_of_correct_samples(n, k):
    """Every c in 0..N, the correct ones in different places, for every k <= N <= 6."""
    groups = [np.roll(np.arange(n) < c, c) for c in range(n + 1)]
    rewards = np.concatenate(groups).astype(np.float32)
    _assert_reference(rewards, n, k, "group")
    _assert_reference(rewards, n, k, "none")


def test_known_values():
    # N = 4, c = 1, k = 2: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2; correct (1/2)/(1/2) = 1,
    # wrong (1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3. c = 3, k = 2: every pair passes -> 0.
    rewards = np.array([1, 0, 0, 0, 1, 1, 1, 0], np.float32)
    adv = np.asarray(group_advantages(rewards, 4, estimator="passk", passk_k=2, eps=0.0))
    np.testing.assert_allclose(adv, [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0], rtol=1e-6)
    assert np.all(adv[4:] == 0.0)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_k1_is_grpo(n, scale):
    """pass@1: R = c/N and s = the population std of the 0/1 rewards, so every scale gives
    GRPO's advantage (ddof = 0)."""
    rewards = _binary(num_groups=100, group_size=n, seed=n)
    grpo = np.asarray(group_advantages(rewards, n, estimator="grpo", scale=scale))
    passk = np.asarray(group_advantages(rewards, n, estimator="passk", passk_k=1, scale=scale))
    # both within their float32 bound of the same exact value
    atol = (group_advantage_tolerance(rewards, n, scale=scale, orders=1)["advantages"]
            + float(passk_tolerance(np.abs(grpo).max(), n, 1)))
    np.testing.assert_allclose(passk, grpo, rtol=0, atol=atol)
    np.testing.assert_array_equal(passk == 0, grpo == 0)
    with pytest.raises(ValueError, match="needs passk_k"):  # no silent pass@1
        group_advantages(rewards, n, estimator="passk", scale=scale)


@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
@pytest.mark.parametrize("k", [1, 2, 3])  # k <= 3 wrong samples of the last group
def test_all_correct_and_all_wrong_groups_are_zero(scale, k):
    rewards = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0], np.float32)
    adv = np.asarray(group_advantages(rewards, 4, estimator="passk", passk_k=k, scale=scale))
    assert np.all(adv[:8] == 0.0) and np.all(np.isfinite(adv))
    assert np.any(adv[8:] != 0.0)
    adv = group_advantages(np.ones(8, np.float32), 4, estimator="passk", passk_k=k, scale=scale)
    assert np.all(np.asarray(adv) == 0.0)


def test_fewer_wrong_than_k_is_zero():
    """N - c < k: every k-subset holds a correct sample, s = 0, no signal (wrong ones too)."""
    rewards = np.array([1, 1, 0, 0, 1, 1, 1, 0], np.float32)
    adv = np.asarray(group_advantages(rewards, 4, estimator="passk", passk_k=3))
    assert np.all(adv == 0.0)
    adv = np.asarray(group_advantages(rewards, 4, estimator="passk", passk_k=2))
    assert np.all(adv[4:] == 0.0) and np.all(adv[:4] != 0.0)


def test_larger_k_shifts_weight_to_wrong_samples_of_easy_groups():
    """The paper's point: a group with many correct samples gives them less and less, then
    nothing, as k grows; a hard group (one correct) keeps rewarding its correct sample."""
    easy = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    pos = [float(group_advantages(easy, 8, estimator="passk", passk_k=k)[0]) for k in (1, 2, 3)]
    assert pos[0] > pos[1] > pos[2] > 0
    assert float(group_advantages(easy, 8, estimator="passk", passk_k=4)[0]) == 0.0


def test_jit_and_gradient():
    rewards = _binary(num_groups=6, group_size=8, seed=7)
    for scale in ADVANTAGE_SCALES:
        fn = functools.partial(group_advantages, group_size=8, estimator="passk", passk_k=3,
                               scale=scale)
        eager = np.asarray(fn(rewards))
        want = passk_reference(rewards, 8, 3, scale)
        np.testing.assert_allclose(jax.jit(fn)(rewards), eager, rtol=0,
                                   atol=2 * float(passk_tolerance(np.abs(want).max(), 8, 3)))
        grad = jax.grad(lambda r: (fn(r) ** 2).sum())(rewards)
        assert np.all(np.asarray(grad) == 0.0)  # counts of correct samples: no gradient


def test_library_thresholds_non_binary_rewards_at_half():
    """Under jit values cannot be checked: the library counts reward > 0.5 as correct (the
    trainer refuses such rewards instead, below)."""
    shaped = np.array([1.1, 0.1, 1.0, 0.0, 0.6, 0.4, -1.0, 0.5], np.float32)
    binary = np.array([1, 0, 1, 0, 1, 0, 0, 0], np.float32)
    np.testing.assert_array_equal(
        group_advantages(shaped, 4, estimator="passk", passk_k=2),
        group_advantages(binary, 4, estimator="passk", passk_k=2))


def test_bad_arguments_fail_clearly():
    rewards = np.array([1, 0, 0, 0], np.float32)
    for k in (0, 5, -1):
        with pytest.raises(ValueError, match=r"passk_k \(the k of pass@k\) must be in "
                                             r"\[1, group_size=4\]"):
            group_advantages(rewards, 4, estimator="passk", passk_k=k)
    for k in (2.0, True, "2"):
        with pytest.raises(TypeError, match="passk_k .* must be a Python int"):
            group_advantages(rewards, 4, estimator="passk", passk_k=k)
    with pytest.raises(ValueError, match="passk_k=2 is read by estimator 'passk' only"):
        group_advantages(rewards, 4, estimator="grpo", passk_k=2)
    with pytest.raises(ValueError, match="passk_k=2 is read by estimator 'passk' only"):
        backends.group_advantages(rewards, 4, estimator="grpo", passk_k=2, backend="pallas")
    with pytest.raises(ValueError, match="ddof must be 0"):
        group_advantages(rewards, 4, estimator="passk", passk_k=2, ddof=1)


# ----------------------------------------------------------------------------- trainer path


def _rl(**overrides):
    return ml_collections.ConfigDict({**dict(num_generations=8, advantage_estimator="passk",
                                             advantage_scale="group", passk_k=3), **overrides})


@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_group_estimator_runs_it_on_the_default_backend(scale):
    """What RLTrainer does without a critic: GroupEstimator(rl, kernels.backend="auto")."""
    rewards = _binary(num_groups=6, group_size=8, seed=11)
    lengths = np.full(rewards.size, 5)
    lengths[3] = 0  # a row the loss does not see: 0
    out = GroupEstimator(_rl(advantage_scale=scale), "auto").advantages(
        rewards, lambda: None, None, 0.0, lengths)["advantages"]
    want = passk_reference(rewards, 8, 3, scale)
    want[3] = 0.0
    assert out.dtype == np.float32
    assert np.all(np.abs(out - want) <= passk_tolerance(want, 8, 3))


def test_every_backend_runs_the_reference():
    """No kernel implements "passk": the Pallas route (interpreted here) falls back to the
    reference with its k, and the kernel called directly refuses it."""
    rewards = _binary(num_groups=4, group_size=8, seed=12)
    want = group_advantages(rewards, 8, estimator="passk", passk_k=4)
    assert backends.fallback_reason_group_advantages(estimator="passk") is not None
    for backend in backends.BACKENDS:
        np.testing.assert_array_equal(
            backends.group_advantages(rewards, 8, estimator="passk", passk_k=4,
                                      backend=backend), want, err_msg=backend)
    with pytest.raises(ValueError, match="does not implement estimator='passk'"):
        group_advantage_kernel.group_advantage(rewards, 8, estimator="passk", interpret=True)


def test_group_estimator_refuses_non_binary_rewards():
    rewards = _binary(num_groups=2, group_size=8, seed=13)
    rewards[5] = 1.1  # e.g. correctness + a 0.1 format bonus
    estimator = GroupEstimator(_rl(), "auto")
    with pytest.raises(ValueError, match=r"'passk': 1 of 16 rewards are not 0 or 1 \(e\.g\. 1\.1"):
        estimator.advantages(rewards, lambda: None, None, 0.0, np.ones(16, int))
    # other estimators take any reward
    GroupEstimator(_rl(advantage_estimator="grpo"), "auto").advantages(
        rewards, lambda: None, None, 0.0, np.ones(16, int))


@pytest.mark.parametrize("k", [0, 9, None, 2.5])
def test_group_estimator_refuses_a_bad_k(k):
    rl = _rl(passk_k=k) if k is not None else _rl()
    if k is None:
        del rl["passk_k"]
    with pytest.raises((ValueError, TypeError), match=r"rl\.passk_k \(the k of pass@k\)"):
        GroupEstimator(rl, "auto")


# ----------------------------------------------------------------------------- config


def _passk_config(**rl):
    config = load_config(ARITH)
    config.rl.advantage_estimator = "passk"
    config.rewards.weights.format_strict = 0.0  # correctness only: 0/1 rewards
    for key, value in rl.items():
        config.rl[key] = value
    return config


def _problems(config, key):
    return [p for p in validate_config(config, 8) if p.startswith(key + ":")]


def test_config_validation():
    assert validate_config(load_config(ARITH), 8) == []  # passk_k = 0 (unset) with "grpo"
    group = load_config(ARITH).rl.num_generations
    assert validate_config(_passk_config(passk_k=2), 8) == []
    assert validate_config(_passk_config(passk_k=group), 8) == []
    for k in (0, group + 1, -1, True):  # (a float is refused by the ConfigDict's int type)
        problems = _problems(_passk_config(passk_k=k), "rl.passk_k")
        assert problems and f"[1, rl.num_generations={group}]" in problems[0], (k, problems)
    # the default config's reward is correctness + 0.1 * format: not 0/1
    config = _passk_config(passk_k=2)
    config.rewards.weights.format_strict = 0.1
    assert "0/1" in _problems(config, "rewards.weights")[0]
    config = _passk_config(passk_k=2)
    config.rewards.weights.correctness = 2.0
    assert _problems(config, "rewards.weights")
    config = _passk_config(passk_k=2, kl_in_reward=True, beta=0.01)
    assert _problems(config, "rl.kl_in_reward")
    # k set for another estimator: named, not silently ignored
    config = load_config(ARITH)
    config.rl.passk_k = 2
    assert "read by rl.advantage_estimator 'passk' only" in _problems(config, "rl.passk_k")[0]
    # a group of one has no baseline
    config = _passk_config(passk_k=1, num_generations=1)
    assert _problems(config, "rl.num_generations")
