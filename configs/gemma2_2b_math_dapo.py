"""DAPO on MATH-format problems from a local Gemma 2 2B directory (R1-Zero style: no SFT).

    jaxrl-reason train --config configs/gemma2_2b_math_dapo.py \
        --config.hf_model=/models/gemma-2-2b-it \
        --config.task.train_file=/data/math/train.jsonl \
        --config.task.eval_files.test=/data/math/test.jsonl
    ... --config gemma2_2b_math_dapo.py:gpu | :v5e-8 | :smoke (tiny, on CPU)

DAPO as in configs/arith_dapo.py (clip-higher 0.28, token-mean loss over the global batch,
dynamic sampling up to 3 rounds, no KL, the soft overlong penalty), on MATH records
(`\\boxed{}` answers, the sympy verifier), 1,024 new tokens, the boxed prompt template
(Gemma 2's chat template has no system turn). Architecture, weights and tokenizer come from
`hf_model`; the knobs (bf16 compute, f32 masters, remat, chunked log-probs, attention chunks)
are those of configs/qwen2_5_1_5b_gsm8k_grpo.py. Gemma 2's 256k vocabulary is where the
memory-lean log-probs matter most.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    qwen = sibling_config(__file__, "qwen2_5_1_5b_gsm8k_grpo")
    target = qwen.target_of(arg)
    smoke = target == "smoke"
    c = sibling_config(__file__, "gsm8k_file_grpo").get_config("smoke" if smoke else None)
    dapo = sibling_config(__file__, "arith_dapo").get_config("smoke" if smoke else None)
    c.name = "gemma2_2b_math_dapo"
    for key in ("algorithm", "epsilon_low", "epsilon_high", "loss_type", "dynamic_sampling",
                "dynamic_sampling_max_rounds", "beta"):
        c.rl[key] = dapo.rl[key]
    c.rewards.weights = ml_collections.ConfigDict(
        {"correctness": 1.0, "format_strict": 0.1, "overlong_dapo": 1.0})
    c = qwen.real_model(c, target, max_new_tokens=1024, micro_batches=16)
    if not smoke:
        c.task.preset = "math"
        c.task.template = "boxed"
        c.task.prompt_buckets = (256, 512)
    return c
