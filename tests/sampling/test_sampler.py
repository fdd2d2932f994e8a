"""The KV-cached sampler against a cache-free recompute loop, EOS and several stop ids,
log-probs, filters, compilation caching, mesh independence, decode stages (attention over the
filled part of the cache) against one whole-buffer stage, and the bf16 KV cache."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.filters import sample_inverse_cdf
from jaxrl_reason.sampling.sampler import (Sampler, left_pad, pick_bucket,
                                           positions_from_valid, stage_ends)
from numerics import abs_matmul_magnitude, attention_tolerance, f32_tolerance
from toy_model import BUCKET, CFG, PAD, PROMPT_LENGTHS

G, L = 2, 6


@pytest.fixture(scope="module")
def reference(params, prompts):
    """Greedy tokens [P, L] and their log-probs, by a full forward per step (no cache)."""
    model, p = Transformer(CFG), params["1dev"]
    tokens_np, valid_np = prompts
    num = tokens_np.shape[0]
    # Future slots hold pads; causality makes them irrelevant to the logits read at each step.
    tokens = jnp.concatenate([jnp.asarray(tokens_np), jnp.full((num, L), PAD, jnp.int32)], 1)
    valid = jnp.concatenate([jnp.asarray(valid_np), jnp.ones((num, L), bool)], 1)
    forward = jax.jit(lambda t: model.apply({"params": p}, t, positions_from_valid(valid),
                                            valid)[0])
    logprobs = []
    for step in range(L):
        logits = forward(tokens)[:, BUCKET - 1 + step]
        new = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logprobs.append(jnp.take_along_axis(jax.nn.log_softmax(logits), new[:, None], 1)[:, 0])
        tokens = tokens.at[:, BUCKET + step].set(new)
    return np.asarray(tokens[:, BUCKET:]), np.asarray(jnp.stack(logprobs, 1))


def _choose_eos(greedy):
    """A token emitted early in some rows (first at index < L-1) and absent from another."""
    candidates = []
    for token in np.unique(greedy):
        present = (greedy == token).any(axis=1)
        first = [int(np.argmax(row == token)) for row in greedy[present]]
        if not present.all() and min(first) < L - 1:
            candidates.append((min(first), -int(present.sum()), int(token)))
    assert candidates, f"no usable EOS in greedy output {greedy}"
    return min(candidates)[2]


@pytest.fixture(scope="module")
def eos_id(reference):
    return _choose_eos(reference[0])


@pytest.fixture(scope="module")
def samplers(meshes, eos_id):
    return {name: Sampler(Transformer(CFG), eos_id=eos_id, pad_id=PAD, mesh=mesh)
            for name, mesh in meshes.items()}


def _run(samplers, params, prompts, mesh="1dev", seed=1, **kwargs):
    kwargs.setdefault("temperature", 0.0)
    out = samplers[mesh](params[mesh], *prompts, jax.random.key(seed), num_samples=G,
                         max_new_tokens=L, **kwargs)
    return jax.tree.map(np.asarray, out)


def _expected_with_eos(greedy, logprobs, eos):
    """The reference truncated at each row's first EOS (EOS kept), pads and zeros after."""
    tokens, lps = greedy.copy(), logprobs.copy()
    lengths, truncated = np.full(len(greedy), L), np.ones(len(greedy), bool)
    for r, row in enumerate(greedy):
        hits = np.flatnonzero(row == eos)
        if hits.size:
            lengths[r], truncated[r] = hits[0] + 1, False
            tokens[r, hits[0] + 1:], lps[r, hits[0] + 1:] = PAD, 0.0
    return tokens, lps, lengths, truncated


def _longest_reduction(buffer_length):
    """The longest sum in CFG's forward: a matmul's d_model or mlp_hidden, attention over
    the buffer, or the vocabulary's log-softmax."""
    return max(CFG.d_model, CFG.mlp_hidden, buffer_length, CFG.vocab_size)


