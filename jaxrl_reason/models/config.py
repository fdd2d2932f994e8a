"""Decoder configuration: one dataclass for Llama / Qwen2 / Gemma-style variants, plus presets.

A model family differs only in the switches below (bias on q/k/v, q/k norm, activation,
embedding scaling, logit soft-capping, tied embeddings, RoPE scaling, sliding-window layers,
Gemma's (1 + w) norms and post-norms), so adding a family means adding a preset, not a new
model class. `jaxrl_reason.models.hf` maps Hugging Face `config.json` files of Llama 3, Qwen2,
Qwen3, Gemma 2 and Gemma 3 (text) onto this config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxrl_reason.models.lora import LoraConfig, lora_config

_ACTIVATIONS = ("silu", "gelu_tanh")
_DTYPES = ("float32", "bfloat16", "float16")
_LOGPROBS_IMPLS = ("auto", "full", "chunked", "pallas")
ATTENTION_IMPLS = ("auto", "reference", "splash", "cudnn")  # see models.attention
_REMAT = ("none", "block", "save_dots")
_ROPE_SCALINGS = (None, "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    Attributes:
        vocab_size: number of token embeddings (rows of the embedding table).
        d_model: width of the residual stream.
        n_layers: number of decoder blocks.
        n_heads: query heads per block.
        n_kv_heads: key/value heads (grouped-query attention; must divide n_heads).
        head_dim: width of one attention head.
        mlp_hidden: hidden width of the gated MLP.
        rope_theta: RoPE base frequency.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: unembed with the transposed embedding table instead of a separate head.
        activation: gate activation of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU).
        qkv_bias: bias on the q/k/v projections (Qwen2).
        qk_norm: RMSNorm on queries and keys per head (Qwen3).
        embed_scale: multiply embeddings by sqrt(d_model) (Gemma).
        final_logit_softcap: if set, logits = cap * tanh(logits / cap) (Gemma 2).
        attn_logit_softcap: if set, attention scores (after scaling, before the mask) become
            cap * tanh(scores / cap) (Gemma 2).
        query_pre_attn_scalar: attention scores are scaled by query_pre_attn_scalar ** -0.5
            instead of head_dim ** -0.5 (Gemma 2/3); None = head_dim.
        norm_plus_one: every RMSNorm (blocks, final, q/k norms) multiplies by (1 + scale)
            with scale initialised to 0, as Gemma stores its norm weights.
        post_norms: four norms per block (Gemma 2/3): the attention and MLP outputs are
            normed again (`post_attn_norm`, `post_mlp_norm`) before the residual add.
        rope_scaling: None, "linear" (all frequencies divided by rope_scaling_factor; Gemma 3's
            global layers) or "llama3" (Llama 3.1/3.2: low frequencies divided by the factor,
            high ones kept, a smooth interpolation between, per rope_low_freq_factor,
            rope_high_freq_factor and rope_original_max_position). Applies to global layers
            and, when rope_local_theta is None, to sliding-window layers too.
        rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor,
            rope_original_max_position: parameters of rope_scaling (as in the HF config's
            `rope_scaling`: factor, low_freq_factor, high_freq_factor,
            original_max_position_embeddings).
        rope_local_theta: RoPE base of the sliding-window layers, unscaled (Gemma 3's
            rope_local_base_freq); None = the global layers' RoPE.
        sliding_window: if set, sliding-window layers let a query attend only to the keys of
            the last `sliding_window` cache slots, itself included (slot distance < window;
            a row's tokens occupy consecutive slots, as the left-padded sampler and scorer
            lay them out). The KV cache stays full-length; older keys are masked.
        sliding_window_pattern: which layers slide when sliding_window is set: 0 = every
            layer; p >= 2 = every p-th layer is global (layer i is global iff (i + 1) % p == 0),
            e.g. 2 for Gemma 2 (local, global, ...) and 6 for Gemma 3 (5 local : 1 global).
        dtype: compute dtype of activations and matmuls. With "bfloat16" every matmul, forward
            and backward, has bf16 operands, and the residual stream and MLP activations are
            bf16; RMSNorm statistics, RoPE, the attention scores (float32 results of the q.k
            matmul) and their softmax, and the logits (hence log-probs) are float32.
        param_dtype: storage dtype of parameters (float32 master weights by default; they are
            cast to `dtype` at each use, so gradients and optimizer state keep this dtype).
        init_std: standard deviation of the normal initializer.
        remat: rematerialization of the decoder blocks in the backward pass (activation memory
            vs recompute): "none" keeps every intermediate for the backward pass; "block"
            saves only each block's input and recomputes the whole block (least memory, about
            one extra forward); "save_dots" recomputes the block but keeps the outputs of its
            weight matmuls (q/k/v/o and MLP projections; policy
            `jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims`), so only the cheap
            element-wise ops and the attention einsums (whose [T, S] score tensors are the
            quadratic part of the memory) are recomputed. Values and gradients are unchanged;
            inference (prefill/decode) is unaffected. XLA:CPU drops the optimization barriers
            that keep the recomputation apart, so there remat saves memory only when compiled
            with `xla_disable_hlo_passes=cse_barrier_expander` (GPU/TPU need nothing).
        scan_layers: run the decoder blocks as one `nn.scan` over stacked params (each leaf
            [n_layers, ...] under params["layers"], logical axis "layers") instead of a python
            loop over params["layer_i"]. The compiled program holds one block: compile time
            stops growing with depth, and with FSDP each layer's weights are gathered inside
            the loop body, one layer at a time, instead of XLA keeping every layer's gathered
            weights alive from the forward to the backward pass (the unrolled 28-layer
            Qwen2.5-7B update grows by 1.36 GiB of temporaries per layer on v5e). Same values.
            The layout is part of the params: `models.params.stack_layers`/`unstack_layers`
            convert, HF import/export and checkpoint restore do it for you.
        logprobs_impl: how training scores completion tokens: "full" (materializes the
            [B, L, V] logits), "chunked" (`jaxrl_reason.kernels.logprobs`: online logsumexp
            over sequence and vocabulary chunks, forward and backward, never the full
            logits), "pallas" (the same computation as Pallas kernels,
            `kernels.logprobs.pallas_logprobs`: Mosaic on TPU, Triton on GPU, the interpreter
            elsewhere; per device under `shard_map` over the batch axes, the unembedding
            gathered), or "auto" (chunked on TPU/GPU, full on CPU).
        logprobs_seq_chunk, logprobs_vocab_chunk: chunk sizes of "chunked".
        attention_chunk: 0 (off) or a query-chunk size: sequences longer than it attend one
            chunk of queries at a time, each chunk rematerialized in the backward pass, so the
            float32 score tensors are [chunk, S] instead of [T, S] per head (long-completion
            training: 5k tokens x 28 heads is 2.8 GB per layer unchunked). Same values; decode
            (one query) is unaffected.
        attention_impl: which implementation computes attention (`models.attention`):
            "reference" (jnp), "splash" (TPU splash attention; interpreted off TPU),
            "cudnn" (`jax.nn.dot_product_attention` with cuDNN, GPU), or "auto" (splash on
            TPU, cuDNN on GPU, the reference elsewhere). Where a kernel does not apply, the
            reference runs and the reason is logged once. Same math.
        lora: None, or LoRA adapters on chosen projections (`models.lora.LoraConfig`; a
            mapping with its fields or PEFT's names is converted), optionally over a quantized
            frozen base (QLoRA).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_hidden: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    activation: str = "silu"
    qkv_bias: bool = False
    qk_norm: bool = False
    embed_scale: bool = False
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    norm_plus_one: bool = False
    post_norms: bool = False
    rope_scaling: str | None = None
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    rope_local_theta: float | None = None
    sliding_window: int | None = None
    sliding_window_pattern: int = 0
    dtype: str = "float32"
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: str = "none"
    scan_layers: bool = False
    logprobs_impl: str = "auto"
    attention_chunk: int = 0
    attention_impl: str = "auto"
    logprobs_seq_chunk: int = 128
    logprobs_vocab_chunk: int = 8192
    lora: LoraConfig | None = None

    def __post_init__(self):
        object.__setattr__(self, "lora", lora_config(self.lora))
        problems = []
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                 "mlp_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive int, got {value!r}")
        if not problems and self.n_heads % self.n_kv_heads:
            problems.append(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if not problems and self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for RoPE")
        if self.activation not in _ACTIVATIONS:
            problems.append(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                problems.append(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
        if not isinstance(self.scan_layers, bool):
            problems.append(f"scan_layers must be true or false, got {self.scan_layers!r}")
        if self.remat not in _REMAT:
            problems.append(f"remat must be one of {_REMAT}, got {self.remat!r}")
        if not isinstance(self.attention_chunk, int) or self.attention_chunk < 0:
            problems.append(f"attention_chunk must be an int >= 0 (0: off), got "
                            f"{self.attention_chunk!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            problems.append(f"attention_impl must be one of {ATTENTION_IMPLS}, got "
                            f"{self.attention_impl!r}")
        if self.logprobs_impl not in _LOGPROBS_IMPLS:
            problems.append(f"logprobs_impl must be one of {_LOGPROBS_IMPLS}, got "
                            f"{self.logprobs_impl!r}")
        problems += self._architecture_problems()
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def _architecture_problems(self) -> list[str]:
        """Problems with the soft-capping, RoPE and sliding-window fields."""
        problems = []

        def positive(name, value, types=(int, float)):
            if isinstance(value, bool) or not isinstance(value, types) or value <= 0:
                problems.append(f"{name} must be positive, got {value!r}")

        for name in ("final_logit_softcap", "attn_logit_softcap", "query_pre_attn_scalar",
                     "rope_local_theta"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        positive("rope_theta", self.rope_theta)
        if self.rope_scaling not in _ROPE_SCALINGS:
            problems.append(f"rope_scaling must be one of {_ROPE_SCALINGS}, got "
                            f"{self.rope_scaling!r}")
        elif self.rope_scaling is not None:
            positive("rope_scaling_factor", self.rope_scaling_factor)
        if self.rope_scaling == "llama3":
            positive("rope_low_freq_factor", self.rope_low_freq_factor)
            positive("rope_original_max_position", self.rope_original_max_position, (int,))
            if not self.rope_high_freq_factor > self.rope_low_freq_factor:
                problems.append(f"rope_high_freq_factor={self.rope_high_freq_factor!r} must "
                                f"exceed rope_low_freq_factor={self.rope_low_freq_factor!r}")
        if self.sliding_window is not None:
            positive("sliding_window", self.sliding_window, (int,))
        pattern = self.sliding_window_pattern
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0 or pattern == 1:
            problems.append(f"sliding_window_pattern must be 0 (every layer slides) or >= 2 "
                            f"(every p-th layer is global), got {pattern!r}")
        if self.rope_local_theta is not None and self.sliding_window is None:
            problems.append("rope_local_theta applies to sliding-window layers; set "
                            "sliding_window too")
        return problems

    def layer_is_sliding(self, layer: int) -> bool:
        """Whether decoder block `layer` (0-based) uses sliding-window attention."""
        if self.sliding_window is None:
            return False
        p = self.sliding_window_pattern
        return p == 0 or (layer + 1) % p != 0

    @property
    def num_params(self) -> int:
        """Exact parameter count (embedding + blocks + final norm + untied head)."""
        d, h, kv, hd, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.mlp_hidden
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        block = attn + 3 * d * f + (4 if self.post_norms else 2) * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.n_layers * block + d + head

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# Presets. `vocab_size` of the task presets is a placeholder that is overwritten with the
# trained tokenizer's size when the model is built for a run.
PRESETS: Mapping[str, ModelConfig] = {
    # ~0.1M parameters: unit tests and smoke runs.
    "test": ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, mlp_hidden=192, tie_embeddings=True),
    # ~1.6M parameters: the default CPU run (arithmetic reasoning in minutes on 2 cores).
    "tiny": ModelConfig(vocab_size=128, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2,
                        head_dim=32, mlp_hidden=512, tie_embeddings=True),
    # The anchors' benchmark models (../shared/anchors/spec.json).
    "bench-tiny": ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8,
                              n_kv_heads=2, head_dim=32, mlp_hidden=768),
    "bench-small": ModelConfig(vocab_size=8192, d_model=512, n_layers=8, n_heads=8,
                               n_kv_heads=2, head_dim=64, mlp_hidden=1536),
    # Published shapes of real checkpoints (their config.json), for sizing and planning; the
    # weights themselves load from a local directory with `jaxrl_reason.models.hf`.
    "qwen2.5-1.5b": ModelConfig(vocab_size=151936, d_model=1536, n_layers=28, n_heads=12,
                                n_kv_heads=2, head_dim=128, mlp_hidden=8960,
                                rope_theta=1_000_000.0, tie_embeddings=True, qkv_bias=True),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28,
                              n_kv_heads=4, head_dim=128, mlp_hidden=18944,
                              rope_theta=1_000_000.0, qkv_bias=True),
    "qwen3-1.7b": ModelConfig(vocab_size=151936, d_model=2048, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, mlp_hidden=6144,
                              rope_theta=1_000_000.0, tie_embeddings=True, qk_norm=True),
    "llama3-8b": ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32,
                             n_kv_heads=8, head_dim=128, mlp_hidden=14336,
                             rope_theta=500_000.0, norm_eps=1e-5),
    "llama3.1-8b": ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32,
                               n_kv_heads=8, head_dim=128, mlp_hidden=14336,
                               rope_theta=500_000.0, norm_eps=1e-5, rope_scaling="llama3",
                               rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                               rope_high_freq_factor=4.0, rope_original_max_position=8192),
    "llama3.2-1b": ModelConfig(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32,
                               n_kv_heads=8, head_dim=64, mlp_hidden=8192,
                               rope_theta=500_000.0, norm_eps=1e-5, tie_embeddings=True,
                               rope_scaling="llama3", rope_scaling_factor=32.0,
                               rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                               rope_original_max_position=8192),
    "gemma2-2b": ModelConfig(vocab_size=256000, d_model=2304, n_layers=26, n_heads=8,
                             n_kv_heads=4, head_dim=256, mlp_hidden=9216, tie_embeddings=True,
                             activation="gelu_tanh", embed_scale=True, norm_plus_one=True,
                             post_norms=True, final_logit_softcap=30.0, attn_logit_softcap=50.0,
                             query_pre_attn_scalar=256.0, sliding_window=4096,
                             sliding_window_pattern=2),
    "gemma3-1b": ModelConfig(vocab_size=262144, d_model=1152, n_layers=26, n_heads=4,
                             n_kv_heads=1, head_dim=256, mlp_hidden=6912, tie_embeddings=True,
                             activation="gelu_tanh", embed_scale=True, norm_plus_one=True,
                             post_norms=True, qk_norm=True, query_pre_attn_scalar=256.0,
                             rope_theta=1_000_000.0, rope_local_theta=10_000.0,
                             sliding_window=512, sliding_window_pattern=6),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Returns the preset `name` with `overrides` applied; ValueError for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
