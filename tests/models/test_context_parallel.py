"""Context parallelism (mesh axis `context`, `models.context_parallel`):
on 8 fake devices, the packed log-prob pass and the packed GRPO update with the sequence
split over 4 context shards equal the same programs with context = 1, in float32 within the
bounds of tests/numerics.py: with segment ids and shared prompts, and in a sliding-window
model. The compiled program gathers keys/values along `context` (no full replication of the
activations), sampling is unchanged, splash under context parallelism (interpreted) equals
the reference, and the config names the knob that does not fit."""
import dataclasses
import importlib.util
import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cached_params import params_on
from packed_rows import packed_rows
from jaxrl_reason.cli import parse
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.models import attention, context_parallel
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.update import make_update_fn, packed_logprobs
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from jaxrl_reason.sampling.sampler import Sampler
from numerics import assert_update_metrics_close, attention_loss_tolerances, \
    attention_tolerance, decoder_grad_tolerance, decoder_tolerance

PROMPTS, GROUP, TP, LENGTH, T = 4, 4, 6, 11, 40     # packs of 40 tokens: 10 per context shard
RULES = shd.DEFAULT_RULES
SMOKE = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "arith_grpo.py") + ":smoke"


def _meshes():
    """(context = 1 on 2 devices, data 2 x context 4 on 8): the same rows per data shard."""
    return (shd.make_mesh({"data": 2}, jax.devices()[:2]),
            shd.make_mesh({"data": 2, "context": 4}))


def _cfg(window: bool):
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    return dataclasses.replace(cfg, sliding_window=5, sliding_window_pattern=2) if window \
        else cfg


def _rows(seed=0, vocab=64):
    """`packed_rows` at this file's shapes."""
    return packed_rows(seed, vocab, PROMPTS, GROUP, TP, LENGTH)


def _packs(prompt, valid, completion, lengths, share):
    """Host packs (numpy dict) with a pack count that splits over 2 data shards."""
    buckets = packing.pack_buckets(packing.max_packs(len(completion), TP + LENGTH - 1, T), 2)
    return packing.pack(prompt, valid, completion, lengths, T, buckets,
                        share_prompts=share).arrays()


def _put(mesh, tree):
    """A host dict on the mesh: arrays batch-sharded, scalars as they are."""
    return {k: shd.put_batch(mesh, RULES, v) if np.ndim(v) else v for k, v in tree.items()}


def _logprob_loss(model, mesh, packs, weights, share):
    """Jitted value-and-gradient of a weighted sum of packed log-probs and entropies."""
    def loss(params):
        logp, ent = packed_logprobs(model, params, packs, temperature=0.7,
                                    share_prompts=share)
        return jnp.sum(logp * weights) + 0.3 * jnp.sum(ent * weights), (logp, ent)
    return jax.jit(shd.with_activation_sharding(jax.value_and_grad(loss, has_aux=True),
                                                mesh, RULES))


def _check_gathers(hlo: str, cfg, rows: int) -> None:
    """The context shards of a compiled program (data 2 x context 4) gather the keys and
    values of each layer along `context`, and never a whole sequence of activations."""
    gathers = re.findall(r"= (\S+\[[\d,]*\])\S* all-gather\((.*)", hlo)
    # Devices are (data, context) row-major: the context groups are 4 consecutive ids.
    kv = [s for s, text in gathers if "replica_groups={{0,1,2,3},{4,5,6,7}}" in text
          and s.endswith(f"[{rows},{T},{cfg.n_kv_heads},{cfg.head_dim}]")]
    assert len(kv) == 2 * cfg.n_layers, gathers             # keys and values of each layer
    # No gather rebuilds a shard's whole sequence of the residual stream or MLP hidden ...
    for width in (cfg.d_model, cfg.mlp_hidden):
        assert not any(s.endswith(f"[{rows},{T},{width}]") for s, _ in gathers), gathers
    # ... which each device computes on its own quarter: [rows, T / 4, d_model].
    assert f"[{rows},{T // 4},{cfg.d_model}]" in hlo