def _logit_terms(params, prompts, out):
    """sum_i |h_i W_ij| of the logits of `out`'s tokens (float32 bound's magnitude)."""
    model = Transformer(CFG)
    prompt_tokens, prompt_valid = (np.repeat(x, G, axis=0) for x in prompts)
    length = out.tokens.shape[1]
    mask = scoring.completion_mask_from_lengths(jnp.asarray(out.lengths), length)
    hidden = scoring.completion_hidden(model, params["1dev"], prompt_tokens, prompt_valid,
                                       jnp.asarray(out.tokens), mask)
    unembedding = model.apply({"params": params["1dev"]}, method=Transformer.unembedding)
    return abs_matmul_magnitude(hidden, unembedding)


# ----------------------------------------------------------------------------- greedy + EOS


@pytest.mark.parametrize("mesh", ["1dev", "8dev"])
def test_greedy_matches_cache_free_recompute(samplers, params, prompts, reference, eos_id, mesh):
    out = _run(samplers, params, prompts, mesh)
    want_tokens, want_lp, want_len, want_trunc = _expected_with_eos(*reference, eos_id)
    rep = lambda x: np.repeat(x, G, axis=0)  # noqa: E731  group-major rows
    assert out.tokens.shape == (len(PROMPT_LENGTHS) * G, L) and out.tokens.dtype == np.int32
    np.testing.assert_array_equal(out.tokens, rep(want_tokens))
    # Cached decode vs a full forward (and sharded over 8 devices): other summation orders.
    atol = f32_tolerance(_longest_reduction(BUCKET + L), _logit_terms(params, prompts, out),
                         chain=2 * CFG.n_layers + 2)
    np.testing.assert_allclose(out.logprobs, rep(want_lp), rtol=0, atol=atol)
    np.testing.assert_array_equal(out.lengths, rep(want_len))
    np.testing.assert_array_equal(out.truncated, rep(want_trunc))


def test_eos_handling(samplers, params, prompts, reference, eos_id):
    greedy = reference[0]
    # The chosen EOS makes the test meaningful: some rows stop early, some never stop.
    has_eos = (greedy == eos_id).any(axis=1)
    assert has_eos.any() and not has_eos.all()
    out = _run(samplers, params, prompts)
    for r in range(out.tokens.shape[0]):
        row = out.tokens[r]
        hits = np.flatnonzero(row == eos_id)
        if out.truncated[r]:
            assert hits.size == 0 and out.lengths[r] == L
            assert np.all(out.logprobs[r] < 0)
        else:
            stop = hits[0]
            assert out.lengths[r] == stop + 1
            assert np.all(row[stop + 1:] == PAD) and np.all(out.logprobs[r, stop + 1:] == 0)
            assert np.all(out.logprobs[r, :stop + 1] < 0)
    assert out.truncated.any() and (out.lengths < L).any()


# ----------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_scoring(samplers, params, prompts, eos_id, temperature):
    out = _run(samplers, params, prompts, seed=3, temperature=temperature)
    prompt_tokens, prompt_valid = (np.repeat(x, G, axis=0) for x in prompts)
    mask = scoring.completion_mask_from_lengths(jnp.asarray(out.lengths), L)
    logp, _ = jax.jit(lambda *a: scoring.completion_logprobs(
        Transformer(CFG), params["1dev"], *a, temperature=temperature, with_entropy=False))(
        prompt_tokens, prompt_valid, jnp.asarray(out.tokens), mask)
    # Cached decode vs one scoring forward: the logits' terms are divided by the temperature.
    atol = f32_tolerance(_longest_reduction(BUCKET + L),
                         _logit_terms(params, prompts, out) / temperature,
                         chain=2 * CFG.n_layers + 2)
    np.testing.assert_allclose(out.logprobs, np.asarray(logp), rtol=0, atol=atol)
    # Sampling, not greedy: the G samples of some prompt differ.
    assert any(not np.array_equal(out.tokens[i], out.tokens[i + 1]) for i in range(0, 8, 2))


# ----------------------------------------------------------------------------- filters


def test_top_k_one_and_tiny_top_p_are_greedy(samplers, params, prompts):
    greedy = _run(samplers, params, prompts)
    top_k = _run(samplers, params, prompts, seed=5, temperature=1.0, top_k=1)
    np.testing.assert_array_equal(top_k.tokens, greedy.tokens)
    np.testing.assert_allclose(top_k.logprobs, greedy.logprobs, atol=1e-5)  # both at T = 1
    top_p = _run(samplers, params, prompts, seed=6, temperature=0.8, top_p=1e-6)
    np.testing.assert_array_equal(top_p.tokens, greedy.tokens)
    np.testing.assert_array_equal(top_p.lengths, greedy.lengths)


