"""The reward TRL gets in benchmarks/learning_vs_trl.py equals ours, exactly, on real
completions of the SFT checkpoint (docs/learning_vs_trl_completions.json, written by
`learning_vs_trl.py completions`) and on hand-written edge cases; the `report` subcommand
(benchmarks/learning_vs_trl_report.py) on a small hand-made workdir."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_vs_trl as lvt  # noqa: E402
import learning_vs_trl_report as lvt_report  # noqa: E402
from jaxrl_reason.rewards.pool import config_options, make_reward_pool  # noqa: E402

FIXTURE = ROOT / "docs" / "learning_vs_trl_completions.json"
EDGE = [  # (completion, answer)
    ("<think>1+2=3</think><answer>3</answer>", "3"),
    ("<think>1+2=3</think><answer>4</answer>", "3"),
    ("<answer>3</answer>", "3"),
    ("<think>x</think> <answer> 3.0 </answer>", "3"),
    ("<think>x</think><answer></answer>", "3"),
    ("the answer is 3", "3"),
    ("<think>a</think><answer>3</answer><answer>3</answer>", "3"),
    ("<think>9</think><answer>1,234</answer>", "1234"),
    ("", "3"),
]


@pytest.fixture(scope="module")
def config():
    # The pool's per-call timeout (a run's guard against a stuck verifier) scores a late row
    # 0; on a loaded test machine it would fire, and the TRL side has no such guard.
    return lvt.load_config({"rewards.timeout_s": 300.0})


def both_totals(config, prompts, completions, answers):
    """(ours float32 [N] from the run's reward pool, TRL's float32 [N] as GRPOTrainer sums)."""
    examples = [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)]
    with make_reward_pool(config) as pool:
        scored = pool.score(list(completions), examples)
    assert not [r for r in scored.reasons if "timeout" in r], scored.reasons
    ours = scored.total
    funcs, weights = lvt.trl_reward_funcs(dict(config.rewards.weights), config_options(config))
    return np.asarray(ours, np.float32), lvt.trl_total(funcs, weights, prompts, completions,
                                                       answers)


def test_weights_are_the_configs(config):
    funcs, weights = lvt.trl_reward_funcs(dict(config.rewards.weights), config_options(config))
    assert [f.__name__ for f in funcs] == list(config.rewards.weights)
    assert weights == [float(w) for w in config.rewards.weights.values()]
    with pytest.raises(ValueError, match="format_strict"):
        lvt.trl_reward_funcs({"format_strict": float("nan")})


def test_edge_cases_agree(config):
    completions, answers = zip(*EDGE)
    ours, trl = both_totals(config, ["What is 1+2?"] * len(EDGE), completions, answers)
    np.testing.assert_array_equal(trl, ours)
    assert ours[0] == np.float32(1.1) and ours[1] == np.float32(0.1) and ours[2] == 1.0


def test_real_completions_agree_exactly(config):
    rows = json.loads(FIXTURE.read_text())["completions"]
    assert len(rows) >= 1000, f"{FIXTURE} holds {len(rows)} completions, fewer than 1,000"
    prompts = [r["prompt"] for r in rows]
    completions = [r["completion"] for r in rows]
    answers = [r["answer"] for r in rows]
    ours, trl = both_totals(config, prompts, completions, answers)
    differ = np.flatnonzero(ours != trl)
    assert differ.size == 0, [(completions[i], answers[i], ours[i], trl[i]) for i in differ[:5]]
    # Not a degenerate fixture: right, wrong, well- and ill-formed completions all occur.
    values = {round(float(v), 4) for v in ours}
    assert {1.1, 0.1}.issubset(values) and (0.0 in values or 1.0 in values), values


def test_trl_arguments_follow_our_config_and_unmatched_settings_are_refused():
    config = lvt.load_config({"rl.batch_prompts": 4, "rl.loss_type": "dapo"})
    args = lvt.trl_args(config)
    assert args["per_device_train_batch_size"] == 4 * config.rl.num_generations
    assert args["loss_type"] == "dapo" and args["adam_beta2"] == 0.95
    assert args["shuffle_dataset"] is False
    lvt.check_supported(config)
    with pytest.raises(ValueError, match="rl.dynamic_sampling"):
        lvt.check_supported(lvt.load_config({"rl.dynamic_sampling": True}))
    with pytest.raises(KeyError, match="rl.nope"):
        lvt.load_config({"rl.nope": 1})


def test_time_to_reach_interpolates_and_says_never():
    reach = lvt_report.time_to_reach
    assert reach([0.0, 10.0, 20.0], [0.2, 0.4, 0.6], 0.5) == pytest.approx(15.0)
    assert reach([0.0, 10.0], [0.5, 0.6], 0.4) == 0.0
    assert reach([0.0, 10.0], [0.2, 0.3], 0.5) is None


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_report_subcommand_gathers_seeds_into_the_json_and_the_plot(tmp_path):
    """Two seeds, 4 steps saved every 2: pass@1 curves and wall times per step over seeds,
    our time to TRL's final pass@1 (interpolated), through the driver's command line."""
    _write(tmp_path / "plan.json", {
        "steps": 4, "save_every": 2, "seeds": [0, 1], "overrides": {}, "table": [],
        "reward_weights": {"correctness": 1.0}, "versions_ours": {}, "load_average": [0.0]})
    ours_final = {0: 0.6, 1: 0.8}
    for seed in (0, 1):
        d = tmp_path / f"seed{seed}"
        p1 = {"sft": 0.2, "ours_step_2": 0.4, "ours_step_4": ours_final[seed],
              "trl_step_2": 0.3, "trl_step_4": 0.5}
        _write(d / "eval.json", {"results": {k: {"path": k, "sets": {"held_out": {"mean": v}}}
                                             for k, v in p1.items()}})
        # step k ends at 100 + 10 k; step 1 spent 10 s in time/* before its end
        (d / "ours").mkdir(parents=True)
        (d / "ours" / "metrics.jsonl").write_text("".join(json.dumps(
            {"phase": "rl", "step": k, "time": 100.0 + 10 * k, "time/sample_s": 10.0,
             "reward/correctness": 0.1 * k}) + "\n" for k in range(1, 5)))
        _write(d / "ours" / "eval.json", {"timings": {"rl_s": 40.0 + seed}})
        _write(d / "trl" / "timing.json", {
            "train_s": 80.0, "step_end_s": {str(k): 20.0 * k for k in range(5)},
            "load_average": [1.0], "versions": {"trl": "x"}, "torch_threads": 1,
            "log_history": [{"rewards/correctness/mean": 0.25}, {"loss": 0.0}]})
        for side in ("ours", "trl"):
            _write(d / f"{side}.timed.json", {
                "side": side, "seed": seed, "threads": 1, "cpu_affinity": [1],
                "wall_s": 90.0, "load_before": [0.5, 0.4, 0.3], "load_after": [1.1, 0.9, 0.5],
                "load_samples": [[30.0, 1.0]], "probe_gflops_before": 30.0,
                "probe_gflops_after": 29.0})
    out, png = tmp_path / "report.json", tmp_path / "report.png"
    lvt.main(["report", "--workdir", str(tmp_path), "--out", str(out), "--plot", str(png),
              "--label", "test"])
    report = json.loads(out.read_text())
    ours, trl = report["curves"]["ours"], report["curves"]["trl"]
    assert ours["steps"] == trl["steps"] == [0, 2, 4]
    assert [p["mean"] for p in ours["pass1"]] == pytest.approx([0.2, 0.4, 0.7])
    assert [w["mean"] for w in ours["wall_s"]] == pytest.approx([0.0, 20.0, 40.0])
    assert [w["mean"] for w in trl["wall_s"]] == pytest.approx([0.0, 40.0, 80.0])
    assert ours["pass1"][-1]["n"] == 2 and ours["pass1"][-1]["low"] < 0.6
    assert report["trl_final_pass1"]["mean"] == pytest.approx(0.5)
    assert report["ours_s_to_trl_final"] == pytest.approx(20.0 + 20.0 / 3)
    assert report["ours_total_s"]["mean"] == pytest.approx(40.5)
    assert report["ours_total_s"]["values"] == [40.0, 41.0]
    assert report["trl_total_s"]["values"] == [80.0, 80.0]
    assert report["train_batch_correctness"]["by_seed"]["0"] == {
        "ours": pytest.approx([0.1, 0.2, 0.3, 0.4]), "trl": [0.25]}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = report["runs"]["by_seed"]["1"]
    assert run["ours"]["train_s"] == 41.0 and run["trl"]["train_s"] == 80.0
    assert run["trl"]["torch_threads"] == 1 and run["trl"]["load_after"] == [1.1, 0.9, 0.5]
    assert run["ours"]["probe_gflops_before"] == 30.0
    assert report["load_check"] == {"limit_per_core": 1.5, "violations": [], "enforced": True}
    # A run on a loaded machine: the report refuses to write anything.
    timed = tmp_path / "seed1" / "trl.timed.json"
    _write(timed, {**json.loads(timed.read_text()), "load_samples": [[30.0, 2.5]]})
    out2, png2 = tmp_path / "loaded.json", tmp_path / "loaded.png"
    with pytest.raises(SystemExit, match="refusing to write .*seed 1 trl: load average 2.50"):
        lvt.main(["report", "--workdir", str(tmp_path), "--out", str(out2), "--plot",
                  str(png2), "--label", "test"])
    assert not out2.exists() and not png2.exists()
