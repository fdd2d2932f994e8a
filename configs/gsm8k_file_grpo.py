"""GRPO on problems from local files (GSM8K / MATH / generic JSONL or parquet).

    jaxrl-reason train --config configs/gsm8k_file_grpo.py
    jaxrl-reason train --config configs/gsm8k_file_grpo.py:smoke
    jaxrl-reason train --config configs/gsm8k_file_grpo.py \
        --config.task.train_file=/data/gsm8k/train.jsonl \
        --config.task.eval_files.test=/data/gsm8k/test.jsonl

By default it reads the small GSM8K-format sample shipped in configs/data/ (word problems
written by configs/data/make_sample_gsm8k.py; real GSM8K cannot be downloaded here) and
runs the same recipe as configs/arith_grpo.py: tokenizer trained on the file, cold-start
SFT on `<think>{solution}</think><answer>{answer}</answer>` targets built from the
records' worked solutions, GRPO with the math verifier, evaluation on the test file.
For MATH use `--config.task.preset=math`; for your own {prompt, answer} records,
`--config.task.preset=generic --config.task.prompt_field=question`.
"""

import os

import ml_collections

from jaxrl_reason.config.files import sibling_config

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    smoke = arg == "smoke"
    c.name = "gsm8k_file_grpo"
    c.task.name = "file"                    # problems from local files (no levels)
    c.task.train_levels = ()                # unused by file tasks
    c.task.eval_levels = ()
    c.task.train_file = os.path.join(_DATA, "sample_gsm8k_train.jsonl")  # file, dir or glob
    c.task.eval_files = ml_collections.ConfigDict(  # eval set name -> file
        {"test": os.path.join(_DATA, "sample_gsm8k_test.jsonl")})
    c.task.format = "auto"                  # auto | jsonl | parquet
    c.task.preset = "gsm8k"                 # gsm8k | math | generic field mapping
    c.task.prompt_field = ""                # source field of the prompt ("" = the preset's)
    c.task.answer_field = ""                # source field of the answer ("" = the preset's)
    c.task.id_field = ""                    # source field of the id ("" = file-line)
    c.task.on_error = "raise"               # malformed records: raise | skip (and count)
    c.task.template = "plain"               # plain | r1 | boxed | a format string with {prompt}
    c.task.prompt_buckets = (48, 80)        # word problems are longer than "What is a+b?"
    c.sft.num_examples = 64 if smoke else 400
    c.sft.steps = 4 if smoke else 300
    c.rl.steps = 2 if smoke else 100
    c.eval.num_problems = 16 if smoke else 100
    return c
