"""completion_logprobs with model.logprobs_impl = "chunked" or "pallas" (never the
[N, L, V] logits) gives the "full" values and gradients."""
import dataclasses

import pytest

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.params import init_params
from jaxrl_reason.models.scoring import completion_logprobs
from jaxrl_reason.models.transformer import Transformer
from numerics import decoder_grad_tolerance, decoder_tolerance


@pytest.mark.parametrize("impl, devices", [("chunked", 1), ("pallas", 1), ("pallas", 4)])
def test_lean_logprobs_equal_full_values_and_gradients(impl, devices):
    """"pallas" on 4 devices: the kernels run per device under shard_map (rows split)."""
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:devices])
    full_cfg = dataclasses.replace(get_preset("test"), logprobs_impl="full")
    chunk_cfg = dataclasses.replace(full_cfg, logprobs_impl=impl, logprobs_seq_chunk=5,
                                    logprobs_vocab_chunk=48)
    params = init_params(full_cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    rng = np.random.default_rng(0)
    n, tp, length = 4, 6, 11
    prompt = jnp.asarray(rng.integers(3, full_cfg.vocab_size, (n, tp)), jnp.int32)
    valid = jnp.asarray(np.arange(tp)[None, :] >= np.array([[0], [2], [5], [1]]))
    completion = jnp.asarray(rng.integers(3, full_cfg.vocab_size, (n, length)), jnp.int32)
    mask = jnp.asarray(np.arange(length)[None, :] < np.array([[11], [4], [0], [7]]),
                       jnp.float32)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    prompt, valid, completion, mask = jax.device_put((prompt, valid, completion, mask), rows)

    def loss(p, cfg):
        logp, ent = completion_logprobs(Transformer(cfg), p, prompt, valid, completion, mask,
                                        temperature=0.7, mesh=mesh, batch_axes="data")
        return jnp.sum(logp * 1.3) + jnp.sum(ent * 0.2), (logp, ent)

    (lf, (logp_f, ent_f)), gf = jax.value_and_grad(loss, has_aux=True)(params, full_cfg)
    (lc, (logp_c, ent_c)), gc = jax.value_and_grad(loss, has_aux=True)(params, chunk_cfg)
    # Chunked / kernel log-softmax: other summation orders (tests/numerics.py).
    atol = decoder_tolerance(full_cfg, params, tokens=tp + length, temperature=0.7)
    np.testing.assert_allclose(logp_c, logp_f, rtol=0, atol=atol)
    np.testing.assert_allclose(ent_c, ent_f, rtol=0, atol=atol * np.log(full_cfg.vocab_size))
    grad_atol = decoder_grad_tolerance(full_cfg, gf, tokens=tp + length, rows=n)
    for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gf)):
        np.testing.assert_allclose(a, b, rtol=0, atol=grad_atol)


@pytest.mark.parametrize("chunk", [4, 7])
def test_chunked_attention_equals_full_attention_values_and_gradients(chunk):
    """model.attention_chunk: queries attended `chunk` at a time (remat per chunk), T not a
    multiple of the chunk, left padding and a sliding window: same log-probs and grads."""
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:1])
    full_cfg = dataclasses.replace(get_preset("test"), logprobs_impl="full",
                                   sliding_window=6, sliding_window_pattern=2,
                                   attn_logit_softcap=20.0)
    chunk_cfg = dataclasses.replace(full_cfg, attention_chunk=chunk)
    params = init_params(full_cfg, jax.random.key(1), mesh, shd.DEFAULT_RULES)
    rng = np.random.default_rng(1)
    n, tp, length = 3, 6, 11
    prompt = jnp.asarray(rng.integers(3, full_cfg.vocab_size, (n, tp)), jnp.int32)
    valid = jnp.asarray(np.arange(tp)[None, :] >= np.array([[0], [2], [5]]))
    completion = jnp.asarray(rng.integers(3, full_cfg.vocab_size, (n, length)), jnp.int32)
    mask = jnp.asarray(np.arange(length)[None, :] < np.array([[11], [4], [1]]), jnp.float32)

    def loss(p, cfg):
        logp, ent = completion_logprobs(Transformer(cfg), p, prompt, valid, completion, mask)
        return jnp.sum(logp) + 0.1 * jnp.sum(ent), logp

    (lf, logp_f), gf = jax.value_and_grad(loss, has_aux=True)(params, full_cfg)
    (lc, logp_c), gc = jax.value_and_grad(loss, has_aux=True)(params, chunk_cfg)
    np.testing.assert_allclose(logp_c, logp_f, rtol=0,
                               atol=decoder_tolerance(full_cfg, params, tokens=tp + length))
    grad_atol = decoder_grad_tolerance(full_cfg, gf, tokens=tp + length, rows=n)
    for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gf)):
        np.testing.assert_allclose(a, b, rtol=0, atol=grad_atol)


