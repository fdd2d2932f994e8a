"""Mesh construction and logical-axis sharding.

Layers name logical axes only (`embed`, `mlp`, `heads`, `kv_heads`, `head_dim`, `vocab`,
`batch`, `length`, `cache_length`); a short list of rules in the config maps them onto the
mesh axes `data`, `fsdp`, `tensor` and `context`. Sharding is data: changing the parallelism
of a run is a config change.

`context` (context parallelism) splits the sequence of the training-side passes: the rule
("length", "context") shards the activations' length axis, and attention gathers the keys
and values of the whole sequence along it (`models.attention`). A model call with a KV cache
(prefill, decode, cached scoring) keeps its length axis unsharded (`unsharded_length`), and
the sampler splits its rows over the context axis instead (`sampling_rules`).

The mesh uses `AxisType.Auto` axes: arrays carry `NamedSharding`s and XLA's SPMD partitioner
propagates them through the jitted programs, so model code needs no explicit sharding types.
A logical dimension whose size the assigned mesh axes do not divide is replicated instead
(tiny test models on 8 devices), never an error.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor", "context")
CONTEXT_AXIS = "context"

# Default logical-axis rules: batch over data+fsdp, weights' embed dim over fsdp and context
# (ZeRO-3 style: the context chips hold shards of the weights, not copies), heads/mlp/vocab
# over tensor, the activations' sequence over context (a no-op at the default context size
# 1). Anything not listed is replicated.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", ("fsdp", "context")),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "tensor"),
    ("head_dim", None),
    ("length", "context"),
    ("cache_length", None),
)


def resolve_mesh_shape(shape: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Resolves a `{axis: size}` mapping (one size may be -1) to sizes for MESH_AXES.

    Raises ValueError naming the axis when sizes do not multiply to `num_devices`.
    """
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh: unknown axes {sorted(unknown)}; axes are {MESH_AXES}")
    sizes = [int(shape.get(axis, 1)) for axis in MESH_AXES]
    free = [i for i, s in enumerate(sizes) if s == -1]
    if len(free) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {dict(shape)}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh: axis sizes must be positive or -1, got {dict(shape)}")
    fixed = math.prod(s for s in sizes if s != -1)
    if free:
        if num_devices % fixed:
            raise ValueError(
                f"mesh: fixed axes {dict(shape)} (product {fixed}) do not divide the "
                f"{num_devices} available devices")
        sizes[free[0]] = num_devices // fixed
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh: axes {dict(zip(MESH_AXES, sizes))} need {math.prod(sizes)} devices, "
            f"but {num_devices} are available")
    return tuple(sizes)


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None,
              dcn: Mapping[str, int] | None = None) -> Mesh:
    """Builds a Mesh with axes ("data", "fsdp", "tensor", "context") and Auto axis types.

    Args:
      shape: global axis sizes, e.g. {"data": -1, "fsdp": 1, "tensor": 1, "context": 1}; -1
        takes all remaining devices; a missing axis has size 1.
      devices: defaults to `jax.devices()`: the devices of every process on multi-host, in
        process order, so one slice's (or host's) devices are contiguous along the outermost
        axis that is split over processes.
      dcn: multi-slice; how many slices each axis spans, e.g. {"data": 2} for a data axis
        split over two TPU slices that talk over the data-center network (each slice holds
        `shape / dcn` of every axis, laid out over its fast interconnect by
        `mesh_utils.create_hybrid_device_mesh`). A "slice" is a TPU device's `slice_index`,
        or a device's process on other platforms (GPU hosts, CPU processes). None or all 1:
        one slice, devices reshaped in order.
    Raises ValueError when the sizes do not fit the devices or `dcn` does not divide them.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(shape, len(devices))
    dcn_sizes = resolve_dcn_shape(dcn or {}, sizes)
    if math.prod(dcn_sizes) == 1:
        device_array = np.asarray(devices, dtype=object).reshape(sizes)
    else:
        device_array = _hybrid_device_array(sizes, dcn_sizes, devices)
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return Mesh(device_array, MESH_AXES, axis_types=auto)


def resolve_dcn_shape(dcn: Mapping[str, int], sizes: Sequence[int]) -> tuple[int, ...]:
    """Per-axis slice counts (MESH_AXES order) of a `{axis: slices}` mapping; each must be
    >= 1 and divide that axis's global size. Raises ValueError naming the axis."""
    unknown = set(dcn) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"dcn_mesh: unknown axes {sorted(unknown)}; axes are {MESH_AXES}")
    out = tuple(int(dcn.get(axis, 1)) for axis in MESH_AXES)
    for axis, n, size in zip(MESH_AXES, out, sizes):
        if n < 1 or size % n:
            raise ValueError(f"dcn_mesh: {axis}={n} slices must be >= 1 and divide the mesh's "
                             f"{axis} axis of {size} devices")
    return out


