"""Tests for jaxrl_reason.evaluation.pass_at_k: pass@k, maj@k, best-of-k, accuracy curves, t
quantiles, summaries, table; and eval_runner's curves end to end on a tiny model."""
import itertools
import math

import numpy as np
import pytest

from jaxrl_reason.evaluation.pass_at_k import (
    accuracy_curve,
    best_of_k,
    canonical_answers,
    curve_ks,
    format_table,
    maj_at_k,
    mean_ci,
    pass_at_k,
    pass_at_k_batch,
    seed_metrics,
    student_t_quantile,
    summarize_curves,
    summarize_seeds,
)


# ----------------------------------------------------------------------------- pass@k


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k),
                                                       abs=1e-12), (n, c, k)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # large n stays finite and in range (binomials here would overflow floats)
    v = pass_at_k(2000, 1, 1000)
    assert v == pytest.approx(0.5)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_int():
    with pytest.raises(TypeError, match="k"):
        pass_at_k(4, 1, 1.5)


def test_pass_at_k_batch_is_mean_over_problems():
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
    expected = np.mean([pass_at_k(4, 1, 2), 1.0, 0.0])
    assert pass_at_k_batch(correct, 2) == pytest.approx(expected)
    assert pass_at_k_batch(correct, 1) == pytest.approx(correct.mean())


def test_pass_at_k_batch_rejects_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="shape"):
        pass_at_k_batch(np.ones((4,), dtype=bool), 1)
    with pytest.raises(TypeError, match="dtype"):
        pass_at_k_batch(np.full((2, 2), 0.5), 1)
    with pytest.raises(ValueError, match="k"):
        pass_at_k_batch(np.ones((2, 2), dtype=bool), 3)


# ----------------------------------------------------------------------------- maj@k


def test_maj_at_k_majority_wins():
    answers = [["3", "4", "4", "3", "4"]]
    correct = np.array([[True, False, False, True, False]])
    assert maj_at_k(answers, correct, 5) == 0.0  # "4" x3 beats "3" x2
    assert maj_at_k(answers, correct, 4) == 1.0  # tie 2-2, "3" appears first
    assert maj_at_k(answers, correct, 1) == 1.0


def test_maj_at_k_none_never_wins():
    answers = [[None, None, "7", None], [None, None, None, None]]
    correct = np.array([[False, False, True, False], [False, False, False, False]])
    assert maj_at_k(answers, correct, 4) == pytest.approx(0.5)
    assert maj_at_k(answers, correct, 2) == 0.0  # only Nones among the first two


def test_maj_at_k_uses_only_first_k_samples():
    answers = [["1", "2", "2", "2"]]
    correct = np.array([[True, False, False, False]])
    assert maj_at_k(answers, correct, 2) == 1.0  # tie "1"/"2" -> "1" first
    assert maj_at_k(answers, correct, 3) == 0.0


def test_maj_at_k_rejects_mismatched_answers():
    correct = np.ones((2, 3), dtype=bool)
    with pytest.raises(ValueError, match="problems"):
        maj_at_k([["a", "a", "a"]], correct, 2)
    with pytest.raises(ValueError, match=r"answers\[1\]"):
        maj_at_k([["a", "a", "a"], ["a"]], correct, 2)
    with pytest.raises(TypeError, match="str or None"):
        maj_at_k([["a", 3, "a"], ["a", "a", "a"]], correct, 2)


# ----------------------------------------------------------------------------- t / CI


@pytest.mark.parametrize("df,expected", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228),
                                         (30, 2.042)])
def test_student_t_quantile_975(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_student_t_quantile_other_levels_and_symmetry():
    assert student_t_quantile(0.995, 5) == pytest.approx(4.032, abs=5e-4)
    assert student_t_quantile(0.95, 3) == pytest.approx(2.353, abs=5e-4)
    assert student_t_quantile(0.025, 2) == pytest.approx(-4.303, abs=5e-4)
    assert student_t_quantile(0.5, 7) == 0.0
    assert student_t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        student_t_quantile(0.9, 0)


def test_mean_ci_matches_formula():
    values = [0.5, 0.6, 0.7]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(0.6)
    assert half == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)


def test_mean_ci_single_value_has_nan_half_width():
    mean, half = mean_ci([0.42])
    assert mean == pytest.approx(0.42)
    assert math.isnan(half)


