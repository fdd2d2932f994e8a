"""The decoder: config validation, parameter counts and axes, RoPE, masking, KV cache, scoring,
bf16 compute with float32 master weights (rematerialization: test_remat.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.extend import core as jex_core

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer, einsum_f32
from jaxrl_reason.sampling.sampler import positions_from_valid
from numerics import (abs_matmul_magnitude, attention_loss_tolerances, decoder_tolerance,
                      f32_tolerance)

RULES = shd.DEFAULT_RULES


def is_axes(t):
    """A logical-axes leaf: a tuple of names (or None)."""
    return isinstance(t, tuple) and all(isinstance(n, (str, type(None))) for n in t)


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def model_and_params(mesh1):
    cfg = models.get_preset("test", init_std=0.2)
    return Transformer(cfg), models.init_params(cfg, jax.random.key(0), mesh1, RULES)


@pytest.fixture(scope="module")
def forward(model_and_params):
    model, params = model_and_params

    @jax.jit
    def fwd(tokens, positions, valid):
        return model.apply({"params": params}, tokens, positions, valid)[0]

    return fwd


def _random_tokens(rng, shape, vocab=128):
    return jnp.asarray(np.random.default_rng(rng).integers(1, vocab, size=shape), jnp.int32)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes, match", [
    (dict(n_kv_heads=3), "n_kv_heads=3 must divide n_heads=4"),
    (dict(head_dim=15), "head_dim=15 must be even"),
    (dict(activation="relu"), "activation must be one of"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(n_layers=0), "n_layers must be a positive int"),
    (dict(d_model=64.0), "d_model must be a positive int"),
    (dict(remat="full"), "remat must be one of"),
])
def test_config_validation_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        models.get_preset("test", **changes)


def test_unknown_preset_names_known_ones():
    with pytest.raises(ValueError, match="unknown model preset 'nope'.*tiny"):
        models.get_preset("nope")


_VARIANTS = [
    dict(),
    dict(tie_embeddings=False),
    dict(qkv_bias=True),
    dict(qk_norm=True),
    dict(tie_embeddings=False, qkv_bias=True, qk_norm=True, activation="gelu_tanh",
         embed_scale=True, final_logit_softcap=30.0),
]


@pytest.mark.parametrize("changes", _VARIANTS)
def test_num_params_matches_abstract_params(changes):
    cfg = models.get_preset("test", **changes)
    assert models.count_params(models.abstract_params(cfg)) == cfg.num_params


@pytest.mark.parametrize("changes", [_VARIANTS[0], _VARIANTS[-1]])
def test_num_params_matches_initialised_params(changes, mesh1):
    # Initialisation compiles (~2 s each), so only the two extreme variants are materialised.
    cfg = models.get_preset("test", **changes)
    params = models.init_params(cfg, jax.random.key(1), mesh1, RULES)
    assert models.count_params(params) == cfg.num_params
    assert ("lm_head" in params) == (not cfg.tie_embeddings)
    for leaf in jax.tree.leaves(params):
        assert leaf.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(params["final_norm"]["scale"]), 1.0)


@pytest.mark.parametrize("changes", [dict(), dict(tie_embeddings=False, qkv_bias=True,
                                                   qk_norm=True)])
def test_param_logical_axes_cover_every_leaf(changes):
    cfg = models.get_preset("test", **changes)
    shapes = models.abstract_params(cfg)
    axes = models.param_logical_axes(cfg)
    axes_leaves, axes_def = jax.tree.flatten(axes, is_leaf=is_axes)
    shape_leaves, shape_def = jax.tree.flatten(shapes)
    assert axes_def == shape_def
    known = {name for name, _ in RULES}
    for names, x in zip(axes_leaves, shape_leaves):
        assert is_axes(names) and len(names) == x.ndim, (names, x.shape)
        assert set(names) <= known, names
    assert tuple(axes["embedding"]) == ("vocab", "embed")


# ----------------------------------------------------------------------------- rope


def _rope_numpy(x, positions, theta):
    """x * cos + rotate_half(x) * sin, float64, with rotate_half(x) = [-x2, x1]."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    angles = np.asarray(positions, np.float64)[..., None] * inv_freq  # [B, T, d/2]
    emb = np.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = np.concatenate([-x2, x1], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def test_rope_matches_numpy_rotate_half():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [0, 0, 7, 100, 2047]], np.int32)
    got = models.rope(jnp.asarray(x), jnp.asarray(positions), 10_000.0)
    assert got.shape == x.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), _rope_numpy(x, positions, 10_000.0),
                               rtol=1e-4, atol=1e-4)
    # Position 0 is the identity; norms are preserved everywhere.
    np.testing.assert_allclose(np.asarray(got)[1, 0], x[1, 0], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(got), axis=-1),
                               np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_keeps_dtype_and_dot_products_depend_on_offset_only():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)

    def dot(m, n):
        rq = models.rope(q, jnp.array([[m]]), 500.0)
        rk = models.rope(k, jnp.array([[n]]), 500.0)
        return float(jnp.sum(rq * rk))

    assert dot(3, 1) == pytest.approx(dot(12, 10), rel=1e-4, abs=1e-4)
    assert dot(3, 1) != pytest.approx(dot(3, 2), rel=1e-3)
    assert models.rope(q.astype(jnp.bfloat16), jnp.array([[2]]), 500.0).dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- masking


