"""The sampler's time on rows of unequal lengths, static batch beside slot refill, under a
KV-cache budget: pure arithmetic on the model's shapes and a chip's published figures (no
compile), used by `runtime/plan.py` (`jaxrl-reason plan` with `rl.max_num_seqs` > 0) and
`benchmarks/tpu_plan.py --long-tail`.

XLA's cost analysis counts a decode loop's body once, so, like the plan's sampler row, the
time is analytic per decode step: max(FLOPs / peak, bytes / bandwidth) over the slice.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from jaxrl_reason.models.params import abstract_params
from jaxrl_reason.sampling import refill

GiB = 2**30
# The anchors' long_tail workload (../shared/anchors/spec.json): lognormal lengths, median 96
# and sigma 0.9, clipped to [8, 512], seed 1; `long_tail_lengths` keeps its shape at any
# maximum length.
LONG_TAIL = {"median": 96 / 512, "sigma": 0.9, "min": 8 / 512, "seed": 1}


def model_params(cfg) -> int:
    """Weights of the model `cfg` describes, counted one per weight whatever their storage
    (an nf4 leaf packs two in a byte), LoRA adapters included."""
    total = 0
    for path, x in jax.tree_util.tree_flatten_with_path(abstract_params(cfg))[0]:
        name = str(getattr(path[-1], "key", path[-1]))
        total += math.prod(x.shape) * (2 if name == "kernel_nf4" else 1)
        if name in ("kernel_scale", "kernel_absmax"):
            total -= math.prod(x.shape)
    return total


def kv_bytes_per_position(cfg, itemsize: int = 2) -> int:
    """Bytes of one row's K and V at one position, all layers (`itemsize` 2: bf16 cache)."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize


