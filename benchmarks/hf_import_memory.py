r"""Host memory of `load_hf_checkpoint` on a synthetic few-hundred-MB Llama checkpoint.

    python benchmarks/hf_import_memory.py                  # ~400 MB float32, ~1 min on 2 cores
    python benchmarks/hf_import_memory.py --quick --json out.json      # a few MB, for tests
    python benchmarks/hf_import_memory.py --mesh data=-1   # every param replicated 8 times

The checkpoint (config.json, model-0000i-of-0000n.safetensors of at most --max-shard-mb each,
model.safetensors.index.json) is written straight from numpy, one chunk of random values at a
time, under the tensor names of `jaxrl_reason.models.hf.tensor_map`, so the writer never
holds the model. Each import then runs in a fresh subprocess on the fake 8-device CPU mesh
(JAX_PLATFORMS=cpu, --xla_force_host_platform_device_count=8): jax is initialised, the mesh
built and a tiny sharded jit run, the peak-RSS counter is reset (`echo 5 >
/proc/self/clear_refs`), and the RSS before the call is the baseline. After the call:

  rss_growth       peak RSS (VmHWM) minus the baseline: everything the import touched.
  params_bytes     bytes of the loaded params on the devices (sum over every device's
                   shard). A CPU "device" lives in host memory, so these count in the RSS.
  overhead         rss_growth - params_bytes: the import's transient host memory.
  overhead / largest tensor: ~1-2 for a streaming import; a naive one that reads the whole
                   checkpoint before placing it is ~ total / largest.

A sampling thread also records the peak anonymous and file-backed RSS (safetensors maps the
shard files; pages of a mapped file count in the RSS while it is open), and after the call
one small tensor is compared with the values the writer generated, the bytes of all live
jax arrays are summed, and the RSS is read again after glibc's malloc_trim(0) (freed heap
memory that glibc kept counts in the RSS; --mmap-threshold sets MALLOC_MMAP_THRESHOLD_ so
that large buffers are returned to the OS when freed). scan_layers=True (the layers stacked
per leaf on the devices after placing) is measured in its own subprocess.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 2**20
_CHUNK = 1 << 22  # random values generated and written per step (16 MiB of float32)
_INIT_STD = 0.02
# ~400 MB: embedding 32768 x 1024 (128 MiB, tied) + 6 layers of 44.6 MB (largest 11.5 MB).
FULL = dict(vocab_size=32768, d_model=1024, n_layers=6, n_heads=16, n_kv_heads=4,
            head_dim=64, mlp_hidden=2816, tie_embeddings=True)
# ~4.4 MB: embedding 4096 x 128 (2 MiB) + 2 layers.
QUICK = dict(vocab_size=4096, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
             mlp_hidden=512, tie_embeddings=True)


# ----------------------------------------------------------------------------- writing


def synthetic_config(quick: bool):
    from jaxrl_reason.models import get_preset
    return get_preset("llama3.2-1b", **(QUICK if quick else FULL))


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def tensor_chunks(seed: int, index: int, name: str, count: int):
    """The values of tensor `index` as float32 chunks of at most _CHUNK (deterministic)."""
    import numpy as np
    rng = np.random.default_rng([seed, index])
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        if _is_norm(name):
            yield np.ones(n, np.float32)
        else:
            chunk = rng.standard_normal(n, dtype=np.float32)
            chunk *= _INIT_STD
            yield chunk


def tensor_value(seed: int, index: int, name: str, shape):
    import numpy as np
    count = math.prod(shape)
    return np.concatenate(list(tensor_chunks(seed, index, name, count))).reshape(shape)


def checkpoint_tensors(cfg):
    """[(index, HF name, HF shape)] in checkpoint order."""
    from jaxrl_reason.models.hf import _flat, tensor_map
    from jaxrl_reason.models.params import abstract_params
    shapes = {k: tuple(v.shape) for k, v in _flat(abstract_params(cfg)).items()}
    return [(i, e.name, tuple(e.hf_shape(shapes[e.path])))
            for i, e in enumerate(tensor_map(cfg))]


def _write_safetensors(path: str, tensors, seed: int) -> None:
    """One safetensors file (float32), written chunk by chunk."""
    header, offset = {}, 0
    for _, name, shape in tensors:
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset,
                                                                             offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for index, name, shape in tensors:
            for chunk in tensor_chunks(seed, index, name, math.prod(shape)):
                f.write(chunk.tobytes())


def write_checkpoint(cfg, out_dir: str, max_shard_bytes: int, seed: int = 0) -> dict:
    """config.json + sharded safetensors + index of `cfg` with random values; figures."""
    from jaxrl_reason.models.hf import hf_config
    tensors = checkpoint_tensors(cfg)
    shards, used = [[]], 0
    for t in tensors:
        size = 4 * math.prod(t[2])
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(t)
        used += size
    os.makedirs(out_dir, exist_ok=True)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(os.path.join(out_dir, file), shard, seed)
        for _, name, shape in shard:
            weight_map[name] = file
            total += 4 * math.prod(shape)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg, dtype="float32"), f, indent=1)
    largest = max(tensors, key=lambda t: math.prod(t[2]))
    return {"checkpoint_bytes": total, "largest_tensor_bytes": 4 * math.prod(largest[2]),
            "largest_tensor": largest[1], "n_tensors": len(tensors), "n_files": len(shards),
            "max_shard_bytes": max_shard_bytes,
            "file_bytes": sum(os.path.getsize(os.path.join(out_dir, f))
                              for f in os.listdir(out_dir))}


# ----------------------------------------------------------------------------- measuring


def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


class _Sampler(threading.Thread):
    """Peak RssAnon / RssFile seen every `interval` s (a lower bound: samples can miss)."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        self.interval, self.stop = interval, threading.Event()
        self.peak = {"RssAnon": 0, "RssFile": 0, "RssShmem": 0}

    def run(self):
        while not self.stop.is_set():
            s = _status()
            for k in self.peak:
                self.peak[k] = max(self.peak[k], s.get(k, 0))
            time.sleep(self.interval)


