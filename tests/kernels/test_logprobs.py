"""Memory-lean log-probs: values and gradients of the chunked (jnp) and Pallas (interpret
mode) implementations against the full-logits reference and against `completion_logprobs`."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from numerics import decoder_tolerance, logprobs_tolerances

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import logprobs as lp
from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer

PALLAS_BLOCKS = lp.BlockSizes(block_rows=8, block_vocab=128)


def _inputs(seed, batch, length, dim, vocab, dtype=jnp.float32, w_dtype=None, w_scale=0.5):
    k = jax.random.split(jax.random.key(seed), 5)
    hidden = jax.random.normal(k[0], (batch, length, dim), jnp.float32).astype(dtype)
    w = (w_scale * jax.random.normal(k[1], (dim, vocab), jnp.float32)).astype(w_dtype or dtype)
    targets = jax.random.randint(k[2], (batch, length), 0, vocab)
    cotangents = (jax.random.normal(k[3], (batch, length)), jax.random.normal(k[4], (batch, length)))
    return hidden, w, targets, cotangents


def _values_and_grads(fn, hidden, w, targets, cotangents):
    """(logp, entropy, d hidden, d unembedding) for random cotangents of both outputs."""
    @jax.jit
    def run(hidden, w, targets, cotangents):
        out, vjp = jax.vjp(lambda h, u: fn(h, u, targets), hidden, w)
        return (*out, *vjp(cotangents))

    return run(hidden, w, targets, cotangents)


def _assert_close(got, want, atols):
    """Each array within its atol."""
    for name, a, b, atol in zip(("logp", "entropy", "d_hidden", "d_unembedding"), got, want,
                                atols):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape == b.shape and np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=name)


def _check(impl_fn, shape, *, temperature=1.0, softcap=None, with_entropy=True,
           dtype=jnp.float32, w_dtype=None, rel=None, seed=0):
    """rel=None: float32 inputs, within the float32 bound of tests/numerics.py; else (bf16
    inputs, whose rounding is not float32's) within rel * the largest reference entry."""
    hidden, w, targets, cotangents = _inputs(seed, *shape, dtype=dtype, w_dtype=w_dtype)
    got = _values_and_grads(
        lambda h, u, y: impl_fn(h, u, y, temperature=temperature, softcap=softcap,
                                with_entropy=with_entropy), hidden, w, targets, cotangents)

    def reference(h, u, y):
        logp, entropy = lp.logprobs_reference(h, u, y, temperature, softcap=softcap)
        return logp, (entropy if with_entropy else jnp.zeros_like(entropy))

    want = _values_and_grads(reference, hidden, w, targets, cotangents)
    if rel is None:
        atols = logprobs_tolerances(hidden, w, temperature, want)
    else:
        atols = [rel * float(np.abs(np.asarray(b, np.float32)).max()) for b in want]
    _assert_close(got, want, atols)


def _chunked(seq_chunk, vocab_chunk):
    return lambda *a, **k: lp.chunked_logprobs(*a, seq_chunk=seq_chunk, vocab_chunk=vocab_chunk,
                                               **k)


def _pallas(blocks=PALLAS_BLOCKS):
    return lambda *a, **k: lp.pallas_logprobs(*a, block_sizes=blocks, interpret=True, **k)


# ----------------------------------------------------------------------------- chunked


@pytest.mark.parametrize("shape, seq_chunk, vocab_chunk, temperature, softcap, with_entropy", [
    ((2, 7, 16, 1000), 3, 128, 1.0, None, True),     # neither chunk divides
    ((1, 9, 32, 320), 16, 512, 1.3, None, True),     # chunks larger than L and V
    ((2, 6, 16, 257), 2, 64, 0.9, 3.0, True),        # Gemma-2 soft-capping
    ((1, 1, 8, 1), 1, 1, 1.0, None, True),           # single token, single-word vocabulary
])
def test_chunked_matches_reference(shape, seq_chunk, vocab_chunk, temperature, softcap,
                                   with_entropy):
    _check(_chunked(seq_chunk, vocab_chunk), shape, temperature=temperature, softcap=softcap,
           with_entropy=with_entropy)


@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float32])
def test_chunked_bf16_inputs(w_dtype):
    """bf16 hidden states with a bf16 or an f32 (master-weight) unembedding."""
    _check(_chunked(3, 128), (2, 7, 16, 1000), temperature=0.8, dtype=jnp.bfloat16,
           w_dtype=w_dtype, rel=2e-2)


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 3), length=st.integers(1, 9), dim=st.sampled_from([8, 16]),
       vocab=st.integers(2, 300), seq_chunk=st.integers(1, 10), vocab_chunk=st.integers(1, 400),
       temperature=st.sampled_from([0.5, 1.0, 1.7]), with_entropy=st.booleans(),
       seed=st.integers(0, 2**16))
