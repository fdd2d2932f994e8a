"""The host-speed probe every benchmark records (the anchors use the same one): numpy float32
matmul GFLOP/s. Numpy only, so any benchmark process can import it before choosing its
framework. A slow probe next to a slow run says the machine, not the code, was slow."""
from __future__ import annotations

import time

import numpy as np

__all__ = ["matmul_gflops"]


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