def _parse_mesh(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def child(args) -> int:
    """Imports args.child once and prints CHILD_JSON with the memory figures."""
    import resource

    start = _status()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxrl_reason.runtime import sharding as shd
    from jaxrl_reason.models import get_preset
    from jaxrl_reason.models.hf import load_hf_checkpoint, tensor_map
    from jaxrl_reason.models.params import param_shardings

    mesh = shd.make_mesh(_parse_mesh(args.mesh))
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P()))
    jax.jit(lambda v: v * 2.0)(x).block_until_ready()
    param_shardings(get_preset("test"), mesh, shd.DEFAULT_RULES)  # flax tracing machinery
    del x
    gc.collect()

    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        reset = False
    base = _status()
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    cfg, params = load_hf_checkpoint(args.child, mesh, shd.DEFAULT_RULES,
                                     scan_layers=args.scan_layers)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    end = _status()
    ru_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = end["VmHWM"] if reset else ru_peak
    gc.collect()
    settled = _status()

    leaves = jax.tree.leaves(params)
    device_bytes = sum(s.data.nbytes for leaf in leaves for s in leaf.addressable_shards)
    logical_bytes = sum(leaf.nbytes for leaf in leaves)
    live = {}  # per-device buffers of every live array (its shards are live arrays too)
    for leaf in jax.live_arrays():
        for s in leaf.addressable_shards:
            live[(s.device.id, s.data.unsafe_buffer_pointer())] = s.data.nbytes
    live_bytes = sum(live.values())
    trimmed = None
    try:  # glibc keeps freed heap memory; what is left after returning it to the OS
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = _status()["VmRSS"] - base["VmRSS"]
    except (OSError, AttributeError):
        pass

    # One small tensor (layer 1's k_proj, unstacked) against the values the writer generated.
    flat_cfg = cfg.replace(scan_layers=False)
    entries = tensor_map(flat_cfg)
    index = next(i for i, e in enumerate(entries) if e.path == ("layer_1", "attn", "k_proj",
                                                                   "kernel"))
    entry = entries[index]
    got = np.asarray(params["layers"]["attn"]["k_proj"]["kernel"][1] if args.scan_layers
                     else params["layer_1"]["attn"]["k_proj"]["kernel"])
    want = entry.to_ours(tensor_value(args.seed, index, entry.name,
                                      entry.hf_shape(got.shape)), got.shape)
    values_match = bool(np.array_equal(got, want))

    result = {
        "scan_layers": args.scan_layers, "mesh": dict(mesh.shape), "import_s": seconds,
        "params_count": sum(leaf.size for leaf in leaves), "values_match": values_match,
        "rss_start_bytes": start["VmRSS"], "rss_before_bytes": base["VmRSS"],
        "rss_peak_bytes": peak, "rss_after_bytes": settled["VmRSS"],
        "rss_growth_bytes": peak - base["VmRSS"],
        "retained_bytes": settled["VmRSS"] - base["VmRSS"],
        "retained_after_malloc_trim_bytes": trimmed, "live_array_bytes": live_bytes,
        "params_device_bytes": device_bytes, "params_logical_bytes": logical_bytes,
        "overhead_bytes": peak - base["VmRSS"] - device_bytes,
        "sampled_peak_anon_growth_bytes": sampler.peak["RssAnon"] - base["RssAnon"],
        "sampled_peak_file_growth_bytes": sampler.peak["RssFile"] - base["RssFile"],
        "peak_source": "VmHWM after clear_refs" if reset else "ru_maxrss",
    }
    print("CHILD_JSON " + json.dumps(result), flush=True)
    return 0


