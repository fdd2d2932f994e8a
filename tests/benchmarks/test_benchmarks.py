"""The benchmark scripts' --quick modes on the "test" preset, and compare.sh's table built
from their results. Behaviour only: no timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rl_step  # noqa: E402
import rl_step_long_tail  # noqa: E402
import roofline  # noqa: E402
import sampler as sampler_bench  # noqa: E402
from jaxrl_reason.models.config import get_preset  # noqa: E402


def test_flop_counts():
    cfg = get_preset("bench-tiny")
    assert cfg.num_params == 3_541_248  # the spec's / anchors' count
    assert roofline.matmul_params(cfg) == cfg.num_params - 1024 * 256
    per_token = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    assert roofline.attention_flops_per_token(cfg, 10) == per_token * 10
    assert roofline.forward_flops(cfg, 3, 7) == 2 * cfg.num_params * 3 + per_token * 7
    assert roofline.train_flops(cfg, 3, 7) == 6 * cfg.num_params * 3 + 3 * per_token * 7
    assert roofline.causal_keys(0, 4) == 1 + 2 + 3 + 4
    assert roofline.causal_keys(32, 2) == 33 + 34
    # The sampler's useful FLOPs: prefill of P x Tp tokens + (L - 1) decode steps of N rows.
    w = {"n_prompts": 2, "prompt_len": 4, "new_tokens": 3}
    want = (roofline.forward_flops(cfg, 8, 2 * roofline.causal_keys(0, 4))
            + roofline.forward_flops(cfg, 4 * 2, 4 * (2 * 4 + 3)))
    assert sampler_bench.sampler_flops(cfg, w, rows=4) == pytest.approx(want)


def test_presets_match_the_anchor_spec():
    spec = roofline.load_spec()
    if spec is None:
        pytest.skip("anchors' spec.json is not on this machine")
    for name in spec["models"]:
        roofline.check_preset_matches_spec(name, spec)
    with pytest.raises(ValueError, match="differs from spec"):
        bad = {"models": {"bench-tiny": {**spec["models"]["bench-tiny"], "d_model": 7}}}
        roofline.check_preset_matches_spec("bench-tiny", bad)


def test_roofline_quick(tmp_path):
    out = tmp_path / "roofline.json"
    assert roofline.main(["--quick", "--presets", "test", "--tokens", "8", "--json",
                          str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["models"]["test@8"]["gflops"] > 0
    assert {"q_proj", "lm_head"} <= set(result["models"]["test@8"])
    assert len(result["machine"]["loadavg"]) == 3
    frac = roofline.roofline_fraction(1e9, get_preset("test"), 8)
    assert frac["fraction"] == pytest.approx(1.0 / frac["roofline_gflops"], rel=0.02)


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    """sampler.py and rl_step.py --quick, their RESULT_JSON files as compare.sh stores them."""
    out = tmp_path_factory.mktemp("compare")
    sampler_json, rl_json = out / "sampler.json", out / "rl.json"
    assert sampler_bench.main(["--quick", "--scaling", "--json", str(sampler_json)]) == 0
    assert rl_step.main(["--quick", "--json", str(rl_json)]) == 0
    run = json.loads(sampler_json.read_text())["runs"]["test"]
    for m in ("bench-tiny", "bench-small"):
        (out / f"ours.sampler.{m}.json").write_text(json.dumps(run))
    (out / "ours.rl_step.bench-tiny.json").write_text(
        json.dumps(json.loads(rl_json.read_text())["result"]))
    return out, json.loads(sampler_json.read_text()), json.loads(rl_json.read_text())


def test_sampler_quick(quick_results):
    _, result, _ = quick_results
    run = result["runs"]["test"]
    assert run["rows"] == 4 and run["new_tokens"] == 8
    assert run["decode_tok_s"] > 0 and run["compile_s"] > 0 and run["peak_rss_mib"] > 0
    assert 0 < run["roofline_fraction"] and run["xla_memory_mib"]["argument"] > 0
    assert len(run["loadavg_start"]) == 3
    assert [(r["rows"], r["new_tokens"]) for r in result["scaling"]] == [(4, 8), (8, 8), (4, 16)]


def test_rl_step_quick(quick_results):
    _, _, result = quick_results
    r = result["result"]
    assert set(r["split_s_median"]) == {"sample", "score", "reference", "train"}
    assert len(r["step_s_all"]) == 2 and r["completion_len_mean"] == [8.0, 8.0]
    assert all(v > 0 for v in r["roofline_fraction"].values())
    assert r["kl"][0] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference


def test_hash_rewards_are_deterministic_uniform():
    import numpy as np

    tokens = np.random.default_rng(0).integers(0, 1000, (4000, 16))
    lengths = np.full(4000, 16)
    r = rl_step.hash_rewards(tokens, lengths)
    assert r.dtype == np.float32 and ((0 <= r) & (r < 1)).all()
    np.testing.assert_array_equal(r, rl_step.hash_rewards(tokens, lengths))
    assert abs(r.mean() - 0.5) < 0.02
    shorter = rl_step.hash_rewards(tokens, np.full(4000, 15))  # masked tokens do not count
    np.testing.assert_array_equal(shorter, rl_step.hash_rewards(
        np.where(np.arange(16) < 15, tokens, 7), np.full(4000, 15)))


def test_compare_sh_table(quick_results, tmp_path):
    out, _, _ = quick_results
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    runs = {f"tunix_sampler.{m}": {"decode_tok_s": 1000.0} for m in ("bench-tiny", "bench-small")}
    runs.update({f"hf_generate.{m}": {"decode_tok_s": 2000.0}
                 for m in ("bench-tiny", "bench-small")})
    runs["trl_grpo_step.bench-tiny"] = {"step_s_median": 5.0, "split_s_median": {
        "generate": 2.5, "score_ref_logps_reward": 0.7, "policy_fwd_loss_bwd": 2.3}}
    (anchors / "results.json").write_text(json.dumps({"date_utc": "then", "runs": runs}))
    env = {**os.environ, "REUSE": "1", "OUT": str(out), "ANCHORS": str(anchors),
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "compare.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("summary: sampler bench-tiny ")
    assert "x Tunix" in lines[-1] and "GRPO step" in lines[-1]
    assert "anchors* from results.json" in proc.stdout
    table = [line for line in lines if line.startswith("| sampler bench-tiny")]
    assert len(table) == 2 and table[0].split("|")[3].strip() == "Tunix*"
    ours = json.loads((out / "ours.sampler.bench-tiny.json").read_text())
    assert float(table[0].split("|")[5]) == pytest.approx(ours["decode_tok_s"] / 1000.0, abs=0.01)
    # The ceiling line: the anchor's FLOP rate as a share of ours' matmul rate, and the step
    # with every part at 100% of its rate.
    (ceiling,) = [line for line in lines if line.startswith("ceiling: ")]
    theirs = ours["roofline_fraction"] * 1000.0 / ours["decode_tok_s"]
    assert (f"sampler bench-tiny: Tunix ran at {100 * theirs:.0f}% of the matmul rate"
            in ceiling)
    assert f"2x Tunix needs {200 * theirs:.0f}%" in ceiling
    rl = json.loads((out / "ours.rl_step.bench-tiny.json").read_text())
    best = sum(rl["split_s_median"][k] * min(1.0, rl["roofline_fraction"][k])
               for k in ("sample", "reference", "train"))
    assert f"{best:.2f} s = {best / 5.0:.2f}x TRL's time" in ceiling


def test_scale_lengths_keeps_the_shape():
    import numpy as np

    lengths = np.array([8, 96, 512, 100])
    got = sampler_bench.scale_lengths(lengths, 64)
    assert got.dtype == np.int32 and got.tolist() == [1, 12, 64, 12]
    assert sampler_bench.scale_lengths(lengths, 1024, 2).tolist() == [16, 192]  # of all 4
    with pytest.raises(ValueError, match="max_len"):
        sampler_bench.scale_lengths(lengths, 0)


def test_sampler_long_tail_quick(tmp_path):
    if roofline.load_spec() is None:
        pytest.skip("anchors' spec.json is not on this machine")
    out = tmp_path / "lt.json"
    assert sampler_bench.main(["--workload", "long_tail", "--quick", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["runs"]["test"]
    assert r["rows"] == 8 and r["slots"] == 4 and r["max_new_tokens"] == 16
    assert 0 < r["slot_occupancy"] <= 1 and 0 < r["static_slot_occupancy"] <= 1
    assert 0 < r["kv_cache_bytes"] <= r["static_kv_cache_bytes"]
    assert r["useful_tok_s"] > 0 and r["static_useful_tok_s"] > 0


def test_compare_sh_long_tail_table(tmp_path):
    ours = {"useful_tok_s": 4000.0, "static_useful_tok_s": 1000.0, "slot_occupancy": 0.95,
            "static_slot_occupancy": 0.23, "kv_cache_bytes": 10 * 2**20,
            "static_kv_cache_bytes": 20 * 2**20, "slots": 32, "refill_every": 8,
            "useful_tokens": 30000, "median_s": 7.5, "static_median_s": 30.0,
            "loadavg_start": [1.0, 1.0, 1.0]}
    (tmp_path / "ours.long_tail.bench-tiny.json").write_text(json.dumps(ours))
    for tag, value in (("tunix_sampler", 400.0), ("hf_generate", 800.0),
                       ("hf_continuous_batching", 1000.0)):
        (tmp_path / f"anchor.{tag}.long_tail.json").write_text(
            json.dumps({"useful_tok_s": value, "median_s": 30000 / value}))
    (tmp_path / "loadavg.txt").write_text("ours.long_tail.bench-tiny 1.0 1.1 1.2 1.3 1.4 1.5\n")
    env = {**os.environ, "REUSE": "1", "LONG_TAIL": "1", "OUT": str(tmp_path),
           "ANCHORS": str(tmp_path / "none"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "compare.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = {line.split("|")[3].strip(): float(line.split("|")[5])
             for line in proc.stdout.splitlines() if line.startswith("| long_tail")}
    assert table == {"ours static": 4.0, "Tunix (static)": 10.0,
                     "HF generate (static)": 5.0, "HF continuous batching": 4.0}
    summary = proc.stdout.strip().splitlines()[-1]
    # the fixture's results name no stop mode: budgets known in advance, queued longest first
    assert summary.startswith("summary: long_tail (stops budget, queue longest_first) "
                              "10.00x Tunix OK(>=8), 4.00x HF CB MISS(>=5)")
    assert "4.00x our static OK(>=3)" in summary and "occupancy 95.0% OK" in summary
    assert "KV cache 0.50x static's OK" in summary
    assert "load: ours.long_tail.bench-tiny 1.0 1.1 1.2 -> 1.3 1.4 1.5" in proc.stdout


def test_ks_statistic():
    import numpy as np

    a = np.array([1, 2, 3, 4])
    assert rl_step_long_tail.ks_statistic(a, a[::-1]) == 0.0
    assert rl_step_long_tail.ks_statistic(a, np.array([10, 11])) == 1.0
    assert rl_step_long_tail.ks_statistic(np.array([1, 2]), np.array([2, 3])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="both samples"):
        rl_step_long_tail.ks_statistic(a, np.array([], int))


def test_pad_groups_masks_the_extra_rows():
    import numpy as np

    host = {"tokens": np.ones((4, 6), np.int32), "sampler_logp": np.ones((4, 6), np.float32),
            "lengths": np.array([6, 5, 4, 3], np.int32),
            "prompt_tokens": np.full((2, 3), 7, np.int32),
            "prompt_valid": np.ones((2, 3), bool)}
    got = rl_step_long_tail.pad_groups(host, 3, 2)
    assert got["tokens"].shape == (6, 6) and got["prompt_tokens"].shape == (3, 3)
    assert got["lengths"].tolist() == [6, 5, 4, 3, 0, 0]
    assert (got["tokens"][4:] == 0).all() and (got["prompt_tokens"][2] == 7).all()
    with pytest.raises(ValueError, match="more than"):
        rl_step_long_tail.pad_groups(host, 1, 2)


def test_rl_step_long_tail_quick(tmp_path):
    """Partial rollouts on the seeded lengths: every trained row has its own seeded length,
    and the result has the per-variant layout."""
    if roofline.load_spec() is None:
        pytest.skip("anchors' spec.json is not on this machine")
    out = tmp_path / "lt.json"
    assert rl_step.main(["--workload", "long_tail", "--quick", "--variants", "refill_partial",
                         "--steps", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["result"]
    assert set(r["variants"]) == {"refill_partial"}
    v = r["variants"]["refill_partial"]
    assert v["warmup_steps"] == 4 and v["timed_steps"] == 2 and v["step_s_median"] > 0
    assert v["trained_length"]["n"] == v["trained_rows"] > 0
    assert 0 <= v["ks_trained_vs_generated"] <= 1
    assert set(v["partial"]) >= {"rows_continued", "rows_dropped", "stale_token_share"}
    _, lengths = sampler_bench.long_tail_workload(roofline.load_spec(), quick=True)
    assert v["trained_length"]["max"] <= int(lengths.max())