def test_chunked_generated_shapes(batch, length, dim, vocab, seq_chunk, vocab_chunk,
                                  temperature, with_entropy, seed):
    _check(_chunked(seq_chunk, vocab_chunk), (batch, length, dim, vocab),
           temperature=temperature, with_entropy=with_entropy, seed=seed)


def test_chunked_never_holds_full_logits():
    """XLA's own buffer plan: the training-step temporaries stay far below one [B, L, V] f32."""
    batch, length, dim, vocab = 2, 128, 32, 4096
    hidden, w, targets, _ = _inputs(0, batch, length, dim, vocab)

    def loss(fn):
        return lambda h, u: sum(jnp.sum(x) for x in fn(h, u, targets, temperature=0.9))

    def temp_bytes(fn):
        compiled = jax.jit(jax.grad(loss(fn), argnums=(0, 1))).lower(hidden, w).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = batch * length * vocab * 4
    assert temp_bytes(_chunked(16, 512)) < logits_bytes / 4
    assert temp_bytes(lambda *a, **k: lp.token_logprobs(*a, impl="full", **k)) > logits_bytes


# ----------------------------------------------------------------------------- pallas


@pytest.mark.parametrize("shape, temperature, softcap, with_entropy", [
    ((2, 7, 16, 1000), 1.0, None, True),   # 14 rows: partial row block; partial vocab block
    ((3, 5, 8, 320), 0.7, 2.5, True),
    ((1, 4, 16, 100), 1.3, None, False),   # one block, smaller than the block in both axes
])
def test_pallas_matches_reference(shape, temperature, softcap, with_entropy):
    _check(_pallas(), shape, temperature=temperature, softcap=softcap, with_entropy=with_entropy)


def test_pallas_bf16_inputs():
    """bf16 hidden states, f32 W blocks cast in the kernel."""
    _check(_pallas(), (2, 7, 16, 320), temperature=0.8, dtype=jnp.bfloat16,
           w_dtype=jnp.float32, rel=2e-2)


@settings(max_examples=2, deadline=None)
@given(batch=st.integers(1, 3), length=st.integers(1, 9), vocab=st.integers(2, 300),
       block_rows=st.sampled_from([8, 16]), temperature=st.sampled_from([0.5, 1.0, 1.7]),
       seed=st.integers(0, 2**16))
def test_pallas_generated_shapes(batch, length, vocab, block_rows, temperature, seed):
    _check(_pallas(lp.BlockSizes(block_rows, 128)), (batch, length, 8, vocab),
           temperature=temperature, seed=seed)


def test_pallas_inside_shard_map():
    """How a sharded trainer calls the kernel: batch over the mesh, W replicated; the
    shard_map transpose sums dW over the devices."""
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:4]), ("data",))

    def sharded(h, u, y, **kw):
        local = lambda h, u, y: _pallas()(h, u, y, **kw)  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P("data")),
                             out_specs=P("data"), check_vma=False)(h, u, y)

    _check(sharded, (4, 5, 8, 300), temperature=0.9)


@pytest.mark.parametrize("rows, vocab, match", [(12, 128, "block_rows"), (8, 100, "block_vocab"),
                                                (0, 128, "block_rows")])
def test_block_sizes_validation(rows, vocab, match):
    with pytest.raises(ValueError, match=match):
        lp.BlockSizes(rows, vocab)


