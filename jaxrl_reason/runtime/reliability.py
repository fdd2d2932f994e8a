"""Run guards: graceful stop on SIGTERM/SIGINT, non-finite update skipping, start-up checks.

- `GracefulStop`: while installed (the CLI runs every command inside one; leaving it
  releases the workdir locks the command took, see `workdir_lock`), SIGTERM (spot-TPU preemption, `kill`) and the first
  SIGINT (Ctrl-C) only set a flag; the training loops check it at every step boundary,
  save a checkpoint and raise `Preempted`, which the CLI turns into exit code 0. A second
  SIGINT interrupts at once (KeyboardInterrupt).
- `train_state.apply_gradients_if_finite` (used by every training step): one optimizer
  update that leaves params and optimizer state untouched when the loss or the gradient
  norm is not finite (inside jit, no host sync).
- `SkipGuard`: counts consecutive skipped updates on the host, logs each with the batch's
  example ids, and stops the run with a clear message after `max_consecutive` in a row.
- `check_workdir`, `check_prompt_lengths`: problems found before anything is compiled
  (an unwritable or full disk, a prompt longer than every bucket).

Multi-host: a stop signal reaches the hosts at different moments, so `stop_requested` asks
every process (any of them stopping stops all, at the same step); skipped-step messages are
printed by process 0 only (every process logs them).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import paths
from jaxrl_reason.checkpoints import workdir_lock

_log = logging.getLogger(__name__)


class Preempted(Exception):
    """The run stopped at a step boundary after SIGTERM/SIGINT, with a checkpoint saved."""

    def __init__(self, phase: str, step: int):
        super().__init__(f"stopped by signal in phase {phase!r} after step {step}; a "
                         f"checkpoint was saved: continue with --resume")
        self.phase, self.step = phase, step


class NumericError(RuntimeError):
    """Too many consecutive non-finite updates or reward batches."""


class GracefulStop:
    """Context manager installing the SIGTERM/SIGINT handlers (main thread only; elsewhere,
    e.g. in a notebook worker thread, it does nothing)."""

    _requested = threading.Event()

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    @classmethod
    def requested(cls) -> bool:
        """Whether a stop signal arrived (since the last `reset`)."""
        return cls._requested.is_set()

    @classmethod
    def reset(cls) -> None:
        cls._requested.clear()

    @classmethod
    def request(cls) -> None:
        """Ask for a stop at the next step boundary (what the signal handler does)."""
        cls._requested.set()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested():
            raise KeyboardInterrupt
        _log.warning("signal %d: saving a checkpoint at the next step boundary", signum)
        print(f"[signal] {signal.Signals(signum).name}: stopping at the next step boundary "
              "(checkpoint, then exit 0); Ctrl-C again to interrupt now", flush=True)
        self.request()

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        # The CLI runs each command inside one GracefulStop: the workdir locks the command
        # took (`workdir_lock.acquire`) end with it.
        workdir_lock.release_all()


def stop_requested() -> bool:
    """Whether the loops should checkpoint and stop now.

    On multi-host: whether ANY process got a stop signal, so that all of them save the same
    step and stop together. That is a collective: every process must call this at the same
    points of the loop (the training loops do). One process: the local flag.
    """
    local = GracefulStop.requested()
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    return bool(np.any(multihost_utils.process_allgather(np.int32(local))))


# ----------------------------------------------------------------------- numeric guards


class SkipGuard:
    """Host-side count of consecutive skipped steps.

    Args:
      phase: name for messages ("sft", "rl").
      max_consecutive: stop after this many skips in a row (>= 1).
    """

    def __init__(self, phase: str, max_consecutive: int):
        self.phase, self.max_consecutive = phase, int(max_consecutive)
        self.consecutive = 0
        self.total = 0

    def update(self, step: int, skipped: bool, why: str, example_ids: Iterable[Any]) -> None:
        """Record one step; raises NumericError after `max_consecutive` skips in a row."""
        if not skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total += 1
        ids = list(example_ids)
        shown = ", ".join(map(str, ids[:8])) + (" ..." if len(ids) > 8 else "")
        message = (f"[{self.phase}] step {step}: update skipped ({why}); weights and optimizer "
                   f"state unchanged; batch examples: {shown}")
        _log.warning(message)
        if jax.process_index() == 0:
            print(message, flush=True)
        if self.consecutive >= self.max_consecutive:
            raise NumericError(
                f"{self.phase}: {self.consecutive} consecutive steps skipped (last: {why} at "
                f"step {step}); stopping. Lower the learning rate, check the data of the "
                f"logged examples, or resume from the last checkpoint")


# ---------------------------------------------------------------------- start-up checks


def tree_bytes(tree) -> int:
    """Total bytes of the arrays (or ShapeDtypeStructs) in a pytree."""
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def check_workdir(workdir: str, checkpoint_bytes: int, max_to_keep: int,
                  phases: int = 2) -> None:
    """Raises OSError naming `workdir` when it cannot be written or its disk lacks room for
    `phases * (max_to_keep + 1)` checkpoints of `checkpoint_bytes` (plus 10%). Existing
    checkpoint directories (`checkpoints/` and its phase directories, which a resumed run
    writes into) must be writable too: a read-only one is found here, before any work.

    `workdir` may be remote (gs://..., any etils.epath path): the write probe goes through
    epath, and the free-space check is skipped (an object store has no disk to measure).
    Every process of a multi-host job checks with its own probe file (each writes its
    checkpoint shards there).
    """
    root = paths.as_path(workdir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"workdir {workdir!r} is not writable: {e}") from e
    for directory in [root] + _checkpoint_dirs(root):
        _probe_write(directory, workdir)
    if paths.is_remote(workdir):
        _log.info("workdir %s is remote: free space is not checked", workdir)
        return
    need = int(1.1 * phases * (max_to_keep + 1) * checkpoint_bytes)
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise OSError(f"workdir {workdir!r}: {free / 2**20:.0f} MiB free on its disk, but the "
                      f"run's checkpoints need about {need / 2**20:.0f} MiB ({phases} phases x "
                      f"{max_to_keep + 1} checkpoints x {checkpoint_bytes / 2**20:.1f} MiB)")


def _checkpoint_dirs(root) -> list:
    """The existing `checkpoints` directory of a workdir and its phase directories (a
    resumed run saves into them, so each must be writable too)."""
    top = root / "checkpoints"
    if not top.is_dir():
        return []
    return [top] + sorted(d for d in top.iterdir() if d.is_dir())


def _probe_write(directory, workdir: str) -> None:
    """Writes and deletes a probe file in `directory` (one per process); raises OSError
    naming the directory when that fails (read-only, no permission, full)."""
    suffix = "" if jax.process_count() == 1 else f".{jax.process_index()}"
    probe = directory / f".write_probe{suffix}"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        what = ("workdir" if os.fspath(directory) == os.fspath(paths.as_path(workdir))
                else "checkpoint directory")
        raise OSError(f"{what} {os.fspath(directory)!r} is not writable, so no checkpoint "
                      f"could be saved; nothing was trained (fix its permissions or pass "
                      f"another --workdir): {e}") from e


def check_prompt_lengths(encode, sets: Mapping[str, Sequence[Mapping]], buckets: Sequence[int],
                         limit: int = 512) -> None:
    """Raises ValueError naming the set and example whose prompt (tokens from `encode(text)`)
    is longer than the largest of `buckets`; checks the first `limit` examples of each set."""
    largest = max(buckets)
    for name, source in sets.items():
        for i in range(min(limit, len(source))):
            example = source[i]
            n = len(encode(example["prompt"]))
            if n > largest:
                raise ValueError(
                    f"{name}: prompt of example {example.get('id', i)!r} has {n} tokens, "
                    f"longer than the largest bucket in task.prompt_buckets={tuple(buckets)}")
