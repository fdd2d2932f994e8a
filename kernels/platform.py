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
