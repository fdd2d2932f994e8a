"""Hugging Face checkpoints: `*.safetensors` <-> params (`config.json` <-> ModelConfig is in
`hf_config`, re-exported here).

Supported `model_type`s: llama (Llama 3 / 3.1 / 3.2), qwen2 (Qwen2 / 2.5), qwen3, gemma2,
gemma3_text, and gemma3 (multimodal checkpoints: the `text_config` and the language model's
tensors; the vision tower is skipped).

Import streams tensor by tensor: each tensor is read from its file, laid out as our param
(transposes and head reshapes), cast, and placed straight into its target `NamedSharding`
before the next one is read, so the host never holds more than about one tensor beyond the
params themselves. Export is the inverse (plus `config.json`), one output file at a time.
A model directory may come from anywhere: its `config.json` values and the files its
safetensors index names are checked first (`hf_checks`: finite, in-range numbers; weight
files that resolve inside the directory).

Tensor layout, HF name (prefix `model.`) -> our param, per layer i (`L = layers.{i}`):
  embed_tokens.weight [V, D]                  -> embedding [V, D]
  lm_head.weight [V, D] (no prefix)           -> lm_head [D, V] (transposed; absent when tied)
  norm.weight [D]                             -> final_norm.scale
  L.self_attn.{q,k,v}_proj.weight [N*hd, D]   -> layer_i.attn.{q,k,v}_proj.kernel [D, N, hd]
  L.self_attn.{q,k,v}_proj.bias [N*hd]        -> layer_i.attn.{q,k,v}_proj.bias [N, hd] (Qwen2)
  L.self_attn.o_proj.weight [D, H*hd]         -> layer_i.attn.o_proj.kernel [H, hd, D]
  L.self_attn.{q,k}_norm.weight [hd]          -> layer_i.attn.{q,k}_norm.scale (Qwen3, Gemma 3)
  L.mlp.{gate,up}_proj.weight [F, D]          -> layer_i.mlp.{gate,up}_proj.kernel [D, F]
  L.mlp.down_proj.weight [D, F]               -> layer_i.mlp.down_proj.kernel [F, D]
  L.input_layernorm.weight                    -> layer_i.attn_norm.scale
  Llama/Qwen: L.post_attention_layernorm      -> layer_i.mlp_norm.scale
  Gemma:      L.post_attention_layernorm      -> layer_i.post_attn_norm.scale
              L.pre_feedforward_layernorm     -> layer_i.mlp_norm.scale
              L.post_feedforward_layernorm    -> layer_i.post_mlp_norm.scale
Gemma's norm weights are stored as w with the norm multiplying by (1 + w); so are ours
(`ModelConfig.norm_plus_one`), so every tensor maps without arithmetic and a round trip is
bit-identical.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.hf_checks import weight_file
from jaxrl_reason.models.hf_config import (  # noqa: F401  (re-exported: hf.config_from_hf...)
    SUPPORTED_MODEL_TYPES, config_from_hf, hf_config, load_hf_config)
from jaxrl_reason.models.params import (abstract_params, is_stacked, param_shardings,
                                        stack_layers, unstack_layers)

# Tensors of a checkpoint that carry no parameter of ours.
_SKIPPED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                     "model.multi_modal_projector.")
_TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:  # pragma: no cover - the dependency is declared
        raise ImportError("reading Hugging Face checkpoints needs the `safetensors` package "
                          "(pip install safetensors)") from e
    return safetensors


# ----------------------------------------------------------------------------- tensor map


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One param <-> one HF tensor.

    kind "same": identical layout; "flat": HF stores it flattened (biases [N*hd]);
    "linear": HF stores W [out, in] and ours is a kernel [*in, *out] with `n_in` input axes.
    """
    path: tuple[str, ...]
    name: str
    kind: str = "same"
    n_in: int = 1

    def hf_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        if self.kind == "flat":
            return (math.prod(ours),)
        if self.kind == "linear":
            return (math.prod(ours[self.n_in:]), math.prod(ours[:self.n_in]))
        return tuple(ours)

    def to_ours(self, x: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
        if self.kind == "linear":
            return np.ascontiguousarray(x.T).reshape(ours)
        return x.reshape(ours)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "linear":
            ins = math.prod(x.shape[:self.n_in])
            return np.ascontiguousarray(x.reshape(ins, -1).T)
        return x.reshape(self.hf_shape(x.shape))


def tensor_map(cfg: ModelConfig, prefix: str = "model.", lm_head: str = "lm_head.weight"
               ) -> list[_Entry]:
    """Every param of `cfg` with its HF tensor name, in checkpoint order."""
    entries = [_Entry(("embedding",), prefix + "embed_tokens.weight")]
    mlp_norm = "pre_feedforward_layernorm" if cfg.post_norms else "post_attention_layernorm"
    for i in range(cfg.n_layers):
        ours, theirs = f"layer_{i}", f"{prefix}layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            entries.append(_Entry((ours, "attn", proj, "kernel"),
                                  f"{theirs}self_attn.{proj}.weight", "linear"))
            if cfg.qkv_bias:
                entries.append(_Entry((ours, "attn", proj, "bias"),
                                      f"{theirs}self_attn.{proj}.bias", "flat"))
        entries.append(_Entry((ours, "attn", "o_proj", "kernel"),
                              f"{theirs}self_attn.o_proj.weight", "linear", 2))
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                entries.append(_Entry((ours, "attn", norm, "scale"),
                                      f"{theirs}self_attn.{norm}.weight"))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            entries.append(_Entry((ours, "mlp", proj, "kernel"), f"{theirs}mlp.{proj}.weight",
                                  "linear"))
        norms = [("attn_norm", "input_layernorm"), ("mlp_norm", mlp_norm)]
        if cfg.post_norms:
            norms += [("post_attn_norm", "post_attention_layernorm"),
                      ("post_mlp_norm", "post_feedforward_layernorm")]
        for ours_norm, hf_norm in norms:
            entries.append(_Entry((ours, ours_norm, "scale"), f"{theirs}{hf_norm}.weight"))
    entries.append(_Entry(("final_norm", "scale"), prefix + "norm.weight"))
    if not cfg.tie_embeddings:
        entries.append(_Entry(("lm_head",), lm_head, "linear"))
    return entries