@pytest.mark.parametrize("window, share", [(False, True), (True, False)])
def test_context_parallel_logprobs_and_gradients_equal_context_one(window, share):
    """Values and gradients at cp = 4 against cp = 1, and the cp program's collectives."""
    cfg = _cfg(window)
    model = Transformer(cfg)
    prompt, valid, completion, lengths, mask = _rows()
    host = _packs(prompt, valid, completion, lengths, share)
    assert host["pack_segments"].max() > 1          # a real packed batch
    weights = np.random.default_rng(1).normal(size=mask.shape).astype(np.float32)
    results = []
    for mesh in _meshes():
        params = params_on(cfg, mesh)
        fn = _logprob_loss(model, mesh, _put(mesh, host), shd.put_batch(mesh, RULES, weights),
                           share).lower(params).compile()
        if mesh.shape["context"] > 1:
            _check_gathers(fn.as_text(), cfg, rows=len(host["pack_tokens"]) // 2)
        (_, (logp, ent)), grads = fn(params)
        results.append((params, np.asarray(logp), np.asarray(ent), jax.device_get(grads)))
    (params, logp_a, ent_a, ga), (_, logp_b, ent_b, gb) = results
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    assert np.abs(logp_a).max() > 100 * atol                 # a real comparison
    np.testing.assert_allclose(logp_b, logp_a, rtol=0, atol=atol)
    np.testing.assert_allclose(ent_b, ent_a, rtol=0, atol=atol * np.log(cfg.vocab_size))
    grad_atol = decoder_grad_tolerance(cfg, ga, tokens=T, rows=len(mask))
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def _rl():
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    rl = fv.config.rl
    rl.loss_type, rl.beta, rl.num_iterations = "grpo", 0.04, 2
    rl.entropy_coef, rl.epsilon_high, rl.max_new_tokens = 0.01, 0.28, LENGTH
    return rl


def test_context_parallel_grpo_update_equals_context_one():
    """One packed GRPO update with SGD at rate 1 (so params - new params = the gradient),
    KL term, entropy bonus and clipping engaged, on cp = 1 and cp = 4."""
    cfg, rl, sgd = _cfg(False), _rl(), optax.sgd(1.0)
    model = Transformer(cfg)
    prompt, valid, completion, lengths, mask = _rows(2)
    rng = np.random.default_rng(3)
    n = len(mask)
    logp0 = rng.normal(-3.0, 0.5, mask.shape).astype(np.float32) * mask
    rows = {"mask": mask, "loss_mask": mask,
            "advantages": rng.normal(size=n).astype(np.float32),
            "old_logp": (logp0 + rng.normal(0, 0.3, mask.shape) * mask).astype(np.float32),
            "ref_logp": (logp0 + rng.normal(0, 0.2, mask.shape) * mask).astype(np.float32),
            "sampler_logp": logp0}
    host = {**rows, **_packs(prompt, valid, completion, lengths, True),
            "num_sequences": np.float32(n), "num_tokens": np.float32(mask.sum()),
            "beta": np.float32(rl.beta)}
    results = []
    for mesh in _meshes():
        params = params_on(cfg, mesh)
        update = make_update_fn(model, sgd, rl, mesh, RULES, packed=True)
        new, metrics = update(create_train_state(jax.tree.map(jnp.copy, params), sgd),
                              _put(mesh, host))
        grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
        results.append((jax.device_get(params), jax.device_get(metrics), grads))
    (params, m_a, g_a), (_, m_b, g_b) = results
    logp_atol = decoder_tolerance(cfg, params, tokens=T, temperature=rl.temperature)
    x = {"logp": logp0, "old_logp": rows["old_logp"], "ref_logp": rows["ref_logp"],
         "mask": mask, "advantages": rows["advantages"], "entropy": None}
    assert_update_metrics_close(m_a, m_b, x, beta=rl.beta, entropy_coef=rl.entropy_coef,
                                epsilon_high=rl.epsilon_high, logp_atol=logp_atol)
    grad_atol = decoder_grad_tolerance(cfg, g_a, tokens=T, rows=n)
    for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def _all_gathers(hlo: str) -> list[tuple[str, str]]:
    """(result shape, the instruction's text) of each all-gather of a compiled HLO text."""
    return re.findall(r"= (\S+\[[\d,]*\])\S* all-gather\((.*)", hlo)


@pytest.mark.parametrize("window", [None, 96])
def test_splash_under_context_parallelism_equals_the_reference(window, monkeypatch):
    """Splash (interpreted) on 2 context shards of 128 queries with segment ids (and a
    sliding window with a logit softcap): values and gradients against the reference
    attention on the whole sequence."""
    monkeypatch.setattr(attention, "_NOTED", set())        # records any fallback
    cfg = dataclasses.replace(get_preset("test"), attention_impl="splash",
                              sliding_window=window,
                              attn_logit_softcap=None if window is None else 20.0)
    batch, length, kv_heads, groups, head_dim = 2, 256, 1, 2, cfg.head_dim
    keys = jax.random.split(jax.random.key(4), 4)
    q = jax.random.normal(keys[0], (batch, length, kv_heads, groups, head_dim))
    k, v = (jax.random.normal(x, (batch, length, kv_heads, head_dim)) for x in keys[1:3])
    cot = jax.random.normal(keys[3], q.shape)
    seg = np.repeat(np.array([[1, 2, 3, 0], [1, 1, 2, 2]], np.int32), length // 4, axis=1)
    seg[0, 150:170] = 3                                     # a segment across the shard edge
    valid = seg > 0
    mesh = shd.make_mesh({"data": 4, "context": 2})

    def run(impl, mesh):
        c = dataclasses.replace(cfg, attention_impl=impl)
        def loss(q, k, v):
            out = attention.attend(c, q, k, v, jnp.asarray(valid), 0, window, head_major=False,
                                   first_slot=0, segment_ids=jnp.asarray(seg))
            return jnp.sum(jnp.where(valid[:, :, None, None, None], out * cot, 0)), out
        fn = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
        return jax.jit(shd.with_activation_sharding(fn, mesh, RULES))(q, k, v)

    (loss_want, want), grads_want = run("reference", None)
    (loss_got, got), grads_got = run("splash", mesh)
    assert not attention._NOTED                             # splash ran, no fallback
    real = valid[:, :, None, None, None]
    atol = attention_tolerance(q, k, v, keys=length, scale=head_dim ** -0.5)
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), rtol=0,
                               atol=atol)
    loss_atol, grad_atol = attention_loss_tolerances(
        q, k, v, np.where(real, cot, 0), grads_want, keys=length, queries=length,
        scale=head_dim ** -0.5)
    np.testing.assert_allclose(loss_got, loss_want, rtol=0, atol=loss_atol)
    for a, b in zip(grads_want, grads_got):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed")
