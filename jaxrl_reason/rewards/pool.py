"""Weighted composition of registered rewards, scored on a host thread pool.

The trainer submits a batch, dispatches its device work, then collects the rewards:

    with RewardPool({"correctness": 1.0, "format_strict": 0.1}) as pool:
        future = pool.submit(completions, examples)   # returns at once
        ...                                           # device work runs meanwhile
        rewards = future.result()                     # BatchRewards

A batch never stalls or crashes the caller: a component that raises scores 0 ("<name>/
exception"), one returning NaN/inf scores 0 ("<name>/nonfinite"). Time limits are charged
to each call, not to the batch, so a verdict does not depend on the machine's load or on
its neighbours in the batch:

- a call that has used `timeout_s` seconds of CPU time on its thread (the thread's own
  clock, `time.pthread_getcpuclockid`) is abandoned and scores 0 ("<name>/timeout"): the
  answer's own cost, a legitimate 0 (rewards that work in other processes charge those
  processes' CPU time the same way, e.g. the math verifier's comparisons);
- a call still running `backstop_factor * timeout_s` seconds of wall time after it started
  (a call that makes no progress, or a machine too busy to run it) is abandoned and is
  *unscored*: it scores 0 with the reason "<name>/unscored", counted apart from any verdict
  (`BatchRewards.unscored`), so an evaluation can retry it and a training run can log it.
  A reward may also return `RewardResult(0.0, "unscored")` itself (the math verifier does
  when its own backstop passes). Every call ends within its backstop, so a batch always
  returns.

Python threads cannot be killed, so a thread stuck in an abandoned call is retired and
replaced by a fresh one, which goes on with the batch; the old one exits on its own if the
call ever returns.

A per-completion reward may prepare a whole batch: when it has a `prefetch` attribute
(`prefetch(completions, examples, workers=W, **options)` returning callables), the
coordinator calls it once per batch and the threads run the callables it returns before
the per-completion calls (`correctness` sends its sympy comparisons to a few worker jobs
this way). A prefetch or task that fails only loses its speed-up.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from jaxrl_reason.rewards.base import (
    BatchContext,
    RewardFunction,
    RewardResult,
    set_limit_scale,
)

# Which rewards a config names, bound to their options (re-exported: callers import them here).
from jaxrl_reason.rewards.resolve import (  # noqa: E402,F401
    check_sandbox,
    config_options,
    import_reward_modules,
    resolve_rewards,
)

_log = logging.getLogger(__name__)
_POLL_S = 0.02  # how often the coordinator checks the running calls against their limits
DEFAULT_BACKSTOP_FACTOR = 10.0  # `rewards.backstop_factor` of configs that have none


@dataclasses.dataclass(frozen=True)
class BatchRewards:
    """Rewards of one batch of N completions.

    Attributes:
      total: [N] float32, sum over components of weight * score.
      components: name -> [N] float32 unweighted scores of that component.
      reasons: counts of "<component>/<reason>" tags (e.g. "correctness/wrong").
      seconds: wall time the pool spent scoring the batch (host verifier time).
      unscored: component -> bool [N], calls left without a verdict (reason "unscored":
        the wall-clock backstop passed); their score 0 is not a verdict.
      timed_out: component -> bool [N], calls that used up their CPU time (reason
        "timeout").
    """

    total: np.ndarray
    components: dict[str, np.ndarray]
    reasons: collections.Counter
    seconds: float
    unscored: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    timed_out: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def unscored_count(self) -> int:
        """Calls of the batch left unscored, over all components."""
        return sum(n for tag, n in self.reasons.items() if tag.endswith("/unscored"))


def _score_one(
    fn: RewardFunction, completion: str, example: Mapping[str, Any]
) -> tuple[float, str | None]:
    """Call a reward function; (score, reason) with failures mapped to score 0."""
    try:
        out = fn(completion, example)
        if isinstance(out, RewardResult):
            score, reason = float(out.score), out.reason
        elif isinstance(out, (bool, int, float, np.number)):
            score, reason = float(out), None
        else:
            raise TypeError(
                f"reward returned {type(out).__name__}, expected RewardResult or float"
            )
    except Exception as exc:  # a verifier must never crash a step
        _log.debug("reward %r raised: %r", getattr(fn, "__name__", fn), exc, exc_info=True)
        return 0.0, "exception"
    if not math.isfinite(score):
        return 0.0, "nonfinite"
    return score, reason


def _batch_inputs(n: int, lengths, truncated, max_length, group_size,
                  names: list[str]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Checked (lengths int [N], truncated bool [N], max_length, group_size)."""
    if lengths is None or truncated is None or max_length is None:
        raise ValueError(f"RewardPool.submit: batch reward(s) {names} need lengths=, "
                         "truncated= and max_length=")
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    truncated = np.asarray(truncated, bool).reshape(-1)
    if lengths.shape != (n,) or truncated.shape != (n,):
        raise ValueError(f"RewardPool.submit: lengths {lengths.shape} / truncated "
                         f"{truncated.shape} do not match {n} completions")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 \
            or n % group_size:
        raise ValueError(f"RewardPool.submit: {n} completions do not split into groups of "
                         f"{group_size!r}")
    return lengths, truncated, int(max_length), group_size


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