@pytest.mark.parametrize("variant, devices", [
    ("plain", 1), ("plain", 4),
    ("gemma_like", 1),       # sliding window + softcaps + qk-norm, scanned layers
    ("chunked_pallas", 1),   # query-chunked attention, Pallas log-probs
])
def test_shared_prompts_equal_per_row_prompts_values_and_gradients(variant, devices):
    """A prompt per group of G rows (each prompt run once, its cache shared) gives the
    per-row pass's log-probs, entropies and gradients: left padding, masked tails, a row
    with one real token and a row with none."""
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:devices])
    cfg = dataclasses.replace(get_preset("test"), logprobs_impl="full")
    if variant == "gemma_like":
        cfg = dataclasses.replace(cfg, sliding_window=5, sliding_window_pattern=2,
                                  attn_logit_softcap=20.0, final_logit_softcap=15.0,
                                  qk_norm=True, scan_layers=True)
    if variant == "chunked_pallas":
        cfg = dataclasses.replace(cfg, attention_chunk=4, logprobs_impl="pallas")
    params = init_params(cfg, jax.random.key(2), mesh, shd.DEFAULT_RULES)
    rng = np.random.default_rng(2)
    p, g, tp, length = 2, 4, 6, 9
    prompt = jnp.asarray(rng.integers(3, cfg.vocab_size, (p, tp)), jnp.int32)
    valid = jnp.asarray(np.arange(tp)[None, :] >= np.array([[0], [3]]))
    completion = jnp.asarray(rng.integers(3, cfg.vocab_size, (p * g, length)), jnp.int32)
    lengths = np.array([[9], [4], [1], [0], [7], [9], [2], [5]])
    mask = jnp.asarray(np.arange(length)[None, :] < lengths, jnp.float32)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    completion, mask = jax.device_put((completion, mask), rows)
    model = Transformer(cfg)

    def loss(params, prompt_rows, valid_rows):
        logp, ent = completion_logprobs(model, params, prompt_rows, valid_rows, completion,
                                        mask, temperature=0.8, mesh=mesh, batch_axes="data")
        return jnp.sum(logp * 1.1) + jnp.sum(ent * 0.3), (logp, ent)

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (_, (logp_s, ent_s)), g_s = grad(params, prompt, valid)
    (_, (logp_r, ent_r)), g_r = grad(params, jnp.repeat(prompt, g, 0), jnp.repeat(valid, g, 0))
    atol = decoder_tolerance(cfg, params, tokens=tp + length, temperature=0.8)
    np.testing.assert_allclose(logp_s, logp_r, rtol=0, atol=atol)
    np.testing.assert_allclose(ent_s, ent_r, rtol=0, atol=atol * np.log(cfg.vocab_size))
    assert np.all(np.asarray(logp_s)[3] == 0) and np.all(np.asarray(logp_s)[0] < 0)
    grad_atol = decoder_grad_tolerance(cfg, g_r, tokens=tp + length, rows=p * g)
    for a, b in zip(jax.tree.leaves(g_s), jax.tree.leaves(g_r)):
        np.testing.assert_allclose(a, b, rtol=0, atol=grad_atol)


def test_prompts_must_divide_the_rows():
    cfg = get_preset("test")
    params = init_params(cfg, jax.random.key(0), shd.make_mesh({"data": 1}, jax.devices()[:1]),
                         shd.DEFAULT_RULES)
    with pytest.raises(ValueError, match="5 completion rows cannot share 2 prompts"):
        completion_logprobs(Transformer(cfg), params, jnp.ones((2, 3), jnp.int32),
                            jnp.ones((2, 3), bool), jnp.ones((5, 4), jnp.int32),
                            jnp.ones((5, 4)))