def run_child(ckpt: str, scan_layers: bool, mesh: str, seed: int,
              mmap_threshold: int | None = None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", ckpt, "--mesh", mesh,
           "--seed", str(seed)] + (["--scan-layers"] if scan_layers else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("CHILD_JSON ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"import subprocess failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("CHILD_JSON "):])


def _mb(n: float) -> str:
    return f"{n / MIB:.1f}"


def table(ckpt: dict, runs: dict) -> str:
    rows = ["| import | checkpoint MiB | largest tensor MiB | RSS growth MiB | params on "
            "devices MiB | overhead MiB | overhead / largest | import s |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        rows.append(f"| {name} | {_mb(ckpt['checkpoint_bytes'])} | "
                    f"{_mb(ckpt['largest_tensor_bytes'])} | {_mb(r['rss_growth_bytes'])} | "
                    f"{_mb(r['params_device_bytes'])} | {_mb(r['overhead_bytes'])} | "
                    f"{r['overhead_over_largest']:.2f} | {r['import_s']:.1f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a ~4 MB checkpoint (for tests)")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--mesh", default="fsdp=-1",
                    help="mesh axes of the 8 CPU devices (default fsdp=-1: params sharded "
                         "8 ways; data=-1 replicates every param on every device)")
    ap.add_argument("--max-shard-mb", type=float, default=None,
                    help="safetensors file size limit (default 100, 1 with --quick)")
    ap.add_argument("--dir", help="write the checkpoint here and keep it (default: a "
                                  "temporary directory, removed at the end)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mmap-threshold", type=int, default=None,
                    help="MALLOC_MMAP_THRESHOLD_ for the import subprocesses (e.g. 1048576: "
                         "glibc then returns freed large buffers to the OS at once)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--scan-layers", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    cfg = synthetic_config(args.quick)
    shard_mb = args.max_shard_mb or (1.0 if args.quick else 100.0)
    with tempfile.TemporaryDirectory(prefix="hf_import_memory_") as tmp:
        ckpt_dir = args.dir or os.path.join(tmp, "ckpt")
        t0 = time.perf_counter()
        ckpt = write_checkpoint(cfg, ckpt_dir, int(shard_mb * 1e6), args.seed)
        ckpt["write_s"] = time.perf_counter() - t0
        print(f"checkpoint: {_mb(ckpt['checkpoint_bytes'])} MiB in {ckpt['n_files']} files, "
              f"{ckpt['n_tensors']} tensors, largest {ckpt['largest_tensor']} "
              f"{_mb(ckpt['largest_tensor_bytes'])} MiB (written in {ckpt['write_s']:.1f} s)",
              flush=True)
        runs = {}
        for scan in (False, True):
            name = f"scan_layers={scan}"
            r = run_child(ckpt_dir, scan, args.mesh, args.seed, args.mmap_threshold)
            r["overhead_over_largest"] = r["overhead_bytes"] / ckpt["largest_tensor_bytes"]
            runs[name] = r
            trimmed = r["retained_after_malloc_trim_bytes"]
            print(f"{name}: RSS growth {_mb(r['rss_growth_bytes'])} MiB, params on devices "
                  f"{_mb(r['params_device_bytes'])} MiB, overhead {_mb(r['overhead_bytes'])} "
                  f"MiB = {r['overhead_over_largest']:.2f} x largest tensor; sampled peak "
                  f"anon +{_mb(r['sampled_peak_anon_growth_bytes'])} / file "
                  f"+{_mb(r['sampled_peak_file_growth_bytes'])} MiB; retained "
                  f"{_mb(r['retained_bytes'])} MiB "
                  f"({'?' if trimmed is None else _mb(trimmed)} after malloc_trim; live "
                  f"arrays {_mb(r['live_array_bytes'])}); values match: {r['values_match']}; "
                  f"{r['import_s']:.1f} s", flush=True)
    result = {"quick": args.quick, "mesh": args.mesh, "mmap_threshold": args.mmap_threshold,
              "config": dict(QUICK if args.quick else FULL),
              "checkpoint": ckpt, "runs": runs, "loadavg": list(os.getloadavg())}
    print()
    print(table(ckpt, runs))
    print()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    worst = max(r["overhead_over_largest"] for r in runs.values())
    print(f"summary: import of {_mb(ckpt['checkpoint_bytes'])} MiB (largest tensor "
          f"{_mb(ckpt['largest_tensor_bytes'])} MiB): overhead "
          + ", ".join(f"{n} {_mb(r['overhead_bytes'])} MiB "
                      f"({r['overhead_over_largest']:.2f}x)" for n, r in runs.items())
          + f"; worst {worst:.2f}x largest tensor", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
