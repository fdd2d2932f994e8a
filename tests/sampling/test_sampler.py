"""The KV-cached sampler against a cache-free recompute loop, EOS handling, log-probs, filters,
compilation caching and mesh independence."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models, sharding as shd
from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import (Sampler, left_pad, pick_bucket,
                                           positions_from_valid)

PAD = 0
PROMPT_LENGTHS = (6, 3, 1, 4)
BUCKET, G, L = 6, 2, 6
CFG = models.get_preset("test", init_std=0.5)  # large weights: diverse, non-repeating outputs


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    lists = [list(rng.integers(1, CFG.vocab_size, n)) for n in PROMPT_LENGTHS]
    return left_pad(lists, BUCKET, PAD)


@pytest.fixture(scope="module")
def meshes():
    return {"1dev": shd.make_mesh({"data": 1}, devices=jax.devices()[:1]),
            "8dev": shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})}


@pytest.fixture(scope="module")
def params(meshes):
    return {name: models.init_params(CFG, jax.random.key(0), mesh, shd.DEFAULT_RULES)
            for name, mesh in meshes.items()}


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


# ----------------------------------------------------------------------------- greedy + EOS


@pytest.mark.parametrize("mesh", ["1dev", "8dev"])
def test_greedy_matches_cache_free_recompute(samplers, params, prompts, reference, eos_id, mesh):
    out = _run(samplers, params, prompts, mesh)
    want_tokens, want_lp, want_len, want_trunc = _expected_with_eos(*reference, eos_id)
    rep = lambda x: np.repeat(x, G, axis=0)  # noqa: E731  group-major rows
    assert out.tokens.shape == (len(PROMPT_LENGTHS) * G, L) and out.tokens.dtype == np.int32
    np.testing.assert_array_equal(out.tokens, rep(want_tokens))
    np.testing.assert_allclose(out.logprobs, rep(want_lp), atol=1e-4)
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
    np.testing.assert_allclose(out.logprobs, np.asarray(logp), atol=1e-4)
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
