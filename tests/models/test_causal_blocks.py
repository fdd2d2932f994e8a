"""Causal query blocks: on CPU, attention over T >= 48 queries with a static first slot runs
each block of queries against only the keys it can see (attention._causal_block_attention).
The reference is the one-piece attention (`_CAUSAL_BLOCK` set out of reach)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.models import attention, scoring
from jaxrl_reason.models.transformer import Transformer, attention_mask, causal_query_blocks
from numerics import (attention_loss_tolerances, decoder_grad_tolerance, decoder_tolerance,
                      f32_tolerance)


@pytest.mark.parametrize("num_queries,num_keys,first_slot,block,window", [
    (127, 159, 32, 32, None), (100, 100, 0, 34, None), (64, 200, 0, 16, None),
    (90, 130, 40, 30, 24), (50, 50, 0, 10, 7), (33, 70, 37, 11, 1000)])
def test_spans_cover_every_key_the_mask_allows(num_queries, num_keys, first_slot, block, window):
    spans = causal_query_blocks(num_queries, num_keys, first_slot, block, window)
    assert [a for a, *_ in spans] == list(range(0, num_queries, block))
    assert spans[-1][1] == num_queries
    allowed = np.asarray(attention_mask(jnp.ones((1, num_keys), bool), num_queries, first_slot,
                                        window))[0]                                 # [T, S]
    covered = np.zeros_like(allowed)
    for a, b, lo, hi in spans:
        assert 0 <= lo <= hi <= num_keys
        covered[a:b, lo:hi] = True
    assert not (allowed & ~covered).any()
    # and the ranges are tight: each block's last query sees its last key, its first query
    # the first key of a windowed range
    for a, b, lo, hi in spans:
        assert allowed[b - 1, hi - 1]
        if window is not None:
            assert allowed[a, lo]


def _no_blocks(monkeypatch):
    monkeypatch.setattr(attention, "_CAUSAL_BLOCK", 10 ** 9)


def test_block_choice():
    f32 = jnp.float32
    assert attention._causal_block(127, f32) == 32
    assert attention._causal_block(100, f32) == 34
    assert attention._causal_block(40, f32) is None          # round(40 / 32) = 1 block
    assert attention._causal_block(4096, f32) == 512         # at most 8 blocks
    assert attention._causal_block(127, jnp.bfloat16) is None


@pytest.mark.parametrize("softcap,window", [(None, None), (30.0, 20)])
def test_block_attention_equals_one_piece_values_and_gradients(softcap, window):
    cfg = models.get_preset("test", attn_logit_softcap=softcap)
    b, t, first = 2, 70, 9
    s = first + t
    kv, g, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    q = jax.random.normal(jax.random.key(0), (b, t, kv, g, hd))
    k = jax.random.normal(jax.random.key(1), (b, s, kv, hd))
    v = jax.random.normal(jax.random.key(2), (b, s, kv, hd))
    key_valid = jnp.arange(s)[None, :] >= jnp.array([0, 4])[:, None]   # row 1 left-padded
    mask = attention_mask(key_valid, t, first, window)
    cot = jax.random.normal(jax.random.key(3), q.shape)
    spans = causal_query_blocks(t, s, first, 24, window)
    assert len(spans) == 3 and spans[0][3] < s

    def loss(fn):
        return lambda *a: jnp.sum(fn(cfg, *a, mask) * cot)
    blocked = lambda cfg, *a: attention._causal_block_attention(cfg, *a, spans)  # noqa: E731
    got = jax.value_and_grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
    want = jax.value_and_grad(loss(attention._attend), argnums=(0, 1, 2))(q, k, v)
    # Query blocks over key prefixes vs one piece: other summation orders (tests/numerics.py).
    loss_atol, grad_atol = attention_loss_tolerances(q, k, v, cot, want[1], keys=s,
                                                     queries=t * g, scale=hd ** -0.5)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=loss_atol)
    for a, w in zip(got[1], want[1]):
        np.testing.assert_allclose(a, w, rtol=0, atol=grad_atol)


def _model(**overrides):
    cfg = models.get_preset("test", init_std=0.2, **overrides)
    model = Transformer(cfg)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = model.init(jax.random.key(0), tokens, jnp.zeros((1, 4), jnp.int32),
                        jnp.ones((1, 4), bool))["params"]
    return cfg, model, params


@pytest.mark.parametrize("overrides", [
    {}, {"scan_layers": True, "remat": "block"},
    {"sliding_window": 16, "sliding_window_pattern": 2, "attn_logit_softcap": 50.0}],
    ids=["plain", "scanned-remat", "sliding"])
def test_model_forward_and_gradients_unchanged(monkeypatch, overrides):
    """A left-padded batch of 80 tokens through the whole model: logits at the real tokens
    and parameter gradients equal the one-piece attention's; the blocks are really used."""
    cfg, model, params = _model(**overrides)
    b, t = 3, 80
    tokens = jax.random.randint(jax.random.key(5), (b, t), 0, cfg.vocab_size)
    valid = jnp.arange(t)[None, :] >= jnp.array([0, 5, 17])[:, None]
    positions = scoring.positions_from_valid(valid)

    def loss(p):
        logits, _ = model.apply({"params": p}, tokens, positions, valid)
        return jnp.sum(jnp.where(valid[..., None], logits, 0.0) ** 2), logits

    calls = []
    real = attention._causal_block_attention
    monkeypatch.setattr(attention, "_causal_block_attention",
                        lambda *a: calls.append(a[-1]) or real(*a))
    (got_loss, got_logits), got_grads = jax.value_and_grad(loss, has_aux=True)(params)
    assert calls and all(len(spans) == 2 for spans in calls)
    _no_blocks(monkeypatch)
    (want_loss, want_logits), want_grads = jax.value_and_grad(loss, has_aux=True)(params)
    # Blocked vs one-piece attention: other summation orders (tests/numerics.py). The loss
    # sum z^2 moves by 2 sum |z| * (a logit's bound) plus its own sum's rounding.
    logit_atol = decoder_tolerance(cfg, params, tokens=t)
    z = np.where(valid[..., None], np.asarray(want_logits, np.float64), 0.0)
    loss_atol = 2 * np.abs(z).sum() * logit_atol + f32_tolerance(z.size, (z ** 2).sum())
    np.testing.assert_allclose(got_loss, want_loss, rtol=0, atol=loss_atol)
    np.testing.assert_allclose(np.where(valid[..., None], got_logits, 0),
                               np.where(valid[..., None], want_logits, 0), rtol=0,
                               atol=logit_atol)
    grad_atol = decoder_grad_tolerance(cfg, want_grads, tokens=t, rows=b)
    for a, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(a, w, rtol=0, atol=grad_atol)