def test_sampling_parameters_do_not_recompile(samplers, params, prompts):
    sampler = samplers["1dev"]
    _run(samplers, params, prompts)
    size = sampler._generate._cache_size()
    for kwargs in (dict(temperature=1.3), dict(temperature=0.2, top_p=0.9),
                   dict(temperature=1.0, top_k=7), dict(temperature=0.0, top_k=0, top_p=1.0)):
        _run(samplers, params, prompts, seed=7, **kwargs)
    assert sampler._generate._cache_size() == size


def test_one_and_eight_device_meshes_sample_identically(samplers, params, prompts):
    one = _run(samplers, params, prompts, "1dev", seed=11, temperature=1.0)
    eight = _run(samplers, params, prompts, "8dev", seed=11, temperature=1.0)
    np.testing.assert_array_equal(one.tokens, eight.tokens)
    np.testing.assert_array_equal(one.lengths, eight.lengths)
    np.testing.assert_allclose(one.logprobs, eight.logprobs, atol=1e-4)


# ----------------------------------------------------------------------------- padding helpers


def test_left_pad_and_pick_bucket():
    tokens, valid = left_pad([[5, 6, 7], [], [9]], 4, pad_id=1)
    np.testing.assert_array_equal(tokens, [[1, 5, 6, 7], [1, 1, 1, 1], [1, 1, 1, 9]])
    np.testing.assert_array_equal(valid, [[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]])
    assert tokens.dtype == np.int32 and valid.dtype == bool
    np.testing.assert_array_equal(positions_from_valid(jnp.asarray(valid)),
                                  [[0, 0, 1, 2], [0, 0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="prompt 1 has 5 tokens, longer than the prompt bucket"):
        left_pad([[1], [1, 2, 3, 4, 5]], 4, pad_id=0)
    assert pick_bucket([3, 9, 2], [32, 8, 16]) == 16
    assert pick_bucket([8], [8, 16]) == 8
    assert pick_bucket([], [4, 8]) == 4
    with pytest.raises(ValueError, match="prompt of 40 tokens is longer than every bucket"):
        pick_bucket([3, 40], [16, 32])


# ----------------------------------------------------------------------------- stop ids


def _expected_with_stops(greedy, logprobs, stops):
    """The reference truncated at each row's first token among `stops` (kept)."""
    tokens, lps = greedy.copy(), logprobs.copy()
    lengths, truncated = np.full(len(greedy), L), np.ones(len(greedy), bool)
    for r, row in enumerate(greedy):
        hits = np.flatnonzero(np.isin(row, stops))
        if hits.size:
            lengths[r], truncated[r] = hits[0] + 1, False
            tokens[r, hits[0] + 1:], lps[r, hits[0] + 1:] = PAD, 0.0
    return tokens, lps, lengths, truncated


def test_several_stop_ids(params, prompts, reference, eos_id):
    greedy = reference[0]
    # A second stop id: the token at position 1 of a row that never emits eos_id.
    other = next(int(row[1]) for row in greedy if eos_id not in row and row[1] != eos_id)
    stops = [eos_id, other]
    want = _expected_with_stops(*reference, stops)
    assert (want[2] < L).sum() > (_expected_with_eos(*reference, eos_id)[2] < L).sum()
    rep = lambda x: np.repeat(x, G, axis=0)  # noqa: E731
    sampler = Sampler(Transformer(CFG), eos_id=eos_id, eos_ids=[other, eos_id], pad_id=PAD)
    assert sampler.eos_ids == tuple(stops) and sampler.eos_id == eos_id
    assert Sampler(Transformer(CFG), eos_ids=stops, pad_id=PAD).eos_ids == tuple(stops)
    assert Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD).eos_ids == (-1,)
    out = jax.tree.map(np.asarray, sampler(params["1dev"], *prompts, jax.random.key(0),
                                           num_samples=G, max_new_tokens=L, temperature=0.0))
    np.testing.assert_array_equal(out.tokens, rep(want[0]))
    np.testing.assert_allclose(out.logprobs, rep(want[1]), atol=1e-4)
    np.testing.assert_array_equal(out.lengths, rep(want[2]))
    np.testing.assert_array_equal(out.truncated, rep(want[3]))
    # No stop id at all: every row runs to L tokens.
    out = Sampler(Transformer(CFG), eos_ids=(), pad_id=PAD)(
        params["1dev"], *prompts, jax.random.key(0), num_samples=G, max_new_tokens=L,
        temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), rep(greedy))
    assert np.asarray(out.truncated).all()


