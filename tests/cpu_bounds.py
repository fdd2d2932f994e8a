"""Time bounds that load cannot break: the calling thread's CPU time, with the cyclic garbage
collector paused, plus a wall-clock backstop.

Wall time on a shared 2-core CI machine stretches with whatever else runs; a thread's CPU
time does not. A full cyclic collection costs in proportion to the whole test process's heap
(an xdist worker's, after hundreds of tests: one 0.06 s call measured 2.2 s there), not to
the input under test, so it is paused inside the block and runs after it.
"""
from __future__ import annotations

import contextlib
import gc
import time


@contextlib.contextmanager
def gc_paused():
    """The block runs with the cyclic collector off (restored after, whatever happens)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Bound:
    """`with Bound(cpu_s, wall_s):` fails when the block used more than `cpu_s` seconds of
    this thread's CPU time, or more than `wall_s` seconds of wall time (the backstop, for
    work done off this thread or a hang). `label` is added to the failure message."""

    def __init__(self, cpu_s: float, wall_s: float, label=None) -> None:
        self.cpu_s, self.wall_s, self.label = cpu_s, wall_s, label
        self._gc = gc_paused()

    def __enter__(self):
        self._gc.__enter__()
        self.cpu, self.wall = time.thread_time(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        cpu, wall = time.thread_time() - self.cpu, time.monotonic() - self.wall
        self._gc.__exit__(*exc)
        if exc[0] is None:
            assert cpu <= self.cpu_s, ("thread CPU", cpu, self.label)
            assert wall <= self.wall_s, ("wall", wall, self.label)
