"""Packed log-prob passes and the packed update (rl.packing) against the padded ones, in
float32: per-row log-probs, the loss, its metrics and the gradients agree within the
float-reordering bounds of tests/numerics.py, for every GRPO-family aggregation, on 1 and
on 8 fake devices."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cached_params import params_on
from packed_rows import packed_rows
from trainer_support import SMOKE
from jaxrl_reason.cli import parse
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.scoring import completion_logprobs
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.update import (make_logprob_fn, make_packed_logprob_fn, make_update_fn,
                                    packed_logprobs)
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import assert_update_metrics_close, decoder_grad_tolerance, decoder_tolerance

PROMPTS, GROUP, TP, LENGTH, T = 4, 4, 6, 11, 40


def _rows(seed=0, vocab=64):
    """`packed_rows` at this file's shapes."""
    return packed_rows(seed, vocab, PROMPTS, GROUP, TP, LENGTH)


def _setup(devices):
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:devices])
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    params = params_on(cfg, mesh)
    return mesh, cfg, params


def _put(mesh, x):
    """Batch-sharded, or replicated when the rows do not split (the 4 prompts on 8)."""
    x = np.asarray(x)
    if len(x) % shd.data_parallel_size(mesh, shd.DEFAULT_RULES):
        return shd.put_replicated(mesh, x)
    return shd.put_batch(mesh, shd.DEFAULT_RULES, x)


def _packs(mesh, prompt, valid, completion, lengths, share, devices):
    buckets = packing.pack_buckets(packing.max_packs(len(completion), TP + LENGTH - 1, T),
                                   devices)
    packs = packing.pack(prompt, valid, completion, lengths, T, buckets, share_prompts=share)
    return {name: _put(mesh, x) for name, x in packs.arrays().items()}


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("share", [True, False])
def test_packed_logprobs_equal_padded_values_and_gradients(devices, share):
    mesh, cfg, params = _setup(devices)
    model = Transformer(cfg)
    prompt, valid, completion, lengths, mask = _rows()
    packs = _packs(mesh, prompt, valid, completion, lengths, share, devices)
    args = [_put(mesh, x) for x in (prompt, valid, completion, mask)]
    weights = _put(mesh, np.random.default_rng(1).normal(size=mask.shape).astype(np.float32))

    def padded(p):
        logp, ent = completion_logprobs(model, p, *args, temperature=0.7)
        return jnp.sum(logp * weights) + 0.3 * jnp.sum(ent * weights), (logp, ent)

    def packed(p):
        with shd.activation_sharding(mesh, shd.DEFAULT_RULES):
            logp, ent = packed_logprobs(model, p, packs, temperature=0.7, share_prompts=share)
        return jnp.sum(logp * weights) + 0.3 * jnp.sum(ent * weights), (logp, ent)

    (_, (logp_a, ent_a)), ga = jax.jit(jax.value_and_grad(padded, has_aux=True))(params)
    (_, (logp_b, ent_b)), gb = jax.jit(jax.value_and_grad(packed, has_aux=True))(params)
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    assert np.abs(np.asarray(logp_a)).max() > 100 * atol   # a real comparison
    np.testing.assert_allclose(logp_b, logp_a, rtol=0, atol=atol)
    np.testing.assert_allclose(ent_b, ent_a, rtol=0, atol=atol * np.log(cfg.vocab_size))
    assert np.all(np.asarray(logp_b)[mask == 0] == 0)
    grad_atol = decoder_grad_tolerance(cfg, ga, tokens=T, rows=len(mask))
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)
    # the jitted log-prob passes of the trainer agree the same way
    padded_fn = make_logprob_fn(model, 0.7, 1, mesh, shd.DEFAULT_RULES)
    packed_fn = make_packed_logprob_fn(model, 0.7, share, mesh, shd.DEFAULT_RULES)
    np.testing.assert_allclose(packed_fn(params, packs), padded_fn(params, *args), rtol=0,
                               atol=atol)


def _rl(loss_type):
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    rl = fv.config.rl
    rl.loss_type, rl.beta, rl.num_iterations = loss_type, 0.04, 2
    rl.entropy_coef, rl.epsilon_high, rl.max_new_tokens = 0.01, 0.28, LENGTH
    return rl


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_packed_update_equals_padded_loss_metrics_and_gradients(devices, loss_type):
    """One update with SGD at rate 1 (new params = params - gradient), with the KL term,
    entropy bonus and clipping engaged (old log-probs away from the current ones)."""
    mesh, cfg, params = _setup(devices)
    model, rl, sgd = Transformer(cfg), _rl(loss_type), optax.sgd(1.0)
    prompt, valid, completion, lengths, mask = _rows(2)
    rng = np.random.default_rng(3)
    n = len(mask)
    logp0 = np.asarray(make_logprob_fn(model, rl.temperature)(
        params, *(jnp.asarray(x) for x in (prompt, valid, completion, mask))))
    rows = {"mask": mask, "loss_mask": mask,
            "advantages": rng.normal(size=n).astype(np.float32),
            "old_logp": (logp0 + rng.normal(0, 0.3, mask.shape) * mask).astype(np.float32),
            "ref_logp": (logp0 + rng.normal(0, 0.2, mask.shape) * mask).astype(np.float32),
            "sampler_logp": logp0}
    common = {name: _put(mesh, x) for name, x in rows.items()}
    common.update(num_sequences=np.float32(n), num_tokens=np.float32(mask.sum()),
                  beta=np.float32(rl.beta))
    padded_batch = {**common, **{name: _put(mesh, x) for name, x in (
        ("prompt_tokens", prompt), ("prompt_valid", valid), ("completion_tokens", completion))}}
    packed_batch = {**common, **_packs(mesh, prompt, valid, completion, lengths, True,
                                       devices)}
    results = []
    for packed, batch in ((False, padded_batch), (True, packed_batch)):
        update = make_update_fn(model, sgd, rl, mesh, shd.DEFAULT_RULES, packed=packed)
        state = create_train_state(jax.tree.map(jnp.copy, params), sgd)
        new, metrics = update(state, batch)
        grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
        results.append((jax.device_get(metrics), grads))
    (m_pad, g_pad), (m_pack, g_pack) = results
    # Log-probs differ by at most the decoder bound (assert_update_metrics_close: how that
    # bounds each metric); the gradient's norm by the entry bound times sqrt(entries).
    logp_atol = decoder_tolerance(cfg, params, tokens=T, temperature=rl.temperature)
    x = {"logp": logp0, "old_logp": rows["old_logp"], "ref_logp": rows["ref_logp"],
         "mask": mask, "advantages": rows["advantages"], "entropy": None}
    grad_atol = decoder_grad_tolerance(cfg, g_pad, tokens=T, rows=n)
    assert_update_metrics_close(
        m_pad, m_pack, x, beta=rl.beta, entropy_coef=rl.entropy_coef,
        epsilon_high=rl.epsilon_high, logp_atol=logp_atol,
        grad_norm_atol=grad_atol * np.sqrt(sum(np.size(g) for g in jax.tree.leaves(g_pad))))
    for a, b in zip(jax.tree.leaves(g_pad), jax.tree.leaves(g_pack)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)

