"""Decoder models: one config for Llama / Qwen2 / Qwen3 / Gemma 2/3 variants, presets, params,
and Hugging Face checkpoint import/export (`hf`)."""

from jaxrl_reason.models.config import PRESETS, ModelConfig, get_preset
from jaxrl_reason.models.hf import (config_from_hf, export_hf_checkpoint, hf_config,
                                    load_hf_checkpoint, load_hf_config)
from jaxrl_reason.models.params import (abstract_params, cache_shardings, count_params,
                                        init_cache, init_params, param_logical_axes,
                                        param_shardings, stack_layers, to_layout,
                                        unstack_layers)
from jaxrl_reason.models.transformer import Transformer, rope

__all__ = [
    "PRESETS", "ModelConfig", "Transformer", "abstract_params", "cache_shardings",
    "config_from_hf", "count_params", "export_hf_checkpoint", "get_preset", "hf_config",
    "init_cache", "init_params", "load_hf_checkpoint", "load_hf_config", "param_logical_axes",
    "param_shardings", "rope", "stack_layers", "to_layout", "unstack_layers",
]
