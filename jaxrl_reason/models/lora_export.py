"""Export of a LoRA model: the adapter in PEFT's format and the merged model in the Hugging
Face layout.

PEFT's adapter directory: `adapter_config.json` and `adapter_model.safetensors` whose tensors
are named `base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A,B}.weight`, with
lora_A [r, in_features] and lora_B [out_features, r] (torch's Linear layout). Ours are
A [in..., r] and B [r, out...], flattened in the order of `hf.tensor_map`'s kernels, so
lora_A = A.reshape(in, r).T and lora_B = B.reshape(r, out).T. The base the adapter applies
to is the run's base model (dequantized when it was held quantized), exported alongside.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from jaxrl_reason.models import hf
from jaxrl_reason.models import lora as lora_lib
from jaxrl_reason.models import lora_params
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.params import is_stacked, unstack_layers

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_HF_MODULE = {"attn": "self_attn", "mlp": "mlp"}


def peft_adapter_config(cfg: ModelConfig, base_model: str = "") -> dict:
    """PEFT's LoraConfig fields for `cfg.lora` (a causal LM, no bias, no rsLoRA)."""
    lora = cfg.lora
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
            "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
            "target_modules": lora.target_modules(), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "base_model_name_or_path": base_model}


def peft_tensors(cfg: ModelConfig, params: Any) -> dict[str, np.ndarray]:
    """{PEFT tensor name: float32 array} of the adapters in `params` (either layout)."""
    if cfg.lora is None:
        raise ValueError("the model has no LoRA adapters to export (model.lora is unset)")
    if is_stacked(params):
        params = unstack_layers(cfg, params)
    out = {}
    for i in range(cfg.n_layers):
        layer = params[f"layer_{i}"]
        for qualified in lora_lib.PROJECTIONS:
            module, proj = qualified.split(".")
            leaves = layer[module][proj]
            if "lora_a" not in leaves:
                continue
            a = np.asarray(hf._host(leaves["lora_a"]), np.float32)
            b = np.asarray(hf._host(leaves["lora_b"]), np.float32)
            rank = a.shape[-1]
            name = f"base_model.model.model.layers.{i}.{_HF_MODULE[module]}.{proj}"
            out[f"{name}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, rank).T)
            out[f"{name}.lora_B.weight"] = np.ascontiguousarray(b.reshape(rank, -1).T)
    if not out:
        raise ValueError("params hold no adapter leaves (lora_a/lora_b) to export")
    return out


def export_peft_adapter(cfg: ModelConfig, params: Any, out_dir: str, *,
                        base_model: str = "") -> list[str]:
    """Writes the adapters as a PEFT adapter directory; returns the written paths.
    base_model: recorded as `base_model_name_or_path` (the base's directory)."""
    tensors = peft_tensors(cfg, params)
    if jax.process_index() != 0:
        return []
    os.makedirs(out_dir, exist_ok=True)
    weights = os.path.join(out_dir, ADAPTER_WEIGHTS)
    hf._safetensors().numpy.save_file(tensors, weights, metadata={"format": "pt"})
    config = os.path.join(out_dir, ADAPTER_CONFIG)
    with open(config, "w") as f:
        json.dump(peft_adapter_config(cfg, base_model), f, indent=2)
    return [weights, config]


def export_lora(cfg: ModelConfig, params: Any, out_dir: str, *, dtype: str | None = None,
                max_shard_bytes: int = hf.DEFAULT_MAX_SHARD_BYTES) -> dict[str, list[str]]:
    """The three exports of a LoRA model under `out_dir`:
        merged/   the adapted model with the adapters merged in (HF layout);
        base/     the base model the adapter applies to (dequantized, HF layout);
        adapter/  the adapter in PEFT's format, pointing at base/.
    Returns {"merged": files, "base": files, "adapter": files}."""
    plain = cfg.replace(lora=None)
    merged = lora_params.merged_params(cfg, params)
    base = lora_params.merged_params(cfg, lora_lib.without_adapters(params))
    base_dir = os.path.join(out_dir, "base")
    return {
        "merged": hf.export_hf_checkpoint(plain, merged, os.path.join(out_dir, "merged"),
                                          dtype=dtype, max_shard_bytes=max_shard_bytes),
        "base": hf.export_hf_checkpoint(plain, base, base_dir, dtype=dtype,
                                        max_shard_bytes=max_shard_bytes),
        "adapter": export_peft_adapter(cfg, params, os.path.join(out_dir, "adapter"),
                                       base_model=os.path.abspath(base_dir)),
    }