def test_causality(forward):
    tokens = _random_tokens(0, (2, 8))
    valid = jnp.ones((2, 8), bool)
    positions = positions_from_valid(valid)
    changed = tokens.at[:, 5].set((tokens[:, 5] + 1) % 128)
    a, b = forward(tokens, positions, valid), forward(changed, positions, valid)
    assert a.shape == (2, 8, 128) and a.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a[:, :5]), np.asarray(b[:, :5]))
    assert not np.allclose(np.asarray(a[:, 5:]), np.asarray(b[:, 5:]), atol=1e-3)


def test_left_padding_invariance(model_and_params, forward):
    prompt = np.asarray(_random_tokens(1, (5,)))
    # Row 0: no padding. Row 1: three left pads holding junk tokens (must be masked out).
    tokens_a = jnp.asarray(prompt[None], jnp.int32)
    valid_a = jnp.ones((1, 5), bool)
    tokens_b = jnp.asarray(np.concatenate([[77, 3, 120], prompt])[None], jnp.int32)
    valid_b = jnp.asarray([[False] * 3 + [True] * 5])
    logits_a = forward(tokens_a, positions_from_valid(valid_a), valid_a)
    logits_b = forward(tokens_b, positions_from_valid(valid_b), valid_b)
    # Attention over 5 vs 8 slots (3 masked) sums in another order (tests/numerics.py).
    atol = decoder_tolerance(model_and_params[0].cfg, model_and_params[1], tokens=8)
    np.testing.assert_allclose(np.asarray(logits_b[:, 3:]), np.asarray(logits_a), rtol=0,
                               atol=atol)


def test_kv_cache_prefill_then_decode_matches_full_forward(model_and_params, forward):
    model, params = model_and_params
    batch, prefix, total = 2, 5, 9
    tokens = _random_tokens(2, (batch, total))
    # Row 1 is left-padded by two junk slots.
    valid = jnp.asarray([[True] * total, [False, False] + [True] * (total - 2)])
    positions = positions_from_valid(valid)
    full = forward(tokens, positions, valid)
    # Cached prefill/decode vs one full forward: other attention lengths and shapes.
    atol = decoder_tolerance(model.cfg, params, tokens=total)

    apply = jax.jit(lambda t, p, kv, c, i: model.apply({"params": params}, t, p, kv, c, i))
    cache = models.init_cache(model.cfg, batch, total)
    key_valid = jnp.concatenate([valid[:, :prefix], jnp.zeros((batch, total - prefix), bool)], 1)
    logits, cache = apply(tokens[:, :prefix], positions[:, :prefix], key_valid, cache,
                          jnp.int32(0))
    assert len(cache) == model.cfg.n_layers
    assert cache[0]["k"].shape == (batch, model.cfg.n_kv_heads, total, model.cfg.head_dim)
    np.testing.assert_allclose(np.asarray(logits[1, 2:]), np.asarray(full[1, 2:prefix]),
                               rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(logits[0]), np.asarray(full[0, :prefix]), rtol=0,
                               atol=atol)
    for slot in range(prefix, total):
        key_valid = key_valid.at[:, slot].set(True)
        step, cache = apply(tokens[:, slot:slot + 1], positions[:, slot:slot + 1], key_valid,
                            cache, jnp.int32(slot))
        np.testing.assert_allclose(np.asarray(step[:, 0]), np.asarray(full[:, slot]), rtol=0,
                                   atol=atol, err_msg=f"slot {slot}")


