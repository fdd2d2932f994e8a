"""LoRA adapters and a quantized base (models.lora): the adapted projection against a numpy
reference, the base with the adapters removed against the plain model, gradients and
optimizer state on the adapters only, int8/nf4 round trips, sharding, the sampler's
log-probs against the trainer's, and clear errors for bad configs."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime import train_state as ts
from jaxrl_reason.models import lora as lora_lib, lora_params, scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import Sampler, left_pad
from numerics import decoder_tolerance, f32_tolerance

BASE = models.get_preset("test", init_std=0.2)
LORA = {"r": 4, "lora_alpha": 8.0, "target_modules": "all-linear"}
RULES = shd.DEFAULT_RULES


def _inputs(batch=2, length=7, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (batch, length), 1, BASE.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    return tokens, positions, jnp.ones((batch, length), bool)


def _randomize_b(params, seed=1, scale=0.05):
    """Adapters with nonzero B (fresh ones have B = 0 and change nothing)."""
    adapters, base = lora_lib.split_adapters(params)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return lora_lib.merge_trees(jax.tree.unflatten(treedef, leaves), base)


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1}, devices=jax.devices()[:1])


# ----------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("contract,features,quant", [(1, (6,), "none"), (1, (3, 4), "none"),
                                                     (2, (5,), "none"), (1, (6,), "int8")])
def test_projection_equals_numpy_reference(contract, features, quant):
    lcfg = lora_lib.LoraConfig(rank=3, alpha=6.0, targets=("q_proj",), base_quant=quant)
    layer = lora_lib.Projection(features=features, contract=contract, use_bias=contract == 1,
                                dtype=jnp.float32, param_dtype=jnp.float32,
                                kernel_init=nn.initializers.normal(0.5),
                                kernel_logical=(None,) * (contract + len(features)),
                                bias_logical=(None,) * len(features), lora=lcfg, adapted=True)
    x = jax.random.normal(jax.random.key(0), (2, 5) + (4, 2)[:contract] if contract == 2
                          else (2, 5, 8))
    params = nn.meta.unbox(layer.init(jax.random.key(1), x))["params"]
    params["lora_b"] = jax.random.normal(jax.random.key(2), params["lora_b"].shape)
    if "bias" in params:
        params["bias"] = jax.random.normal(jax.random.key(3), params["bias"].shape)
    y = np.asarray(layer.apply({"params": params}, x), np.float64)

    w = np.asarray(lora_lib.dequantize_kernel(params, jnp.float32), np.float64)
    xs = np.asarray(x, np.float64)
    axes = (list(range(xs.ndim - contract, xs.ndim)), list(range(contract)))
    a, b = (np.asarray(params[k], np.float64) for k in ("lora_a", "lora_b"))
    expected = np.tensordot(xs, w, axes) + 2.0 * np.tensordot(
        np.tensordot(xs, a, axes), b, ([-1], [0]))
    if "bias" in params:
        expected = expected + np.asarray(params["bias"], np.float64)
    assert y.shape == (2, 5) + features
    width = int(np.prod(x.shape[-contract:]))
    magnitude = float(np.tensordot(np.abs(xs), np.abs(w), axes).max()
                      + 2 * np.tensordot(np.abs(np.tensordot(xs, a, axes)), np.abs(b),
                                         ([-1], [0])).max())
    np.testing.assert_allclose(y, expected, rtol=0,
                               atol=f32_tolerance(width, magnitude, chain=2, orders=1))


@pytest.mark.parametrize("scan", [False, True])
def test_base_without_adapters_is_the_plain_model(scan, mesh1):
    cfg = BASE.replace(scan_layers=scan)
    lcfg = cfg.replace(lora=LORA)
    params = _randomize_b(models.init_params(lcfg, jax.random.key(0), mesh1, RULES))
    inputs = _inputs()
    run = jax.jit(lambda c, p: Transformer(c).apply({"params": p}, *inputs)[0],
                  static_argnums=0)
    with_adapters = run(lcfg, params)
    reference = run(lcfg, lora_lib.without_adapters(params))
    plain = run(cfg, lora_lib.without_adapters(params))
    np.testing.assert_array_equal(np.asarray(reference), np.asarray(plain))
    assert float(jnp.abs(with_adapters - plain).max()) > 1e-3  # the adapters do something
    # and the merged weights reproduce the adapted model
    merged = run(cfg, lora_params.merged_params(lcfg, params))
    np.testing.assert_allclose(np.asarray(merged), np.asarray(with_adapters), rtol=0,
                               atol=decoder_tolerance(cfg, params, tokens=7))


def test_targets_choose_the_projections(mesh1):
    cfg = BASE.replace(lora={"rank": 2, "targets": ("q_proj", r"mlp\.(up|down)_proj")})
    adapters, _ = lora_lib.split_adapters(models.init_params(cfg, jax.random.key(0), mesh1,
                                                             RULES))
    assert sorted(adapters["layer_0"]["attn"]) == ["q_proj"]
    assert sorted(adapters["layer_1"]["mlp"]) == ["down_proj", "up_proj"]
    assert cfg.lora.target_modules() == ["q_proj", "up_proj", "down_proj"]


# ----------------------------------------------------------------------------- training


def test_gradients_and_optimizer_state_only_on_adapters(mesh1):
    cfg = BASE.replace(lora=LORA)
    params = _randomize_b(models.init_params(cfg, jax.random.key(0), mesh1, RULES))
    model = Transformer(cfg)
    tokens, positions, valid = _inputs()

    def loss(p):
        logits = model.apply({"params": p}, tokens, positions, valid)[0]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    optimizer = optax.adam(1e-2)
    state = ts.create_train_state(params, optimizer)
    adapters, base = lora_lib.split_adapters(params)
    n_adapter = models.count_params(adapters)
    mu = state.opt_state[0].mu
    assert jax.tree.structure(mu) == jax.tree.structure(adapters)
    assert models.count_params(state.opt_state) == 2 * n_adapter + 1  # mu, nu, count

    value, grads = jax.jit(ts.value_and_grad(loss))(params)
    assert jax.tree.structure(grads) == jax.tree.structure(adapters)
    full_value, full_grads = jax.jit(jax.value_and_grad(loss))(params)
    assert float(value) == float(full_value)
    for g, f in zip(jax.tree.leaves(grads), jax.tree.leaves(lora_lib.split_adapters(
            full_grads)[0])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(f), rtol=1e-6, atol=1e-9)
    new, _ = jax.jit(lambda s, g: ts.apply_gradients(s, g, optimizer))(state, grads)
    new_adapters, new_base = lora_lib.split_adapters(new.params)
    for x, y in zip(jax.tree.leaves(new_base), jax.tree.leaves(base)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert all(float(jnp.abs(x - y).max()) > 0
               for x, y in zip(jax.tree.leaves(new_adapters), jax.tree.leaves(adapters)))


def test_full_finetuning_is_unchanged_without_adapters(mesh1):
    params = models.init_params(BASE, jax.random.key(0), mesh1, RULES)
    trainable, frozen = ts.split_trainable(params)
    assert trainable is params and frozen == {}


# ----------------------------------------------------------------------------- QLoRA


def test_int8_and_nf4_round_trips():
    w = jax.random.normal(jax.random.key(0), (64, 4, 16))
    q, scale = lora_lib.quantize_int8(w, 1)
    assert q.dtype == jnp.int8 and scale.shape == (1, 4, 16)
    err = np.abs(np.asarray(q, np.float32) * np.asarray(scale) - np.asarray(w))
    assert (err <= np.asarray(scale) / 2 + 1e-7).all()
    packed, absmax = lora_lib.quantize_nf4(w)
    assert packed.dtype == jnp.uint8 and packed.shape == (64, 4, 8) and absmax.shape == (64, 4, 1)
    levels = jnp.asarray(lora_lib.NF4_LEVELS)
    exact = levels[jax.random.randint(jax.random.key(1), (3, 32), 0, 16)] * 2.5
    exact = exact.at[:, 0].set(2.5)  # every block's absmax is 2.5
    back = lora_lib.dequantize_nf4(*lora_lib.quantize_nf4(exact), jnp.float32)
    np.testing.assert_allclose(np.asarray(back), np.asarray(exact), rtol=1e-6)
    back = lora_lib.dequantize_nf4(packed, absmax, jnp.float32)
    gap = np.diff(lora_lib.NF4_LEVELS).max() / 2
    assert (np.abs(np.asarray(back - w)) <= gap * np.asarray(absmax).repeat(16, -1) + 1e-6).all()


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_quantized_base_from_a_float_model(quant, mesh1):
    """attach_adapters quantizes a trained float base; the model then runs on the
    dequantized kernels, with the adapters (B = 0) changing nothing."""
    base = models.init_params(BASE, jax.random.key(0), mesh1, RULES)
    cfg = BASE.replace(lora={**LORA, "base_quant": quant})
    params = lora_params.attach_adapters(cfg, base, jax.random.key(1), mesh1, RULES)
    q_proj = params["layer_0"]["attn"]["q_proj"]
    assert set(q_proj) >= set(lora_lib.QUANT_KEYS[quant]) and "kernel" not in q_proj
    inputs = _inputs()
    out = Transformer(cfg).apply({"params": params}, *inputs)[0]
    dequantized = lora_params.merged_params(cfg, params)
    ref = Transformer(BASE).apply({"params": dequantized}, *inputs)[0]
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0,
                               atol=decoder_tolerance(BASE, base, tokens=7))
    plain = Transformer(BASE).apply({"params": base}, *inputs)[0]
    # quantization error: int8 keeps ~8 bits per weight, nf4 ~4 (mean drift of the logits
    # of this chaotic init_std=0.2 model, relative to their largest magnitude)
    drift = float(jnp.abs(out - plain).mean()) / float(jnp.abs(plain).max())
    assert 0 < drift < (0.02 if quant == "int8" else 0.2)
    # gradients flow to the adapters through the quantized base
    _, grads = ts.value_and_grad(lambda p: Transformer(cfg).apply(
        {"params": p}, *inputs)[0].sum())(params)
    assert float(jnp.abs(grads["layer_0"]["attn"]["q_proj"]["lora_b"]).max()) > 0


def test_adapters_and_quantized_leaves_are_sharded():
    mesh = shd.make_mesh({"fsdp": 4, "tensor": 2})
    cfg = BASE.replace(lora={**LORA, "base_quant": "int8"})
    params = models.init_params(cfg, jax.random.key(0), mesh, RULES)
    q = params["layer_0"]["attn"]["q_proj"]
    assert q["lora_a"].sharding.spec == jax.sharding.PartitionSpec("fsdp")       # embed
    assert q["lora_b"].sharding.spec == jax.sharding.PartitionSpec(None, "tensor")  # heads
    assert q["kernel_int8"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    down = params["layer_0"]["mlp"]["down_proj"]
    assert down["lora_a"].sharding.spec == jax.sharding.PartitionSpec("tensor")  # mlp


# ----------------------------------------------------------------------------- the sampler


def test_sampler_logprobs_equal_the_trainers(mesh1):
    """The sampler runs the same apply on the unmerged adapters: its log-probs are the
    scoring pass's (float32 bound of two summation orders)."""
    cfg = BASE.replace(lora={**LORA, "base_quant": "int8"})
    params = _randomize_b(models.init_params(cfg, jax.random.key(0), mesh1, RULES), scale=0.2)
    rng = np.random.default_rng(0)
    prompts = left_pad([list(rng.integers(1, cfg.vocab_size, n)) for n in (5, 3)], 5, 0)
    sampler = Sampler(Transformer(cfg), eos_id=1, pad_id=0, mesh=mesh1)
    out = jax.tree.map(np.asarray, sampler(params, *prompts, jax.random.key(3), num_samples=2,
                                           max_new_tokens=6, temperature=1.0))
    prompt_tokens, prompt_valid = (np.repeat(x, 2, axis=0) for x in prompts)
    mask = scoring.completion_mask_from_lengths(jnp.asarray(out.lengths), 6)
    logp, _ = scoring.completion_logprobs(Transformer(cfg), params, prompt_tokens, prompt_valid,
                                          jnp.asarray(out.tokens), mask, with_entropy=False)
    np.testing.assert_allclose(out.logprobs, np.asarray(logp), rtol=0,
                               atol=decoder_tolerance(cfg, params, tokens=11))
    # with the adapters removed, the same sampler program family gives the base policy
    base_logp, _ = scoring.completion_logprobs(
        Transformer(cfg), lora_lib.without_adapters(params), prompt_tokens, prompt_valid,
        jnp.asarray(out.tokens), mask, with_entropy=False)
    assert float(jnp.abs(base_logp - logp).max()) > 1e-4


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("lora,message", [
    ({"rank": 0}, "rank must be a positive int"),
    ({"r": -2}, "rank must be a positive int"),
    ({"targets": ("qproj",)}, "target 'qproj' matches no projection"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target 'lm_head' matches no projection"),
    ({"targets": ("q_proj(",)}, "is not a valid regex"),
    ({"base_quant": "int4"}, "base_quant must be one of"),
    ({"dropout": 1.5}, "dropout must be a float in [0, 1)"),
    ({"rank": 4, "r": 4}, "'rank' is given twice"),
    ({"ranks": 4}, "unknown key 'ranks'"),
])
def test_bad_lora_configs_are_refused(lora, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BASE.replace(lora=lora)


def test_peft_names_and_round_trip_through_a_dict():
    cfg = BASE.replace(lora={"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
                             "target_modules": ["q_proj", "v_proj"]})
    assert cfg.lora == lora_lib.LoraConfig(rank=16, alpha=32, targets=("q_proj", "v_proj"))
    import dataclasses
    assert models.ModelConfig(**dataclasses.asdict(cfg)) == cfg
    assert hash(cfg) == hash(models.ModelConfig(**dataclasses.asdict(cfg)))


def test_hf_model_takes_the_lora_block_as_a_knob():
    """With hf_model the architecture comes from config.json and model.lora still applies."""
    import os

    import ml_collections

    from jaxrl_reason.runtime.build import hf_model_config
    path = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2")
    config = ml_collections.ConfigDict({"hf_model": path, "model": {
        "dtype": "float32", "lora": {"r": 2, "target_modules": ["q_proj", "v_proj"],
                                     "base_quant": "nf4"}}})
    cfg = hf_model_config(config, 0)
    assert cfg.qkv_bias and cfg.lora == lora_lib.LoraConfig(
        rank=2, targets=("q_proj", "v_proj"), base_quant="nf4")