def stage_width(position: int, max_new_tokens: int, decode_stages: int = 4) -> int:
    """The decode cache width (new-token columns) a step at `position` attends over: the
    narrowest of `decode_stages` equal stages of `max_new_tokens` that holds it."""
    stage = -(-max_new_tokens // decode_stages)
    return min(max_new_tokens, -(-max(position, 1) // stage) * stage)


def refill_schedule(lengths, slots: int, refill_every: int,
                    min_slots: int = 4) -> list[tuple[int, int, int]]:
    """Slot refill's decode steps for int `lengths` [N] (tokens per row) in `slots` slots:
    `sampling.refill.replay` of the sampler's own schedule, rows queued in row order (how
    long a row runs is not known before it stops), the slots shrinking to `min_slots` in
    the tail as the sampler's do (0: never). Returns per step (slots computed, busy slots,
    the largest token index among them)."""
    if slots < 1 or refill_every < 1:
        raise ValueError(f"refill_schedule: slots and refill_every must be >= 1, got "
                         f"{slots} and {refill_every}")
    levels = refill.slot_levels(slots, 1, min_slots) if min_slots else None
    return refill.replay(lengths, slots, refill_every, levels)


def sampler_time(cfg, lengths, *, prompt_len: int, num_prompts: int, chip: Chip, n_dev: int,
                 weight_bytes: float, kv_budget_bytes: float, slots: int = 0,
                 refill_every: int = 8, decode_stages: int = 4,
                 cache_itemsize: int = 2) -> dict[str, Any]:
    """Roofline time of sampling rows of int `lengths` [N] (N = num_prompts x G) on a slice
    of `n_dev` chips with at most `kv_budget_bytes` of KV cache per chip: a static batch
    (`slots` = 0: as many rows at once as the budget holds, in batches each decoded to its
    longest row) or slot refill (`slots` > 0, capped by the budget and N).

    Per decode step, all computed rows (every slot, idle or not; every row of a static batch
    to its batch's end) cost 2 |theta| FLOPs plus attention over the step's cache width
    (`stage_width`), and the step reads the weights (`weight_bytes`, all chips) and the
    computed rows' K and V up to that width; the step takes max(FLOPs / peak, bytes /
    bandwidth) over the slice (the plan's analytic sampler count, per step). Prefill is left
    out (the same in both). Returns rows_at_once, batches (static) or slots, decode_steps,
    kv_cache_bytes per chip, flops, hbm_bytes, seconds, useful_tokens, useful_tok_s and
    occupancy (useful row-steps / computed row-steps; a row's first token comes from its
    prompt's prefill, as in the sampler, and is neither)."""
    lengths = [int(x) for x in lengths]
    n, max_len = len(lengths), max(lengths)
    per_pos = kv_bytes_per_position(cfg, cache_itemsize)
    budget = kv_budget_bytes * n_dev
    attn = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    params = model_params(cfg)
    flops = hbm = seconds = 0.0
    computed = 0

    def step(rows: int, position: int) -> None:
        nonlocal flops, hbm, seconds, computed
        width = prompt_len + stage_width(position, max_len, decode_stages)
        f = rows * (2 * params + attn * width)
        b = weight_bytes + rows * width * per_pos
        flops, hbm, computed = flops + f, hbm + b, computed + rows
        seconds += max(f / (chip.peak_flops * n_dev), b / (chip.hbm_bandwidth * n_dev))

    if slots:
        prompts_kv = num_prompts * prompt_len * per_pos  # kept to refill slots from
        fit = int((budget - prompts_kv) // (per_pos * (prompt_len + max_len)))
        rows = min(slots, n, fit)
        if rows < 1:
            raise ValueError(f"sampler_time: a KV budget of {kv_budget_bytes / GiB:.2f} GiB "
                             f"per chip holds no slot of {prompt_len + max_len} positions")
        schedule = refill_schedule(lengths, rows, refill_every)
        for size, _, position in schedule:  # the slots of that step's level
            step(size, position)
        kv, shape = per_pos * (rows * (prompt_len + max_len)) + prompts_kv, {"slots": rows}
    else:
        rows = min(n, int(budget // (per_pos * (prompt_len + max_len - 1))))
        if rows < 1:
            raise ValueError(f"sampler_time: a KV budget of {kv_budget_bytes / GiB:.2f} GiB "
                             f"per chip holds no row of {prompt_len + max_len - 1} positions")
        batches = [lengths[i:i + rows] for i in range(0, n, rows)]
        schedule = []
        for batch in batches:
            for t in range(1, max(batch)):  # token 0 comes from the prefill
                step(len(batch), t)
                schedule.append(t)
        kv = per_pos * rows * (prompt_len + max_len - 1)
        shape = {"rows_at_once": rows, "batches": len(batches)}
    useful = sum(lengths)
    return {**shape, "decode_steps": len(schedule), "kv_cache_bytes": kv / n_dev,
            "flops": flops, "hbm_bytes": hbm, "seconds": seconds, "useful_tokens": useful,
            "useful_tok_s": useful / seconds, "occupancy": (useful - n) / computed}


def long_tail_lengths(rows: int, max_len: int) -> list[int]:
    """int lengths [rows] in [1, max_len] with the anchors' long_tail shape scaled so that
    its longest possible row is `max_len`: seeded lognormal (`LONG_TAIL`), rounded,
    clipped. Deterministic; the same rows and max_len give the same lengths."""
    if rows < 1 or max_len < 1:
        raise ValueError(f"long_tail_lengths: need rows >= 1 and max_len >= 1, got {rows} "
                         f"and {max_len}")
    rng = np.random.default_rng(LONG_TAIL["seed"])
    raw = LONG_TAIL["median"] * max_len * np.exp(LONG_TAIL["sigma"]
                                                 * rng.standard_normal(rows))
    low = max(1, round(LONG_TAIL["min"] * max_len))
    return np.clip(np.rint(raw), low, max_len).astype(int).tolist()


def long_tail_plan(cfg, *, rows: int, max_new_tokens: int, prompt_len: int,
                   num_prompts: int, slots: int, refill_every: int, chip, n_dev: int,
                   weight_bytes_per_chip: float, other_bytes_per_chip: float,
                   kv_budget_bytes: float | None = None) -> dict[str, Any]:
    """Sampler time for `rows` long-tailed lengths (`long_tail_lengths`), static batch beside
    slot refill with `slots` (`rl.max_num_seqs`), under a KV budget per chip: by default the
    chip's HBM left beside the sampler's weights and the other arrays resident then
    (`other_bytes_per_chip`). Returns {"lengths": {rows, mean, median, max},
    "kv_budget_bytes", "slots", "refill_every", "static", "refill"}; a sampler the budget
    cannot hold is {"error": message} instead of `sampler_time`'s figures."""
    lengths = long_tail_lengths(rows, max_new_tokens)
    budget = (chip.hbm_bytes - weight_bytes_per_chip - other_bytes_per_chip
              if kv_budget_bytes is None else kv_budget_bytes)
    common = dict(prompt_len=prompt_len, num_prompts=num_prompts, chip=chip, n_dev=n_dev,
                  weight_bytes=weight_bytes_per_chip * n_dev, kv_budget_bytes=budget)
    out = {"lengths": {"rows": rows, "mean": float(np.mean(lengths)),
                       "median": float(np.median(lengths)), "max": max(lengths)},
           "kv_budget_bytes": budget, "slots": slots, "refill_every": refill_every}
    for name, extra in (("static", {}), ("refill", {"slots": slots,
                                                    "refill_every": refill_every})):
        try:
            out[name] = sampler_time(cfg, lengths, **common, **extra)
        except ValueError as e:
            out[name] = {"error": str(e)}
    return out


def format_long_tail(lt: dict[str, Any]) -> str:
    """The printed long-tail sampler rows of `long_tail_plan`'s result."""
    n = lt["lengths"]
    lines = [f"sampler on long-tailed lengths ({n['rows']} rows: mean {n['mean']:,.0f}, median "
             f"{n['median']:,.0f}, max {n['max']:,} new tokens; the anchors' long_tail "
             f"shape), KV budget {lt['kv_budget_bytes'] / GiB:.2f} GiB per chip:", "",
             "| sampler | rows at once x batches, or slots | decode steps | KV GiB / chip | "
             "roofline s | useful tok/s | occupancy |", "|---|---|---|---|---|---|---|"]
    for name in ("static", "refill"):
        r = lt[name]
        label = name if name == "static" else f"refill ({lt['slots']} slots asked, every " \
                                             f"{lt['refill_every']} steps)"
        if "error" in r:
            lines.append(f"| {label} | {r['error']} | | | | | |")
            continue
        shape = (f"{r['rows_at_once']} x {r['batches']}" if name == "static"
                 else f"{r['slots']} slots")
        lines.append(f"| {label} | {shape} | {r['decode_steps']:,} | "
                     f"{r['kv_cache_bytes'] / GiB:.2f} | {r['seconds']:.2f} | "
                     f"{r['useful_tok_s']:,.0f} | {100 * r['occupancy']:.0f}% |")
    return "\n".join(lines)
