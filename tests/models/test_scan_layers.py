"""`ModelConfig.scan_layers`: the decoder blocks as one nn.scan over stacked params gives the
same logits, gradients (every remat policy), KV-cached prefill/decode and samples as the
unrolled layer_i stack, for every family switch; stack_layers/unstack_layers convert exactly
and keep each leaf's sharding; the run-level paths (init_checkpoint of the other layout) work."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models.params import (cache_length, init_cache, is_stacked, pad_cache,
                                        repeat_cache)
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import Sampler, left_pad
from numerics import decoder_tolerance, kv_cache_tolerance

FAMILIES = {
    "llama3": dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_original_max_position=8),
    "qwen2": dict(qkv_bias=True, tie_embeddings=True),
    "qwen3": dict(qk_norm=True),
    "gemma2": dict(activation="gelu_tanh", embed_scale=True, norm_plus_one=True,
                   post_norms=True, attn_logit_softcap=5.0, final_logit_softcap=10.0,
                   query_pre_attn_scalar=12.0, sliding_window=3, sliding_window_pattern=2),
    "gemma3": dict(activation="gelu_tanh", embed_scale=True, norm_plus_one=True,
                   post_norms=True, qk_norm=True, sliding_window=3, sliding_window_pattern=3,
                   rope_local_theta=100.0, rope_scaling="linear", rope_scaling_factor=2.0),
    "all_sliding": dict(sliding_window=2),
}


@pytest.fixture(scope="module")
def mesh():
    return shd.make_mesh({"fsdp": 4, "tensor": 2})


def _pair(changes, mesh, **extra):
    cfg = models.get_preset("test", n_layers=3, init_std=0.2, **changes, **extra)
    params = models.init_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    scfg = cfg.replace(scan_layers=True)
    return cfg, params, scfg, models.stack_layers(scfg, params)


def _inputs(batch=2, length=9):
    tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, 128)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    return tokens, positions, jnp.ones((batch, length), bool)


def _max_rel(a, b):
    diffs = [float(jnp.abs(x - y).max() / (jnp.abs(x).max() + 1e-9))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    return max(diffs)


# Every family switch without remat; the remat policies (which only change what the backward
# pass keeps) on Gemma 2, whose blocks have the most parts (post-norms, soft-caps, windows).
@pytest.mark.parametrize("family, remats", [(f, ("none",)) for f in sorted(FAMILIES)
                                            if f != "gemma2"]
                         + [("gemma2", ("none", "block", "save_dots"))])
def test_forward_and_gradients_match_the_unrolled_stack(family, remats, mesh):
    cfg, params, scfg, sparams = _pair(FAMILIES[family], mesh)
    tokens, positions, valid = _inputs()

    def loss(p, c):
        logits, _ = Transformer(c).apply({"params": p}, tokens, positions, valid)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    a, ga = grad(params, cfg)
    for remat in remats:
        b, gb = grad(sparams, scfg.replace(remat=remat))
        # Another program (a scanned block), other fusions: the float32 bound of the
        # log-probs (tests/numerics.py), averaged.
        np.testing.assert_allclose(float(a), float(b), rtol=0,
                                   atol=decoder_tolerance(cfg, params, tokens=9))
        assert _max_rel(ga, models.unstack_layers(scfg, gb)) < 1e-4, remat


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "llama3"])
def test_cached_prefill_and_decode_match(family, mesh):
    cfg, params, scfg, sparams = _pair(FAMILIES[family], mesh)
    tokens, positions, valid = _inputs()
    key_valid = jnp.concatenate([valid, jnp.zeros((2, 4), bool)], axis=1)
    outs = []
    for c, p in ((cfg, params), (scfg, sparams)):
        model = Transformer(c)
        cache = init_cache(c, 2, 13)
        logits, cache = model.apply({"params": p}, tokens, positions, key_valid, cache, 0)
        step_valid = key_valid.at[:, 9].set(True)
        step, cache = model.apply({"params": p}, tokens[:, :1], positions[:, :1] + 9,
                                  step_valid, cache, 9)
        outs.append((logits, step, cache))
    (la, sa, ca), (lb, sb, cb) = outs
    # Scanned vs unrolled programs fuse and sum in other orders (tests/numerics.py).
    atol = decoder_tolerance(cfg, params, tokens=13)
    np.testing.assert_allclose(np.asarray(la), np.asarray(lb), rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(sa), np.asarray(sb), rtol=0, atol=atol)
    assert isinstance(ca, tuple) and set(cb) == {"k", "v"}
    np.testing.assert_allclose(np.stack([np.asarray(c["k"]) for c in ca]),
                               np.asarray(cb["k"]), rtol=0,
                               atol=kv_cache_tolerance(cfg, params, tokens=13))


@pytest.mark.parametrize("family", ["gemma2", "qwen2"])
def test_sampler_gives_the_same_tokens(family, mesh):
    cfg, params, scfg, sparams = _pair(FAMILIES[family], mesh)
    tokens, valid = left_pad([[5, 6, 7], [8, 9, 10, 11, 12]], 6, pad_id=0)
    outs = []
    for c, p in ((cfg, params), (scfg, sparams)):
        sampler = Sampler(Transformer(c), eos_id=-1, pad_id=0, mesh=mesh,
                          rules=shd.DEFAULT_RULES)
        out = sampler(p, tokens, valid, jax.random.key(3), num_samples=3, max_new_tokens=7,
                      temperature=0.0)
        outs.append(np.asarray(out.tokens))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_stack_and_unstack_are_exact_and_keep_shardings(mesh):
    cfg, params, scfg, sparams = _pair({}, mesh)
    assert is_stacked(sparams) and not is_stacked(params)
    abstract = models.abstract_params(scfg)
    assert jax.tree.structure(abstract) == jax.tree.structure(sparams)
    expected = models.param_shardings(scfg, mesh, shd.DEFAULT_RULES)
    for x, s, a in zip(jax.tree.leaves(sparams), jax.tree.leaves(expected),
                       jax.tree.leaves(abstract)):
        assert x.shape == a.shape and x.sharding.is_equivalent_to(s, x.ndim)
    axes = models.param_logical_axes(scfg)
    assert axes["layers"]["mlp"]["gate_proj"]["kernel"] == ("layers", "embed", "mlp")
    back = models.unstack_layers(scfg, sparams)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                            jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))
        assert x.sharding.is_equivalent_to(y.sharding, x.ndim), path
    assert models.to_layout(cfg, sparams).keys() == params.keys()
    assert models.to_layout(scfg, params).keys() == sparams.keys()
    # consume=True takes the layers out of the given dict.
    copy = dict(params)
    models.stack_layers(scfg, copy, consume=True)
    assert not any(k.startswith("layer_") for k in copy)
    with pytest.raises(ValueError, match="no layer_2"):
        models.stack_layers(scfg, {k: v for k, v in params.items() if k != "layer_2"})


def test_cache_helpers_work_on_both_layouts():
    for scan in (False, True):
        cfg = models.get_preset("test", scan_layers=scan)
        # Row b of every cache leaf holds the value b; its batch axis is 1 when stacked.
        rows = jnp.arange(2.0).reshape((1,) * scan + (2, 1, 1, 1))
        cache = jax.tree.map(lambda x: x + rows, init_cache(cfg, 2, 5))
        assert cache_length(cache) == 5
        assert cache_length(pad_cache(cache, 3)) == 8
        leaf = jax.tree.leaves(repeat_cache(cache, 3))[0]
        batch = leaf[0, :, 0, 0, 0] if scan else leaf[:, 0, 0, 0]
        np.testing.assert_array_equal(np.asarray(batch), [0, 0, 0, 1, 1, 1])


def test_scan_layers_must_be_a_bool():
    with pytest.raises(ValueError, match="scan_layers must be true or false"):
        models.get_preset("test", scan_layers="yes")