# ----------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_match_manual_gather(model_and_params, forward, temperature):
    model, params = model_and_params
    prompt_len, length = 4, 5
    prompt_tokens = _random_tokens(3, (3, prompt_len))
    prompt_valid = jnp.asarray([[True] * 4, [False, True, True, True], [False, False, True, True]])
    completion = _random_tokens(4, (3, length))
    lengths = jnp.asarray([5, 2, 0])
    mask = scoring.completion_mask_from_lengths(lengths, length)
    np.testing.assert_array_equal(np.asarray(mask), [[1] * 5, [1, 1, 0, 0, 0], [0] * 5])

    logp, entropy = jax.jit(lambda *a: scoring.completion_logprobs(
        model, params, *a, temperature=temperature))(prompt_tokens, prompt_valid, completion, mask)
    assert logp.shape == entropy.shape == (3, length)

    # Manual: one full forward over prompt + completion, log_softmax(logits / T), gather.
    tokens = jnp.concatenate([prompt_tokens, completion], axis=1)
    valid = jnp.concatenate([prompt_valid, mask.astype(bool)], axis=1)
    logits = np.asarray(forward(tokens, positions_from_valid(valid), valid), np.float64)
    scaled = logits[:, prompt_len - 1: prompt_len - 1 + length] / temperature
    scaled -= scaled.max(-1, keepdims=True)
    logprobs = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
    want = np.take_along_axis(logprobs, np.asarray(completion)[..., None], -1)[..., 0]
    want_entropy = -(np.exp(logprobs) * logprobs).sum(-1)
    m = np.asarray(mask)
    # Scoring's forward vs the plain one (float64 after the logits): other summation orders.
    atol = decoder_tolerance(model.cfg, params, tokens=prompt_len + length,
                             temperature=temperature)
    np.testing.assert_allclose(np.asarray(logp), want * m, rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(entropy), want_entropy * m, rtol=0,
                               atol=atol * np.log(model.cfg.vocab_size))
    assert np.all(np.asarray(logp)[m == 0] == 0) and np.all(np.asarray(logp)[m == 1] < 0)

    if temperature != 1.0:  # with_entropy=False once (an eager call is slow)
        no_entropy = scoring.completion_logprobs(model, params, prompt_tokens, prompt_valid,
                                                 completion, mask, temperature=temperature,
                                                 with_entropy=False)
        np.testing.assert_allclose(np.asarray(no_entropy[0]), np.asarray(logp), rtol=0,
                                   atol=atol)  # eager vs jit: other fusions
        assert np.all(np.asarray(no_entropy[1]) == 0)


# ----------------------------------------------------------------------------- bf16 compute


