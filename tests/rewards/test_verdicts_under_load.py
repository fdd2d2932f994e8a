"""Verdicts that do not depend on the machine's load: each comparison is charged its own
CPU time, so honest answers batched behind slow neighbours are scored alike on a quiet and
on a saturated machine, and only the wall-clock backstop (a job that gets no CPU at all)
leaves an answer unscored, never "wrong"."""
import numpy as np
import pytest
from busy_cpu import saturated

from jaxrl_reason.rewards import RewardPool
from jaxrl_reason.rewards import _sympy_worker
from jaxrl_reason.rewards import math as math_reward
from jaxrl_reason.rewards._sympy_worker import SympyPool

# About half a second of CPU time each in a sympy job (big-number trigonometry); distinct,
# so that no verdict comes from a cache.
SLOW = [r"\sin((10^{999})^{60})", r"\sin((10^{998})^{60})", r"\sin((10^{997})^{60})"]
# About 0.4 s of CPU time each: well under the default 2 s limit even on a contended core.
SLOWISH = [r"\sin((10^{900})^{60})", r"\sin((10^{899})^{60})", r"\sin((10^{898})^{60})"]
HONEST = [r"\cos(0)", r"\sqrt{1}", r"e^{0}"]  # equal to 1, each needs a worker job


@pytest.mark.saturates_cpu
def test_honest_answers_behind_slow_neighbours_score_alike_on_a_saturated_machine(
        monkeypatch):
    """One batch job holds `\\cos(0)`, three slow answers and then `\\sqrt{1}`, `e^{0}`
    (sorted by answer), each slow one well under its 2 s CPU limit (the default), together
    over the pool's 1.5 s limit per call. With four busy processes on the machine the slow
    ones take several times their CPU time in wall time; under the old wall-clock limits
    (1.5 s for the batch) the answers after them were scored 0. Charged their own CPU time,
    every answer gets its verdict: the honest ones 1, the slow ones "wrong" (decided, not a
    timeout)."""
    pool = SympyPool(2, isolate=False)
    monkeypatch.setattr(_sympy_worker, "_POOL", pool)
    texts = [f"The answer is \\boxed{{{a}}}." for a in HONEST[:1] + SLOWISH + HONEST[1:]]
    try:
        pool.warm()
        with saturated(4), RewardPool({"correctness": 1.0}, num_workers=1,
                                      timeout_s=1.5) as rewards:
            out = rewards.score(texts, [{"prompt": "p", "answer": "1"}] * len(texts))
    finally:
        pool.shutdown()
    np.testing.assert_array_equal(out.total, [1, 0, 0, 0, 1, 1])
    assert out.reasons == {"correctness/wrong": 3}
    assert not out.unscored["correctness"].any()


@pytest.mark.saturates_cpu
def test_cpu_limit_is_a_timeout_and_the_backstop_is_unscored():
    """The same slow comparison is a timeout when its CPU limit is below its cost, whatever
    the load; a backstop too short for the job to get its CPU leaves it unscored
    (`detail=True`: "w"), and `math.equivalence_verdict` says "unscored", not "different"."""
    pool = SympyPool(1, isolate=False)
    options = {"targets": ["latex"]}
    try:
        pool.warm()
        assert pool.compare(SLOW[0], "1", "mv", 0.0, 0.05, options) is None
        with saturated(4):
            assert pool.compare(SLOW[1], "1", "mv", 0.0, 0.05, options) is None
            assert pool.compare(SLOW[2], "1", "mv", 0.0, 30.0, options, wall_s=0.05,
                                detail=True) == _sympy_worker.UNSCORED
        assert pool.compare(SLOW[2], "1", "mv", 0.0, 30.0, options, wall_s=0.05) is None
        assert pool.compare(HONEST[1], "1", "mv", 0.0, 5.0, options) is True
    finally:
        pool.shutdown()


def test_equivalence_verdict_tells_unscored_from_different(monkeypatch):
    pool = SympyPool(1, isolate=False)
    monkeypatch.setattr(_sympy_worker, "_POOL", pool)
    try:
        pool.warm()
        assert math_reward.equivalence_verdict(SLOW[1], "1", 0.05) == "timeout"
        monkeypatch.setattr(_sympy_worker, "MIN_WALL_S", 0.0)
        monkeypatch.setattr(_sympy_worker, "WALL_FACTOR", 0.01)  # 0.3 s for 30 s of CPU
        assert math_reward.equivalence_verdict(SLOW[0], "1", 30.0) == "unscored"
        assert math_reward.equivalence_verdict(r"\sqrt{4}", "3", 30.0) == "different"
    finally:
        pool.shutdown()