def test_mean_ci_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0, 2.0], confidence=1.5)


# ----------------------------------------------------------------------------- summaries


def test_summarize_seeds():
    per_seed = [{"pass@1": 0.5, "mean_length": 100.0}, {"pass@1": 0.7, "mean_length": 120.0}]
    out = summarize_seeds(per_seed)
    assert set(out) == {"pass@1", "mean_length"}
    assert out["pass@1"]["mean"] == pytest.approx(0.6)
    assert out["pass@1"]["values"] == [0.5, 0.7]
    assert out["pass@1"]["ci95"] == pytest.approx(12.7062 * np.std([0.5, 0.7], ddof=1)
                                                  / math.sqrt(2), rel=1e-4)
    with pytest.raises(ValueError, match="seed 1"):
        summarize_seeds([{"a": 1.0}, {"b": 1.0}])
    with pytest.raises(ValueError, match="empty"):
        summarize_seeds([])


def test_seed_metrics():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0]], dtype=bool)
    answers = [["5", "6", "6", "5"], ["1", None, "2", "2"]]
    lengths = np.array([[10, 20, 30, 40], [1, 2, 3, 4]], dtype=np.int32)
    out = seed_metrics(correct, answers, lengths, ks=(1, 2, 4, 8))
    assert set(out) == {"accuracy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4",
                        "mean_length"}
    assert out["accuracy"] == pytest.approx(0.25) == pytest.approx(out["pass@1"])
    assert out["pass@4"] == pytest.approx(0.5)
    assert out["pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + 0.0) / 2)
    assert out["maj@2"] == pytest.approx(0.5)  # problem 0: tie "5"/"6" -> "5" correct
    assert out["maj@4"] == pytest.approx(0.5)  # problem 0: tie 2-2 -> "5"
    assert out["mean_length"] == pytest.approx(13.75)


def test_seed_metrics_rejects_bad_lengths():
    correct = np.ones((1, 2), dtype=bool)
    with pytest.raises(ValueError, match="lengths shape"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 3), dtype=np.int32), ks=(1,))
    with pytest.raises(TypeError, match="integers"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 2)), ks=(1,))
    with pytest.raises(ValueError, match=">= 1"):
        seed_metrics(correct, [["a", "a"]], np.ones((1, 2), dtype=np.int32), ks=(0, 1))


# ----------------------------------------------------------------------------- table


def test_format_table():
    held_out = summarize_seeds([{"pass@1": 0.62, "maj@4": 0.70, "mean_length": 210.0},
                                {"pass@1": 0.64, "maj@4": 0.72, "mean_length": 230.0},
                                {"pass@1": 0.63, "maj@4": 0.74, "mean_length": 220.0}])
    hard = summarize_seeds([{"pass@1": 0.21, "mean_length": 400.0}])
    table = format_table({"level 1-3 (held-out)": held_out, "level 4": hard},
                         ["pass@1", "maj@4", "mean_length"])
    lines = table.split("\n")
    assert len(lines) == 4
    assert "pass@1 (%)" in lines[0] and "mean_length (tokens)" in lines[0]
    assert set(lines[1]) <= {"|", "-"}
    half = 4.3027 * 0.01 / math.sqrt(3) * 100
    assert f"63.0 ± {half:.1f}" in lines[2]
    assert "220.0 ± 24.8" in lines[2]
    # one seed: no interval; missing metric: "-"
    cells = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert cells == ["level 4", "21.0", "-", "400.0"]
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_format_table_rejects_empty():
    with pytest.raises(ValueError):
        format_table({}, ["pass@1"])
    with pytest.raises(ValueError):
        format_table({"a": {}}, [])


# ----------------------------------------------------------------------------- test-time compute


