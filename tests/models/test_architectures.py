"""The family switches of the decoder: sliding-window attention (full forward and KV-cached
decode), RoPE scaling, Gemma's (1 + w) norms and post-norms, soft-capping, validation of the
new config fields, and the published shapes of the real-model presets. Numerical parity with
transformers: test_hf_parity.py."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.models.transformer import (Transformer, attention_mask, rope,
                                             rope_frequencies)
from jaxrl_reason.sampling.sampler import positions_from_valid
from numerics import decoder_tolerance

GEMMA_LIKE = dict(activation="gelu_tanh", embed_scale=True, norm_plus_one=True, post_norms=True,
                  qk_norm=True, attn_logit_softcap=5.0, final_logit_softcap=10.0,
                  query_pre_attn_scalar=12.0, sliding_window=3, sliding_window_pattern=2,
                  rope_local_theta=100.0, rope_scaling="linear", rope_scaling_factor=2.0,
                  init_std=0.3)


def _params(cfg, seed=0):
    dummy = jnp.zeros((1, 1), jnp.int32)
    init = jax.jit(lambda key: Transformer(cfg).init(key, dummy, dummy, jnp.ones((1, 1), bool)))
    return nn.meta.unbox(init(jax.random.key(seed)))["params"]


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes, match", [
    (dict(rope_scaling="yarn"), "rope_scaling must be one of"),
    (dict(rope_scaling="linear", rope_scaling_factor=0.0), "rope_scaling_factor must be positive"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=4.0, rope_high_freq_factor=1.0),
     "rope_high_freq_factor=1.0 must exceed"),
    (dict(rope_scaling="llama3", rope_original_max_position=0), "rope_original_max_position"),
    (dict(sliding_window=0), "sliding_window must be positive"),
    (dict(sliding_window=4, sliding_window_pattern=1), "sliding_window_pattern must be 0"),
    (dict(rope_local_theta=1e4), "rope_local_theta applies to sliding-window layers"),
    (dict(attn_logit_softcap=-1.0), "attn_logit_softcap must be positive"),
    (dict(query_pre_attn_scalar=0), "query_pre_attn_scalar must be positive"),
])
def test_new_field_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        models.get_preset("test", **changes)


def test_defaults_keep_the_parameter_tree():
    cfg = models.get_preset("test")
    leaves = {jax.tree_util.keystr(k) for k, _ in
              jax.tree_util.tree_flatten_with_path(models.abstract_params(cfg))[0]}
    assert not any("post_" in leaf for leaf in leaves)
    assert [cfg.layer_is_sliding(i) for i in range(4)] == [False] * 4


@pytest.mark.parametrize("changes", [GEMMA_LIKE, dict(GEMMA_LIKE, qk_norm=False),
                                     dict(qkv_bias=True, sliding_window=2)])
def test_num_params_and_logical_axes_cover_new_params(changes):
    cfg = models.get_preset("test", **changes)
    shapes = models.abstract_params(cfg)
    assert models.count_params(shapes) == cfg.num_params
    axes = models.param_logical_axes(cfg)
    def is_axes(t):
        return isinstance(t, tuple) and all(isinstance(n, (str, type(None))) for n in t)

    for names, x in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(shapes)):
        assert len(names) == x.ndim
    if cfg.post_norms:
        layer = axes["layer_0"]
        assert layer["post_attn_norm"]["scale"] == layer["post_mlp_norm"]["scale"] == ("embed",)


def test_layer_is_sliding_patterns():
    cfg = models.get_preset("test", n_layers=6, sliding_window=4)
    assert [cfg.layer_is_sliding(i) for i in range(6)] == [True] * 6
    cfg = cfg.replace(sliding_window_pattern=2)
    assert [cfg.layer_is_sliding(i) for i in range(6)] == [True, False] * 3
    cfg = cfg.replace(sliding_window_pattern=6)
    assert [cfg.layer_is_sliding(i) for i in range(6)] == [True] * 5 + [False]


# Parameter counts published for the real checkpoints (safetensors totals).
_PUBLISHED = {"qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512,
              "qwen3-1.7b": 1_720_574_976, "llama3-8b": 8_030_261_248,
              "llama3.1-8b": 8_030_261_248, "llama3.2-1b": 1_235_814_400,
              "gemma2-2b": 2_614_341_888, "gemma3-1b": 999_885_952}


@pytest.mark.parametrize("name", sorted(_PUBLISHED))
def test_real_model_presets_have_published_sizes(name):
    cfg = models.get_preset(name)
    assert cfg.num_params == _PUBLISHED[name]
    assert models.count_params(models.abstract_params(cfg)) == cfg.num_params


# ----------------------------------------------------------------------------- components


def test_attention_mask_window():
    key_valid = jnp.asarray([[False, True, True, True, True, True]])
    full = np.asarray(attention_mask(key_valid, 6, 0))[0]
    windowed = np.asarray(attention_mask(key_valid, 6, 0, window=2))[0]
    for q in range(6):
        for k in range(6):
            assert full[q, k] == (k >= 1 and k <= q)
            assert windowed[q, k] == (full[q, k] and q - k < 2)
    # Decode: one query at slot 5 sees slots 4 and 5 only.
    np.testing.assert_array_equal(np.asarray(attention_mask(key_valid, 1, 5, window=2))[0, 0],
                                  [False, False, False, False, True, True])


def _llama3_numpy(d, theta, factor, low, high, original):
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    wavelen = 2 * np.pi / inv
    smooth = (original / wavelen - low) / (high - low)
    out = np.where(wavelen > original / low, inv / factor, inv)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, (1 - smooth) * inv / factor + smooth * inv, out)


def test_rope_frequencies_llama3_and_linear():
    got = np.asarray(rope_frequencies(16, 10000.0, "llama3", 8.0, 1.0, 4.0, 64))
    want = _llama3_numpy(16, 10000.0, 8.0, 1.0, 4.0, 64)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    plain = np.asarray(rope_frequencies(16, 10000.0))
    assert got[0] == pytest.approx(plain[0])  # high frequency kept
    assert got[-1] == pytest.approx(plain[-1] / 8.0, rel=1e-5)  # low frequency divided
    assert plain[1] / 8 < got[1] < plain[1]  # interpolated band
    np.testing.assert_allclose(np.asarray(rope_frequencies(16, 10000.0, "linear", 4.0)),
                               plain / 4.0, rtol=1e-6)
    # rope() with the plain frequencies passed explicitly is the default rope.
    x = jax.random.normal(jax.random.key(0), (1, 5, 2, 16))
    positions = jnp.arange(5)[None]
    np.testing.assert_allclose(np.asarray(rope(x, positions, 10000.0, jnp.asarray(plain))),
                               np.asarray(rope(x, positions, 10000.0)), atol=1e-6)


def test_plus_one_norms_start_at_identity():
    cfg = models.get_preset("test", **GEMMA_LIKE)
    params = _params(cfg)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if "norm" in jax.tree_util.keystr(path):
            np.testing.assert_array_equal(np.asarray(leaf), 0.0)
    assert set(params["layer_0"]) == {"attn", "mlp", "attn_norm", "mlp_norm", "post_attn_norm",
                                      "post_mlp_norm"}


# ----------------------------------------------------------------------------- sliding window


def test_sliding_window_limits_what_a_layer_sees():
    """One all-sliding layer with window 3: the logits at t depend on tokens t-2..t only."""
    cfg = models.get_preset("test", n_layers=1, sliding_window=3, init_std=0.3)
    params = _params(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 128, (1, 8)), jnp.int32)
    valid = jnp.ones((1, 8), bool)
    fwd = jax.jit(lambda t: Transformer(cfg).apply({"params": params}, t,
                                                   positions_from_valid(valid), valid)[0])
    base = np.asarray(fwd(tokens))
    far = np.asarray(fwd(tokens.at[0, 4].set(tokens[0, 4] % 127 + 1)))  # 3 before slot 7
    near = np.asarray(fwd(tokens.at[0, 5].set(tokens[0, 5] % 127 + 1)))  # 2 before slot 7
    np.testing.assert_array_equal(far[0, 7], base[0, 7])
    assert not np.allclose(far[0, 4:7], base[0, 4:7])
    assert not np.allclose(near[0, 7], base[0, 7])


def test_sliding_window_kv_cache_decode_matches_full_forward():
    """Gemma-like model (alternating windows of 3, post-norms, soft-caps, local RoPE): prefill
    then one-token decode against a full-length cache equals the full forward, with a
    left-padded row whose slots are offset from its positions."""
    cfg = models.get_preset("test", **GEMMA_LIKE)
    params = _params(cfg, seed=1)
    model = Transformer(cfg)
    batch, prefix, total = 2, 5, 11
    tokens = jnp.asarray(np.random.default_rng(1).integers(1, 128, (batch, total)), jnp.int32)
    valid = jnp.asarray([[True] * total, [False, False] + [True] * (total - 2)])
    positions = positions_from_valid(valid)
    forward = jax.jit(lambda m, p: m.apply({"params": p}, tokens, positions, valid)[0],
                      static_argnums=0)
    full = forward(model, params)
    apply = jax.jit(lambda t, p, kv, c, i: model.apply({"params": params}, t, p, kv, c, i))
    cache = models.init_cache(cfg, batch, total)
    key_valid = jnp.concatenate([valid[:, :prefix], jnp.zeros((batch, total - prefix), bool)], 1)
    logits, cache = apply(tokens[:, :prefix], positions[:, :prefix], key_valid, cache,
                          jnp.int32(0))
    # Cached vs full attention: other summation orders (tests/numerics.py).
    atol = decoder_tolerance(cfg, params, tokens=total)
    np.testing.assert_allclose(np.asarray(logits[0]), np.asarray(full[0, :prefix]), rtol=0,
                               atol=atol)
    for slot in range(prefix, total):
        key_valid = key_valid.at[:, slot].set(True)
        step, cache = apply(tokens[:, slot:slot + 1], positions[:, slot:slot + 1], key_valid,
                            cache, jnp.int32(slot))
        np.testing.assert_allclose(np.asarray(step[:, 0]), np.asarray(full[:, slot]),
                                   rtol=0, atol=atol, err_msg=f"slot {slot}")
    # The window matters here: without it the logits differ.
    wide = Transformer(cfg.replace(sliding_window=None, rope_local_theta=None))
    unwindowed = forward(wide, params)
    assert not np.allclose(np.asarray(unwindowed[:, -1]), np.asarray(full[:, -1]), atol=1e-3)
    assert math.isfinite(float(jnp.abs(full).max())) and float(jnp.abs(full).max()) <= 10.0
