"""PPO's critic on padding-free packs (rl.packing with advantage_estimator='gae') against
the padded critic, in float32 on one device: the values, the value loss, its metrics and
gradients agree within the float-reordering bounds of tests/numerics.py, with prompts
shared or repeated; and a packed PPO trainer's steps match the padded trainer's."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.value import completion_values, init_value_params, packed_values
from jaxrl_reason.rl.value_passes import make_value_update_fn
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import decoder_grad_tolerance, decoder_tolerance, value_head_tolerance
from trainer_support import run_steps

PROMPTS, GROUP, TP, LENGTH, T = 3, 2, 5, 9, 32


def _rows(seed=0, vocab=64):
    """A prompt per row (the critic's layout; row 2's prompt has one token) and completions
    of 0..L tokens (row 1 reads nothing, row 4 all L)."""
    rng = np.random.default_rng(seed)
    n = PROMPTS * GROUP
    prompt_len = np.repeat(np.array([5, 1, 3]), GROUP)
    valid = np.arange(TP)[None, :] >= (TP - prompt_len)[:, None]
    prompt = np.where(valid, rng.integers(3, vocab, (n, TP)), 0).astype(np.int32)
    prompt[1::2], valid[1::2] = prompt[::2], valid[::2]  # siblings share their prompt
    completion = rng.integers(3, vocab, (n, LENGTH)).astype(np.int32)
    lengths = rng.integers(1, LENGTH + 1, n)
    lengths[1], lengths[4] = 0, LENGTH
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.float32)
    return prompt, valid, completion, lengths, mask


@functools.lru_cache(maxsize=1)
def _setup():
    """(mesh of 1 device, the "test" model at vocabulary 64, its value params), made once
    for the file (each init compiles its own program): read-only, so copy the params
    before a donating update."""
    mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    params = init_value_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES,
                               head_init_std=0.5)  # values away from 0
    return mesh, cfg, params


def _packs(prompt, valid, completion, lengths, share):
    """The trainer's packs: a prompt per group (the first row's), `share` as its packer."""
    packs = packing.pack(prompt[::GROUP], valid[::GROUP], completion, lengths, T,
                         share_prompts=share)
    assert packs.num_packs < PROMPTS * GROUP  # rows really share packs
    return {name: jnp.asarray(x) for name, x in packs.arrays().items()}


def critic_targets(model, params, prompt, valid, completion, mask):
    """(the critic update's row arrays: mask, normalizers, old values (the current values
    plus noise, so that clipping engages) and returns, f32 numpy; the current values
    f32 [N, L]) for the rows of `_rows`."""
    rng = np.random.default_rng(3)
    values0 = np.asarray(completion_values(model, params, *(jnp.asarray(x) for x in (
        prompt, valid, completion, mask))))
    common = {"mask": mask, "num_tokens": np.float32(mask.sum()),
              "num_sequences": np.float32(len(mask)),
              "old_values": (values0 + rng.normal(0, 0.3, mask.shape) * mask).astype(np.float32),
              "returns": (rng.normal(size=mask.shape) * mask).astype(np.float32)}
    return common, values0


@pytest.mark.parametrize("share", [True, False])
def test_packed_values_equal_padded_values_and_gradients(share):
    mesh, cfg, params = _setup()
    model = Transformer(cfg)
    prompt, valid, completion, lengths, mask = _rows()
    packs = _packs(prompt, valid, completion, lengths, share)
    weights = jnp.asarray(np.random.default_rng(1).normal(size=mask.shape), jnp.float32)
    rows = [jnp.asarray(x) for x in (prompt, valid, completion, mask)]

    def padded(p):
        values = completion_values(model, p, *rows)
        return jnp.sum(values * weights), values

    def packed(p):
        values = packed_values(model, p, packs, share_prompts=share)
        return jnp.sum(values * weights), values

    (_, a), ga = jax.jit(jax.value_and_grad(padded, has_aux=True))(params)
    (_, b), gb = jax.jit(jax.value_and_grad(packed, has_aux=True))(params)
    atol = value_head_tolerance(cfg, params, tokens=T)
    assert np.abs(np.asarray(a)).max() > 100 * atol  # a real comparison
    np.testing.assert_allclose(b, a, rtol=0, atol=atol)
    assert np.all(np.asarray(b)[mask == 0] == 0)
    grad_atol = decoder_grad_tolerance(cfg, ga, tokens=T, rows=len(mask))
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(y, x, rtol=0, atol=grad_atol)


def test_packed_critic_update_equals_padded_update():
    """One donated critic update with SGD at rate 1, clipping engaged: loss metrics, the
    gradient norm and the gradients (old params - new params) agree."""
    mesh, cfg, params = _setup()
    model, sgd = Transformer(cfg), optax.sgd(1.0)
    prompt, valid, completion, lengths, mask = _rows(2)
    common, values0 = critic_targets(model, params, prompt, valid, completion, mask)
    batches = {None: {**common, "prompt_tokens": prompt, "prompt_valid": valid,
                      "completion_tokens": completion},
               True: {**common, **_packs(prompt, valid, completion, lengths, True)}}
    out = {}
    for share, batch in batches.items():
        update = make_value_update_fn(model, sgd, clip_range=0.2, max_completion_length=LENGTH,
                                      mesh=mesh, rules=shd.DEFAULT_RULES, share_prompts=share)
        state = create_train_state(jax.tree.map(jnp.copy, params), sgd)
        new, metrics = update(state, jax.tree.map(jnp.asarray, batch))
        out[share] = (jax.device_get(metrics), jax.tree.map(
            lambda a, b: np.asarray(a) - np.asarray(b), params, new.params))
    (m_a, g_a), (m_b, g_b) = out[None], out[True]
    assert set(m_a) == set(m_b) and 0 < m_a["value_clip_frac"] < 1
    atol = 4 * value_head_tolerance(cfg, params, tokens=T) * (1 + np.abs(values0).max())
    for name in m_a:
        if name in ("value_clip_frac", "value_grad_norm"):
            continue
        np.testing.assert_allclose(m_b[name], m_a[name], rtol=0, atol=atol, err_msg=name)
    assert m_b["value_clip_frac"] == m_a["value_clip_frac"]
    grad_atol = decoder_grad_tolerance(cfg, g_a, tokens=T, rows=len(mask))
    size = sum(np.size(g) for g in jax.tree.leaves(g_a))
    np.testing.assert_allclose(m_b["value_grad_norm"], m_a["value_grad_norm"], rtol=0,
                               atol=grad_atol * np.sqrt(size))
    for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


PPO = ("--config.rl.advantage_estimator=gae", "--config.rl.beta=0.02",
       "--config.rl.kl_in_reward=True", "--config.rl.value.learning_rate=3e-3")


def test_packed_ppo_steps_match_padded_steps(make_trainer):
    weights = {"_test_text_length": 1.0, "_test_half_constant": 1.0}
    padded, _ = make_trainer(*PPO, weights=weights)
    packed, initial = make_trainer(*PPO, "--config.rl.packing=True",
                                   "--config.rl.pack_tokens=64", weights=weights)
    assert packed.advantage_source.packed and not padded.advantage_source.packed
    a, b = run_steps(padded, 2), run_steps(packed, 2)
    atol = 8 * decoder_tolerance(packed.rt.model_cfg, initial, tokens=64)
    for step_a, step_b in zip(a, b):
        assert set(step_a) == set(step_b)
        for name, value in step_a.items():
            if not name.startswith("time/"):
                np.testing.assert_allclose(step_b[name], value, rtol=0,
                                           atol=atol * (1.0 + abs(value)), err_msg=name)
    assert any(step["value_grad_norm"] > 0 and step["grad_norm"] > 0 for step in a)