def test_splash_under_context_parallelism_compiles_for_tpu_v5e(monkeypatch):
    """The splash kernels on 4 context shards of 512 queries compile with Mosaic, ahead of
    time for a v5e 2x4 slice (mesh data 2 x context 4): the forward, dq and dkv kernels, and
    no fallback."""
    from jaxrl_reason.kernels import platform
    from jaxrl_reason.runtime import plan as planner

    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    monkeypatch.setattr(attention, "_NOTED", set())
    _, devices = planner.topology_devices("v5e:2x4")
    mesh = shd.make_mesh({"data": 2, "context": 4}, devices=devices)
    cfg = dataclasses.replace(get_preset("test"), attention_impl="splash", dtype="bfloat16",
                              head_dim=128)
    batch, length, kv_heads, groups = 4, 2048, 2, 2

    def loss(q, k, v, seg):
        out = attention.attend(cfg, q, k, v, seg > 0, 0, None, head_major=False, first_slot=0,
                               segment_ids=seg)
        return jnp.sum(out.astype(jnp.float32))

    def sds(shape, dtype, logical):
        return jax.ShapeDtypeStruct(shape, dtype,
                                    sharding=shd.named_sharding(mesh, logical, RULES, shape))
    heads = ("batch", "length", "kv_heads")
    args = (sds((batch, length, kv_heads, groups, 128), jnp.bfloat16, heads),
            sds((batch, length, kv_heads, 128), jnp.bfloat16, heads),
            sds((batch, length, kv_heads, 128), jnp.bfloat16, heads),
            sds((batch, length), jnp.int32, ("batch", "length")))
    fn = jax.jit(shd.with_activation_sharding(jax.grad(loss, argnums=(0, 1, 2)), mesh, RULES))
    with platform.target("tpu"):
        hlo = fn.lower(*args).compile().as_text()
    assert hlo.count("tpu_custom_call") == 3 and not attention._NOTED
    assert "all-gather" in hlo


