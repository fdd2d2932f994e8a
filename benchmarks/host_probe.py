"""The host-speed probe every benchmark records (the anchors use the same one): numpy float32
matmul GFLOP/s. Numpy only, so any benchmark process can import it before choosing its
framework. A slow probe next to a slow run says the machine, not the code, was slow."""
from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["matmul_gflops", "require_quiet"]

QUIET_LOAD_PER_CORE = 0.5  # a 1-minute load average above this per core counts as loaded


def require_quiet(allow_load: bool = False, per_core: float = QUIET_LOAD_PER_CORE) -> dict:
    """Refuse to benchmark on a loaded machine: raise SystemExit when the 1-minute load
    average exceeds `per_core` times the machine's cores, unless `allow_load` (the record
    then says so). Returns the record to store with the figures: the load averages, the
    cores, the threshold and whether the check was waived."""
    load, cores = os.getloadavg(), os.cpu_count() or 1
    record = {"load_average_1_5_15_min": list(load), "cores": cores,
              "quiet_threshold": per_core * cores, "load_check_waived": bool(allow_load)}
    if load[0] > per_core * cores and not allow_load:
        raise SystemExit(
            f"refusing to benchmark: the 1-minute load average is {load[0]:.2f} on {cores} "
            f"cores (limit {per_core * cores:.2f}); wait for other jobs to finish, or pass "
            "--allow-load to record a run that is not publishable")
    return record


def matmul_gflops(n: int = 512, reps: int = 20) -> float:
    """numpy float32 [n, n] @ [n, n] GFLOP/s: the best of 3 timings of `reps` products."""
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 * reps / best / 1e9
