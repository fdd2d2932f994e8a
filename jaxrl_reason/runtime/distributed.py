"""Multi-host JAX: starting the distributed runtime, and moving data between hosts and the mesh.

JAX runs multi-host jobs as multi-controller programs: every process (one per host, or one per
GPU) runs this same program on its own devices, and `jax.devices()` lists the devices of all
of them. The CLI calls `initialize(config.distributed)` before any other JAX call.

When to initialize (`distributed.enabled`):
  "auto" (default): when the config or the environment names the job (a coordinator address
    or a process count > 1: `distributed.*` fields or `JAX_COORDINATOR_ADDRESS`,
    `JAX_NUM_PROCESSES`), when the environment is a Cloud TPU VM or TPU pod (TPU chips on
    the PCI bus, `TPU_WORKER_HOSTNAMES` / `TPU_PROCESS_ADDRESSES` with several workers, or
    `MEGASCALE_COORDINATOR_ADDRESS` for multi-slice), or when `JAXRL_REASON_MULTIHOST=1`
    (the CLI's `--multihost`). Anything else (a laptop, one GPU machine, CI) runs as a
    single process without a coordinator.
  true: always. Unset fields come from the environment, then from JAX's own detection
    (Cloud TPU metadata, Slurm, Open MPI), so `srun jaxrl-reason train ... 
    --config.distributed.enabled=true` needs nothing else.
  false: never.

How host data meets global arrays (the rule every caller follows):
  * every process holds the SAME host copy of each batch (prompts are drawn from the same
    seeded iterator on every process; `check_same` verifies it), so uploads build global
    arrays from that copy (`sharding.put_batch` / `put_replicated`: each process fills the
    shards of its own devices);
  * device results are read back with `to_host`, which all-gathers a sharded array to every
    process (a collective: call it on every process, in the same order);
  * host-side decisions that may differ between processes (verifier timeouts) are made once,
    by process 0, and sent to all (`broadcast_from_primary`), so every process takes the
    same branches and compiles the same shapes.

With one process every helper is the single-host operation (`jax.device_get`, identity), so
single-host runs are unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
from typing import Any, Callable, Mapping

import jax
import numpy as np

_log = logging.getLogger(__name__)

ENABLED_VALUES = ("auto", "true", "false")
MULTIHOST_ENV = "JAXRL_REASON_MULTIHOST"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


# ---------------------------------------------------------------------- initialization


@dataclasses.dataclass(frozen=True)
class Settings:
    """Resolved `jax.distributed.initialize` arguments (None = let JAX detect it)."""
    enabled: str = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    initialization_timeout: int = 300

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `jax.distributed.initialize` (unset ones omitted)."""
        out: dict[str, Any] = {"initialization_timeout": self.initialization_timeout}
        for name in ("coordinator_address", "num_processes", "process_id", "local_device_ids"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "local_device_ids" else value
        return out


def _enabled(value: Any) -> str:
    """"auto" | "true" | "false" from a bool or a string (any case); ValueError otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text in _TRUE:
        return "true"
    if text in _FALSE:
        return "false"
    raise ValueError(f"distributed.enabled must be 'auto', true or false, got {value!r}")


def _int_or_none(value: Any, unset: int, name: str) -> int | None:
    if value is None or value == "" or value == unset:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _device_ids(value: Any) -> tuple[int, ...] | None:
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, int):
        value = [value]
    return tuple(int(v) for v in value)


def settings(block: Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None) -> Settings:
    """The initialization settings of a config's `distributed` block (may be None) and the
    environment. A config field that is set wins over the environment variable
    (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`,
    `JAX_LOCAL_DEVICE_IDS`); `JAXRL_REASON_MULTIHOST` in {1, true} turns "auto" into true.
    Raises ValueError for malformed values."""
    env = os.environ if env is None else env
    block = dict(block or {})
    enabled = _enabled(block.get("enabled", "auto"))
    if enabled == "auto" and env.get(MULTIHOST_ENV, "").strip().lower() in _TRUE:
        enabled = "true"
    address = block.get("coordinator_address") or env.get("JAX_COORDINATOR_ADDRESS") or None
    num = _int_or_none(block.get("num_processes"), 0, "distributed.num_processes")
    if num is None:
        num = _int_or_none(env.get("JAX_NUM_PROCESSES"), 0, "JAX_NUM_PROCESSES")
    pid = _int_or_none(block.get("process_id"), -1, "distributed.process_id")
    if pid is None:
        pid = _int_or_none(env.get("JAX_PROCESS_ID"), -1, "JAX_PROCESS_ID")
    ids = _device_ids(block.get("local_device_ids")) or _device_ids(env.get("JAX_LOCAL_DEVICE_IDS"))
    timeout = int(block.get("initialization_timeout", 300) or 300)
    if num is not None and num < 1:
        raise ValueError(f"distributed.num_processes must be >= 1, got {num}")
    if pid is not None and num is not None and not 0 <= pid < num:
        raise ValueError(f"distributed.process_id={pid} is not in [0, {num})")
    return Settings(enabled=enabled, coordinator_address=address, num_processes=num,
                    process_id=pid, local_device_ids=ids, initialization_timeout=timeout)


def _count(hosts: str | None) -> int:
    return len([h for h in (hosts or "").split(",") if h.strip()])


def _cloud_tpu_vm() -> bool:
    """Whether TPU chips are on this machine's PCI bus (JAX's own check; no network, no
    backend initialization). False when it cannot tell."""
    try:
        from jax._src import hardware_utils
        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # noqa: BLE001 (a private helper: treat any change as "no TPU")
        return False


def decide(s: Settings, env: Mapping[str, str] | None = None,
           on_tpu_vm: Callable[[], bool] | None = None) -> tuple[bool, str]:
    """(initialize?, why) for settings `s` in environment `env` (see the module docstring);
    `on_tpu_vm` (default: TPU chips on the PCI bus) is asked last."""
    env = os.environ if env is None else env
    on_tpu_vm = on_tpu_vm or _cloud_tpu_vm
    if s.enabled == "false":
        return False, "distributed.enabled=false"
    if s.enabled == "true":
        return True, "distributed.enabled=true"
    if s.num_processes == 1:
        return False, "one process (distributed.num_processes=1)"
    if s.coordinator_address:
        return True, f"coordinator address {s.coordinator_address}"
    if s.num_processes is not None:
        return True, f"{s.num_processes} processes"
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return True, "multi-slice TPU (MEGASCALE_COORDINATOR_ADDRESS)"
    for name in ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES"):
        if _count(env.get(name)) > 1:
            return True, f"TPU pod ({name} lists {_count(env.get(name))} workers)"
    if env.get("TPU_SKIP_MDS_QUERY") is None and on_tpu_vm():
        return True, "Cloud TPU VM (JAX reads the slice's workers from its metadata)"
    return False, "single machine (no coordinator, process count or TPU pod detected)"


def initialize(block: Mapping[str, Any] | None = None, *,
               env: Mapping[str, str] | None = None,
               initialize_fn: Callable[..., None] | None = None,
               on_tpu_vm: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """Calls `jax.distributed.initialize` when `decide` says so; call it before any other JAX
    call. Returns the keyword arguments it was called with, or None when it was not.

    Args:
      block: the config's `distributed` block (None: defaults, i.e. "auto").
      env: environment (default os.environ); initialize_fn: default
        `jax.distributed.initialize` (tests pass a recorder); on_tpu_vm: see `decide`.
    Raises ValueError for bad settings; RuntimeError when JAX was already used.
    """
    s = settings(block, env)
    go, why = decide(s, env, on_tpu_vm)
    if not go:
        _log.debug("jax.distributed not initialized: %s", why)
        return None
    fn = initialize_fn or jax.distributed.initialize
    if initialize_fn is None and jax.distributed.is_initialized():
        return None  # e.g. a notebook or test that initialized it already
    kwargs = s.kwargs()
    _log.info("jax.distributed.initialize(%s): %s", kwargs, why)
    fn(**kwargs)
    return kwargs


# ---------------------------------------------------------------------- processes


def process_count() -> int:
    return jax.process_count()


def is_primary() -> bool:
    """Whether this is process 0, the one that logs and writes run files."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """A barrier of all processes (no-op with one); every process must use the same name."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------- host <-> mesh


def _leaf_to_host(x: Any) -> Any:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)


def to_host(tree: Any) -> Any:
    """numpy copies of the (possibly multi-host) arrays of `tree`, complete on every process.

    One process: `jax.device_get(tree)`. Several: a sharded array is all-gathered (a
    collective: every process must call this for the same arrays in the same order); a
    replicated one is read from a local shard.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return jax.tree.map(_leaf_to_host, tree)


def broadcast_from_primary(obj: Any) -> Any:
    """Process 0's `obj` (any picklable value) on every process; `obj` itself with one
    process. A collective: every process calls it, the others may pass anything (None)."""
    if jax.process_count() == 1:
        return obj
    from jax.experimental import multihost_utils
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if is_primary() else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
    buf = data if is_primary() else np.zeros(size, np.uint8)
    out = multihost_utils.broadcast_one_to_all(buf)
    return obj if is_primary() else pickle.loads(np.asarray(out, np.uint8).tobytes())


def digest(*arrays: Any) -> str:
    """SHA-256 of arrays' shapes, dtypes and bytes (or of str/bytes values)."""
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, str):
            a = a.encode("utf-8")
        if isinstance(a, bytes):
            h.update(b"b%d:" % len(a) + a)
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.shape}{a.dtype}:".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def check_same(what: str, *arrays: Any) -> None:
    """Raises RuntimeError unless every process holds the same `arrays` (no-op with one).

    Multi-host correctness rests on identical host copies (uploads take each process's own
    copy of its shards); a process whose data or tokenizer differs would silently train on
    a mixed batch. A collective of 32 bytes per process.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils
    mine = np.frombuffer(bytes.fromhex(digest(*arrays)), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise RuntimeError(
            f"multi-host: {what} differ between processes (processes {differ} disagree with "
            f"process 0); every process must load the same data, tokenizer and config")


__all__ = ["ENABLED_VALUES", "MULTIHOST_ENV", "Settings", "broadcast_from_primary",
           "check_same", "decide", "digest", "initialize", "is_primary",
           "process_count", "settings", "sync", "to_host"]