def _eqns(jaxpr):
    """Every equation of a jaxpr, recursing into sub-jaxprs (custom_vjp, remat, pjit, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jex_core.ClosedJaxpr):
                    yield from _eqns(sub.jaxpr)
                elif isinstance(sub, jex_core.Jaxpr):
                    yield from _eqns(sub)


def _input_dtypes(closed_jaxpr, primitive):
    """[(operand dtypes, output dtype)] of every `primitive` equation."""
    return [(tuple(str(v.aval.dtype) for v in e.invars), str(e.outvars[0].aval.dtype))
            for e in _eqns(closed_jaxpr.jaxpr) if e.primitive.name == primitive]


def test_einsum_f32_returns_float32_and_keeps_backward_matmuls_in_bf16():
    rng = np.random.default_rng(5)
    a32 = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
    b32 = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
    a, b = a32.astype(jnp.bfloat16), b32.astype(jnp.bfloat16)
    cot = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)

    def loss(x, y):
        return jnp.sum(einsum_f32("btd,dv->btv", x, y) * cot)

    out = einsum_f32("btd,dv->btv", a, b)
    want = jnp.einsum("btd,dv->btv", a.astype(jnp.float32), b.astype(jnp.float32))
    assert out.dtype == jnp.float32
    # bf16 products are exact in float32; only the length-8 sums' order may differ.
    magnitude = abs_matmul_magnitude(np.asarray(a, np.float32), np.asarray(b, np.float32))
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=0,
                               atol=f32_tolerance(8, magnitude))
    ga, gb = jax.grad(loss, argnums=(0, 1))(a, b)
    assert ga.dtype == gb.dtype == jnp.bfloat16
    want_ga, want_gb = jax.grad(loss, argnums=(0, 1))(a.astype(jnp.float32),
                                                       b.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(ga, np.float32), np.asarray(want_ga), rtol=0.02,
                               atol=0.05)
    np.testing.assert_allclose(np.asarray(gb, np.float32), np.asarray(want_gb), rtol=0.02,
                               atol=0.05)
    # Every matmul of the backward pass has bf16 operands (a plain preferred_element_type=f32
    # einsum would transpose into float32 x bf16 matmuls).
    dots = _input_dtypes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(a, b), "dot_general")
    assert len(dots) == 3 and {ops for ops, _ in dots} == {("bfloat16", "bfloat16")}
    # float32 operands take the plain einsum.
    np.testing.assert_array_equal(np.asarray(einsum_f32("btd,dv->btv", a32, b32)),
                                  np.asarray(jnp.einsum("btd,dv->btv", a32, b32)))


def test_bf16_compute_with_float32_master_weights(model_and_params):
    """dtype=bfloat16, param_dtype=float32: params, grads and optimizer state are float32, every
    matmul (forward and backward) runs on bf16 operands, norms / softmax / logits / log-probs
    are float32, and the log-probs stay close to the float32 model's."""
    model32, params = model_and_params
    cfg = model32.cfg.replace(dtype="bfloat16", qk_norm=True)
    model = Transformer(cfg)
    # Same params as the f32 model, plus the q/k norm scales (ones) that qk_norm adds.
    params = jax.tree.map(lambda x: x, params)
    for i in range(cfg.n_layers):
        attn = params[f"layer_{i}"]["attn"] = dict(params[f"layer_{i}"]["attn"])
        attn["q_norm"] = attn["k_norm"] = {"scale": jnp.ones((cfg.head_dim,), jnp.float32)}
    abstract = models.abstract_params(cfg)
    assert jax.tree.structure(abstract) == jax.tree.structure(params)
    assert {x.dtype for x in jax.tree.leaves(abstract)} == {jnp.dtype(jnp.float32)}
    opt_state = optax.adamw(1e-3).init(params)
    assert {x.dtype for x in jax.tree.leaves(opt_state) if x.ndim} == {jnp.dtype(jnp.float32)}

    prompt, prompt_valid = _random_tokens(6, (2, 4)), jnp.ones((2, 4), bool)
    completion, mask = _random_tokens(7, (2, 6)), jnp.ones((2, 6), jnp.float32)

    def loss(p, m=model):
        logp, entropy = scoring.completion_logprobs(m, p, prompt, prompt_valid, completion, mask)
        return -jnp.sum(logp), (logp, entropy)

    def forward(p):
        return model.apply({"params": p}, prompt, jnp.zeros_like(prompt), prompt_valid)[0]

    # The jaxprs: matmul operands, and the dtype of the numerically sensitive ops.
    forward_jaxpr = jax.make_jaxpr(forward)(params)
    grad_jaxpr = jax.make_jaxpr(jax.grad(loss, has_aux=True))(params)
    for jaxpr in (forward_jaxpr, grad_jaxpr):
        dots = _input_dtypes(jaxpr, "dot_general")
        assert dots and {ops for ops, _ in dots} == {("bfloat16", "bfloat16")}, dots
        assert {out for _, out in _input_dtypes(jaxpr, "rsqrt")} == {"float32"}  # RMSNorm
        assert {out for _, out in _input_dtypes(jaxpr, "exp")} == {"float32"}  # softmaxes
    # Forward: the attention scores (one per layer) and the logits are float32 results of
    # bf16 matmuls; every other matmul (projections, MLP, probs @ v) returns bf16.
    outs = [out for _, out in _input_dtypes(forward_jaxpr, "dot_general")]
    assert outs.count("float32") == cfg.n_layers + 1
    assert outs.count("bfloat16") == cfg.n_layers * 8  # q, k, v, o, gate, up, down, probs@v

    (_, (logp, entropy)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert logp.dtype == entropy.dtype == jnp.float32
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(params)):
        assert g.dtype == jnp.float32 and g.shape == p.shape
        assert np.all(np.isfinite(np.asarray(g)))
    # Close to the float32 model (bf16 keeps ~3 significant digits; logits here are O(10)).
    model32 = Transformer(cfg.replace(dtype="float32"))
    logp32, entropy32 = jax.jit(lambda p: loss(p, model32)[1])(params)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(logp32), rtol=0.05, atol=0.1)
    np.testing.assert_allclose(np.asarray(entropy), np.asarray(entropy32), rtol=0.05, atol=0.1)