def test_prefill_skips_the_empty_cache_and_decode_is_unchanged(monkeypatch):
    """A prefill of 64 tokens into a 96-slot cache (first slot 0, a python int) attends in
    blocks over the filled slots only; the cache it writes (at real tokens: a padding slot's
    entry is never attended to) and the next decode step's logits equal the one-piece
    prefill's."""
    cfg, model, params = _model()
    b, t, slots = 2, 64, 96
    tokens = jax.random.randint(jax.random.key(6), (b, t), 0, cfg.vocab_size)
    valid = jnp.arange(t)[None, :] >= jnp.array([0, 3])[:, None]
    positions = scoring.positions_from_valid(valid)
    key_valid = jnp.concatenate([valid, jnp.zeros((b, slots - t), bool)], axis=1)

    def run():
        cache = models.init_cache(cfg, b, slots)
        logits, cache = model.apply({"params": params}, tokens, positions, key_valid, cache, 0)
        step_valid = key_valid.at[:, t].set(True)
        nxt, _ = model.apply({"params": params}, tokens[:, -1:], positions[:, -1:] + 1,
                             step_valid, cache, jnp.int32(t))
        return logits, cache, nxt

    spans = []
    real = attention._causal_block_attention
    monkeypatch.setattr(attention, "_causal_block_attention",
                        lambda *a: spans.append(a[-1]) or real(*a))
    got = run()
    assert spans and all(hi <= t for *_, hi in spans[0])
    _no_blocks(monkeypatch)
    want = run()
    np.testing.assert_allclose(np.where(valid[..., None], got[0], 0),
                               np.where(valid[..., None], want[0], 0), rtol=1e-4, atol=1e-4)
    real = key_valid[:, None, :, None]                              # cache [B, K, S, hd]
    for a, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(np.where(real, a, 0), np.where(real, w, 0), rtol=1e-4,
                                   atol=1e-4)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-4)