class _Batch:
    """Shared state of one batch: work items are (item, component) pairs claimed in order."""

    def __init__(
        self,
        fns: list[tuple[str, RewardFunction]],
        completions: list[str],
        examples: list[Mapping[str, Any]],
    ):
        self.fns, self.completions, self.examples = fns, completions, examples
        self.size = len(completions) * len(fns)
        self.scores = np.zeros(self.size, np.float64)
        self.reasons: list[str | None] = ["unscored"] * self.size
        self._recorded = np.zeros(self.size, bool)
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._remaining = self.size
        self.done = threading.Event()
        self.context: tuple | None = None  # batch-reward inputs (see `_batch_inputs`)
        self.tasks: list = []  # prefetch tasks, run before the items (see `_prefetch`)
        self._task_counter = itertools.count()
        if self.size == 0:
            self.done.set()

    def claim_task(self):
        """The next unclaimed prefetch task, or None when none is left."""
        index = next(self._task_counter)
        return None if index >= len(self.tasks) else self.tasks[index]

    def claim(self) -> int | None:
        """The next unclaimed work index, or None when none is left."""
        index = next(self._counter)
        return None if index >= self.size else index

    def run(self, index: int) -> tuple[float, str | None]:
        item, comp = divmod(index, len(self.fns))
        return _score_one(self.fns[comp][1], self.completions[item], self.examples[item])

    def record(self, index: int, score: float, reason: str | None) -> bool:
        """Record the result of work `index` unless one is recorded already (a call
        abandoned at its limit keeps the pool's verdict). Returns whether it was recorded."""
        with self._lock:
            if self._recorded[index]:
                return False
            self._recorded[index] = True
            self.scores[index], self.reasons[index] = score, reason
            self._remaining -= 1
            if self._remaining == 0:
                self.done.set()
            return True


def _prefetch(fns: list[tuple[str, RewardFunction]], completions: list[str],
              examples: list[Mapping[str, Any]], workers: int) -> list:
    """The prefetch tasks of a batch: for each per-completion reward with a `prefetch`
    attribute (`prefetch(completions, examples, workers=W, **options)` returning callables,
    e.g. `math.correctness_prefetch`), what it returns for this batch, its bound options
    passed on. A prefetch that raises is logged and skipped (its calls then do all the
    work themselves)."""
    tasks: list = []
    for name, fn in fns:
        prefetch = getattr(fn, "prefetch", None)
        if not callable(prefetch):
            continue
        options = fn.keywords if isinstance(fn, functools.partial) else {}
        try:
            tasks += list(prefetch(completions, examples, workers=workers, **options))
        except Exception as exc:
            _log.warning("prefetch of reward %r failed: %r", name, exc)
    return tasks


def _prefetch_within(batch: _Batch, workers: int, timeout_s: float, scale: float) -> list:
    """`_prefetch` of `batch` on a thread of its own (with `limit_scale()` = `scale`), waited
    for at most `timeout_s` of wall time (the coordinator must not hang on a reward's
    preparation); [] when it takes longer (the thread is abandoned and the calls do all the
    work)."""
    out: list = []
    done = threading.Event()

    def run() -> None:
        try:
            set_limit_scale(scale)
            out.extend(_prefetch(batch.fns, batch.completions, batch.examples, workers))
        finally:
            done.set()

    threading.Thread(target=run, name="reward-pool-prefetch", daemon=True).start()
    if not done.wait(timeout_s):
        _log.warning("reward prefetch took more than %.1fs; batch scored without it",
                     timeout_s)
        return []
    return list(out)


def _run_task(task) -> None:
    """Run one prefetch task; a failure only costs its speed-up (logged)."""
    try:
        task()
    except Exception as exc:
        _log.debug("reward prefetch task failed: %r", exc, exc_info=True)


