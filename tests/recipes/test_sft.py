"""SFT batches: completion masks, length buckets, and a clear error for a trace that does not fit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxrl_reason.cli import parse
from jaxrl_reason.data.arithmetic import make_example
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.recipes.sft import sft_batch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])
    return build_runtime(fv.config, str(tmp_path_factory.mktemp("sft")))


def test_completions_are_padded_to_the_length_bucket(rt):
    examples = [make_example("train", level, i, 0) for i, level in enumerate((1, 1, 3, 2))]
    lengths = [len(rt.tokenizer.encode(e["completion"], add_eos=True)) for e in examples]
    batch = sft_batch(rt, examples, max_completion_length=200, length_bucket=16)
    width = batch["completion_tokens"].shape[1]
    assert width % 16 == 0 and max(lengths) <= width < max(lengths) + 16
    assert batch["completion_mask"].sum(1).tolist() == lengths
    for row, n, example in zip(batch["completion_tokens"], lengths, examples):
        assert rt.tokenizer.decode(row[:n]) == example["completion"]
        assert row[n - 1] == rt.tokenizer.eos_id and (row[n:] == rt.tokenizer.pad_id).all()
    # Without a bucket, or with a cap below the bucketed width, the cap is the width.
    assert sft_batch(rt, examples, 200)["completion_tokens"].shape[1] == 200
    capped = sft_batch(rt, examples, max(lengths), length_bucket=64)
    assert capped["completion_tokens"].shape[1] == max(lengths)
    np.testing.assert_array_equal(capped["completion_mask"].sum(1), lengths)


def test_a_completion_longer_than_the_limit_is_named(rt):
    example = make_example("train", 3, 5, 0)
    with pytest.raises(ValueError, match=f"{example['id']}.*sft.max_completion_length=8"):
        sft_batch(rt, [example], max_completion_length=8, length_bucket=32)
