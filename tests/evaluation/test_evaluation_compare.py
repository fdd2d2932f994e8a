"""eval_runner.compare end to end on a tiny random model: the same problems and seeds for
both checkpoints, per-seed verdicts that agree with the report, the paired tests, pass@k
curves for every k and their plot."""
import jax
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.evaluation import runner as eval_runner
from jaxrl_reason.runtime.build import build_runtime


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from configs import arith_grpo

    config = arith_grpo.get_config("smoke")
    config.eval.num_samples = 4
    config.eval.seeds = (0, 1)
    config.eval.batch_prompts = 4
    config.eval.max_new_tokens = 8
    config.log.progress_bar = False
    rt = build_runtime(config, str(tmp_path_factory.mktemp("cmp")))
    params = [models.init_params(rt.model_cfg, jax.random.key(i), rt.mesh, rt.rules)
              for i in (0, 1)]
    sets = {name: exs[:6] for name, exs in eval_runner.eval_sets(config).items()}
    return rt, params, sets


def test_evaluate_samples_returns_the_verdicts_of_the_report(tiny):
    rt, (params, _), sets = tiny
    report, correct = eval_runner.evaluate_samples(rt, params, sets, progress=False)
    assert set(correct) == set(sets)
    for name, arr in correct.items():
        assert arr.shape == (2, 6, 4) and arr.dtype == bool  # [S, P, n]
        values = report["sets"][name]["pass@1"]["values"]
        np.testing.assert_allclose(values, arr.mean(axis=(1, 2)))
        assert report["sets"][name]["pass@1"]["std"] >= 0


def test_compare_tests_every_set_and_k(tiny, tmp_path):
    rt, (params_a, params_b), sets = tiny
    result = eval_runner.compare(rt, params_a, rt, params_b, sets, num_resamples=200,
                                 labels=("sft", "rl"), progress=False)
    assert result["labels"] == ["sft", "rl"]
    assert set(result["reports"]) == {"sft", "rl"} and set(result["tests"]) == set(sets)
    for name in sets:
        assert set(result["tests"][name]) == {"pass@1", "pass@2", "pass@4"}
        t = result["tests"][name]["pass@1"]
        assert (t["num_problems"], t["num_seeds"], t["num_resamples"]) == (6, 2, 200)
        assert t["mean_a"] == pytest.approx(
            result["reports"]["sft"]["sets"][name]["pass@1"]["mean"])
        assert t["mean_b"] == pytest.approx(
            result["reports"]["rl"]["sets"][name]["pass@1"]["mean"])
        assert t["ci_low"] <= t["diff"] <= t["ci_high"] and 0 < t["p_value"] <= 1
        curve = result["pass_at_k"][name]
        assert curve["k"] == [1, 2, 3, 4]
        assert curve["sft"]["mean"][0] == pytest.approx(t["mean_a"])
        assert np.all(np.diff(curve["rl"]["mean"]) >= 0)
    text = eval_runner.format_pass_at_k(result)
    assert text.count("k=3:") == 2 * len(sets)
    png = eval_runner.plot_pass_at_k(result, str(tmp_path / "pass_at_k.png"))
    assert png is None or (tmp_path / "pass_at_k.png").stat().st_size > 0
    # The same checkpoint twice: the very same samples, so no difference at all.
    same = eval_runner.compare(rt, params_a, rt, params_a, sets, num_resamples=100,
                               progress=False)
    for tests in same["tests"].values():
        assert all(t["diff"] == 0.0 and t["p_value"] == 1.0 for t in tests.values())
    with pytest.raises(ValueError, match="labels"):
        eval_runner.compare(rt, params_a, rt, params_b, sets, labels=("x", "x"),
                            progress=False)
