"""benchmarks/tpu_plan.py's report from stored compiles: which setting each (model, slice)
reports, and the pairs still to compile. No compilation: synthetic per-device figures."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tpu_plan  # noqa: E402

GiB = 2**30
CHIP = {"name": "TPU v5e", "hbm_bytes": 16 * GiB, "peak_flops": 197e12, "hbm_bandwidth": 819e9}


def compile_entry(model, slice_name, setting, update_gib, *, layers=None, scan=True):
    """A stored compile whose update needs `update_gib` per chip (the other programs 1 GiB)."""
    def program(name, gib):
        return {"name": name, "argument_bytes": gib * GiB, "output_bytes": 0.0,
                "temp_bytes": 0.0, "flops": 1e15, "hbm_bytes": 1e12, "model_flops": 8e15,
                "note": "", "mosaic_calls": 0, "resident_bytes": 0.0}
    return {"model": model, "slice": slice_name, "setting": setting, "scan": scan,
            "layers": layers or tpu_plan._full_depth(model), "params": 7e9, "compile_s": 1.0,
            "chip": dict(CHIP), "devices": 8,
            "programs": {"sampler": program("sampler", 1.0),
                         "log-prob pass": program("log-prob pass", 1.0),
                         "update": program("update", update_gib)}}


def test_first_fitting_setting_is_reported_and_the_rest_are_pending():
    compiles = [compile_entry("qwen2.5-7b", "v5e-8", "B", 20.0),
                compile_entry("qwen2.5-7b", "v5e-8", "E", 14.0),
                compile_entry("qwen2.5-7b", "v5e-8", "A", 30.0),
                compile_entry("llama3-8b", "v5e-8", "A", 40.0),
                compile_entry("llama3-8b", "v5e-8", "B", 25.0),
                # unrolled and shallow compiles never stand for the full model
                compile_entry("gemma2-2b", "v5e-8", "A", 2.0, layers=2, scan=False)]
    results, pending = tpu_plan.chosen(compiles)
    picked = {(r["model"], r["slice"]): r["setting"] for r in results}
    assert picked == {("qwen2.5-7b", "v5e-8"): "E",   # the one that fits
                      ("llama3-8b", "v5e-8"): "B"}    # none fits: the last tried
    assert ("gemma2-2b", "v5e-8") in pending and ("qwen2.5-7b", "v5e-8") not in pending
    assert len(pending) == len(tpu_plan.MODELS) * len(tpu_plan.SLICES) - 2

    md = tpu_plan.markdown(results, [], pending)
    rows = [line for line in md.splitlines() if line.startswith("| qwen2.5-7b")
            or line.startswith("| llama3-8b")]
    assert len(rows) == 2
    assert "| yes |" in rows[0] and "14.0 / 16" in rows[0]
    assert "| NO |" in rows[1] and "25.0 / 16" in rows[1]
    assert "Not compiled yet" in md and "gemma2-2b on v5e-8" in md



def test_long_tail_sampler_time_table(monkeypatch):
    """--long-tail: static vs refill rows per KV budget from a stored compile (small shapes
    so the schedule is short)."""
    import pytest
    import roofline

    if roofline.load_spec() is None:
        pytest.skip("anchors' spec.json is not on this machine")
    monkeypatch.setattr(tpu_plan, "ROWS_PROMPTS", 2)
    monkeypatch.setattr(tpu_plan, "G", 4)
    monkeypatch.setattr(tpu_plan, "PROMPT", 16)
    monkeypatch.setattr(tpu_plan, "COMPLETION", 64)
    lengths = tpu_plan.long_tail_lengths(8, 64)
    assert len(lengths) == 8 and max(lengths) <= 64 and min(lengths) >= 1
    rows = tpu_plan.long_tail(compile_entry("qwen2.5-7b", "v5e-8", "E", 10.0), [0.5], [4])
    (row,) = rows
    assert row["static"]["rows_at_once"] == 8 and row["refill_4"]["slots"] == 4
    assert row["refill_4"]["useful_tokens"] == row["static"]["useful_tokens"] == sum(lengths)
    table = tpu_plan.long_tail_markdown(rows)
    assert "| qwen2.5-7b | v5e-8 | 0.5 | static | 8 x 1 |" in table
    assert "| refill 4 | 4 slots |" in table