# ----------------------------------------------------------------------------- decode stages


def test_stage_ends():
    assert stage_ends(128, 4) == (32, 64, 96, 128)
    assert stage_ends(96, 4) == (24, 48, 72, 96)
    assert stage_ends(6, 4) == (2, 3, 5, 6)
    assert stage_ends(1, 4) == (1,)
    assert stage_ends(100, 1) == (100,)
    assert stage_ends(20, 3) == (7, 14, 20)  # stages shorter than 8: no rounding


def test_filled_part_attention_equals_whole_buffer(params, prompts, eos_id):
    """Decode stages with caches sized to the filled part give the tokens of one stage over
    the whole Tp + L buffer: greedy, and sampling with a fixed key."""
    length = 11
    whole, staged = (Sampler(Transformer(CFG), eos_id=eos_id, pad_id=PAD, decode_stages=n)
                     for n in (1, 4))  # 4 stages: caches of Tp + (3, 6, 9, 11) - 1 slots
    for temperature in (0.0, 1.0):
        a, b = (jax.tree.map(np.asarray, s(params["1dev"], *prompts, jax.random.key(4),
                                           num_samples=G, max_new_tokens=length,
                                           temperature=temperature))
                for s in (whole, staged))
        np.testing.assert_array_equal(b.tokens, a.tokens)
        np.testing.assert_array_equal(b.lengths, a.lengths)
        # Attention over Tp + 10 vs fewer cache slots sums in another order, and so does
        # every layer after it: the float32 bound of the longest reduction, over the terms of
        # the logits (h @ unembedding, ~32 here), through each layer's attention and MLP,
        # the unembedding and the log-softmax.
        atol = f32_tolerance(_longest_reduction(BUCKET + length), _logit_terms(params, prompts, a),
                             chain=2 * CFG.n_layers + 2)
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=atol)
        assert (a.lengths > 6).any()  # the later stages did run for some rows


def test_decode_stage_caches_grow(params, prompts):
    """The compiled program holds one KV cache size per stage (the filled part, rounded up
    to the stage), not only the whole buffer."""
    sampler = Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD, decode_stages=4)
    hlo = sampler.lower(params["1dev"], *prompts, jax.random.key(0), num_samples=G,
                        max_new_tokens=16).as_text()
    rows, kv, hd = len(PROMPT_LENGTHS) * G, CFG.n_kv_heads, CFG.head_dim
    for end in stage_ends(16, 4):  # 4, 8, 12, 16 -> caches of Tp + end - 1 slots
        assert f"tensor<{rows}x{kv}x{BUCKET + end - 1}x{hd}xf32>" in hlo, end  # head-major


# ----------------------------------------------------------------------------- bf16 cache


def test_bf16_cache_close_to_f32(samplers, params, prompts, eos_id):
    model = Transformer(CFG)
    f32 = samplers["1dev"]
    bf16 = Sampler(model, eos_id=eos_id, pad_id=PAD, cache_dtype=jnp.bfloat16)
    hlo = bf16.lower(params["1dev"], *prompts, jax.random.key(0), num_samples=G,
                     max_new_tokens=L).as_text()
    assert re.search(rf"x{CFG.n_kv_heads}x\d+x{CFG.head_dim}xbf16>", hlo)  # the cache is bf16
    a, b = (jax.tree.map(np.asarray, s(params["1dev"], *prompts, jax.random.key(2),
                                       num_samples=G, max_new_tokens=L, temperature=0.0))
            for s in (f32, bf16))
    # Attention reads bf16 keys/values (the prefill too): scored by the float32 model without
    # a cache, the bf16 sampler's own tokens get log-probs within bf16 rounding of what it
    # reported (these weights are 25x larger than a real init: logits of ~10).
    prompt_tokens, prompt_valid = (np.repeat(x, G, axis=0) for x in prompts)
    mask = scoring.completion_mask_from_lengths(jnp.asarray(b.lengths), L)
    exact, _ = scoring.completion_logprobs(model, params["1dev"], prompt_tokens, prompt_valid,
                                           jnp.asarray(b.tokens), mask, with_entropy=False)
    np.testing.assert_allclose(b.logprobs, np.asarray(exact), atol=0.05)
    assert np.mean(a.tokens == b.tokens) > 0.9


