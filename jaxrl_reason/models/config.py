"""Decoder configuration: one dataclass for Llama / Qwen2 / Gemma-style variants, plus presets.

A model family differs only in the switches below (bias on q/k/v, q/k norm, activation,
embedding scaling, logit soft-capping, tied embeddings), so adding a family means adding a
preset, not a new model class.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

_ACTIVATIONS = ("silu", "gelu_tanh")
_DTYPES = ("float32", "bfloat16", "float16")
_LOGPROBS_IMPLS = ("auto", "full", "chunked")
_REMAT = ("none", "block", "save_dots")


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
        logprobs_impl: how training scores completion tokens: "full" (materializes the
            [B, L, V] logits), "chunked" (`jaxrl_reason.kernels.logprobs`: online logsumexp
            over sequence and vocabulary chunks, forward and backward, never the full
            logits), or "auto" (chunked on TPU/GPU, full on CPU).
        logprobs_seq_chunk, logprobs_vocab_chunk: chunk sizes of "chunked".
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
    dtype: str = "float32"
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: str = "none"
    logprobs_impl: str = "auto"
    logprobs_seq_chunk: int = 128
    logprobs_vocab_chunk: int = 8192

    def __post_init__(self):
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
        if self.remat not in _REMAT:
            problems.append(f"remat must be one of {_REMAT}, got {self.remat!r}")
        if self.logprobs_impl not in _LOGPROBS_IMPLS:
            problems.append(f"logprobs_impl must be one of {_LOGPROBS_IMPLS}, got "
                            f"{self.logprobs_impl!r}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def num_params(self) -> int:
        """Exact parameter count (embedding + blocks + final norm + untied head)."""
        d, h, kv, hd, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.mlp_hidden
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        block = attn + 3 * d * f + 2 * d
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
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Returns the preset `name` with `overrides` applied; ValueError for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
