"""LoRA adapters and a quantized frozen base (QLoRA) on the decoder's projections.

A targeted projection computes y = x W (+ b) + (alpha / rank) * (x A) B, with A [in..., r]
and B [r, out...] (B starts at zero, so a fresh adapter leaves the model unchanged). The
adapters are ordinary leaves `lora_a` / `lora_b` next to the projection's `kernel`, so the
sampler, the trainer and the scorer all run the same `Transformer.apply` on one params tree:
nothing is merged or synced. A projection whose params hold no `lora_a` runs without its
adapter, so `without_adapters(params)` (the same arrays minus the adapter leaves) is the
frozen base model: the reference policy of KL-regularised RL costs no parameter memory.

QLoRA: with `base_quant` the projections' kernels are held quantized and dequantized at each
use: "int8" (symmetric, one float32 scale per output channel: `kernel_int8`,
`kernel_scale`) or "nf4" (4-bit NormalFloat of Dettmers et al. 2023, two codes per byte
along the last axis, one float32 absmax per block of up to 64 values of the last axis:
`kernel_nf4`, `kernel_absmax`). Embeddings, norms and the LM head stay in `param_dtype`.
A projection that holds a float `kernel` uses it whatever `base_quant` says, so a LoRA model
also runs the plain params of the base it was attached to (`lora_params.attach_adapters`).

Dropout (`dropout` > 0) acts on the adapter's input only, and only in an apply given a
`DROPOUT_RNG` key: the policy and SFT updates pass one (`dropout_key`, folded from the seed
and the optimizer step, so --resume redraws the same masks); the sampler, the old-policy and
reference log-prob passes, the critic's passes and evaluation pass none and run the adapter
deterministically.

Hand-written rather than qwix: qwix intercepts `lax.dot_general`/einsum calls inside a
module, while our CPU projections go through a custom-VJP matmul
(`transformer.cpu_dense_dot_general`) it does not see; and the two properties this module
is for, a base that is the params minus the adapter leaves (no flag threaded through the
sampler) and quantized leaves that carry our logical axes (so they shard like the rest),
are direct here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# The projections adapters may target, as "<module>.<name>" (the names PEFT users know).
PROJECTIONS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
ADAPTER_KEYS = ("lora_a", "lora_b")
BASE_QUANTS = ("none", "int8", "nf4")
QUANT_KEYS = {"int8": ("kernel_int8", "kernel_scale"), "nf4": ("kernel_nf4", "kernel_absmax")}
_ALIASES = {"r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout",
            "target_modules": "targets"}
NF4_BLOCK = 64
# The flax RNG stream of LoRA dropout: only passes given a key for it drop anything.
DROPOUT_RNG = "lora_dropout"
# The 16 NormalFloat-4 levels (QLoRA, Dettmers et al. 2023; bitsandbytes' table).
NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA hyper-parameters (`model.lora` of a run config).

    Attributes:
        rank: adapter rank r (> 0). PEFT name: `r`.
        alpha: scaling numerator; the adapter's output is multiplied by alpha / rank. PEFT
            name: `lora_alpha`.
        dropout: dropout rate in [0, 1) on the adapter's input (PEFT's placement:
            B(A(dropout(x)))), applied only in passes given a `DROPOUT_RNG` key (the
            training updates, see `dropout_key`); the sampler, the old-policy, reference
            and value passes and evaluation run without it. PEFT name: `lora_dropout`.
        targets: regexes; a projection is adapted when one of them fully matches its name
            ("q_proj") or its qualified name ("attn.q_proj"); "all-linear" (PEFT's) = all
            seven. Every regex must match at least one projection. PEFT name:
            `target_modules`.
        base_quant: storage of the frozen projections' kernels: "none", "int8" or "nf4".
    """
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple = ("q_proj", "v_proj")
    base_quant: str = "none"

    def __post_init__(self):
        targets = self.targets
        if isinstance(targets, str):
            targets = (targets,)
        object.__setattr__(self, "targets", tuple(targets))
        problems = []
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            problems.append(f"rank must be a positive int, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or self.alpha <= 0:
            problems.append(f"alpha must be positive, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0 <= self.dropout < 1:
            problems.append(f"dropout must be a float in [0, 1), got {self.dropout!r}")
        if self.base_quant not in BASE_QUANTS:
            problems.append(f"base_quant must be one of {BASE_QUANTS}, got "
                            f"{self.base_quant!r}")
        if not self.targets:
            problems.append("targets is empty; name at least one projection, e.g. "
                            "('q_proj', 'v_proj') or 'all-linear'")
        for pattern in self.targets:
            problems += _target_problems(pattern)
        if problems:
            raise ValueError("invalid model.lora: " + "; ".join(problems))

    @property
    def scaling(self) -> float:
        """alpha / rank, the factor of the adapter's output."""
        return self.alpha / self.rank

    def targeted(self, projection: str) -> bool:
        """Whether `projection` ("attn.q_proj", ...) carries an adapter."""
        return any(_matches(p, projection) for p in self.targets)

    def target_modules(self) -> list[str]:
        """Short names of the adapted projections, in PROJECTIONS order (PEFT's form)."""
        return [p.split(".")[1] for p in PROJECTIONS if self.targeted(p)]


def _matches(pattern: str, projection: str) -> bool:
    if pattern == "all-linear":
        return True
    return bool(re.fullmatch(pattern, projection) or
                re.fullmatch(pattern, projection.split(".")[1]))


def _target_problems(pattern: Any) -> list[str]:
    if not isinstance(pattern, str):
        return [f"targets must be strings (regexes), got {pattern!r}"]
    try:
        re.compile(pattern)
    except re.error as e:
        return [f"target {pattern!r} is not a valid regex ({e})"]
    if not any(_matches(pattern, p) for p in PROJECTIONS):
        return [f"target {pattern!r} matches no projection; the projections are "
                f"{list(PROJECTIONS)} (a target fully matches the name or module.name)"]
    return []


def lora_config(value: Any) -> LoraConfig | None:
    """A LoraConfig from None / {} (no LoRA), a LoraConfig, or a mapping with our names or
    PEFT's (`r`, `lora_alpha`, `lora_dropout`, `target_modules`). ValueError names unknown
    or doubly given keys."""
    if value is None or isinstance(value, LoraConfig):
        return value
    if hasattr(value, "to_dict"):  # an ml_collections ConfigDict
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ValueError(f"model.lora must be a mapping or None, got {type(value).__name__}")
    if not value:
        return None
    fields = {}
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    for key, item in value.items():
        name = _ALIASES.get(key, key)
        if name not in known:
            raise ValueError(f"model.lora: unknown key {key!r}; known keys: {sorted(known)} "
                             f"(or PEFT's {sorted(_ALIASES)})")
        if name in fields:
            raise ValueError(f"model.lora: {name!r} is given twice (as {name!r} and its "
                             f"PEFT name)")
        fields[name] = item
    return LoraConfig(**fields)


# ------------------------------------------------------------------ quantization


def quantize_int8(w: jax.Array, contract: int) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 per output channel. w: float [in..., out...] with `contract` leading
    input axes. Returns (int8 of w's shape, float32 scale [1 x contract, out...])."""
    axes = tuple(range(contract))
    w32 = w.astype(jnp.float32)
    scale = jnp.max(jnp.abs(w32), axis=axes, keepdims=True) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8), scale


def nf4_block(last: int) -> int:
    """Block size along the last axis: gcd(64, last) (so it divides it)."""
    return math.gcd(NF4_BLOCK, last)


def quantize_nf4(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """NF4 along the last axis (even length). w: float [..., n]. Returns (uint8 [..., n / 2]
    with two 4-bit codes per byte, low nibble first; float32 absmax [..., n / block])."""
    n = w.shape[-1]
    if n % 2:
        raise ValueError(f"nf4 needs an even last axis, got shape {w.shape}")
    block = nf4_block(n)
    blocks = w.astype(jnp.float32).reshape(*w.shape[:-1], n // block, block)
    absmax = jnp.max(jnp.abs(blocks), axis=-1)
    absmax = jnp.where(absmax > 0, absmax, 1.0)
    normed = (blocks / absmax[..., None]).reshape(w.shape)
    mids = jnp.asarray((NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2)
    codes = jnp.searchsorted(mids, normed).astype(jnp.uint8)
    pairs = codes.reshape(*w.shape[:-1], n // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4), absmax


def dequantize_nf4(packed: jax.Array, absmax: jax.Array, dtype) -> jax.Array:
    """Inverse of `quantize_nf4`: [..., n / 2] uint8 + [..., n / block] -> dtype [..., n]."""
    codes = jnp.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    values = jnp.asarray(NF4_LEVELS)[codes.astype(jnp.int32)]
    n = values.shape[-1]
    block = n // absmax.shape[-1]
    values = values.reshape(*values.shape[:-1], n // block, block) * absmax[..., None]
    return values.reshape(*packed.shape[:-1], n).astype(dtype)


def quantize_kernel(w: jax.Array, contract: int, quant: str) -> dict[str, jax.Array]:
    """{leaf name: array} holding kernel `w` [in..., out...] as `quant`."""
    if quant == "int8":
        q, scale = quantize_int8(w, contract)
        return {"kernel_int8": q, "kernel_scale": scale}
    if quant == "nf4":
        q, absmax = quantize_nf4(w)
        return {"kernel_nf4": q, "kernel_absmax": absmax}
    raise ValueError(f"base_quant must be one of {BASE_QUANTS[1:]} to quantize, got {quant!r}")


def dequantize_kernel(leaves: Mapping[str, jax.Array], dtype) -> jax.Array:
    """The float kernel of a projection's params (quantized or not), in `dtype`."""
    if "kernel" in leaves:
        return jnp.asarray(leaves["kernel"]).astype(dtype)
    if "kernel_int8" in leaves:
        return (leaves["kernel_int8"].astype(jnp.float32) * leaves["kernel_scale"]).astype(dtype)
    if "kernel_nf4" in leaves:
        return dequantize_nf4(leaves["kernel_nf4"], leaves["kernel_absmax"], dtype)
    raise ValueError(f"projection params hold no kernel (keys {sorted(leaves)})")


def quant_shapes(shape: Sequence[int], contract: int, quant: str) -> dict[str, tuple]:
    """{leaf name: (shape, dtype)} of a kernel of `shape` held as `quant`."""
    shape = tuple(shape)
    if quant == "int8":
        return {"kernel_int8": (shape, jnp.int8),
                "kernel_scale": ((1,) * contract + shape[contract:], jnp.float32)}
    block = nf4_block(shape[-1])
    return {"kernel_nf4": (shape[:-1] + (shape[-1] // 2,), jnp.uint8),
            "kernel_absmax": (shape[:-1] + (shape[-1] // block,), jnp.float32)}


def quant_logical(quant: str, logical: Sequence, contract: int) -> dict[str, tuple]:
    """Logical axes of the quantized leaves of a kernel with axes `logical`."""
    logical = tuple(logical)
    if quant == "int8":
        return {"kernel_int8": logical,
                "kernel_scale": (None,) * contract + logical[contract:]}
    return {"kernel_nf4": logical, "kernel_absmax": logical}


# ------------------------------------------------------------------ the layer


def _a_init(fan_in: int):
    """PEFT's default for A: kaiming-uniform(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), ...)."""
    bound = 1.0 / math.sqrt(fan_in)
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


class Projection(nn.Module):
    """A dense projection over the last `contract` input axes, with an optional LoRA adapter
    and an optionally quantized kernel: x [..., in...] -> [..., features...].

    The base computes what flax's Dense/DenseGeneral compute (same params `kernel`/`bias`,
    same promotion to `dtype`, the same `dot_general`), so unadapted it is the same layer.
    """
    features: tuple
    contract: int
    use_bias: bool
    dtype: Any
    param_dtype: Any
    kernel_init: Callable
    kernel_logical: tuple
    bias_logical: tuple = ()
    lora: LoraConfig | None = None
    adapted: bool = False
    dot_general: Callable | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        n_in = self.contract
        in_shape = x.shape[x.ndim - n_in:]
        shape = tuple(in_shape) + tuple(self.features)
        quant = "none" if self.lora is None else self.lora.base_quant
        init = nn.with_logical_partitioning(self.kernel_init, self.kernel_logical)
        if quant == "none" or self.has_variable("params", "kernel"):  # a float base
            kernel = self.param("kernel", init, shape, self.param_dtype)
        else:
            kernel = self._quantized_kernel(shape, quant)
        dims = ((tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))), ((), ()))
        dot = self.dot_general or jax.lax.dot_general
        xd = x.astype(self.dtype)
        y = dot(xd, kernel.astype(self.dtype), dims)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, self.bias_logical), tuple(self.features),
                self.param_dtype)
            y = y + bias.astype(self.dtype)
        if self.adapted and (self.is_initializing() or self.has_variable("params", "lora_a")):
            y = y + self._adapter(xd, in_shape, dims, dot).astype(y.dtype)
        return y

    def _quantized_kernel(self, shape, quant):
        names = QUANT_KEYS[quant]
        logical = quant_logical(quant, self.kernel_logical, self.contract)
        if self.is_initializing():  # random init, then quantized (tests and planning)
            w = self.kernel_init(self.make_rng("params"), shape, jnp.float32)
            packed = quantize_kernel(w, self.contract, quant)
        else:  # flax checks a stored param's shape against its init's
            packed = {n: jnp.zeros(s, d) for n, (s, d) in
                      quant_shapes(shape, self.contract, quant).items()}
        leaves = {n: self.param(n, lambda _, n=n: nn.LogicallyPartitioned(packed[n],
                                                                            logical[n]))
                  for n in names}
        return dequantize_kernel(leaves, self.dtype)

    def _adapter(self, xd, in_shape, dims, dot):
        rank = self.lora.rank
        a = self.param("lora_a", nn.with_logical_partitioning(
            _a_init(int(np.prod(in_shape))), tuple(self.kernel_logical[:self.contract]) + (None,)),
            tuple(in_shape) + (rank,), self.param_dtype)
        b = self.param("lora_b", nn.with_logical_partitioning(
            nn.initializers.zeros, (None,) + tuple(self.kernel_logical[self.contract:])),
            (rank,) + tuple(self.features), self.param_dtype)
        if self.lora.dropout > 0 and self.has_rng(DROPOUT_RNG):  # a training pass
            xd = _dropout(xd, self.lora.dropout, self.make_rng(DROPOUT_RNG))
        # alpha / r scales the rank-r activations, not the full-width output.
        h = dot(xd, a.astype(self.dtype), dims)                           # [..., r]
        h = h * jnp.asarray(self.lora.scaling, h.dtype)
        return dot(h, b.astype(self.dtype), (((h.ndim - 1,), (0,)), ((), ())))


def _dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout: each entry of x [...] kept with probability 1 - rate and scaled
    by 1 / (1 - rate), else 0; same shape and dtype."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def dropout_key(lora: LoraConfig | None, seed: int, step: jax.Array) -> jax.Array | None:
    """The LoRA dropout key of the training update at optimizer step `step` (int32 [],
    e.g. `TrainState.step`): fold_in(key(seed), step), so a resumed run draws the masks the
    uninterrupted one drew. None (no dropout, no RNG in the program) without LoRA or with
    `dropout` = 0."""
    if lora is None or lora.dropout == 0:
        return None
    return jax.random.fold_in(jax.random.key(seed), step)


def dropout_rngs(key: jax.Array | None, call: int = 0) -> dict[str, jax.Array]:
    """`rngs` for one `Transformer.apply` of a training pass: {DROPOUT_RNG: fold_in(key,
    call)} (`call` numbers the applies of one pass, so each draws its own masks), or {}."""
    return {} if key is None else {DROPOUT_RNG: jax.random.fold_in(key, call)}


# ------------------------------------------------------------------ params trees


def _is_dict(x) -> bool:
    return isinstance(x, Mapping)


def has_adapters(params: Any) -> bool:
    """Whether a params tree holds any LoRA adapter leaf."""
    if not _is_dict(params):
        return False
    return any(k in ADAPTER_KEYS or has_adapters(v) for k, v in params.items())


def split_adapters(params: Mapping) -> tuple[dict, dict]:
    """(adapters, base): two nested dicts, the adapter leaves and everything else (empty
    sub-dicts dropped). `merge_trees(adapters, base)` restores `params`."""
    adapters, base = {}, {}
    for k, v in params.items():
        if _is_dict(v):
            a, b = split_adapters(v)
            if a:
                adapters[k] = a
            if b:
                base[k] = b
        elif k in ADAPTER_KEYS:
            adapters[k] = v
        else:
            base[k] = v
    return adapters, base


def merge_trees(a: Mapping, b: Mapping) -> dict:
    """The union of two nested dicts with disjoint leaves."""
    out = dict(b)
    for k, v in a.items():
        if k in out and _is_dict(v) and _is_dict(out[k]):
            out[k] = merge_trees(v, out[k])
        elif k in out:
            raise ValueError(f"params trees overlap at {k!r}")
        else:
            out[k] = v
    return out


def without_adapters(params: Mapping) -> dict:
    """The frozen base: `params` minus the adapter leaves (the same arrays, no copy)."""
    return split_adapters(params)[1]