def test_maj_at_k_over_all_subsets_hand_computed():
    # Problem 0: answers a a b (a correct). k=2 subsets: {0,1} -> a (1), {0,2} -> tie, a first
    # (1), {1,2} -> tie, a first (1): 1.0. Problem 1: answers x y y (y correct): {0,1} -> x
    # (0), {0,2} -> x (0), {1,2} -> y (1): 1/3.
    answers = [["a", "a", "b"], ["x", "y", "y"]]
    correct = np.array([[1, 1, 0], [0, 1, 1]], dtype=bool)
    assert maj_at_k(answers, correct, 2, num_subsets=10) == pytest.approx((1.0 + 1 / 3) / 2)
    assert maj_at_k(answers, correct, 2) == pytest.approx(0.5)  # first two samples only
    assert maj_at_k(answers, correct, 3, num_subsets=10) == pytest.approx(1.0)  # k = n: exact
    # Random subsets (C(n, k) > num_subsets) are seeded and approach the exact mean.
    rng = np.random.default_rng(0)
    big = [list(rng.choice(["1", "2", "3"], 12, p=[0.5, 0.3, 0.2])) for _ in range(5)]
    big_correct = np.array([[a == "1" for a in row] for row in big])
    exact = maj_at_k(big, big_correct, 5, num_subsets=10 ** 6)  # every one of C(12, 5)
    sampled = maj_at_k(big, big_correct, 5, num_subsets=400, seed=3)
    assert sampled == maj_at_k(big, big_correct, 5, num_subsets=400, seed=3)
    assert abs(sampled - exact) < 0.05


def test_best_of_k_hand_computed():
    answers = [["7", "8", "8", "9"], ["1", "2", None, "2"]]
    correct = np.array([[1, 0, 0, 0], [0, 1, 0, 1]], dtype=bool)
    # Verifier scores: problem 0 passes only sample 0 -> "7" (correct) whatever the vote.
    # Problem 1 passes samples 0 and 2: votes between "1" and None -> "1" (wrong).
    scores = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    assert best_of_k(answers, scores, correct, 4) == pytest.approx(0.5)
    # maj@4 of the same samples: problem 0 -> "8" (wrong), problem 1 -> "2" (right).
    assert maj_at_k(answers, correct, 4) == pytest.approx(0.5)
    # Uniform scores: best-of-k is maj@k; the ground truth as scores: best-of-k is pass@k.
    flat = np.zeros((2, 4))
    for k in (1, 2, 3, 4):
        assert best_of_k(answers, flat, correct, k, num_subsets=100) == pytest.approx(
            maj_at_k(answers, correct, k, num_subsets=100))
        assert best_of_k(answers, correct.astype(float), correct, k, num_subsets=100) == \
            pytest.approx(pass_at_k_batch(correct, k))
    # First k = 2: problem 0 keeps sample 0 ("7", right); problem 1 keeps sample 0 ("1").
    assert best_of_k(answers, scores, correct, 2) == pytest.approx(0.5)
    # Only Nones among the top-scored: the first of them is chosen.
    assert best_of_k([[None, "5"]], np.array([[1.0, 0.0]]), np.array([[True, False]]), 2) == 1.0
    with pytest.raises(ValueError, match="scores shape"):
        best_of_k(answers, np.zeros((2, 3)), correct, 2)


def test_canonical_answers_groups_equivalent_answers():
    calls = []

    def equivalent(a, b):
        calls.append((a, b))
        return float(eval(a)) == float(eval(b))  # noqa: S307 (test-only arithmetic)

    got = canonical_answers(["0.5", "1/2", " 0.5", "2", None, "4/2", "1/2"], key=str.strip,
                            equivalent=equivalent)
    assert got == ["0.5", "0.5", "0.5", "2", None, "2", "0.5"]
    # One call per new key and group: "1/2" vs "0.5"; "2" vs "0.5"; "4/2" vs "0.5", "2".
    assert len(calls) == 4
    assert canonical_answers(["a", "b", "a"]) == ["a", "b", "a"]
    # Grouped answers vote together: "1/2" and "0.5" outvote "2".
    correct = np.array([[True, True, False, False]])
    raw = [["0.5", "1/2", "2", "2"]]
    assert maj_at_k(raw, correct, 4) == 0.0
    assert maj_at_k([canonical_answers(raw[0], equivalent=equivalent)], correct, 4) == 1.0