# ----------------------------------------------------------------------------- token choice


def test_inverse_cdf_sampling_frequencies():
    probs = np.array([0.5, 0.0, 0.3, 0.15, 0.05])
    logprobs = np.log(np.where(probs > 0, probs, 1.0))
    logprobs[1] = -1e30  # filtered out: never drawn
    n = 40_000
    rows = jnp.broadcast_to(jnp.asarray(logprobs, jnp.float32), (n, 5))
    tokens = np.asarray(sample_inverse_cdf(jax.random.key(0), rows))
    freq = np.bincount(tokens, minlength=5) / n
    assert freq[1] == 0
    np.testing.assert_allclose(freq, probs, atol=0.01)


def test_inverse_cdf_sampling_over_blocks():
    """V = 300 (blocks of 128: three, the last one padded): the frequencies follow the
    probabilities across block boundaries, a block with no mass and zero-probability entries
    at a block's start and end are never drawn, and a row whose mass sits in one entry
    always draws it."""
    from jaxrl_reason.sampling import filters
    vocab, n = 300, 60_000
    probs = np.zeros(vocab)
    probs[[0, 5, 127, 128 + 1, 256 + 43]] = [0.1, 0.2, 0.25, 0.15, 0.3]   # block 1: one entry
    logprobs = np.where(probs > 0, np.log(np.where(probs > 0, probs, 1.0)), -1e30)
    rows = jnp.broadcast_to(jnp.asarray(logprobs, jnp.float32), (n, vocab))
    tokens = np.asarray(sample_inverse_cdf(jax.random.key(1), rows))
    freq = np.bincount(tokens, minlength=vocab) / n
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(probs))
    np.testing.assert_allclose(freq, probs, atol=0.01)
    assert filters._CDF_BLOCK == 128
    one_hot = np.full((4, vocab), -1e30, np.float32)
    one_hot[np.arange(4), [0, 127, 128, 299]] = 0.0
    for seed in range(3):
        np.testing.assert_array_equal(
            sample_inverse_cdf(jax.random.key(seed), jnp.asarray(one_hot)), [0, 127, 128, 299])


def test_decode_attention_matches_einsum():
    """The one-query (decode) attention over the head-major cache equals the plain
    [B, S, K, hd] einsum attention (and `_attend`, which the prefill and training use)."""
    from jaxrl_reason.models import attention as tr

    rng = np.random.default_rng(0)
    batch, s, kv, g, hd = 3, 7, 2, 2, 8
    q = jnp.asarray(rng.normal(size=(batch, 1, kv, g, hd)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(batch, s, kv, hd)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(batch, s, kv, hd)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(batch, 1, s)) < 0.7).at[:, :, 0].set(True)
    kh, vh = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # the cache's [B, K, S, hd]
    for cfg in (CFG, CFG.replace(attn_logit_softcap=2.0, query_pre_attn_scalar=12)):
        scale = cfg.head_dim if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k) * scale ** -0.5
        if cfg.attn_logit_softcap is not None:
            scores = cfg.attn_logit_softcap * jnp.tanh(scores / cfg.attn_logit_softcap)
        scores = jnp.where(mask[:, None, None], scores, -1e30)
        want = jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(scores, axis=-1), v)
        # Other kernels, other orders: the float32 bound of attention (tests/numerics.py).
        atol = attention_tolerance(q, k, v, keys=s, scale=scale ** -0.5)
        np.testing.assert_allclose(tr._attend_one_query(cfg, q, kh, vh, mask), want,
                                   rtol=0, atol=atol)
        np.testing.assert_allclose(tr._attend(cfg, q, k, v, mask), want, rtol=0, atol=atol)
