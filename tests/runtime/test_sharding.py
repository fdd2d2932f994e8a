"""Mesh shapes, logical-axis rules, sharded parameter initialisation and batch placement."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd

RULES = shd.DEFAULT_RULES


def is_axes(t):
    """A logical-axes leaf: a tuple of names (or None)."""
    return isinstance(t, tuple) and all(isinstance(n, (str, type(None))) for n in t)


# ----------------------------------------------------------------------------- mesh shape


@pytest.mark.parametrize("shape, want", [
    ({"data": -1}, (8, 1, 1, 1)),
    ({"data": -1, "fsdp": 2}, (4, 2, 1, 1)),
    ({"data": 2, "fsdp": 2, "tensor": -1}, (2, 2, 2, 1)),
    ({"fsdp": -1, "tensor": 8}, (1, 1, 8, 1)),
    ({"data": 2, "fsdp": 2, "tensor": 2}, (2, 2, 2, 1)),
    ({"data": 2, "context": -1}, (2, 1, 1, 4)),
    ({}, None),
])
def test_resolve_mesh_shape(shape, want):
    if want is None:  # everything defaults to 1, which is not 8 devices
        with pytest.raises(ValueError, match="need 1 devices, but 8 are available"):
            shd.resolve_mesh_shape(shape, 8)
    else:
        assert shd.resolve_mesh_shape(shape, 8) == want
    assert shd.resolve_mesh_shape({}, 1) == (1, 1, 1, 1)


@pytest.mark.parametrize("shape, match", [
    ({"data": -1, "fsdp": -1}, "at most one axis may be -1"),
    ({"data": -1, "fsdp": 3}, r"product 3\) do not divide the 8 available devices"),
    ({"data": 3}, "need 3 devices, but 8 are available"),
    ({"data": 4, "fsdp": 4}, "need 16 devices"),
    ({"data": 0, "fsdp": -1}, "positive or -1"),
    ({"data": -2}, "positive or -1"),
    ({"model": 8}, r"unknown axes \['model'\]"),
])
def test_resolve_mesh_shape_errors(shape, match):
    with pytest.raises(ValueError, match=match):
        shd.resolve_mesh_shape(shape, 8)


@pytest.mark.parametrize("sizes", [(8, 1, 1, 1), (2, 2, 2, 1), (1, 8, 1, 1), (2, 1, 1, 4)])
def test_make_mesh_on_eight_devices(sizes):
    assert jax.device_count() == 8
    mesh = shd.make_mesh(dict(zip(shd.MESH_AXES, sizes)))
    assert mesh.axis_names == shd.MESH_AXES
    assert tuple(mesh.shape[a] for a in shd.MESH_AXES) == sizes
    assert mesh.devices.shape == sizes
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_with_explicit_devices():
    mesh = shd.make_mesh({"data": -1}, devices=jax.devices()[:2])
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 1, "context": 1}
    with pytest.raises(ValueError, match="need 8 devices, but 2"):
        shd.make_mesh({"data": 8}, devices=jax.devices()[:2])


# ----------------------------------------------------------------------------- specs


def test_logical_to_spec_follows_rules_without_a_mesh():
    fsdp_context = ("fsdp", "context")  # the weights' model dim: shards, not copies, on context
    assert shd.logical_to_spec(("vocab", "embed"), RULES) == P("tensor", fsdp_context)
    assert shd.logical_to_spec(("embed", "mlp"), RULES) == P(fsdp_context, "tensor")
    # Canonical specs: trailing replicated dimensions are left out (as jit returns them).
    assert shd.logical_to_spec((None, "head_dim", "unlisted"), RULES) == P()
    # A mesh axis is used at most once per array: batch takes data+fsdp, embed gets nothing.
    assert shd.logical_to_spec(("batch", "length", "embed"), RULES) == P(("data", "fsdp"),
                                                                          "context")
    custom = (("embed", ("fsdp", "tensor")), ("mlp", "tensor"))
    assert shd.logical_to_spec(("embed", "mlp"), custom) == P(("fsdp", "tensor"))
    assert shd.logical_to_spec(("mlp", "embed"), custom) == P("tensor", "fsdp")


def test_logical_to_spec_with_mesh_drops_trivial_and_non_dividing_axes():
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    spec = lambda names, shape: shd.logical_to_spec(names, RULES, shape, mesh)  # noqa: E731
    assert spec(("vocab", "embed"), (128, 64)) == P("tensor", "fsdp")
    assert spec(("vocab", "embed"), (127, 64)) == P(None, "fsdp")  # 127 % 2: replicated
    assert spec(("batch", "length"), (8, 5)) == P(("data", "fsdp"))
    assert spec(("batch", "length"), (6, 5)) == P()  # 6 % 4: replicated
    # A replicated dimension does not use up its axes.
    assert spec(("kv_heads", "mlp"), (3, 4)) == P(None, "tensor")
    data_only = shd.make_mesh({"data": 8})
    assert shd.logical_to_spec(("batch", "embed"), RULES, (16, 64), data_only) == P("data")
    assert shd.logical_to_spec(("vocab", "embed"), RULES, (128, 64), data_only) == P()


def test_tree_shardings_and_batch_sharding():
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    logical = {"w": ("embed", "mlp"), "b": ("mlp",)}
    shapes = {"w": jax.ShapeDtypeStruct((64, 6), np.float32),
              "b": jax.ShapeDtypeStruct((5,), np.float32)}
    out = shd.tree_shardings(mesh, logical, shapes, RULES)
    assert out["w"].spec == P("fsdp", "tensor") and out["b"].spec == P()
    assert shd.batch_sharding(mesh, RULES, 3, 8).spec == P(("data", "fsdp"))
    assert shd.data_parallel_size(mesh, RULES) == 4
    assert shd.replicated(mesh).spec == P()


# ----------------------------------------------------------------------------- placement


def test_init_params_on_a_2x2x2_mesh_follows_the_rules():
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    cfg = models.get_preset("test", vocab_size=129, tie_embeddings=False)  # 129 % 2 != 0
    params = models.init_params(cfg, jax.random.key(0), mesh, RULES)
    axes = jax.tree.leaves(models.param_logical_axes(cfg), is_leaf=is_axes)
    leaves = jax.tree.leaves(params)
    assert len(axes) == len(leaves)
    used = set()
    for names, leaf in zip(axes, leaves):
        want = shd.logical_to_spec(names, RULES, leaf.shape, mesh)
        assert leaf.sharding.mesh.shape == mesh.shape
        assert tuple(leaf.sharding.spec) + (None,) * (leaf.ndim - len(leaf.sharding.spec)) \
            == tuple(want) + (None,) * (leaf.ndim - len(want)), names
        used.update(a for a in want if a is not None)
    assert {"fsdp", "tensor"} <= used  # the test is not vacuous
    # vocab=129 does not split over tensor=2, so it is replicated; embed=64 splits over fsdp.
    assert tuple(params["embedding"].sharding.spec) == (None, "fsdp")
    assert params["embedding"].addressable_shards[0].data.shape == (129, 32)
    assert tuple(params["lm_head"].sharding.spec) == ("fsdp",)
    q_kernel = params["layer_0"]["attn"]["q_proj"]["kernel"]  # embed, heads, head_dim
    assert q_kernel.addressable_shards[0].data.shape == (32, 2, 16)


def test_put_batch_splits_rows_or_fails_clearly():
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    batch = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    placed = shd.put_batch(mesh, RULES, batch)
    np.testing.assert_array_equal(np.asarray(placed), batch)
    assert placed.sharding.spec == P(("data", "fsdp"))
    assert placed.addressable_shards[0].data.shape == (2, 3)
    with pytest.raises(ValueError, match="batch of 6 rows does not split over the 4"):
        shd.put_batch(mesh, RULES, batch[:6])
    one_device = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    np.testing.assert_array_equal(np.asarray(shd.put_batch(one_device, RULES, batch[:5])),
                                  batch[:5])


def test_a_donated_update_compiles_once():
    """Params' specs are canonical (no trailing None) and the state's scalars live on the
    mesh, so the state an update returns has the layout it was given: one compile."""
    import jax.numpy as jnp

    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.runtime.train_state import apply_gradients, create_train_state, make_optimizer

    mesh = shd.make_mesh({"data": -1})
    params = init_params(get_preset("test"), jax.random.key(0), mesh, shd.DEFAULT_RULES)
    opt = make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=1.0)
    state = create_train_state(params, opt)
    update = jax.jit(lambda s: apply_gradients(s, jax.tree.map(jnp.ones_like, s.params), opt)[0],
                     donate_argnums=0)
    for _ in range(3):
        state = update(state)
    assert update._cache_size() == 1


def test_optimizer_state_is_sharded_like_the_params_and_stays_so():
    """ZeRO-3: Adam's moments take their param's sharding (zeros_like alone would leave them
    replicated on every device), also after donated updates; the step count is replicated."""
    import jax.numpy as jnp

    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.runtime.train_state import apply_gradients, create_train_state, make_optimizer

    mesh = shd.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    params = init_params(get_preset("test"), jax.random.key(0), mesh, shd.DEFAULT_RULES)
    opt = make_optimizer(1e-3, weight_decay=0.1, max_grad_norm=1.0)
    state = create_train_state(params, opt)
    update = jax.jit(lambda s: apply_gradients(s, jax.tree.map(jnp.ones_like, s.params), opt)[0],
                     donate_argnums=0)
    for _ in range(2):
        for moments in (state.opt_state[1][0].mu, state.opt_state[1][0].nu):
            for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(moments)):
                assert m.sharding.is_equivalent_to(p.sharding, p.ndim), (m.sharding, p.sharding)
        assert state.opt_state[1][0].count.sharding.is_fully_replicated
        state = update(state)
    sharded = [p for p in jax.tree.leaves(state.params) if not p.sharding.is_fully_replicated]
    assert sharded  # the test would be vacuous if nothing were sharded


def _fsdp_residual_sharding(scan: bool, context: bool):
    """Sharding of the residual stream inside a jitted forward+backward of a 2-layer model
    whose weights are FSDP-sharded over 8 devices (the block output, read back through
    return_hidden)."""
    import jax.numpy as jnp

    mesh = shd.make_mesh({"fsdp": 8})
    cfg = models.get_preset("test", d_model=64, scan_layers=scan)
    params = models.init_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    tokens = shd.put_batch(mesh, shd.DEFAULT_RULES, np.zeros((8, 16), np.int32))
    valid = shd.put_batch(mesh, shd.DEFAULT_RULES, np.ones((8, 16), bool))
    model = models.Transformer(cfg)

    def fn(p, t, v):
        hidden, _ = model.apply({"params": p}, t, t, v, return_hidden=True)
        return hidden

    wrapped = shd.with_activation_sharding(fn, mesh, shd.DEFAULT_RULES) if context else fn
    return jax.jit(wrapped)(params, tokens, valid).sharding


@pytest.mark.parametrize("scan", [False, True])
def test_activations_are_batch_sharded_under_activation_sharding(scan):
    """Inside `with_activation_sharding` the residual stream is split over the batch (the
    FSDP layout: weights sharded, activations batch-sharded), in the unrolled and the scanned
    stack; `constrain` is a no-op outside the context."""
    sharding = _fsdp_residual_sharding(scan, context=True)
    assert sharding.spec == P("fsdp"), sharding.spec
    x = np.ones((8, 4), np.float32)
    assert shd.constrain(x, ("batch", None)) is x
    mesh = shd.make_mesh({"fsdp": 8})
    with shd.activation_sharding(mesh, shd.DEFAULT_RULES):
        y = jax.jit(lambda a: shd.constrain(a, ("batch", None)))(x)
    assert y.sharding.spec == P("fsdp")
