"""The platform the kernels are being built for.

Normally that is `jax.default_backend()`. Ahead-of-time compilation for another platform
(`jaxrl-reason plan` compiles TPU programs on a CPU host) traces under `target("tpu")`, so
that "auto" choices (Pallas vs reference, chunked vs full log-probs) and the decision to run
Pallas kernels compiled rather than interpreted follow the target, not the host.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import jax

_state = threading.local()


def current() -> str:
    """"cpu" | "gpu" | "tpu": the innermost `target(...)`, else `jax.default_backend()`."""
    return getattr(_state, "platform", None) or jax.default_backend()


def compiles_kernels() -> bool:
    """True where Pallas kernels compile (TPU: Mosaic, GPU: Triton); False means the
    interpreter."""
    return current() in ("tpu", "gpu")


@contextlib.contextmanager
def target(platform: str) -> Iterator[None]:
    """Trace for `platform` ("cpu", "gpu" or "tpu") inside the block (this thread only)."""
    if platform not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"platform must be 'cpu', 'gpu' or 'tpu', got {platform!r}")
    previous = getattr(_state, "platform", None)
    _state.platform = platform
    try:
        yield
    finally:
        _state.platform = previous


# XLA:CPU hands every dot to YNNPACK by default. On the 2-core AVX-512 host the benchmarks run
# on (benchmarks/rl_step.py, A/B under the same load), the programs whose dots cover thousands
# of rows -- the policy update and the log-prob passes -- ran 20-25% faster with Eigen's dots
# (update 3.24 -> 2.57 s, reference pass 0.85 -> 0.63 s at bench-tiny, 10,176 rows), while the
# sampler's decode loop, whose dots cover a few hundred rows, ran 3.7x slower with them
# (1.07 -> 3.91 s). So "dense" programs turn YNNPACK's dots off and "decode" programs keep
# XLA's default. TPU and GPU programs get no options.
_CPU_PROGRAM_OPTIONS = {
    "dense": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "decode": {},
}


def compiler_options(program: str, mesh=None) -> dict[str, str] | None:
    """XLA options for `jax.jit(..., compiler_options=...)` of a program of kind `program`
    ("dense": training steps and scoring passes over whole sequences; "decode": the
    sampler), for the platform of `mesh`'s devices (default: `current()`). None when there
    is nothing to set."""
    if program not in _CPU_PROGRAM_OPTIONS:
        raise ValueError(f"program must be one of {sorted(_CPU_PROGRAM_OPTIONS)}, "
                         f"got {program!r}")
    target_platform = getattr(_state, "platform", None)  # an AOT build's target comes first
    on = target_platform or (mesh.devices.flat[0].platform if mesh is not None
                             else jax.default_backend())
    if on != "cpu":
        return None
    return dict(_CPU_PROGRAM_OPTIONS[program]) or None