def _flat(tree: dict, prefix: tuple = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _unflat(items: dict[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, value in items.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


# ----------------------------------------------------------------------------- reading


class _Checkpoint:
    """The safetensors files of a model directory: which tensor lives where, dtypes, shapes."""

    def __init__(self, path: str):
        st = _safetensors()
        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                if not isinstance(weight_map, dict) or not all(
                        isinstance(k, str) for k in weight_map):
                    raise TypeError("weight_map is not an object of tensor names")
                files = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError,
                    RecursionError) as e:
                raise ValueError(f"{index}: not a safetensors index ({e!r})") from e
        elif os.path.isfile(single):
            weight_map, files = None, ["model.safetensors"]
        else:
            raise FileNotFoundError(f"{path}: neither model.safetensors nor "
                                    f"model.safetensors.index.json")
        self._offsets: dict[str, dict[str, tuple[int, int]]] = {}  # file -> name -> bytes
        self.location: dict[str, str] = {}  # tensor name -> file name
        self.info: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (dtype, shape)
        for file in files:  # every one a plain relative path resolving inside `path`
            full = weight_file(path, file, index if weight_map is not None else path)
            if not os.path.isfile(full):
                raise FileNotFoundError(f"{index}: lists {file}, which does not exist")
            try:
                with st.safe_open(full, framework="numpy") as handle:
                    for name in handle.keys():
                        piece = handle.get_slice(name)
                        self.location[name] = file
                        self.info[name] = (piece.get_dtype(), tuple(piece.get_shape()))
            except st.SafetensorError as e:
                raise ValueError(f"{full}: not a readable safetensors file ({e})") from e
        if weight_map is not None:
            for name, file in weight_map.items():
                if self.location.get(name) != file:
                    raise ValueError(f"{index}: maps {name} to {file}, which has no such "
                                     f"tensor")

    def where(self, name: str) -> str:
        return os.path.join(self.path, self.location[name])

    def read(self, handle, name: str) -> np.ndarray:
        """One tensor as numpy (bf16 as ml_dtypes.bfloat16, which numpy alone cannot name)."""
        dtype, shape = self.info[name]
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{self.where(name)}: tensor {name} has dtype {dtype}; supported: "
                             f"{sorted(_ST_DTYPES)}")
        if dtype != "BF16":
            return handle.get_tensor(name)
        start, end = self._byte_ranges(self.location[name])[name]
        count = math.prod(shape)
        if end - start != 2 * count:
            raise ValueError(f"{self.where(name)}: tensor {name} holds {end - start} bytes, "
                             f"not {2 * count}")
        return np.fromfile(self.where(name), dtype=ml_dtypes.bfloat16, count=count,
                           offset=start).reshape(shape)

    def _byte_ranges(self, file: str) -> dict[str, tuple[int, int]]:
        """Absolute byte ranges of the tensors of `file` (from the safetensors header)."""
        if file not in self._offsets:
            with open(os.path.join(self.path, file), "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            self._offsets[file] = {
                name: (8 + size + meta["data_offsets"][0], 8 + size + meta["data_offsets"][1])
                for name, meta in header.items() if name != "__metadata__"}
        return self._offsets[file]


def _text_prefix(names: Iterable[str], where: str) -> str:
    names = set(names)
    for prefix in _TEXT_PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix
    raise ValueError(f"{where}: no embed_tokens.weight tensor under any of {_TEXT_PREFIXES}")


def load_hf_checkpoint(path: str, mesh: Mesh, rules: Iterable[tuple[str, Any]], *,
                       dtype: str = "float32", compute_dtype: str | None = None,
                       scan_layers: bool = False):
    """Loads a Hugging Face model directory onto `mesh`, streaming tensor by tensor.

    Args:
      path: directory with config.json and model.safetensors (or sharded
        model-0000i-of-0000n.safetensors files with model.safetensors.index.json).
      mesh, rules: each param is placed in its `param_shardings(cfg, mesh, rules)` sharding.
      dtype: storage dtype of the params ("float32", "bfloat16" or "float16").
      compute_dtype: the config's `dtype` (activations and matmuls); default `dtype`.
      scan_layers: return the scanned layout (`ModelConfig.scan_layers`): the layers are
        placed one tensor at a time as usual, then stacked leaf by leaf on the devices.
    Returns: (ModelConfig, params) with params a nested dict of `dtype` jax.Arrays.
    Raises: FileNotFoundError for missing files; ValueError naming the tensor and file for a
      missing, unexpected or misshaped tensor, and the config field for unsupported models.
    """
    st = _safetensors()
    cfg = load_hf_config(path).replace(param_dtype=dtype, dtype=compute_dtype or dtype)
    ckpt = _Checkpoint(path)
    prefix = _text_prefix(ckpt.info, path)
    lm_head = "language_model.lm_head.weight" if prefix == "language_model.model." else \
        "lm_head.weight"
    entries = {e.name: e for e in tensor_map(cfg, prefix, lm_head)}
    shapes = {k: tuple(v.shape) for k, v in _flat(abstract_params(cfg)).items()}

    missing = [name for name in entries if name not in ckpt.info]
    if missing:
        raise ValueError(f"{path}: missing tensor {missing[0]}" + (
            f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = [name for name in ckpt.info if name not in entries and not (
        name.startswith(_SKIPPED_PREFIXES) or name.endswith("rotary_emb.inv_freq")
        or (cfg.tie_embeddings and name == lm_head))]
    if unexpected:
        raise ValueError(f"{ckpt.where(unexpected[0])}: unexpected tensor {unexpected[0]} for "
                         f"this config" + (f" (and {len(unexpected) - 1} more)"
                                           if len(unexpected) > 1 else ""))
    for name, entry in entries.items():
        want = entry.hf_shape(shapes[entry.path])
        if ckpt.info[name][1] != want:
            raise ValueError(f"{ckpt.where(name)}: tensor {name} has shape "
                             f"{list(ckpt.info[name][1])}, expected {list(want)} from "
                             f"config.json")

    shardings = _flat(param_shardings(cfg, mesh, rules))
    target = np.dtype(jnp.dtype(dtype))
    placed: dict[tuple[str, ...], jax.Array] = {}
    for file in sorted(set(ckpt.location[name] for name in entries)):
        with st.safe_open(os.path.join(path, file), framework="numpy") as handle:
            for name, entry in entries.items():
                if ckpt.location[name] != file:
                    continue
                value = entry.to_ours(ckpt.read(handle, name), shapes[entry.path])
                value = value.astype(target, copy=False)
                placed[entry.path] = jax.make_array_from_callback(
                    value.shape, shardings[entry.path], lambda index, v=value: v[index])
                del value
    params = _unflat(placed)
    del placed
    if scan_layers:
        cfg = cfg.replace(scan_layers=True)
        params = stack_layers(cfg, params, consume=True)
    return cfg, params


# ----------------------------------------------------------------------------- writing


def _host(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-host) array on this host."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def export_hf_checkpoint(cfg: ModelConfig, params: Any, out_dir: str, *,
                         dtype: str | None = None,
                         max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                         base_config: dict | None = None) -> list[str]:
    """Writes `params` as a Hugging Face model directory (config.json + safetensors).

    Args:
      cfg, params: the model (params as returned by `load_hf_checkpoint` / `init_params`).
      out_dir: created if needed; model files already there (model.safetensors, its index,
        model-*-of-*.safetensors) are replaced.
      dtype: dtype of the written tensors; None keeps each param's dtype.
      max_shard_bytes: files larger than this are split into model-0000i-of-0000n.safetensors
        with a model.safetensors.index.json (a single tensor is never split).
      base_config: an original config.json whose token ids and max_position_embeddings are
        carried over.
    Returns: the paths of the written files. On multi-host, every process must call this
      (params are gathered) and process 0 writes.
    Raises ValueError when no supported HF family represents `cfg`.
    """
    st = _safetensors()
    if is_stacked(params):
        params = unstack_layers(cfg, params)
    cfg = cfg.replace(scan_layers=False)
    entries = tensor_map(cfg)
    flat = _flat(params)
    expected = {e.path for e in entries}
    if set(flat) != expected:
        raise ValueError(f"params do not match the config: extra {sorted(set(flat) - expected)[:3]}"
                         f", missing {sorted(expected - set(flat))[:3]}")

    def out_dtype(path):
        return np.dtype(jnp.dtype(dtype if dtype is not None else flat[path].dtype))

    dtypes = {str(out_dtype(e.path)) for e in entries}
    config = hf_config(cfg, dtype=dtypes.pop() if len(dtypes) == 1 else "float32",
                       base=base_config)
    shards: list[list[_Entry]] = [[]]
    used = 0
    for e in entries:
        size = flat[e.path].size * out_dtype(e.path).itemsize
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(e)
        used += size
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(out_dir, exist_ok=True)
        stale = glob.glob(os.path.join(out_dir, "model-*-of-*.safetensors")) + [
            os.path.join(out_dir, n) for n in ("model.safetensors", "model.safetensors.index.json")]
        for file in stale:
            if os.path.isfile(file):
                os.remove(file)
    written, weight_map, total = [], {}, 0
    for shard, name in zip(shards, names):
        tensors = {e.name: e.to_hf(_host(flat[e.path]).astype(out_dtype(e.path), copy=False))
                   for e in shard}
        for e in shard:
            weight_map[e.name] = name
            total += tensors[e.name].nbytes
        if writer:
            st.numpy.save_file(tensors, os.path.join(out_dir, name), metadata={"format": "pt"})
            written.append(os.path.join(out_dir, name))
        del tensors
    if writer:
        if len(shards) > 1:
            index = os.path.join(out_dir, "model.safetensors.index.json")
            with open(index, "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f,
                          indent=2)
            written.append(index)
        config_path = os.path.join(out_dir, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)
        written.append(config_path)
    return written