def test_token_logprobs_rejects_unknown_impl():
    hidden, w, targets, _ = _inputs(0, 1, 2, 8, 16)
    with pytest.raises(ValueError, match="impl must be one of"):
        lp.token_logprobs(hidden, w, targets, impl="fused")


# ----------------------------------------------------------------------------- model


def test_matches_completion_logprobs_on_test_model():
    """Same numbers as `scoring.completion_logprobs` from the tiny model's hidden states."""
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    cfg = models.get_preset("test", init_std=0.2)
    model = Transformer(cfg)
    params = models.init_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    rng = np.random.default_rng(0)
    prompt_len, length, temperature = 4, 6, 0.8
    prompt = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, prompt_len)), jnp.int32)
    prompt_valid = jnp.asarray(np.arange(prompt_len)[None] >= np.array([[0], [1], [2]]))
    completion = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, length)), jnp.int32)
    mask = scoring.completion_mask_from_lengths(jnp.array([6, 3, 1]), length)

    @jax.jit
    def score(params, prompt, prompt_valid, completion, mask):
        """completion_logprobs, and the hidden states and unembedding it reads logits from."""
        want = scoring.completion_logprobs(model, params, prompt, prompt_valid, completion,
                                           mask, temperature=temperature)
        tokens, positions, valid = scoring.sequence_inputs(prompt, prompt_valid, completion,
                                                           mask)
        hidden, _ = model.apply({"params": params}, tokens[:, :-1], positions[:, :-1],
                                valid[:, :-1], return_hidden=True)
        hidden = hidden[:, prompt_len - 1: prompt_len - 1 + length]
        return want, hidden, model.apply({"params": params}, method=Transformer.unembedding)

    want, hidden, unembedding = score(params, prompt, prompt_valid, completion, mask)
    # Other log-softmax orders after the same trunk: the decoder's float32 bound over
    # prompt_len + length tokens; the entropy's x log V (tests/numerics.py).
    atol = decoder_tolerance(cfg, params, tokens=prompt_len + length, temperature=temperature)
    atols = (atol, atol * float(np.log(cfg.vocab_size)))
    for impl in lp.IMPLS:
        got = lp.token_logprobs(hidden, unembedding, completion, impl=impl,
                                temperature=temperature, seq_chunk=4, vocab_chunk=48,
                                block_sizes=PALLAS_BLOCKS, interpret=True)
        for g, w, tol in zip(got, want, atols):
            np.testing.assert_allclose(np.asarray(g * mask), np.asarray(w), atol=tol,
                                       rtol=0, err_msg=impl)


# ----------------------------------------------------------------------------- TPU (AOT)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install 'jax[tpu]'); the Mosaic "
                           "lowering of the Pallas kernels can only be compiled with it")
def test_pallas_compiles_for_tpu_v5e():
    """Ahead-of-time compile of forward + backward for a v5e 2x4 slice, from this CPU host
    (DESIGN.md, Facts): rows sharded over the slice, the kernels inside shard_map."""
    import os

    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P

    # Another process (a concurrent test run) may hold libtpu's lockfile; AOT needs no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4")
    mesh = jax.sharding.Mesh(np.asarray(topology.devices).reshape(-1), ("data",))
    batch, length, dim, vocab = 16, 512, 2048, 32768

    def loss(hidden, w, targets):
        def local(h, u, y):
            logp, entropy = lp.pallas_logprobs(h, u, y, temperature=0.9)
            return jax.lax.psum(jnp.sum(logp) + 0.01 * jnp.sum(entropy), "data")
        return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P("data")),
                             out_specs=P(), check_vma=False)(hidden, w, targets)

    def arg(shape, dtype, spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    args = (arg((batch, length, dim), jnp.bfloat16, P("data")),
            arg((dim, vocab), jnp.bfloat16, P()), arg((batch, length), jnp.int32, P("data")))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
    assert compiled.as_text().count("tpu_custom_call") >= 3  # fwd, dh and dW kernels
    logits_per_device = batch // 8 * length * vocab * 4
    assert compiled.memory_analysis().temp_size_in_bytes < logits_per_device / 8
