"""GRPO with LoRA adapters on the arithmetic task: arith_grpo's run, RL trains only adapters.

    jaxrl-reason train --config configs/arith_grpo_lora.py
    jaxrl-reason train --config configs/arith_grpo_lora.py:smoke      # seconds, for tests
    jaxrl-reason train --config configs/arith_grpo_lora.py --config.model.lora.base_quant=int8

The cold-start SFT fully fine-tunes the random model (adapters on a random base learn
nothing useful; `sft.lora = True` trains adapters in SFT too, for a pretrained `hf_model`).
RL then attaches rank-8 adapters to every projection and trains only them: the sampler runs
the unmerged adapters on the same arrays, and with `rl.beta > 0` the reference is the
base with the adapters removed (no second copy). Checkpoints hold the adapters, their
optimizer state and a fingerprinted reference to the SFT checkpoint they apply to;
`jaxrl-reason export` writes the merged model, the base and a PEFT adapter.

LoRA's learning rate is 10x full fine-tuning's (the adapters start at zero and are few).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "arith_grpo_lora"
    c.model.lora = ml_collections.ConfigDict({
        "rank": 8,                          # adapter rank r (PEFT: r)
        "alpha": 16.0,                      # output scaled by alpha / rank (PEFT: lora_alpha)
        "dropout": 0.0,                     # on the adapter input, in updates only
        "targets": ("all-linear",),         # regexes over q/k/v/o_proj, gate/up/down_proj
        "base_quant": "none",               # frozen base storage: none | int8 | nf4 (QLoRA)
    })
    c.sft.lora = False                      # SFT trains the full model (a cold start)
    c.rl.learning_rate = 5e-4
    return c
