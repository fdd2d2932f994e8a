"""Hugging Face `config.json` <-> `ModelConfig`: which fields of each supported `model_type`
(llama, qwen2, qwen3, gemma2, gemma3_text, gemma3's `text_config`) map to which switch of the
decoder, the defaults published Gemma configs leave out, and clear errors naming the field
for what the decoder cannot represent. The tensors are `jaxrl_reason.models.hf`'s."""

from __future__ import annotations

import json
import os
from typing import Any

from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.hf_checks import check_config_values

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM"}
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
# HF config-class defaults for keys that published Gemma configs leave out (Gemma 3's
# multimodal `text_config` in particular).
_GEMMA_DEFAULTS = {
    "gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                   num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0,
                   query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0,
                   attn_logit_softcapping=50.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                        num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                        query_pre_attn_scalar=256, sliding_window=4096,
                        final_logit_softcapping=None, attn_logit_softcapping=None,
                        hidden_activation="gelu_pytorch_tanh"),
}

def _unsupported(where: str, what: str) -> ValueError:
    return ValueError(f"{where}: unsupported {what}")


def _rope_scaling_fields(spec: dict, max_positions: int | None, where: str) -> dict:
    """ModelConfig RoPE-scaling fields from an HF rope dict ({"rope_type", "factor", ...})."""
    kind = spec.get("rope_type", spec.get("type", "default"))
    if spec.get("partial_rotary_factor", 1.0) != 1.0:
        raise _unsupported(where, f"partial_rotary_factor={spec['partial_rotary_factor']!r}")
    if kind == "default":
        return {}
    if kind == "linear":
        return dict(rope_scaling="linear", rope_scaling_factor=float(spec["factor"]))
    if kind == "llama3":
        original = spec.get("original_max_position_embeddings", max_positions)
        if original is None:
            raise ValueError(f"{where}: llama3 rope scaling without "
                             f"original_max_position_embeddings")
        return dict(rope_scaling="llama3", rope_scaling_factor=float(spec["factor"]),
                    rope_low_freq_factor=float(spec["low_freq_factor"]),
                    rope_high_freq_factor=float(spec["high_freq_factor"]),
                    rope_original_max_position=int(original))
    raise _unsupported(where, f"rope type {kind!r} (supported: default, linear, llama3)")


def _rope_fields(cj: dict, model_type: str, where: str) -> dict:
    """rope_theta / scaling / local theta from either config format.

    transformers 4 writes `rope_theta` + `rope_scaling` (+ Gemma 3's `rope_local_base_freq`);
    transformers 5 writes `rope_parameters`, nested by layer type for Gemma 3.
    """
    params = cj.get("rope_parameters") or {}
    nested = {"full_attention", "sliding_attention"} & set(params)
    max_positions = cj.get("max_position_embeddings")
    if model_type == "gemma3_text":
        if nested:
            global_rope = dict(params.get("full_attention") or {})
            local = dict(params.get("sliding_attention") or {})
        else:
            global_rope = dict(cj.get("rope_scaling") or params)
            local = {"rope_theta": cj.get("rope_local_base_freq")}
        global_rope.setdefault("rope_theta", cj.get("rope_theta", 1_000_000.0))
        if local.get("rope_theta") is None:
            local["rope_theta"] = 10000.0
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise _unsupported(where, f"rope scaling on sliding-window layers {local!r}")
        fields = _rope_scaling_fields(global_rope, max_positions, where)
        return dict(fields, rope_theta=float(global_rope["rope_theta"]),
                    rope_local_theta=float(local["rope_theta"]))
    if nested:
        raise _unsupported(where, f"per-layer-type rope_parameters for {model_type}")
    spec = dict(params or cj.get("rope_scaling") or {})
    default_theta = _GEMMA_DEFAULTS.get(model_type, {}).get("rope_theta", 10000.0)
    spec.setdefault("rope_theta", cj.get("rope_theta", default_theta))
    return dict(_rope_scaling_fields(spec, max_positions, where),
                rope_theta=float(spec["rope_theta"]))