@pytest.mark.parametrize("x_shape, w_shape", [
    ((3, 5, 8), (8, 24)),       # a Dense layer, x narrower: its transpose is materialized
    ((3, 5, 24), (24, 8)),      # a Dense layer, the gradient narrower
    ((2, 3, 7, 4), (2, 3, 4, 9)),   # batched (attention scores): q narrower
    ((2, 3, 7, 9), (2, 3, 9, 4)),   # batched (probs x values): the gradient narrower
])
def test_narrow_transpose_matmul_equals_matmul_values_and_gradients(x_shape, w_shape):
    from jaxrl_reason.models.transformer import narrow_transpose_matmul
    x = jax.random.normal(jax.random.key(0), x_shape)
    w = jax.random.normal(jax.random.key(1), w_shape)
    cot = jax.random.normal(jax.random.key(2), jnp.matmul(x, w).shape)
    loss = lambda f: lambda a, b: jnp.sum(jnp.tanh(f(a, b)) * cot)  # noqa: E731
    # Transposed layouts sum in other orders: the float32 bound of each product's length
    # and terms (tests/numerics.py). The gradients chain the forward's error (through
    # tanh, |tanh''| <= 1) into the cotangent, then a second product.
    xn, wn, cn = (np.asarray(a, np.float64) for a in (x, w, cot))
    fwd_terms = np.abs(xn) @ np.abs(wn)
    np.testing.assert_allclose(narrow_transpose_matmul(x, w), jnp.matmul(x, w), rtol=0,
                               atol=f32_tolerance(x_shape[-1], float(fwd_terms.max())))
    got = jax.jit(jax.grad(loss(narrow_transpose_matmul), argnums=(0, 1)))(x, w)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
    dy = np.abs(cn) * (1.0 + fwd_terms * f32_tolerance(x_shape[-1], 1.0))  # |d tanh| <= 1
    grad_terms = (np.abs(dy) @ np.swapaxes(np.abs(wn), -1, -2),  # dx = dy w^T
                  np.swapaxes(np.abs(xn), -1, -2) @ np.abs(dy))  # dw = x^T dy (summed rows)
    lengths = (w_shape[-1], int(np.prod(x_shape[:-1])) // int(np.prod(w_shape[:-2]) or 1))
    for a, b, terms, n in zip(got, want, grad_terms, lengths):
        assert a.shape == b.shape
        terms = terms.sum(0) if terms.ndim > a.ndim else terms
        np.testing.assert_allclose(a, b, rtol=0, atol=f32_tolerance(max(n, x_shape[-1]),
                                                                    float(terms.max()), chain=2))


@pytest.mark.parametrize("softcap", [None, 20.0])
def test_cpu_attention_layout_equals_the_einsum_form_values_and_gradients(softcap):
    """On CPU (float32) `_attend` runs [B, K, G*T, hd] matmuls through
    narrow_transpose_matmul; the einsum form (what other platforms trace) is the reference."""
    from jaxrl_reason.kernels import platform
    from jaxrl_reason.models.attention import _attend
    cfg = models.get_preset("test", attn_logit_softcap=softcap)
    b, t, s, kv, g, hd = 2, 5, 7, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    q = jax.random.normal(jax.random.key(0), (b, t, kv, g, hd))
    k = jax.random.normal(jax.random.key(1), (b, s, kv, hd))
    v = jax.random.normal(jax.random.key(2), (b, s, kv, hd))
    mask = (jnp.arange(s)[None, None, :] <= jnp.arange(t)[None, :, None] + 2) & (
        jnp.arange(s)[None, None, :] >= jnp.array([0, 3])[:, None, None])
    cot = jax.random.normal(jax.random.key(3), q.shape)
    loss = lambda *a: jnp.sum(_attend(cfg, *a, mask) * cot)  # noqa: E731
    got = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    with platform.target("tpu"):
        want = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    # Two layouts, two summation orders: the float32 bound of attention (tests/numerics.py).
    loss_atol, grad_atol = attention_loss_tolerances(q, k, v, cot, want[1], keys=s,
                                                     queries=t * g, scale=hd ** -0.5)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=loss_atol)
    for a, w in zip(got[1], want[1]):
        np.testing.assert_allclose(a, w, rtol=0, atol=grad_atol)