def _hybrid_device_array(sizes: Sequence[int], dcn_sizes: Sequence[int],
                         devices: Sequence[Any]) -> np.ndarray:
    """Devices [*sizes]: `dcn_sizes` slices along each axis (outer), each slice's devices
    arranged for its interconnect (inner)."""
    from jax.experimental import mesh_utils
    ici = tuple(s // d for s, d in zip(sizes, dcn_sizes))
    # TPU devices know their slice; elsewhere (GPU hosts, CPU processes) a process is one.
    by_process = (getattr(devices[0], "platform", "") != "tpu"
                  or getattr(devices[0], "slice_index", None) is None)
    granules = {getattr(d, "process_index" if by_process else "slice_index") for d in devices}
    if len(granules) != math.prod(dcn_sizes):
        kind = "processes" if by_process else "slices"
        raise ValueError(f"dcn_mesh: {dict(zip(MESH_AXES, dcn_sizes))} asks for "
                         f"{math.prod(dcn_sizes)} slices, but the devices belong to "
                         f"{len(granules)} {kind}")
    return mesh_utils.create_hybrid_device_mesh(ici, tuple(dcn_sizes), devices,
                                                process_is_granule=by_process)


def rule_axes(rules: Iterable[tuple[str, Any]], name: str | None) -> tuple[str, ...]:
    """The mesh axes a logical axis maps to under `rules`, as a tuple: () for None, an
    unlisted name, or a rule to None; (axis,) for one axis."""
    target = dict(rules).get(name) if name is not None else None
    return () if target is None else ((target,) if isinstance(target, str) else tuple(target))


def logical_to_spec(logical: Sequence[str | None], rules: Iterable[tuple[str, Any]],
                    shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> P:
    """Maps logical axis names to a PartitionSpec over mesh axes.

    Args:
      logical: one logical name (or None) per array dimension.
      rules: (logical name, mesh axis | tuple of mesh axes | None) pairs.
      shape, mesh: when both are given, a dimension whose size the mesh axes do not divide
        is replicated, and a mesh axis is used at most once per array.
    """
    rules = tuple(rules)
    used: set[str] = set()
    out = []
    for dim, name in enumerate(logical):
        axes = tuple(a for a in rule_axes(rules, name) if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if mesh.shape[a] > 1)
        if shape is not None and mesh is not None and axes:
            if shape[dim] % math.prod(mesh.shape[a] for a in axes):
                axes = ()
        used.update(axes)
        out.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    # Canonical form, as jit returns it: P("fsdp", None) is P("fsdp") and P(None) is P().
    # A donated update's outputs then match its inputs, so it compiles once, not twice.
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def named_sharding(mesh: Mesh, logical: Sequence[str | None], rules: Iterable[tuple[str, Any]],
                   shape: Sequence[int] | None = None) -> NamedSharding:
    """NamedSharding for an array with the given logical axes (see `logical_to_spec`)."""
    return NamedSharding(mesh, logical_to_spec(logical, rules, shape, mesh))


def tree_shardings(mesh: Mesh, logical_tree: Any, shapes_tree: Any,
                   rules: Iterable[tuple[str, Any]]) -> Any:
    """Maps a pytree of logical-axis tuples and a matching pytree of shapes to shardings.

    `logical_tree` leaves are tuples of names (treated as leaves); `shapes_tree` leaves are
    arrays or ShapeDtypeStructs.
    """
    rules = tuple(rules)
    return jax.tree.map(
        lambda names, x: named_sharding(mesh, names, rules, x.shape),
        logical_tree, shapes_tree,
        is_leaf=lambda t: isinstance(t, tuple) and all(isinstance(n, (str, type(None))) for n in t))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on `mesh`."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, rules: Iterable[tuple[str, Any]], ndim: int,
                   batch_size: int) -> NamedSharding:
    """Sharding of a `[batch, ...]` array: batch over the `batch` rule, the rest replicated."""
    return named_sharding(mesh, ("batch",) + (None,) * (ndim - 1), rules,
                          (batch_size,) + (1,) * (ndim - 1))


def data_parallel_size(mesh: Mesh, rules: Iterable[tuple[str, Any]]) -> int:
    """Number of shards the `batch` logical axis is split into on `mesh`."""
    return math.prod(mesh.shape[a] for a in rule_axes(rules, "batch"))


def put_batch(mesh: Mesh, rules: Iterable[tuple[str, Any]], array: np.ndarray) -> jax.Array:
    """Places a host batch (identical on every process) on the mesh, batch-sharded. On
    multi-host, each process fills only the shards of its own devices from its copy.

    Raises ValueError when the batch does not split evenly over the data-parallel shards.
    """
    array = np.asarray(array)
    dp = data_parallel_size(mesh, rules)
    if array.shape[0] % dp:
        raise ValueError(f"batch of {array.shape[0]} rows does not split over the "
                         f"{dp} data-parallel shards of the mesh {dict(mesh.shape)}")
    sharding = batch_sharding(mesh, rules, array.ndim, array.shape[0])
    return jax.make_array_from_callback(array.shape, sharding, lambda idx: array[idx])


def put_replicated(mesh: Mesh, array: np.ndarray) -> jax.Array:
    """Places a host array (identical on every process) on every device of the mesh."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, replicated(mesh), lambda idx: array[idx])


def to_memory(tree: Any, kind: str) -> Any:
    """`tree`'s arrays moved to memory `kind` ("device" or "pinned_host": host RAM the chip
    reads by DMA), each keeping its sharding's layout; leaves already there are returned
    as they are. Host offload frees HBM for arrays a program does not read (the frozen
    reference during the update, the optimizer state while sampling)."""
    def move(x):
        if not isinstance(x, jax.Array) or x.sharding.memory_kind == kind:
            return x
        return jax.device_put(x, x.sharding.with_memory_kind(kind))
    return jax.tree.map(move, tree)


# ----------------------------------------------------------------------------- activations
# The model knows no mesh; the jitted steps (update, log-prob pass, sampler, SFT) trace it
# inside `activation_sharding(mesh, rules)`, and `constrain` then pins its activations
# (residual stream, MLP hidden) to their logical layout. Without it XLA's partitioner may
# follow the FSDP-sharded weights instead, sharding activations over `embed` and
# replicating the batch: on the Qwen2.5-7B update that made each chip hold the whole
# micro-batch's [8, 5k, 18944] MLP activations.
_ACTIVATION_CONTEXT: contextvars.ContextVar = contextvars.ContextVar(
    "jaxrl_reason_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: Iterable[tuple[str, Any]]):
    """While tracing inside this context, `constrain` lays activations out on `mesh` by
    `rules` (a no-op context when mesh is None)."""
    token = _ACTIVATION_CONTEXT.set(None if mesh is None else (mesh, tuple(rules)))
    try:
        yield
    finally:
        _ACTIVATION_CONTEXT.reset(token)


def with_activation_sharding(fn, mesh: Mesh | None, rules: Iterable[tuple[str, Any]]):
    """`fn` traced inside `activation_sharding(mesh, rules)` (for wrapping before jax.jit)."""
    if mesh is None:
        return fn
    rules = tuple(rules)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with activation_sharding(mesh, rules):
            return fn(*args, **kwargs)
    return wrapped


def activation_context() -> tuple[Mesh, tuple] | None:
    """(mesh, rules) of the innermost `activation_sharding` context, or None outside one
    (for code that must lay out a computation by hand, e.g. a kernel under `shard_map`)."""
    return _ACTIVATION_CONTEXT.get()


def context_parallel_size(mesh: Mesh, rules: Iterable[tuple[str, Any]]) -> int:
    """Number of shards the `length` logical axis (the training passes' sequence) is split
    into on `mesh` by `rules`: the product of its mesh axes' sizes (1 without a rule)."""
    return math.prod(mesh.shape[a] for a in rule_axes(rules, "length"))


def sampling_rules(rules: Iterable[tuple[str, Any]], mesh: Mesh | None) -> tuple:
    """The rules of the sampler: the mesh axes that split the training passes' sequence
    ("length", i.e. context) split its rows instead ("batch" gains them, "length" maps to
    nothing). Decoding keeps whole sequences (`unsharded_length`), so under context
    parallelism the context chips would otherwise all decode the same rows; this way each
    decodes its own and holds the KV cache of its own rows. `rules` unchanged when those
    axes have size 1 (or without a mesh)."""
    rules = tuple(rules)
    length = rule_axes(rules, "length")
    if mesh is None or math.prod(mesh.shape[a] for a in length if a in mesh.shape) == 1:
        return rules
    batch = rule_axes(rules, "batch")
    extra = tuple(a for a in length if a not in batch)
    return tuple((name, batch + extra if name == "batch" else None if name == "length"
                  else axes) for name, axes in rules)


@contextlib.contextmanager
def unsharded_length():
    """While tracing inside this context, `constrain` lays activations out by
    `sampling_rules`: the `length` logical axis is whole and its mesh axes split the rows
    instead (the model's calls with a KV cache: prefill, decode and cached scoring keep
    whole sequences under context parallelism, and the context chips share the rows rather
    than repeat them). A no-op outside an `activation_sharding` context."""
    ctx = _ACTIVATION_CONTEXT.get()
    if ctx is None:
        yield
        return
    mesh, rules = ctx
    token = _ACTIVATION_CONTEXT.set((mesh, sampling_rules(rules, mesh)))
    try:
        yield
    finally:
        _ACTIVATION_CONTEXT.reset(token)


def active_spec(logical: Sequence[str | None], shape: Sequence[int]) -> P | None:
    """The PartitionSpec of an array of `shape` with these logical axes under the active
    `activation_sharding` context (`logical_to_spec`), or None outside one."""
    ctx = _ACTIVATION_CONTEXT.get()
    if ctx is None:
        return None
    mesh, rules = ctx
    return logical_to_spec(logical, rules, shape, mesh)


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the sharding of its logical axes under the active
    `activation_sharding` context; unchanged outside one (or where a dimension does not
    divide, that dimension is replicated, as for params)."""
    ctx = _ACTIVATION_CONTEXT.get()
    if ctx is None:
        return x
    mesh, rules = ctx
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical, rules, x.shape))