def _sliding_fields(cj: dict, model_type: str, n_layers: int, where: str) -> dict:
    """sliding_window / sliding_window_pattern from `layer_types` (or the family default)."""
    types = cj.get("layer_types")
    if model_type not in ("gemma2", "gemma3_text"):
        if cj.get("use_sliding_window"):
            raise _unsupported(where, "use_sliding_window=true (Qwen sliding-window layers)")
        if types and set(types) != {"full_attention"}:
            raise _unsupported(where, f"layer_types {sorted(set(types))} for {model_type}")
        return {}
    if cj.get("use_bidirectional_attention"):
        raise _unsupported(where, "use_bidirectional_attention=true")
    window = cj.get("sliding_window", 4096)
    if types is None:
        pattern = 2 if model_type == "gemma2" else cj.get(
            "sliding_window_pattern", cj.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(n_layers)]
    if len(types) != n_layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ValueError(f"{where}: layer_types must list 'sliding_attention' or "
                         f"'full_attention' for each of the {n_layers} layers, got {types!r}")
    if window is None or "sliding_attention" not in types:
        return dict(sliding_window=None)
    pattern = 0 if "full_attention" not in types else types.index("full_attention") + 1
    expected = ["sliding_attention" if pattern == 0 or (i + 1) % pattern else "full_attention"
                for i in range(n_layers)]
    if pattern == 1 or types != expected:
        raise _unsupported(where, f"layer_types {types!r}: only every-p-th-layer-global "
                                  f"patterns are supported")
    return dict(sliding_window=int(window), sliding_window_pattern=pattern)