def _thread_clock() -> int | None:
    """The calling thread's CPU-time clock id (readable from other threads), or None where
    the platform has none (the pool then charges wall time instead)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


class _WorkerState:
    """A worker thread as the coordinator sees it: the batch it works on and the unit of
    work it is in (`unit`: (batch, index or None for a prefetch task, wall start, CPU
    start)), read under `lock`."""

    def __init__(self) -> None:
        self.current: _Batch | None = None
        self.retired = False
        self.clock: int | None = None
        self.unit: tuple | None = None
        self.lock = threading.Lock()

    def cpu(self) -> float:
        """This thread's CPU time (wall time without a thread clock)."""
        if self.clock is None:
            return time.monotonic()
        try:
            return time.clock_gettime(self.clock)
        except OSError:  # the thread has exited
            return float("inf")

    def begin(self, batch: _Batch, index: int | None) -> None:
        with self.lock:
            self.unit = (batch, index, time.monotonic(), self.cpu())

    def end(self) -> None:
        with self.lock:
            self.unit = None


class RewardPool:
    """Scores batches with a weighted sum of registered rewards on `num_workers` threads.

    Args:
      weights: reward name -> weight (finite float; 0 computes the component for logging
        without adding it to the total). Names must be registered (see `available_rewards`):
        per-completion rewards run on the threads; batch rewards (length shaping) run once
        per batch afterwards and need `lengths`/`truncated` at `submit`.
      options: reward name -> keyword arguments bound to that reward (e.g.
        `{"overlong_dapo": {"cache_length": 16}}`); unknown names or keywords raise.
      verifier: the per-completion reward that decides correctness (`ctx.correct` of batch
        rewards); it is scored (with weight 0 if unweighted) whenever a batch reward needs it.
      num_workers: worker threads (>= 1).
      timeout_s: CPU seconds one call may use on its thread (the answer's own cost, not the
        batch's wall time; batches run one after another in submission order). A call that
        uses it up scores 0 with reason "<name>/timeout".
      backstop_factor: a call still running after `backstop_factor * timeout_s` seconds of
        wall time is abandoned as unscored ("<name>/unscored"); >= 1. The backstop also
        bounds a batch's prefetch.
      limit_scale: what `base.limit_scale()` returns on the pool's threads: rewards with an
        inner limit (the math verifier's per-comparison CPU time) scale it by this (an
        evaluation retries undecided answers in a pool with a larger one).
    """

    def __init__(
        self, weights: Mapping[str, float], *, options: Mapping[str, Mapping] | None = None,
        verifier: str = "correctness", num_workers: int = 4, timeout_s: float = 5.0,
        backstop_factor: float = DEFAULT_BACKSTOP_FACTOR, limit_scale: float = 1.0,
    ):
        if not isinstance(weights, Mapping) or not weights:
            raise ValueError(
                f"RewardPool: weights must be a non-empty mapping name -> float, got {weights!r}"
            )
        self._weights: dict[str, float] = {}
        for name, weight in weights.items():
            if not _is_real(weight) or not math.isfinite(weight):
                raise ValueError(
                    f"RewardPool: weight of {name!r} must be a finite number, got {weight!r}"
                )
            self._weights[name] = float(weight)
        self._fns, self._batch_fns, extra = resolve_rewards(self._weights, options, verifier)
        check_sandbox([name for name, _ in self._fns], options or {})
        self.verifier = verifier
        self._weights.update(extra)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                f"RewardPool: num_workers must be an int >= 1, got {num_workers!r}"
            )
        if not _is_real(timeout_s) or not timeout_s > 0 or not math.isfinite(timeout_s):
            raise ValueError(
                f"RewardPool: timeout_s must be a positive finite number, got {timeout_s!r}"
            )
        for name, value in (("backstop_factor", backstop_factor),
                            ("limit_scale", limit_scale)):
            if not _is_real(value) or not math.isfinite(value) or not value >= 1:
                raise ValueError(
                    f"RewardPool: {name} must be a finite number >= 1, got {value!r}")
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self.backstop_s = float(backstop_factor) * self.timeout_s
        self.limit_scale = float(limit_scale)
        self.abandoned_threads = 0
        self._jobs: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._pending: queue.SimpleQueue[tuple[_Batch, Future] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._workers: list[_WorkerState] = []
        for _ in range(num_workers):
            self._start_worker()
        self._coordinator = threading.Thread(
            target=self._coordinate, name="reward-pool-coordinator", daemon=True
        )
        self._coordinator.start()

    @property
    def needs_lengths(self) -> bool:
        """Whether `submit` needs `lengths`/`truncated`/`max_length` (a batch reward is used)."""
        return bool(self._batch_fns)

    @property
    def weights(self) -> dict[str, float]:
        """A copy of the component weights."""
        return dict(self._weights)

    # ------------------------------------------------------------------------------ API

    def submit(
        self, completions: Sequence[str], examples: Sequence[Mapping[str, Any]], *,
        lengths: Sequence[int] | np.ndarray | None = None,
        truncated: Sequence[bool] | np.ndarray | None = None,
        max_length: int | None = None, group_size: int = 1,
    ) -> Future:
        """Start scoring a batch; returns at once a Future of `BatchRewards` ([N] arrays).

        `lengths` (int [N] tokens), `truncated` (bool [N]), `max_length` (the token budget)
        and `group_size` (G; rows group-major) feed the batch rewards; they are required
        when one is configured (`needs_lengths`).

        Raises ValueError when the sequences differ in length or batch-reward inputs are
        missing, TypeError when a completion is not a str or an example not a Mapping,
        RuntimeError after `close()`.
        """
        completions, examples = list(completions), list(examples)
        context = None
        if self._batch_fns:
            context = _batch_inputs(len(completions), lengths, truncated, max_length,
                                    group_size, [name for name, _ in self._batch_fns])
        if len(completions) != len(examples):
            raise ValueError(
                f"RewardPool.submit: {len(completions)} completions but {len(examples)} examples"
            )
        for i, (text, example) in enumerate(zip(completions, examples)):
            if not isinstance(text, str):
                raise TypeError(
                    f"RewardPool.submit: completions[{i}] is {type(text).__name__}, expected str"
                )
            if not isinstance(example, Mapping):
                raise TypeError(
                    f"RewardPool.submit: examples[{i}] is {type(example).__name__},"
                    " expected a Mapping"
                )
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool.submit called after close()")
            batch = _Batch(self._fns, completions, examples)
            batch.context = context
            self._pending.put((batch, future))
        return future

    def score(
        self, completions: Sequence[str], examples: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> BatchRewards:
        """Score a batch and wait for it (see `submit` for the keyword arguments)."""
        return self.submit(completions, examples, **kwargs).result()

    def close(self) -> None:
        """Finish the batches already submitted, then stop the threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending.put(None)
        self._coordinator.join()
        with self._lock:
            for _ in self._workers:
                self._jobs.put(None)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- threads

    def _start_worker(self) -> _WorkerState:
        state = _WorkerState()
        self._workers.append(state)
        threading.Thread(
            target=self._work, args=(state,), name="reward-pool-worker", daemon=True
        ).start()
        return state

    def _work(self, state: _WorkerState) -> None:
        state.clock = _thread_clock()
        set_limit_scale(self.limit_scale)
        while True:
            batch = self._jobs.get()
            if batch is None:
                return
            state.current = batch
            while (task := batch.claim_task()) is not None:
                state.begin(batch, None)
                _run_task(task)
                state.end()
                if state.retired:
                    return
            while (index := batch.claim()) is not None:
                state.begin(batch, index)
                score, reason = batch.run(index)
                state.end()
                batch.record(index, score, reason)
                if state.retired:
                    return
            state.current = None

    def _coordinate(self) -> None:
        while (item := self._pending.get()) is not None:
            batch, future = item
            if not future.set_running_or_notify_cancel():
                continue
            start = time.perf_counter()
            batch.tasks = _prefetch_within(batch, self.num_workers, self.backstop_s,
                                           self.limit_scale)
            for _ in range(self.num_workers):
                self._jobs.put(batch)
            self._watch(batch)
            try:
                future.set_result(self._collect(batch, time.perf_counter() - start))
            except Exception as exc:
                future.set_exception(exc)

    def _watch(self, batch: _Batch) -> None:
        """Wait for `batch`, abandoning every call that passes its CPU limit ("timeout") or
        its wall-clock backstop ("unscored"), and every prefetch task that passes the
        backstop; a replacement thread takes up the batch."""
        abandoned: collections.Counter = collections.Counter()
        while not batch.done.wait(_POLL_S):
            now = time.monotonic()
            with self._lock:
                states = list(self._workers)
            for state in states:
                with state.lock:
                    unit = state.unit
                    if unit is None or unit[0] is not batch:
                        continue
                    _, index, wall0, cpu0 = unit
                    used, waited = state.cpu() - cpu0, now - wall0
                    if index is None:
                        reason = "backstop" if waited > self.backstop_s else None
                    elif used > self.timeout_s:
                        reason = "timeout"
                    elif waited > self.backstop_s:
                        reason = "unscored"
                    else:
                        reason = None
                    if reason is None:
                        continue
                    state.unit = None
                    state.retired = True
                if index is not None:
                    batch.record(index, 0.0, reason)
                abandoned[reason] += 1
                self._replace(state, batch)
        if abandoned:
            _log.warning(
                "reward batch: abandoned %d call(s) at their %.1fs CPU limit, %d at the "
                "%.1fs wall-clock backstop (unscored), %d prefetch task(s); %d thread(s) "
                "abandoned so far", abandoned["timeout"], self.timeout_s,
                abandoned["unscored"], self.backstop_s, abandoned["backstop"],
                self.abandoned_threads)

    def _replace(self, state: _WorkerState, batch: _Batch) -> None:
        """Retire a worker stuck in `batch` and start a fresh one on the batch's rest."""
        with self._lock:
            if state in self._workers:
                self._workers.remove(state)
                self.abandoned_threads += 1
                self._start_worker()
                self._jobs.put(batch)

    def _collect(self, batch: _Batch, seconds: float) -> BatchRewards:
        n, c = len(batch.completions), len(batch.fns)
        scores = batch.scores.reshape(n, c)
        reasons: collections.Counter = collections.Counter()
        for index, reason in enumerate(batch.reasons):
            if reason is not None:
                reasons[f"{batch.fns[index % c][0]}/{reason}"] += 1
        components = {
            name: scores[:, k].astype(np.float32) for k, (name, _) in enumerate(batch.fns)
        }
        if self._batch_fns:
            components.update(self._batch_components(batch, components, reasons))
        total = np.zeros(n, np.float64)
        for name, values in components.items():
            total += self._weights[name] * values.astype(np.float64)
        tags = np.array([r or "" for r in batch.reasons], object).reshape(n, c) \
            if n * c else np.zeros((n, c), object)
        unscored = {name: tags[:, k] == "unscored" for k, (name, _) in enumerate(batch.fns)}
        timed_out = {name: tags[:, k] == "timeout" for k, (name, _) in enumerate(batch.fns)}
        return BatchRewards(total=total.astype(np.float32), components=components,
                            reasons=reasons, seconds=seconds, unscored=unscored,
                            timed_out=timed_out)

    def _batch_components(self, batch: _Batch, components: dict[str, np.ndarray],
                          reasons: collections.Counter) -> dict[str, np.ndarray]:
        """Scores of the batch rewards; a failing one scores 0 with a counted reason."""
        n = len(batch.completions)
        lengths, truncated, max_length, group_size = batch.context
        correct = components[self.verifier] > 0.5 if self.verifier in components else None
        ctx = BatchContext(completions=batch.completions, examples=batch.examples,
                           lengths=lengths, truncated=truncated, max_length=max_length,
                           group_size=group_size, correct=correct, components=components)
        out = {}
        for name, fn in self._batch_fns:
            try:
                values = np.asarray(fn(ctx), np.float64)
                if values.shape != (n,):
                    raise ValueError(f"returned shape {values.shape}, expected ({n},)")
            except Exception as exc:
                _log.warning("batch reward %r failed: %r", name, exc)
                reasons[f"{name}/exception"] += n
                out[name] = np.zeros(n, np.float32)
                continue
            bad = ~np.isfinite(values)
            if bad.any():
                reasons[f"{name}/nonfinite"] += int(bad.sum())
            out[name] = np.where(bad, 0.0, values).astype(np.float32)
        return out


def make_reward_pool(config) -> RewardPool:
    """The RL reward pool of a run config: `rewards.weights`, `rewards.options`, the task's
    verifier, `rewards.num_workers`, `rewards.timeout_s`, `rewards.backstop_factor`. Imports `rewards.modules` first so
    that user rewards they register (`@register_reward`) can be named in the weights."""
    from jaxrl_reason.data.tasks import task_verifier  # data imports nothing from rewards

    import_reward_modules(config.rewards.get("modules", ()))
    return RewardPool(dict(config.rewards.weights), options=config_options(config),
                      verifier=task_verifier(config), num_workers=config.rewards.num_workers,
                      timeout_s=config.rewards.timeout_s,
                      backstop_factor=config.rewards.get("backstop_factor",
                                                         DEFAULT_BACKSTOP_FACTOR))
