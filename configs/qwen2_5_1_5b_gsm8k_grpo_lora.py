"""GRPO with LoRA on GSM8K from a local Qwen2.5-1.5B(-Instruct) directory (R1-Zero style).

    jaxrl-reason train --config configs/qwen2_5_1_5b_gsm8k_grpo_lora.py \
        --config.hf_model=/models/Qwen2.5-1.5B-Instruct \
        --config.task.train_file=/data/gsm8k/train.jsonl \
        --config.task.eval_files.test=/data/gsm8k/test.jsonl
    ... --config.model.lora.base_quant=int8     # QLoRA: the frozen base held as int8
    jaxrl-reason train --config configs/qwen2_5_1_5b_gsm8k_grpo_lora.py:smoke  # tiny, on CPU

qwen2_5_1_5b_gsm8k_grpo's run (targets smoke | gpu | v5e-8), with rank-16 adapters on every
projection: only they get gradients and Adam state, the reference (beta = 0.04) is the base
with the adapters removed, and checkpoints hold the adapters plus a fingerprinted
reference to `hf_model`. LoRA's learning rate is 2e-5 (20x the full run's 1e-6; TRL's
GRPO LoRA recipes use 1e-5 to 5e-5). Export gives a PEFT adapter for the same directory.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "qwen2_5_1_5b_gsm8k_grpo").get_config(arg)
    c.name = "qwen2_5_1_5b_gsm8k_grpo_lora"
    c.model.lora = ml_collections.ConfigDict({
        "rank": 16, "alpha": 32.0, "dropout": 0.0, "targets": ("all-linear",),
        "base_quant": "none",               # none | int8 | nf4 (QLoRA)
    })
    c.sft.lora = False                      # smoke's SFT fully trains its random model
    c.rl.learning_rate = 2e-5 if arg != "smoke" else c.rl.learning_rate * 10
    return c
