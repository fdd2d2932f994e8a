"""Writes the Hugging Face parity fixtures of tests/models/test_hf_parity.py (needs torch and
transformers; the test suite itself does not).

    python3 -m venv /tmp/venv_hf && /tmp/venv_hf/bin/pip install \
        -c ../shared/anchors/requirements-trl.lock torch==2.13.0+cpu transformers==5.23.0 \
        safetensors numpy
    /tmp/venv_hf/bin/python scripts/make_parity_fixtures.py            # all families
    /tmp/venv_hf/bin/python scripts/make_parity_fixtures.py --check-export DIR --family gemma2

For each family (llama with llama3 RoPE scaling, qwen2, qwen3, gemma2, gemma3_text) it builds
a tiny random-weight float32 model with transformers, saves it with `save_pretrained` into
tests/models/fixtures/<family>/, and writes reference.npz there:

    input_ids  int32 [2, PROMPT]       random prompts (no padding)
    logits     f32   [2, PROMPT, V]    transformers' logits for input_ids (eager attention)
    greedy     int32 [2, NEW]          transformers' `generate` greedy continuation (KV cache,
                                       no EOS: the configs have no eos_token_id)
    margin     f32   []                smallest top-1 minus top-2 logit over the greedy steps

Weights are drawn wider than transformers' init (norm weights away from their identity
value, biases non-zero, q/k wide enough that Gemma 2's attention soft-cap is active) so every
parameter matters, and seeds are retried until every greedy step has a top-1/top-2 margin
above MIN_MARGIN, so float32 rounding cannot flip a token. Gemma's sliding windows are
shorter than the prompt, so local layers really see fewer keys, in prefill and in decode.

--check-export DIR loads a directory written by `jaxrl_reason.models.hf.export_hf_checkpoint`
with transformers and prints its max |logit diff| against the family's reference.npz.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import transformers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "models", "fixtures")
PROMPT, NEW, BATCH, VOCAB = 20, 12, 2, 256
MIN_MARGIN = 1e-2
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, head_dim=16,
               max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
               pad_token_id=0)


def family_configs() -> dict:
    """Tiny configs: same code paths as the real models, a few hundred kB each."""
    return {
        # Llama 3.1 / 3.2: RoPE "llama3" scaling; original_max_position 64 puts the head's
        # 8 frequencies in all three bands (kept, interpolated, divided by the factor).
        "llama": transformers.LlamaConfig(
            **_COMMON, intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2,
            rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=64)),
        # Qwen2 / 2.5: q/k/v biases, tied embeddings (as the 1.5B).
        "qwen2": transformers.Qwen2Config(
            **_COMMON, intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2,
            rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0)),
        # Qwen3: q/k RMSNorm per head before RoPE.
        "qwen3": transformers.Qwen3Config(
            **_COMMON, intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2,
            rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0)),
        # Gemma 2: (1 + w) norms, 4 norms per block, GeGLU, sqrt(d) embedding scale, both
        # soft-caps (small, so that they bend the values), query_pre_attn_scalar != head_dim,
        # alternating sliding (window 6 < prompt 20) and global layers.
        "gemma2": transformers.Gemma2Config(
            **_COMMON, intermediate_size=128, num_hidden_layers=4, num_key_value_heads=2,
            rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=24,
            sliding_window=6, final_logit_softcapping=8.0, attn_logit_softcapping=4.0,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        # Gemma 3 (text): q/k norms, 5 local : 1 global layers, local RoPE base 10k, global
        # RoPE base 1M with linear scaling, no soft-caps.
        "gemma3_text": transformers.Gemma3TextConfig(
            **_COMMON, intermediate_size=96, num_hidden_layers=6, num_key_value_heads=1,
            rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=16,
            sliding_window=6, final_logit_softcapping=None, attn_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters={
                "full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1_000_000.0),
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
    }


def randomize(model, gemma: bool, generator: torch.Generator) -> None:
    """Overwrites every parameter with a wide random draw (see the module docstring)."""
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=generator)
        if name.endswith("norm.weight"):
            p.data = 0.3 * noise if gemma else 1.0 + 0.3 * noise
        elif name.endswith(".bias"):
            p.data = 0.3 * noise
        elif "embed_tokens" in name:
            p.data = noise * (1.0 / 8 if gemma else 1.0)  # Gemma multiplies by sqrt(64)
        else:  # Linear [out, in]
            gain = 2.0 if ("q_proj" in name or "k_proj" in name) else 1.0
            p.data = noise * gain / p.shape[1] ** 0.5


def greedy_margin(model, sequences: torch.Tensor) -> float:
    """Smallest top-1 minus top-2 logit at the positions that chose the generated tokens."""
    with torch.no_grad():
        logits = model(sequences).logits[:, PROMPT - 1:-1]
    top = torch.topk(logits, 2, dim=-1).values
    chosen = logits.argmax(-1)
    assert torch.equal(chosen, sequences[:, PROMPT:]), "generate disagrees with full forward"
    return float((top[..., 0] - top[..., 1]).min())


def build(family: str, config, max_tries: int = 50):
    gemma = family.startswith("gemma")
    for seed in range(max_tries):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", dtype=torch.float32).eval()
        generator = torch.Generator().manual_seed(seed)
        randomize(model, gemma, generator)
        input_ids = torch.randint(1, VOCAB, (BATCH, PROMPT), generator=generator)
        with torch.no_grad():
            logits = model(input_ids).logits
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
        assert out.shape == (BATCH, PROMPT + NEW), out.shape
        margin = greedy_margin(model, out)
        if margin >= MIN_MARGIN:
            return model, input_ids, logits, out[:, PROMPT:], margin, seed
    raise RuntimeError(f"{family}: no seed below {max_tries} gives a greedy margin >= "
                       f"{MIN_MARGIN}")


def write(family: str, config) -> None:
    model, input_ids, logits, greedy, margin, seed = build(family, config)
    out_dir = os.path.join(OUT, family)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    np.savez_compressed(os.path.join(out_dir, "reference.npz"),
                        input_ids=input_ids.numpy().astype(np.int32),
                        logits=logits.numpy().astype(np.float32),
                        greedy=greedy.numpy().astype(np.int32), margin=np.float32(margin))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{family}: seed {seed}, {sum(p.numel() for p in model.parameters()):,} params, "
          f"greedy margin {margin:.3g}, {size / 1e3:.0f} kB in {os.path.relpath(out_dir)}")


def check_export(directory: str, family: str) -> None:
    ref = np.load(os.path.join(OUT, family, "reference.npz"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(ref["input_ids"], dtype=torch.long)).logits.numpy()
    print(f"{directory} ({type(model).__name__}): max |logit diff| vs {family} reference "
          f"{np.abs(logits - ref['logits']).max():.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="*", default=None)
    parser.add_argument("--check-export", default=None, metavar="DIR")
    parser.add_argument("--family", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.check_export:
        check_export(args.check_export, args.family)
        return
    configs = family_configs()
    for family in args.families or configs:
        write(family, configs[family])


if __name__ == "__main__":
    main()