def config_from_hf(config_json: dict, *, source: str = "config.json") -> ModelConfig:
    """ModelConfig (float32) from a Hugging Face `config.json` dict.

    Raises ValueError naming `source` and the field for an unsupported model_type or feature
    (o_proj / MLP biases, other RoPE types, bidirectional attention, irregular layer_types)
    or a value out of range (a non-finite or non-positive RoPE base, norm epsilon or
    scaling factor, a size or count that is not an integer within its bound: the table of
    `hf_checks`), checked before any value is used.
    """
    if not isinstance(config_json, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(config_json).__name__}")
    cj, model_type = config_json, config_json.get("model_type")
    if model_type == "gemma3":
        text = cj.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"{source}: model_type 'gemma3' without a text_config object")
        cj, model_type = text, text.get("model_type", "gemma3_text")
        source = f"{source} (text_config)"
    if model_type not in SUPPORTED_MODEL_TYPES or model_type == "gemma3":
        raise ValueError(f"{source}: unsupported model_type {model_type!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    gemma = model_type in _GEMMA_DEFAULTS
    if gemma:
        cj = {**_GEMMA_DEFAULTS[model_type], **cj}
    check_config_values(cj, source)

    def field(name, default=None, required=True):
        if name in cj and cj[name] is not None:
            return cj[name]
        if required and default is None:
            raise ValueError(f"{source}: missing field {name!r} (model_type {model_type!r})")
        return default

    for flag in ("mlp_bias", "attention_bias"):
        if cj.get(flag):
            raise _unsupported(source, f"{flag}=true for {model_type} (o_proj / MLP biases)")
    act_key = "hidden_activation" if gemma and cj.get("hidden_activation") else "hidden_act"
    act = field(act_key, "silu")
    if act not in _ACTIVATIONS:
        raise _unsupported(source, f"{act_key}={act!r} (supported: {sorted(_ACTIVATIONS)})")
    d, heads = int(field("hidden_size")), int(field("num_attention_heads"))
    n_layers = int(field("num_hidden_layers"))
    kwargs: dict[str, Any] = dict(
        vocab_size=int(field("vocab_size")), d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=int(field("num_key_value_heads", heads)),
        head_dim=int(field("head_dim", d // heads)), mlp_hidden=int(field("intermediate_size")),
        norm_eps=float(field("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(field("tie_word_embeddings", gemma, required=False)),
        activation=_ACTIVATIONS[act], qkv_bias=model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "gemma3_text"))
    kwargs.update(_rope_fields(cj, model_type, source))
    kwargs.update(_sliding_fields(cj, model_type, n_layers, source))
    if gemma:
        for ours, theirs in (("final_logit_softcap", "final_logit_softcapping"),
                             ("attn_logit_softcap", "attn_logit_softcapping"),
                             ("query_pre_attn_scalar", "query_pre_attn_scalar")):
            value = cj.get(theirs)
            kwargs[ours] = None if value is None else float(value)
        kwargs.update(embed_scale=True, norm_plus_one=True, post_norms=True)
    try:
        return ModelConfig(**kwargs)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def _family(cfg: ModelConfig) -> str:
    """The HF model_type that represents `cfg` exactly; ValueError naming what does not fit."""
    gemma_flags = (cfg.norm_plus_one, cfg.post_norms, cfg.embed_scale)
    if any(gemma_flags):
        if not all(gemma_flags) or cfg.qkv_bias:
            raise ValueError("no Hugging Face family matches this config: Gemma needs "
                             "norm_plus_one, post_norms and embed_scale together and no qkv_bias")
        if not cfg.qk_norm:
            if cfg.rope_local_theta is not None:
                raise ValueError("gemma2 has one RoPE for all layers; rope_local_theta must be "
                                 "None")
            return "gemma2"
        if cfg.rope_scaling is not None and cfg.rope_local_theta is None:
            raise ValueError("gemma3 does not scale the RoPE of sliding-window layers; set "
                             "rope_local_theta")
        return "gemma3_text"
    extras = dict(final_logit_softcap=cfg.final_logit_softcap,
                  attn_logit_softcap=cfg.attn_logit_softcap, sliding_window=cfg.sliding_window)
    if cfg.query_pre_attn_scalar not in (None, cfg.head_dim):
        extras["query_pre_attn_scalar"] = cfg.query_pre_attn_scalar
    extras = {k: v for k, v in extras.items() if v is not None}
    if extras:
        raise ValueError(f"no Hugging Face Llama/Qwen family has {sorted(extras)}")
    if cfg.qkv_bias and cfg.qk_norm:
        raise ValueError("no Hugging Face family has both qkv_bias and qk_norm")
    return "qwen2" if cfg.qkv_bias else "qwen3" if cfg.qk_norm else "llama"


def _hf_rope_scaling(cfg: ModelConfig) -> dict | None:
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_scaling_factor}
    if cfg.rope_scaling == "llama3":
        return {"rope_type": "llama3", "factor": cfg.rope_scaling_factor,
                "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_max_position}
    return None


def _float_or_none(value):
    return None if value is None else float(value)


_CARRIED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings",
                 "initializer_range")


def hf_config(cfg: ModelConfig, *, dtype: str = "float32", base: dict | None = None) -> dict:
    """The `config.json` dict of `cfg` (transformers 4 key names, which 5 also reads).

    base: an original config.json whose token ids and max_position_embeddings are kept.
    """
    model_type = _family(cfg)
    gemma = model_type.startswith("gemma")
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[model_type]], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": float(cfg.norm_eps),
        "tie_word_embeddings": cfg.tie_embeddings, "rope_theta": float(cfg.rope_theta),
        "rope_scaling": _hf_rope_scaling(cfg), "torch_dtype": dtype,
        ("hidden_activation" if gemma else "hidden_act"): _HF_ACTIVATIONS[cfg.activation],
        "max_position_embeddings": max(8192, int(cfg.rope_original_max_position
                                                 * cfg.rope_scaling_factor))
        if cfg.rope_scaling == "llama3" else 8192,
        "attention_bias": False,
    }
    if model_type == "llama":
        out["mlp_bias"] = False
    if model_type in ("qwen2", "qwen3"):
        out["use_sliding_window"] = False
        if model_type == "qwen2":
            del out["attention_bias"]
    if gemma:
        layer_types = ["sliding_attention" if cfg.layer_is_sliding(i) else "full_attention"
                       for i in range(cfg.n_layers)]
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim  # an int field in transformers 5
        out.update(query_pre_attn_scalar=int(scalar) if scalar == int(scalar) else scalar,
                   final_logit_softcapping=_float_or_none(cfg.final_logit_softcap),
                   attn_logit_softcapping=_float_or_none(cfg.attn_logit_softcap),
                   sliding_window=cfg.sliding_window, layer_types=layer_types)
    if model_type == "gemma3_text":
        out.update(rope_local_base_freq=float(cfg.rope_local_theta or cfg.rope_theta),
                   sliding_window_pattern=cfg.sliding_window_pattern,
                   use_bidirectional_attention=False)
    for source in (base or {}, (base or {}).get("text_config") or {}):
        out.update({k: source[k] for k in _CARRIED_KEYS if source.get(k) is not None})
    return out


def load_hf_config(path: str) -> ModelConfig:
    """ModelConfig from `path/config.json`; FileNotFoundError / ValueError naming the file."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model "
                                f"directory)")
    with open(file) as f:
        try:
            config_json = json.load(f)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"{file}: not valid JSON ({type(e).__name__}: {e})") from e
    return config_from_hf(config_json, source=file)
