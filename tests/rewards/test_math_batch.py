"""The `correctness` reward's batch preparation (`correctness_prefetch`) inside RewardPool:
the same verdicts as one call per answer, in far fewer worker jobs."""
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_reason.rewards import RewardPool, math as math_reward, register_reward
from jaxrl_reason.rewards._sympy_worker import SympyPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from verifiers import build_items  # noqa: E402

_SEEN: list = []


@register_reward("_test_prefetching")
def _prefetching(completion, example, *, scale: float = 1.0):
    return scale * float(completion in _SEEN)


def _prefetch(completions, examples, workers=1, scale=1.0):
    assert scale == 3.0  # the reward's bound options reach the prefetch
    return [lambda: _SEEN.extend(completions)]


_prefetching.prefetch = _prefetch


@register_reward("_test_prefetch_fails")
def _prefetch_fails(completion, example):
    return 1.0


def _broken(*args, **kwargs):
    raise RuntimeError("boom")


_prefetch_fails.prefetch = _broken


def test_pool_runs_prefetch_tasks_before_the_calls():
    _SEEN.clear()
    options = {"_test_prefetching": {"scale": 3.0}}
    with RewardPool({"_test_prefetching": 1.0, "_test_prefetch_fails": 1.0}, options=options,
                    num_workers=2) as pool:
        out = pool.score(["a", "b", "c"], [{"answer": "x"}] * 3)
    np.testing.assert_allclose(out.components["_test_prefetching"], [3.0, 3.0, 3.0])
    np.testing.assert_allclose(out.components["_test_prefetch_fails"], [1.0, 1.0, 1.0])


@pytest.fixture
def own_pool(monkeypatch):
    """A fresh sympy pool (no cached verdicts) counting the worker requests."""
    from jaxrl_reason.rewards import _sympy_worker

    pool = SympyPool(2, isolate=False)
    pool.warm()
    requests = []
    original = pool._request

    def counted(body, timeout_s, wall_s, count=None):
        requests.append(count or 1)
        return original(body, timeout_s, wall_s, count)

    monkeypatch.setattr(pool, "_request", counted)
    monkeypatch.setattr(_sympy_worker, "_POOL", pool)
    monkeypatch.setattr(math_reward, "CORRECTNESS_TIMEOUT_S", 30.0)  # a loaded machine
    yield pool, requests
    pool.shutdown()


@pytest.mark.parametrize("workers", [1, 3])
def test_prefetched_verdicts_equal_single_calls_in_fewer_jobs(own_pool, workers):
    pool, requests = own_pool
    items = build_items(96, 0.0, seed=3)
    completions, examples = [c for c, _, _ in items], [e for _, e, _ in items]
    with RewardPool({"correctness": 1.0}, num_workers=workers, timeout_s=300.0) as rp:
        batched = rp.score(completions, examples)
    jobs = len(requests)
    assert jobs <= max(workers, 2) and sum(requests) > jobs  # several comparisons per job
    pool._verdicts.clear()
    single = [math_reward.correctness(c, e) for c, e in zip(completions, examples)]
    assert len(requests) - jobs > jobs  # one job per distinct comparison
    np.testing.assert_array_equal(batched.components["correctness"],
                                  np.array([r.score for r in single], np.float32))
    labels = np.array([want for _, _, want in items], bool)
    assert (batched.components["correctness"] > 0.5).tolist().count(True) > 0
    assert ((batched.components["correctness"] > 0.5) != labels).sum() <= 2


def test_prefetch_skips_what_the_parent_decides_and_bad_examples():
    tasks = math_reward.correctness_prefetch(
        ["\\boxed{4}", "\\boxed{5}", "no answer here", "\\boxed{x}"],
        [{"answer": "4"}, {"answer": "4"}, {"answer": "4"}, {"prompt": "no answer key"}])
    assert tasks == []  # integers, a missing answer and a missing key need no worker
    with pytest.raises(ValueError, match="no 'answer'"):
        math_reward.correctness("\\boxed{x}", {"prompt": "no answer key"})


@pytest.mark.parametrize("cores, jobs", [(1, 1), (2, 2), (8, 2)])
def test_one_thread_runs_one_job_per_usable_core_at_once(own_pool, monkeypatch, cores, jobs):
    """With a single pool thread, the batch's comparisons still go to one job per usable
    core at the same time (one task, several jobs side by side), at most one per sympy
    worker."""
    monkeypatch.setattr(math_reward, "_usable_cores", lambda: cores)
    pool, requests = own_pool
    items = build_items(64, 0.0, seed=5)
    tasks = math_reward.correctness_prefetch([c for c, _, _ in items],
                                             [e for _, e, _ in items], workers=1)
    assert len(tasks) == 1
    tasks[0]()
    assert pool.max_workers == 2 and len(requests) == jobs and all(n > 1 for n in requests)


_HANG = []


@register_reward("_test_prefetch_hangs")
def _prefetch_hangs(completion, example):
    return 1.0


def _hanging(*args, **kwargs):
    import threading

    event = threading.Event()
    _HANG.append(event)
    event.wait(30.0)
    return []


_prefetch_hangs.prefetch = _hanging


def test_a_hanging_prefetch_does_not_hang_the_pool():
    """The prefetch is waited for until the backstop (here 2 x 1 s), then the batch is
    scored without it: its calls are not charged for the wait."""
    import time

    start = time.monotonic()
    with RewardPool({"_test_prefetch_hangs": 1.0}, num_workers=2, timeout_s=1.0,
                    backstop_factor=2) as pool:
        out = pool.score(["a", "b"], [{"answer": "x"}] * 2)
    _HANG[0].set()
    assert time.monotonic() - start < 10.0
    assert out.components["_test_prefetch_hangs"].tolist() == [1.0, 1.0]
    assert not out.reasons


def test_unisolated_pool_warns_with_the_actual_reason(monkeypatch):
    """The warning names what is missing (e.g. pyseccomp), not a fixed guess."""
    from jaxrl_reason.rewards import isolation

    monkeypatch.setattr(isolation, "available", lambda: False)
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "pip install pyseccomp")
    with pytest.warns(RuntimeWarning, match="WITHOUT OS isolation: pip install pyseccomp"):
        pool = SympyPool(1)
    assert pool.isolate is False
    pool.shutdown()


def test_jobs_keep_each_gold_together_deal_golds_round_robin_and_stay_bounded():
    ordered = [(f"p{k}", gold, "mv", 0.0, {}) for gold, n in (("a", 3), ("b", 1), ("c", 2))
               for k in range(n)]
    parts = math_reward._deal_by_gold(ordered, 2)
    assert [[r[1] for r in part] for part in parts] == [["a", "a", "a", "c", "c"], ["b"]]
    big = [(f"p{k}", "g", "mv", 0.0, {}) for k in range(2 * math_reward._BATCH_JOB_SIZE + 1)]
    sizes = [len(part) for part in math_reward._deal_by_gold(big, 2)]
    assert sizes == [math_reward._BATCH_JOB_SIZE, math_reward._BATCH_JOB_SIZE, 1]
    assert sorted(r for part in math_reward._deal_by_gold(ordered, 3) for r in part) == \
        sorted(ordered)
