"""Decoder models: one config for Llama / Qwen2 / Gemma-style variants, presets, params."""

from jaxrl_reason.models.config import PRESETS, ModelConfig, get_preset
from jaxrl_reason.models.params import (abstract_params, cache_shardings, count_params,
                                        init_cache, init_params, param_logical_axes,
                                        param_shardings)
from jaxrl_reason.models.transformer import Transformer, rope

__all__ = [
    "PRESETS", "ModelConfig", "Transformer", "abstract_params", "cache_shardings",
    "count_params", "get_preset", "init_cache", "init_params", "param_logical_axes",
    "param_shardings", "rope",
]
