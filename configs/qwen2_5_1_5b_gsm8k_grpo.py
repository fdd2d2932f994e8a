"""GRPO on GSM8K from a local Qwen2.5-1.5B(-Instruct) directory (R1-Zero style: no SFT).

    jaxrl-reason train --config configs/qwen2_5_1_5b_gsm8k_grpo.py \
        --config.hf_model=/models/Qwen2.5-1.5B-Instruct \
        --config.task.train_file=/data/gsm8k/train.jsonl \
        --config.task.eval_files.test=/data/gsm8k/test.jsonl
    ... --config qwen2_5_1_5b_gsm8k_grpo.py:gpu      # one 80 GB GPU (mesh 1 device)
    ... --config qwen2_5_1_5b_gsm8k_grpo.py:v5e-8    # a v5e-8 slice (FSDP over 8 chips)
    jaxrl-reason train --config configs/qwen2_5_1_5b_gsm8k_grpo.py:smoke   # tiny, on CPU

Weights, architecture and tokenizer come from the directory (`hf_model`); the model block
only sets the training knobs: bf16 compute with float32 master weights, remat per block,
chunked log-probs, 512-query attention chunks. G = 8, 4 prompts per chip-group, 512 new
tokens, beta = 0.04, the math verifier plus the format reward, the R1 prompt template.
Size it first: `jaxrl-reason plan --config configs/qwen2_5_1_5b_gsm8k_grpo.py:v5e-8
--config.hf_model=DIR --topology v5e:2x4`. Smoke: the "test" model trained from scratch on
the shipped GSM8K-format sample (no model directory needed).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config

TARGETS = ("smoke", "gpu", "v5e-8")


def target_of(arg: str | None) -> str:
    """The config argument as a target in TARGETS (default "gpu"); ValueError otherwise."""
    target = arg or "gpu"
    if target not in TARGETS:
        raise ValueError(f"unknown config argument {arg!r}; one of {TARGETS}")
    return target


def real_model(c: ml_collections.ConfigDict, target: str, *, max_new_tokens: int,
               micro_batches: int) -> ml_collections.ConfigDict:
    """Shared settings of the real-model configs for `target` in TARGETS: the knobs, the
    mesh, and GRPO's batch (16 prompts x G = 8, lr 1e-6, 500 steps). Smoke: unchanged."""
    c.requires_hf_model = False
    if target == "smoke":
        return c
    c.requires_hf_model = True
    c.model.dtype = "bfloat16"              # matmuls in bf16, float32 masters and Adam
    c.model.param_dtype = "float32"
    c.model.remat = "block"
    c.model.scan_layers = True              # one block in the program: FSDP gathers per layer
    c.model.logprobs_impl = "auto"          # chunked on GPU/TPU: never [B, L, V] logits
    c.model.attention_chunk = 512
    c.sft.steps = 1                         # unused: RL starts from hf_model
    c.kernels.backend = "auto"              # Pallas kernels on GPU and TPU
    c.cpu_devices = 1                       # on CPU: one device, not a weights copy per core
    if target == "v5e-8":
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 1
    else:
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.rl.max_new_tokens = c.eval.max_new_tokens = max_new_tokens
    c.rl.batch_prompts, c.rl.num_generations = 16, 8
    c.rl.learning_rate = 1e-6
    c.rl.micro_batches = micro_batches
    c.rl.steps = 500
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    target = target_of(arg)
    smoke = target == "smoke"
    c = sibling_config(__file__, "gsm8k_file_grpo").get_config("smoke" if smoke else None)
    c.name = "qwen2_5_1_5b_gsm8k_grpo"
    c = real_model(c, target, max_new_tokens=512, micro_batches=8)
    if not smoke:
        c.task.template = "r1"
        c.task.prompt_buckets = (256,)
        c.rl.beta = 0.04
    return c
