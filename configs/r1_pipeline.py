"""The DeepSeek-R1 recipe as one pipeline on the arithmetic task: cold-start SFT -> reasoning
RL (GRPO) -> rejection-sampling SFT on the RL model's own verified answers -> a second RL
stage, each stage starting from the previous stage's checkpoint.

    jaxrl-reason pipeline --config configs/r1_pipeline.py
    jaxrl-reason pipeline --config configs/r1_pipeline.py:smoke          # seconds, for tests
    jaxrl-reason pipeline --config configs/r1_pipeline.py --until rl     # stop after stage 2
    jaxrl-reason pipeline --config configs/r1_pipeline.py \\
        --config.pipeline.stage.rl.overrides.rl.steps=100                # a stage's override

Rerunning the command with the same --workdir skips the finished stages and resumes an
interrupted one from its checkpoints. After every stage the held-out levels 1-3 are
evaluated; `<workdir>/pipeline_table.md` holds the per-stage table. Every other field is
the one of configs/arith_grpo.py (`jaxrl-reason train` on this file runs that single
SFT -> GRPO run).

Departures from DeepSeek-R1 (Guo et al., 2025):
  - one task and one model size: the cold start is gold worked traces, the rejection
    sampling keeps the RL model's verified completions of fresh training prompts (R1 also
    mixes in non-reasoning SFT data and judges some prompts with a generative reward model);
  - the third stage fine-tunes the RL model itself on its own verified samples
    (distill.student_init = "teacher", rejection-sampling fine-tuning / expert iteration)
    at a low learning rate; R1 retrains the base model (DeepSeek-V3-Base) on 800k samples,
    which here would mean a random init (`distill.student_init = "random"`, optionally with
    a smaller `distill.student_preset`, as R1's distilled models);
  - the final stage is the same verifiable-reward GRPO as stage 2 on new prompts (a new
    seed); R1's last stage adds helpfulness/harmlessness reward models
    (`rewards.reward_model_dir` does that here when one is given).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def _stage(kind: str, **overrides) -> ml_collections.ConfigDict:
    """A pipeline stage: its kind and the nested config keys it overrides."""
    return ml_collections.ConfigDict({"kind": kind, "overrides": overrides})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    smoke = arg == "smoke"
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "r1_pipeline"
    c.task.eval_levels = ((1, 2, 3),)       # after every stage: held-out levels 1-3
    c.eval.num_problems = 16 if smoke else 200  # held-out problems per evaluation
    c.eval.seeds = (0,) if smoke else (0, 1)  # sampling seeds per evaluation
    c.eval.batch_prompts = 16 if smoke else 50  # prompts per sampler call

    # Rejection sampling (the distill stage): see jaxrl_reason.recipes.distill.DistillSettings.
    c.distill = ml_collections.ConfigDict()
    c.distill.num_prompts = 16 if smoke else 512  # fresh training prompts sampled from the teacher
    c.distill.num_samples = 2 if smoke else 4   # completions per prompt
    c.distill.keep = "all"                  # all verified completions | shortest per prompt
    c.distill.max_new_tokens = 0            # teacher budget; 0 = rl.max_new_tokens
    c.distill.temperature = 1.0             # teacher sampling temperature
    c.distill.top_p = 1.0                   # teacher nucleus
    c.distill.batch_prompts = 16 if smoke else 64  # prompts per sampler call
    c.distill.seed = 0                      # sampling seed
    c.distill.verifiers = ()                # rewards a completion must pass; () = the task's
    # False keeps every sample unverified (sequence-level distillation): the smoke run's
    # 4-step teacher is never right and rarely stops.
    c.distill.verify = not smoke
    c.distill.drop_truncated = not smoke    # drop completions that hit the budget
    c.distill.dedupe = True                 # drop repeats of a kept completion of one prompt
    c.distill.student_preset = ""           # "" = the teacher's model (needed for "teacher")
    c.distill.student_init = "teacher"      # teacher (fine-tune the RL model) | random
    c.distill.student_steps = 2 if smoke else 100  # student SFT steps
    c.distill.student_learning_rate = 1e-4  # student peak SFT rate (low: it starts from RL)

    c.pipeline = ml_collections.ConfigDict()
    c.pipeline.stages = ("sft", "rl", "distill", "rl_final")  # stage names, in run order
    c.pipeline.init_checkpoint = ""         # a checkpoint to start from instead of the cold start
    c.pipeline.stage = ml_collections.ConfigDict({
        "sft": _stage("sft"),               # the cold start of arith_grpo (sft.*)
        "rl": _stage("rl", rl={"steps": 2 if smoke else 50}),
        "distill": _stage("distill"),       # the distill block above
        "rl_final": _stage("rl", seed=1, rl={"steps": 2 if smoke else 50}),
    })
    return c