def test_splash_falls_back_on_shards_off_its_tile(monkeypatch, caplog):
    """Context shards of 10 queries are no splash tile: the reference runs under context
    parallelism, with one logged reason."""
    monkeypatch.setattr(attention, "_NOTED", set())
    cfg = dataclasses.replace(get_preset("test"), attention_impl="splash")
    keys = jax.random.split(jax.random.key(5), 3)
    q = jax.random.normal(keys[0], (2, T, 1, 2, cfg.head_dim))
    k, v = (jax.random.normal(x, (2, T, 1, cfg.head_dim)) for x in keys[1:])
    valid = jnp.ones((2, T), bool)

    def run(c):
        return attention.attend(c, q, k, v, valid, 0, None, head_major=False, first_slot=0)
    with caplog.at_level(logging.WARNING, logger=attention.logger.name):
        got = jax.jit(shd.with_activation_sharding(lambda: run(cfg), _meshes()[1], RULES))()
    want = jax.jit(lambda: run(dataclasses.replace(cfg, attention_impl="reference")))()
    notes = [r.getMessage() for r in caplog.records if r.name == attention.logger.name]
    assert len(notes) == 1 and "context shard's 10 queries" in notes[0], notes
    np.testing.assert_allclose(got, want, rtol=0, atol=attention_tolerance(
        q, k, v, keys=T, scale=cfg.head_dim ** -0.5))


def test_sampling_is_unchanged_by_the_context_axis():
    """The sampler's programs keep the sequence whole under cp (the context chips share
    the rows instead): the same tokens at context 4 as at context 1, and the same log-probs
    up to float order (the rows' programs run on batches of another size)."""
    cfg = _cfg(False)
    model = Transformer(cfg)
    prompt, valid, _, _, _ = _rows()
    # 8-token prompts: a prefill length that would split over 4 context shards
    prompt, valid = np.pad(prompt, ((0, 0), (2, 0))), np.pad(valid, ((0, 0), (2, 0)))
    outs = []
    for mesh in _meshes():
        params = params_on(cfg, mesh)
        sampler = Sampler(model, eos_ids=(1,), pad_id=0, mesh=mesh, rules=RULES)
        out = sampler(params, shd.put_batch(mesh, RULES, prompt),
                      shd.put_batch(mesh, RULES, valid), jax.random.key(1), num_samples=2,
                      max_new_tokens=8, temperature=1.0)
        outs.append((np.asarray(out.tokens), np.asarray(out.logprobs)))
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("change, match", [
    ({"mesh.context": 3}, "mesh.context: 3 does not divide the 8 devices"),
    ({"mesh.context": 4, "rl.packing": False}, "set rl.packing=True"),
    ({"mesh.context": 4, "rl.pack_tokens": 250}, "rl.pack_tokens: 250 does not divide by "
                                                 "mesh.context=4"),
    ({"mesh.context": 4, "sft.packing": True, "sft.pack_tokens": 250},
     "sft.pack_tokens: 250 does not divide by mesh.context=4"),
    ({"mesh.context": 4, "sharding_rules": (("batch", ("data", "fsdp")),)},
     r"needs the rule \('length', 'context'\)"),
])
def test_validation_names_the_context_knob(change, match):
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    config = fv.config
    config.rl.packing, config.rl.pack_tokens, config.rl.micro_batches = True, 256, 1
    config.mesh.data = -1
    assert not [p for p in validate_config(config, 8) if "context" in p]   # context = 1
    with config.unlocked():
        for key, value in change.items():
            node, _, leaf = key.rpartition(".")
            setattr(config[node] if node else config, leaf, value)
    problems = validate_config(config, 8)
    assert any(re.search(match, p) for p in problems), problems


def test_context_one_leaves_the_model_unsplit():
    """With context = 1 (the default), no attention takes the context path, and the
    weights' shardings under the default rules (embed over fsdp x context) are those of
    embed over fsdp alone."""
    from jaxrl_reason.models.params import param_shardings
    cfg, fsdp = _cfg(False), shd.make_mesh({"fsdp": 4, "tensor": 2})
    fsdp_only = tuple((n, "fsdp" if n == "embed" else a) for n, a in RULES)
    want = jax.tree.leaves(param_shardings(cfg, fsdp, fsdp_only))
    got = jax.tree.leaves(param_shardings(cfg, fsdp, RULES))
    assert [s.spec for s in got] == [s.spec for s in want]
    assert any("fsdp" in str(s.spec) for s in got)
    mesh = shd.make_mesh({"data": 8})
    with shd.activation_sharding(mesh, RULES):
        assert context_parallel.context_shards(T) is None
    with shd.activation_sharding(_meshes()[1], RULES):
        assert context_parallel.context_shards(T)[2] == ("context",)
        assert context_parallel.context_shards(T + 2) is None      # 42 % 4: unsplit
