"""GRPO on Countdown from a local Llama 3.2 1B directory (R1-Zero style: no SFT).

    jaxrl-reason train --config configs/llama3_1b_countdown_grpo.py \
        --config.hf_model=/models/Llama-3.2-1B-Instruct
    ... --config llama3_1b_countdown_grpo.py:gpu | :v5e-8 | :smoke (tiny, on CPU)

The built-in Countdown task (generated problems, exact verifier: no data set needed) with
3-4 numbers (the task's own prompt), G = 8, 512 new tokens, beta = 0.001 (TinyZero's
setting). Architecture (Llama 3 RoPE scaling), weights and tokenizer come from `hf_model`;
knobs as in configs/qwen2_5_1_5b_gsm8k_grpo.py.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    qwen = sibling_config(__file__, "qwen2_5_1_5b_gsm8k_grpo")
    target = qwen.target_of(arg)
    smoke = target == "smoke"
    c = sibling_config(__file__, "countdown_grpo").get_config("smoke" if smoke else None)
    c.name = "llama3_1b_countdown_grpo"
    c = qwen.real_model(c, target, max_new_tokens=512, micro_batches=8)
    if not smoke:
        c.task.train_levels = (2, 3)        # three and four numbers
        c.task.eval_levels = ((2, 3), (4,))
        c.task.prompt_buckets = (128,)
        c.rl.beta = 0.001
    return c
