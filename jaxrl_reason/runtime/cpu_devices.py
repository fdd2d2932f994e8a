"""How many XLA devices this host's CPU runs as (`config.cpu_devices`); set before JAX starts.

XLA:CPU runs a program per device and spreads each op of it over the host's thread pool. A
small model's ops are too small to keep several cores busy that way. As one device per core,
with the rows split over the mesh's data axis, each core runs its own share of every op: on
the 2-core host the benchmarks run on, bench-tiny's GRPO step took 2.69-2.83 s instead of
3.19-3.55 s (`benchmarks/rl_step.py --cpu-devices 2` vs `1`; README "On a CPU"). Params
and optimizer state are replicated per device (unless the mesh's fsdp axis shards them), so
this is for models that fit many times in host RAM.

`config.cpu_devices`:
  0  auto: one device per core this process may run on, lowered to the largest count the
     config's batches split over evenly (see `validation.fits_devices`); 1 in a
     multi-process job (each process keeps JAX's default there);
  N  exactly N devices (1: JAX's default, one device for the whole host).
A device count already chosen in the environment wins over the config:
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (the tests' fake 8-device mesh) or
`JAX_NUM_CPU_DEVICES=N`. Only the CPU backend is affected: on a TPU or GPU host the mesh is
made of the accelerators either way.
"""
from __future__ import annotations

import os
import re
from typing import Callable, Mapping

import jax

_FORCE_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def environment_count(env: Mapping[str, str] | None = None) -> int | None:
    """The CPU device count the environment already sets (JAX_NUM_CPU_DEVICES, else XLA_FLAGS'
    --xla_force_host_platform_device_count; the last occurrence counts), or None."""
    env = os.environ if env is None else env
    value = env.get("JAX_NUM_CPU_DEVICES", "").strip()
    if value.isdigit():  # JAX's -1 means unset
        return int(value)
    counts = _FORCE_FLAG.findall(env.get("XLA_FLAGS", ""))
    return int(counts[-1]) if counts else None


def resolve(value, *, cores: int, fits: Callable[[int], bool] | None = None,
            multi_process: bool = False) -> int:
    """The device count `value` (a `config.cpu_devices`) asks for.

    Args:
      value: 0 (auto) or a positive int; anything else is a ValueError naming the key.
      cores: the cores to split over (`usable_cores()`).
      fits: n -> whether the run's batches split over n data-parallel devices (auto takes the
        largest n <= cores that fits; None: every n fits).
      multi_process: auto gives 1 in a multi-process job.
    Returns: an int >= 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"cpu_devices: must be 0 (auto: one device per core) or a positive "
                         f"device count, got {value!r}")
    if value > 0:
        return value
    if multi_process:
        return 1
    return next(n for n in range(max(1, cores), 0, -1) if n == 1 or fits is None or fits(n))


def started() -> bool:
    """Whether JAX's backends are up (the device count can no longer change)."""
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()


def apply(count: int) -> bool:
    """Makes the CPU backend `count` devices; call it before any JAX computation. Returns
    whether it set anything (False when the environment's count wins, see the module doc, or
    JAX already runs with `count`).

    Raises ValueError when JAX's backends are up already with a different count (the setting
    can no longer take effect: restart the process, or set it first thing).
    """
    if environment_count() is not None:
        return False
    if started():
        have = len(jax.devices("cpu"))
        if have != count:
            raise ValueError(f"cpu_devices: JAX is already running with {have} CPU "
                               f"device(s); {count} must be set before the first JAX call")
        return False
    jax.config.update("jax_num_cpu_devices", int(count))
    return True
