"""Rematerialization (`ModelConfig.remat`): same params, values and gradients; less memory.

XLA:CPU strips the optimization barriers that keep a rematerialized block from being merged
back into the forward pass (its `cse_barrier_expander` pass runs before its later CSE and
scheduling; GPU runs it only after scheduling and TPU honours the barriers), so on CPU remat
saves no memory by default. The memory test therefore compiles with that pass disabled, so
the barriers survive as they would on an accelerator; the compiled programs are also run to
check that the recomputation changes no value.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import positions_from_valid
from numerics import decoder_grad_tolerance, decoder_tolerance, kv_cache_tolerance

REMATS = ("none", "block", "save_dots")
KEEP_BARRIERS = {"xla_disable_hlo_passes": "cse_barrier_expander"}
# Four layers and 128 tokens: the attention scores/probs [B, H, T, T] kept by remat="none"
# dominate the activation memory, and each compile still takes only a few seconds.
SHAPES = dict(n_layers=4, batch=2, prompt_len=8, completion_len=120)


def _config(remat, n_layers=2):
    return models.get_preset("test", init_std=0.2, n_layers=n_layers, remat=remat)


def _tokens(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 128, size=shape), jnp.int32)


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def compiled_grads(mesh1):
    """remat -> (temp bytes, opt-barrier count, loss, grads) of a log-prob loss's gradient."""
    n, b = SHAPES["n_layers"], SHAPES["batch"]
    params = models.init_params(_config("none", n), jax.random.key(0), mesh1, shd.DEFAULT_RULES)
    prompt = _tokens(0, (b, SHAPES["prompt_len"]))
    prompt_valid = jnp.ones(prompt.shape, bool)
    completion = _tokens(1, (b, SHAPES["completion_len"]))
    mask = jnp.ones(completion.shape, jnp.float32)
    results = {}
    for remat in REMATS:
        model = Transformer(_config(remat, n))

        def loss(p, model=model):
            logp, _ = scoring.completion_logprobs(model, p, prompt, prompt_valid, completion,
                                                  mask, with_entropy=False)
            return -jnp.mean(logp)

        compiled = jax.jit(jax.value_and_grad(loss)).lower(params).compile(KEEP_BARRIERS)
        value, grads = compiled(params)
        results[remat] = (compiled.memory_analysis().temp_size_in_bytes,
                          compiled.as_text().count("opt-barrier"), value, grads)
    return results


def test_remat_keeps_params_and_axes():
    base = _config("none")
    for remat in REMATS[1:]:
        cfg = _config(remat)
        assert models.abstract_params(cfg) == models.abstract_params(base)
        assert models.param_logical_axes(cfg) == models.param_logical_axes(base)


def test_remat_same_loss_and_gradients(compiled_grads, mesh1):
    _, _, value, grads = compiled_grads["none"]
    # Recomputing a block is another XLA program (other fusions, other summation orders):
    # the float32 bound of a mean log-prob and of the gradients (tests/numerics.py).
    cfg, tokens = _config("none", SHAPES["n_layers"]), SHAPES["prompt_len"] + SHAPES[
        "completion_len"]
    params = models.init_params(cfg, jax.random.key(0), mesh1, shd.DEFAULT_RULES)
    value_atol = decoder_tolerance(cfg, params, tokens=tokens)
    grad_atol = decoder_grad_tolerance(cfg, grads, tokens=tokens, rows=SHAPES["batch"])
    for remat in REMATS[1:]:
        _, _, other_value, other_grads = compiled_grads[remat]
        np.testing.assert_allclose(float(other_value), float(value), rtol=0, atol=value_atol)
        assert jax.tree.structure(other_grads) == jax.tree.structure(grads)
        for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
            np.testing.assert_allclose(np.asarray(h), np.asarray(g), rtol=0, atol=grad_atol,
                                       err_msg=remat)


def test_remat_reduces_temp_memory(compiled_grads):
    temp = {remat: compiled_grads[remat][0] for remat in REMATS}
    barriers = {remat: compiled_grads[remat][1] for remat in REMATS}
    print("temp bytes of the gradient program:", temp)
    # One barrier per rematerialized block, on top of those the CPU backward of
    # narrow_transpose_matmul places (as many with every remat setting).
    assert barriers["block"] - barriers["none"] == SHAPES["n_layers"], barriers
    assert barriers["save_dots"] - barriers["none"] == SHAPES["n_layers"], barriers
    # Measured: none 11.1 MB, block 3.5 MB, save_dots 4.3 MB.
    assert temp["block"] < 0.5 * temp["none"], temp
    assert temp["save_dots"] < 0.6 * temp["none"], temp


def test_remat_kv_cache_prefill_and_decode_unchanged(mesh1):
    """The sampler's calls: prefill with a python 0 cache_index, then decode steps in a loop
    with a traced one; remat must change neither logits nor cache."""
    params = models.init_params(_config("none"), jax.random.key(2), mesh1, shd.DEFAULT_RULES)
    batch, prefix, total = 2, 4, 7
    tokens = _tokens(3, (batch, total))
    valid = jnp.asarray([[True] * total, [False, False] + [True] * (total - 2)])
    positions = positions_from_valid(valid)
    key_valid = jnp.concatenate([valid[:, :prefix], jnp.zeros((batch, total - prefix), bool)], 1)

    def run(model):
        @jax.jit
        def prefill_and_decode(params):
            apply = functools.partial(model.apply, {"params": params})
            cache = models.init_cache(model.cfg, batch, total)
            logits, cache = apply(tokens[:, :prefix], positions[:, :prefix], key_valid, cache, 0)

            def step(slot, carry):
                out, cache, kv = carry
                kv = kv.at[:, slot].set(True)
                window = lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=1)  # noqa: E731
                logits, cache = apply(window(tokens), window(positions), kv, cache, slot)
                return jax.lax.dynamic_update_slice_in_dim(out, logits, slot, axis=1), cache, kv

            out = jnp.zeros((batch, total, model.cfg.vocab_size), jnp.float32)
            out = out.at[:, :prefix].set(logits)
            out, cache, _ = jax.lax.fori_loop(prefix, total, step, (out, cache, key_valid))
            return out, cache

        return prefill_and_decode(params)

    # "block" only: "save_dots" wraps the block the same way and its policy only matters
    # under differentiation (each variant costs a compile).
    want_logits, want_cache = run(Transformer(_config("none")))
    logits, cache = run(Transformer(_config("block")))
    # Another program: the float32 bounds of logits and cache entries (tests/numerics.py).
    cfg = _config("none")
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=0,
                               atol=decoder_tolerance(cfg, params, tokens=total))
    cache_atol = kv_cache_tolerance(cfg, params, tokens=total)
    for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(want_cache)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=cache_atol)
