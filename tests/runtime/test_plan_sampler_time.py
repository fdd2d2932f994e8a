"""plan.sampler_time: the static batch against slot refill on per-row lengths, and the
long-tail report `jaxrl-reason plan` prints (pure arithmetic, no TPU needed)."""
import pytest

from jaxrl_reason.models.config import get_preset
from jaxrl_reason.runtime import plan, plan_sampler

CHIP = plan.Chip("test chip", 16 * plan.GiB, 1e12, 1e9)


def test_stage_width():
    assert [plan.stage_width(p, 16, 4) for p in (1, 4, 5, 16)] == [4, 4, 8, 16]
    assert plan.stage_width(3, 10, 1) == 10


def test_refill_schedule_by_hand():
    # 2 slots, row order: rows 0 (2 tokens, one decode step) and 1 (5 tokens) start; after
    # the first chunk of 2 steps slot 0 takes row 2 (3 tokens), which ends with row 1.
    steps = plan.refill_schedule([2, 5, 3], slots=2, refill_every=2, min_slots=0)
    assert steps == [(2, 2, 1), (2, 1, 2), (2, 2, 3), (2, 2, 4)]
    # 4 slots shrinking through 3, 2, 1 once the queue is empty: the 3 rows start in 3 of
    # them, and the slots follow the busy count down.
    shrunk = plan.refill_schedule([2, 5, 3], slots=4, refill_every=1, min_slots=1)
    assert shrunk == [(3, 3, 1), (2, 2, 2), (1, 1, 3), (1, 1, 4)]
    with pytest.raises(ValueError, match="slots"):
        plan.refill_schedule([1], slots=0, refill_every=1)


def test_sampler_time_static_vs_refill():
    cfg = get_preset("bench-tiny")
    per_row = plan.kv_bytes_per_position(cfg, 4) * (8 + 16 - 1)
    common = dict(prompt_len=8, num_prompts=2, chip=CHIP, n_dev=1, weight_bytes=1e6,
                  cache_itemsize=4)
    lengths = [16, 2, 2, 2, 2, 2, 2, 2]
    static = plan.sampler_time(cfg, lengths, kv_budget_bytes=8 * per_row, **common)
    assert (static["rows_at_once"], static["batches"], static["decode_steps"]) == (8, 1, 15)
    assert static["occupancy"] == pytest.approx(22 / (8 * 15))  # first tokens: prefill
    # Half the budget: the static batch runs twice, each to its longest row.
    half = plan.sampler_time(cfg, lengths, kv_budget_bytes=4 * per_row, **common)
    assert (half["rows_at_once"], half["batches"], half["decode_steps"]) == (4, 2, 16)
    refill = plan.sampler_time(cfg, lengths, kv_budget_bytes=8 * per_row, slots=2,
                               refill_every=1, **common)
    # 15: each row's first token comes from its prompt's prefill, not a decode step.
    assert refill["slots"] == 2 and refill["decode_steps"] == 15
    # 30 tokens, 8 of them first tokens from the prefills: 22 decoded in 15 steps x 2 slots
    # (no level below 2: the default floor is 4).
    assert refill["occupancy"] == pytest.approx(22 / (15 * 2))
    assert refill["seconds"] < static["seconds"]
    assert refill["kv_cache_bytes"] < static["kv_cache_bytes"]
    assert refill["useful_tokens"] == static["useful_tokens"] == 30
    with pytest.raises(ValueError, match="holds no row"):
        plan.sampler_time(cfg, lengths, kv_budget_bytes=per_row / 2, **common)


def test_long_tail_lengths_have_the_anchors_shape_at_any_length():
    lengths = plan_sampler.long_tail_lengths(256, 512)
    assert lengths == plan_sampler.long_tail_lengths(256, 512)  # deterministic
    assert min(lengths) >= 8 and max(lengths) <= 512
    # The anchors' spec: lognormal, median 96, clipped to [8, 512] (mean about 119).
    assert 80 <= sorted(lengths)[128] <= 112
    longer = plan_sampler.long_tail_lengths(64, 16384)
    assert max(longer) <= 16384 and min(longer) >= 256
    assert abs(sorted(longer)[32] / 16384 - sorted(lengths[:64])[32] / 512) < 0.02
    with pytest.raises(ValueError, match="rows >= 1"):
        plan_sampler.long_tail_lengths(0, 16)


def test_long_tail_plan_budgets_the_hbm_left_beside_the_sampler_and_prints_both():
    cfg = get_preset("bench-tiny")
    common = dict(rows=16, max_new_tokens=64, prompt_len=8, num_prompts=2, slots=4,
                  refill_every=2, chip=CHIP, n_dev=2)
    lt = plan_sampler.long_tail_plan(cfg, weight_bytes_per_chip=4 * plan.GiB,
                             other_bytes_per_chip=2 * plan.GiB, **common)
    assert lt["kv_budget_bytes"] == 10 * plan.GiB  # 16 GiB HBM - weights - resident
    assert lt["static"]["useful_tokens"] == lt["refill"]["useful_tokens"] == sum(
        plan_sampler.long_tail_lengths(16, 64))
    assert lt["refill"]["slots"] == 4 and lt["static"]["rows_at_once"] == 16
    assert lt["refill"]["occupancy"] > lt["static"]["occupancy"]
    text = plan_sampler.format_long_tail(lt)
    assert "| static | 16 x 1 |" in text and "| refill (4 slots asked, every 2 steps) |" in text
    # A budget that holds no row is reported as such, not raised.
    tight = plan_sampler.long_tail_plan(cfg, weight_bytes_per_chip=0, other_bytes_per_chip=0,
                                kv_budget_bytes=1.0, **common)
    assert "holds no row" in tight["static"]["error"]
    assert "holds no slot" in tight["refill"]["error"]
    assert "holds no row" in plan_sampler.format_long_tail(tight)
