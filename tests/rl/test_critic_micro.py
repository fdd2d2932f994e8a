"""The PPO critic's micro-batches (rl.micro_batches, and with rl.packing micro-batches of
packs): the value pass and the critic update against one micro-batch, padded and packed, in
float32 on one device: the same values, gradients and whole-batch metrics (explained
variance included, which no mean of micro-batch values would give)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from test_packing_critic import GROUP, LENGTH, T, _rows, _setup, critic_targets

PACK = 16  # tokens per pack: the rows fill several
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.value_passes import make_value_fn, make_value_update_fn
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import decoder_grad_tolerance, value_head_tolerance


def _batch(model, params, seed=2):
    """(padded batch, packed batch with an even pack count, old values) of `_rows`."""
    prompt, valid, completion, lengths, mask = _rows(seed)
    common, values0 = critic_targets(model, params, prompt, valid, completion, mask)
    packs = packing.pack(prompt[::GROUP], valid[::GROUP], completion, lengths, PACK,
                         lambda n: n + n % 2, share_prompts=True)
    assert packs.num_packs >= 3
    padded = {**common, "prompt_tokens": prompt, "prompt_valid": valid,  # a prompt per row
              "completion_tokens": completion}
    packed = {**common, **packs.arrays()}
    return (jax.tree.map(jnp.asarray, padded), jax.tree.map(jnp.asarray, packed), values0,
            len(packs.tokens))


def _update(model, params, batch, share, **micro):
    mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
    sgd = optax.sgd(1.0)
    update = make_value_update_fn(model, sgd, clip_range=0.2, max_completion_length=LENGTH,
                                  mesh=mesh, rules=shd.DEFAULT_RULES, share_prompts=share,
                                  **micro)
    new, metrics = update(create_train_state(jax.tree.map(jnp.copy, params), sgd), batch)
    return jax.device_get(metrics), jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b),
                                                 params, new.params)


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batched_critic_update_equals_one_micro_batch(packed):
    _, cfg, params = _setup()
    model = Transformer(cfg)
    padded, packs, values0, num_packs = _batch(model, params)
    if packed:
        batch, share, micro = packs, True, {"micro_batches": 2, "packs_per_micro": 1}
    else:
        batch, share, micro = padded, None, {"micro_batches": 2}
    m_one, g_one = _update(model, params, batch, share)
    m_k, g_k = _update(model, params, batch, share, **micro)
    assert set(m_k) == set(m_one) and 0 < m_one["value_clip_frac"] < 1
    assert abs(m_one["explained_variance"]) > 1e-3
    atol = 4 * value_head_tolerance(cfg, params, tokens=T) * (1 + np.abs(values0).max())
    for name in m_one:  # the whole batch's values, explained variance included
        np.testing.assert_allclose(m_k[name], m_one[name], rtol=1e-5, atol=atol, err_msg=name)
    grad_atol = decoder_grad_tolerance(cfg, g_one, tokens=T, rows=len(values0))
    assert max(np.abs(g).max() for g in jax.tree.leaves(g_one)) > 100 * grad_atol
    for a, b in zip(jax.tree.leaves(g_one), jax.tree.leaves(g_k)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def test_micro_batched_critic_update_without_normalizers_uses_the_whole_batchs():
    """A batch without num_tokens / num_sequences: the micro-batched update divides by
    the whole batch's tokens (`micro.with_normalizers`), as one micro-batch does."""
    _, cfg, params = _setup()
    model = Transformer(cfg)
    padded, _, values0, _ = _batch(model, params)
    batch = {k: v for k, v in padded.items() if k not in ("num_tokens", "num_sequences")}
    m_one, g_one = _update(model, params, batch, None)
    m_k, g_k = _update(model, params, batch, None, micro_batches=3)
    atol = 4 * value_head_tolerance(cfg, params, tokens=T) * (1 + np.abs(values0).max())
    np.testing.assert_allclose(m_k["value_loss"], m_one["value_loss"], rtol=1e-5, atol=atol)
    grad_atol = decoder_grad_tolerance(cfg, g_one, tokens=T, rows=len(values0))
    for a, b in zip(jax.tree.leaves(g_one), jax.tree.leaves(g_k)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def test_micro_batched_value_pass_equals_one_pass():
    mesh, cfg, params = _setup()
    model = Transformer(cfg)
    padded, packs, _, num_packs = _batch(model, params)
    rows = [padded[k] for k in ("prompt_tokens", "prompt_valid", "completion_tokens", "mask")]
    one = make_value_fn(model, mesh, shd.DEFAULT_RULES)(params, *rows)
    two = make_value_fn(model, mesh, shd.DEFAULT_RULES, micro_batches=2)(params, *rows)
    atol = value_head_tolerance(cfg, params, tokens=T)
    assert np.abs(np.asarray(one)).max() > 100 * atol
    np.testing.assert_allclose(two, one, rtol=0, atol=atol)
    packed_one = make_value_fn(model, mesh, shd.DEFAULT_RULES, share_prompts=True)(params, packs)
    packed_k = make_value_fn(model, mesh, shd.DEFAULT_RULES, share_prompts=True,
                             packs_per_micro=num_packs // 2)(params, packs)
    np.testing.assert_allclose(packed_k, packed_one, rtol=0, atol=atol)
    np.testing.assert_allclose(packed_one, one, rtol=0, atol=atol)


def test_a_packed_critic_with_micro_batches_needs_their_packs():
    _, cfg, _ = _setup()
    with pytest.raises(ValueError, match="packs of a micro-batch"):
        make_value_update_fn(Transformer(cfg), optax.sgd(1.0), clip_range=0.2,
                             share_prompts=True, micro_batches=2)