def test_accuracy_curve_and_summary():
    assert curve_ks(1) == [1] and curve_ks(8) == [1, 2, 4, 8] and curve_ks(6) == [1, 2, 4, 6]
    answers = [["5", "6", "6", "5"], ["1", None, "2", "2"]]
    correct = np.array([[1, 0, 0, 1], [0, 0, 1, 1]], dtype=bool)
    scores = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    curve = accuracy_curve(correct, answers, scores, num_subsets=100)
    assert curve["k"] == [1, 2, 4]
    assert curve["pass@k"] == pytest.approx([pass_at_k_batch(correct, k) for k in (1, 2, 4)])
    assert curve["maj@k"][0] == pytest.approx(0.5)  # maj@1 = mean correctness of answered
    assert curve["maj@k"][-1] == pytest.approx(1.0)  # "5" (tie, first) and "2"
    assert curve["best_of@k"][-1] == pytest.approx(1.0)
    # Problem 0's verifier passes both correct samples: best-of-2 is right whenever one of
    # them is in the pair (5 of 6 pairs); problem 1 falls back to the vote: pairs
    # (1,None)->"1" 0, (1,2)->"1" 0, (1,2)->0, (None,2)->1, (None,2)->1, (2,2)->1 = 3/6.
    assert curve["best_of@k"][1] == pytest.approx((5 / 6 + 3 / 6) / 2)
    other = accuracy_curve(correct, answers, None, ks=(1, 4), num_subsets=0)
    assert set(other) == {"k", "pass@k", "maj@k"} and other["k"] == [1, 4]
    summary = summarize_curves([curve, curve])
    assert summary["k"] == [1, 2, 4]
    assert summary["maj@k"]["mean"] == pytest.approx(curve["maj@k"])
    assert summary["maj@k"]["ci95"] == pytest.approx([0.0, 0.0, 0.0])
    assert math.isnan(summarize_curves([curve])["pass@k"]["ci95"][0])
    with pytest.raises(ValueError, match="different k"):
        summarize_curves([curve, other])


def test_seed_metrics_with_verifier_scores():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0]], dtype=bool)
    answers = [["5", "6", "6", "5"], ["1", None, "2", "2"]]
    lengths = np.ones((2, 4), dtype=np.int32)
    scores = np.array([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = seed_metrics(correct, answers, lengths, ks=(1, 2, 4), scores=scores)
    assert {"best_of@2", "best_of@4"} <= set(out) and "best_of@1" not in out
    assert out["best_of@4"] == pytest.approx(0.0)  # the verifier prefers the wrong "6"s
    assert out["maj@4"] == pytest.approx(0.5)
    assert "best_of@4 (%)" in format_table({"s": summarize_seeds([out])}, ["best_of@4"])


def test_eval_runner_reports_curves(tmp_path):
    """evaluate() on a random tiny model: curves per set, best_of@n in the table, a plot."""
    import jax

    from configs import arith_grpo
    from jaxrl_reason import models
    from jaxrl_reason.evaluation import runner as eval_runner
    from jaxrl_reason.runtime.build import build_runtime

    config = arith_grpo.get_config("smoke")
    config.eval.num_samples = 4
    config.eval.seeds = (0, 1)
    config.eval.batch_prompts = 4
    config.eval.max_new_tokens = 8
    config.log.progress_bar = False
    rt = build_runtime(config, str(tmp_path))
    params = models.init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    examples = eval_runner.eval_sets(config)
    sets = {name: exs[:4] for name, exs in list(examples.items())[:1]}
    report = eval_runner.evaluate(rt, params, sets, progress=False)
    (name,) = sets
    curve = report["curves"][name]
    assert curve["k"] == [1, 2, 4]
    assert set(curve) == {"k", "pass@k", "maj@k", "best_of@k"}
    for metric in ("pass@k", "maj@k", "best_of@k"):
        assert all(0.0 <= m <= 1.0 for m in curve[metric]["mean"])
        assert len(curve[metric]["ci95"]) == 3
    assert {"best_of@4", "maj@4", "pass@4"} <= set(report["sets"][name])
    assert report["config"]["best_of_verifier"] == "format_strict"
    assert "best_of@4" in eval_runner.comparison_table({"ckpt": report}, 4)
    assert "maj@k" in eval_runner.format_curves(report)
    png = eval_runner.plot_curves(report, str(tmp_path / "curves.png"))
    assert png is None or (tmp_path / "curves.png").stat().st_size > 0


# ----------------------------------------------------------------------------- seeds, domains


def test_summarize_seeds_reports_std():
    out = summarize_seeds([{"pass@1": 0.5}, {"pass@1": 0.7}, {"pass@1": 0.6}])
    assert out["pass@1"]["std"] == pytest.approx(np.std([0.5, 0.7, 0.6], ddof=1))
    assert math.isnan(summarize_seeds([{"pass@1": 0.5}])["pass@1"]["std"])


def test_format_table_with_std():
    summary = summarize_seeds([{"pass@1": 0.62}, {"pass@1": 0.64}, {"pass@1": 0.63}])
    table = format_table({"set": summary}, ["pass@1"], show_std=True)
    assert "63.0 ± 2.5 (sd 1.0)" in table
    assert "(sd" not in format_table({"set": summary}, ["pass@1"])
    one = summarize_seeds([{"pass@1": 0.5}])
    assert "(sd" not in format_table({"set": one}, ["pass@1"], show_std=True)


def test_pass_at_k_curve_every_k():
    from jaxrl_reason.evaluation.pass_at_k import pass_at_k_curve
    correct = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 1]], bool)
    curve = pass_at_k_curve(correct)
    assert len(curve) == 4
    for k, value in enumerate(curve, start=1):
        assert value == pytest.approx(pass_at_k_batch(correct, k))
    assert pass_at_k_curve(correct, max_k=2) == curve[:2]
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k_curve(correct, max_k=5)


