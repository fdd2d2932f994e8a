"""Evaluation verdicts that do not depend on the machine's load: the same checkpoint gives
byte-identical reports on a quiet machine and with both cores saturated by other
processes; an answer without a verdict is retried with longer limits, and the evaluation
fails, rather than scoring it wrong, when too many stay unscored."""
import collections
import json

import numpy as np
import pytest
from busy_cpu import saturated

from jaxrl_reason.rewards import RewardPool, RewardResult, register_reward
from jaxrl_reason.rewards.base import limit_scale


@register_reward("_test_needs_longer")
def _needs_longer(completion, example):
    """Unscored at the default limits when the completion holds "slow"; scored with any
    longer ones (an evaluation's retry); 1 for an even length."""
    if "slow" in completion and limit_scale() == 1.0:
        return RewardResult(0.0, "unscored")
    return float(len(completion) % 2 == 0)


@register_reward("_test_never_scored")
def _never_scored(completion, example):
    return RewardResult(0.0, "unscored")


@pytest.fixture(scope="module")
def tiny():
    """A random tiny model on the smoke config's runtime, and one small held-out set."""
    import tempfile

    import jax

    from configs import arith_grpo
    from jaxrl_reason import models
    from jaxrl_reason.evaluation import runner
    from jaxrl_reason.runtime.build import build_runtime

    config = arith_grpo.get_config("smoke")  # the default evaluation settings, smoke-sized
    config.log.progress_bar = False
    with tempfile.TemporaryDirectory() as workdir:
        rt = build_runtime(config, workdir)
        params = models.init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
        yield rt, params, runner.eval_sets(config)


def _report_bytes(rt, params, sets, monkeypatch) -> tuple[bytes, collections.Counter]:
    """The evaluation's report as bytes, and the reasons of every reward batch it scored."""
    from jaxrl_reason.evaluation import runner
    from jaxrl_reason.rewards.pool import RewardPool

    reasons: collections.Counter = collections.Counter()
    collect = RewardPool._collect

    def counted(self, batch, seconds):
        out = collect(self, batch, seconds)
        reasons.update(out.reasons)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(RewardPool, "_collect", counted)
        report = runner.evaluate(rt, params, sets, progress=False)
    return json.dumps(report, indent=1, sort_keys=True, default=float).encode(), reasons


@pytest.mark.slow
@pytest.mark.saturates_cpu
def test_eval_report_is_byte_identical_on_a_saturated_machine(tiny, monkeypatch):
    """The smoke config's evaluation (its default reward limits: 5 s of CPU per call, a
    50 s wall backstop) with a sympy worker pool starting up on a quiet machine, then again
    with four busy-loop processes on the two cores and a fresh pool starting up under that
    load. The random model's answers include expressions that go to the sympy workers.
    Before, a batch had 5 s of wall time: the first batch, waiting for the workers, scored
    its calls 0 as timeouts (11 on a quiet machine, 22 on a saturated one)."""
    from jaxrl_reason.rewards import _sympy_worker

    rt, params, sets = tiny
    runs = []
    for load in (0, 4):
        monkeypatch.setattr(_sympy_worker, "_POOL", None)  # the workers start up in the run
        try:
            with saturated(load):
                runs.append(_report_bytes(rt, params, sets, monkeypatch))
        finally:
            if _sympy_worker._POOL is not None:
                _sympy_worker._POOL.shutdown()
    (quiet, quiet_reasons), (loaded, loaded_reasons) = runs
    assert json.loads(quiet)["unscored"] == {name: 0 for name in sets}
    # No call is charged for the load (a backstop hit, e.g. while the workers start on a
    # machine other jobs also load, is retried with longer limits and leaves no trace in
    # the report).
    for reasons in (quiet_reasons, loaded_reasons):
        assert not [tag for tag in reasons if tag.endswith("/timeout")], reasons
    assert loaded == quiet


def test_undecided_answers_are_retried_with_longer_limits():
    from jaxrl_reason.evaluation.runner import _score_retrying

    texts = ["ab", "slow-", "slow", "abc"]
    rows = [{"prompt": "p", "answer": "x"}] * 4
    with RewardPool({"_test_needs_longer": 1.0}, num_workers=2) as pool, \
            RewardPool({"_test_needs_longer": 1.0}, num_workers=2, timeout_s=20.0,
                       limit_scale=4.0) as retry_pool:
        first = pool.score(texts, rows)
        assert first.unscored["_test_needs_longer"].tolist() == [False, True, True, False]
        batch, retried, still = _score_retrying(pool, retry_pool, texts, rows,
                                                ["_test_needs_longer"])
        without, _, left = _score_retrying(pool, None, texts, rows, None)
    assert retried == 2 and not still.any()
    np.testing.assert_array_equal(batch.components["_test_needs_longer"], [1, 0, 1, 0])
    np.testing.assert_array_equal(batch.total, [1, 0, 1, 0])
    assert not batch.unscored["_test_needs_longer"].any()
    assert left.tolist() == [False, True, True, False]  # no retry pool: reported, not wrong
    assert without.reasons == collections.Counter({"_test_needs_longer/unscored": 2})


def test_eval_fails_when_too_many_answers_stay_unscored(tiny):
    import ml_collections

    from jaxrl_reason.evaluation import runner

    rt, params, sets = tiny
    one = {name: examples[:4] for name, examples in list(sets.items())[:1]}
    (name,) = one
    cfg = ml_collections.ConfigDict(rt.config.eval.to_dict())
    cfg.seeds, cfg.best_of_verifier, cfg.answer_equivalence = (0,), "", False
    with pytest.raises(runner.UnscoredError, match="eval.max_unscored_share") as err:
        runner.evaluate_samples(rt, params, one, eval_cfg=cfg, progress=False,
                                verifier="_test_never_scored")
    answers = len(one[name]) * cfg.num_samples
    assert err.value.report["unscored"] == {name: answers}
    cfg.max_unscored_share = 1.0  # allowed: reported, and the run goes on
    report, _ = runner.evaluate_samples(rt, params, one, eval_cfg=cfg, progress=False,
                                        verifier="_test_never_scored")
    assert report["unscored"] == {name: answers}
    assert report["config"]["max_unscored_share"] == 1.0
