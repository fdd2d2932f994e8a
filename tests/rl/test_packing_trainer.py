"""RLTrainer with rl.packing against the padded trainer: the same step (same params, rows
and rewards) gives the same metrics up to float summation order, with the reference pass,
the KL term, two policy iterations (the old-log-prob pass), skipped rows, and two
micro-batches (of rows, and of packs)."""
import numpy as np
import pytest

from trainer_support import run_steps
from jaxrl_reason.rl import packing
from numerics import decoder_tolerance

FLAGS = ("--config.rl.beta=0.04", "--config.rl.num_iterations=2")


@pytest.mark.parametrize("flags", [FLAGS, ("--config.rl.skip_zero_advantage_rows=True",),
                                   FLAGS + ("--config.rl.micro_batches=2",)])
def test_packed_steps_match_padded_steps(make_trainer, flags):
    weights = {"_test_text_length": 1.0, "_test_half_constant": 1.0}  # some groups vary
    padded, _ = make_trainer(*flags, weights=weights)
    packed, initial = make_trainer(*flags, "--config.rl.packing=True",
                                   "--config.rl.pack_tokens=64", weights=weights)
    assert packed.packed is not None and padded.packed is None
    a, b = run_steps(padded, 2), run_steps(packed, 2)
    cfg = packed.rt.model_cfg
    # every update metric is a weighted mean of per-token terms of log-probs that differ by
    # at most the decoder bound; 8x covers the loss terms' slopes (ratio * |A|, the KL's)
    atol = 8 * decoder_tolerance(cfg, initial, tokens=64)
    for step_a, step_b in zip(a, b):
        assert set(step_a) == set(step_b)
        for name, value in step_a.items():
            if name.startswith("time/"):
                continue
            scale = 1.0 + abs(value)
            np.testing.assert_allclose(step_b[name], value, rtol=0, atol=atol * scale,
                                       err_msg=name)
    assert any(step["train_rows_frac"] > 0 and step["grad_norm"] > 0 for step in a)
    if "--config.rl.micro_batches=2" in flags:
        # The trainer sized its pack micro-batches (half the largest batch's packs, a
        # multiple of the 8 devices). The smoke batches' short rows fill one of them, so
        # the multi-micro-batch path itself is tested in tests/rl/test_packing_micro.py.
        c = packed.rt.config
        most = packing.max_packs(c.rl.batch_prompts * c.rl.num_generations,
                                 max(c.task.prompt_buckets) + c.rl.max_new_tokens - 1, 64)
        per = packed.packed.packer.packs_per_micro
        assert per is not None and per == packing.packs_per_micro_batch(most, 8, 2)