def test_domain_metrics():
    from jaxrl_reason.evaluation.pass_at_k import domain_metrics
    domains = ["code", "code", "countdown", None, "countdown", "countdown"]
    out = domain_metrics(domains, [1.0, 0.0, 0.5, 9.0, 0.5, 1.1],
                         verdicts=[1, 0, 0, 1, 0, 1], lengths=[10, 20, 30, 40, 50, 70])
    assert out == pytest.approx({
        "reward/code": 0.5, "accuracy/code": 0.5, "length/code": 15.0, "frac/code": 2 / 6,
        "reward/countdown": 0.7, "accuracy/countdown": 1 / 3, "length/countdown": 50.0,
        "frac/countdown": 0.5})
    assert domain_metrics([None, None], [1.0, 0.0]) == {}
    assert set(domain_metrics(["a"], [1.0])) == {"reward/a", "frac/a"}
    with pytest.raises(ValueError, match="2 domains"):
        domain_metrics(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="accuracy"):
        domain_metrics(["a", "b"], [1.0, 0.0], verdicts=[1.0])


@pytest.mark.parametrize("text,seeds", [("3", (0, 1, 2)), ("1", (0,)), ("0,4,9", (0, 4, 9)),
                                        ("7,", (7,)), (" 2 , 5 ", (2, 5))])
def test_parse_seeds(text, seeds):
    from jaxrl_reason.evaluation.runner import parse_seeds
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text,match", [("0", ">= 1"), ("", "count"), ("a", "integers"),
                                        ("1,1", "repeat"), ("1,-2", ">= 0"), ("2.5", "integers")])
def test_parse_seeds_rejects_bad_input(text, match):
    from jaxrl_reason.evaluation.runner import parse_seeds
    with pytest.raises(ValueError, match=match):
        parse_seeds(text)


def test_with_eval_overrides_copies_and_checks():
    import ml_collections

    from jaxrl_reason.evaluation.runner import with_eval_overrides
    config = ml_collections.ConfigDict({"eval": {"seeds": (0, 1), "num_samples": 4,
                                                 "num_problems": 200}})
    config.lock()
    out = with_eval_overrides(config, seeds=(3, 4, 5), num_samples=16)
    assert tuple(out.eval.seeds) == (3, 4, 5) and out.eval.num_samples == 16
    assert out.eval.num_problems == 200 and tuple(config.eval.seeds) == (0, 1)
    with pytest.raises(ValueError, match="num_problems"):
        with_eval_overrides(config, num_problems=0)


def test_file_sets_tag_the_file_verifier(tmp_path):
    from jaxrl_reason.evaluation.runner import file_sets
    data = tmp_path / "probe.jsonl"
    data.write_text("".join(f'{{"prompt": "What is {i}+1?", "answer": "{i + 1}"}}\n'
                            for i in range(5)))
    (name, examples), = file_sets(str(data), num_problems=3).items()
    assert name == "probe.jsonl" and len(examples) == 3
    assert all(e["verifier"] == "correctness" for e in examples)
    assert len(file_sets(str(data))["probe.jsonl"]) == 5
