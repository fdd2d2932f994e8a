"""Checkpoints of the training state: params, optimizer state, step, RNG, data-iterator state.

Built on `orbax.checkpoint.CheckpointManager`. One step directory holds two orbax items:

- ``state``: a pytree of arrays saved with `args.StandardSave`. Sharded `jax.Array`s are
    written by every process for its own shards (multi-host safe), and restored straight into
    the shardings of the abstract tree given to `Checkpointer.restore` (which may differ from
    the shardings at save time).
- ``metadata``: a JSON dict saved with `args.JsonSave` (config, data-iterator state, phase
    name, wall time, ...). `bytes` values are stored base64-encoded and come back as `bytes`;
    tuples come back as lists and dict keys as strings, as JSON does.

After orbax has finalized a step (its directory renamed into place / committed), the
primary process writes our own manifest ``<directory>/<step>/jaxrl_manifest.json`` with
the step, every array's path, shape and dtype, and a SHA-256 of the metadata. A step
without a valid manifest (a save killed before it finished) is invisible to
`latest_step`, `all_steps` and `restore`. With ``async_save=True`` the manifest of a step is
written at the next `save`, `wait_until_finished` or `close`, so a process killed before
then resumes from the step before (never from a half-written one).

RNG keys: typed key arrays are not saved directly. Pass ``jax.random.key_data(key)`` (a
uint32 array, e.g. shape [2] for threefry) in the state and rebuild the key after restore
with ``jax.random.wrap_key_data(restored["rng"])``.
"""
from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

PyTree = Any

MANIFEST_NAME = "jaxrl_manifest.json"
MANIFEST_FORMAT = 1
_STATE_ITEM = "state"
_METADATA_ITEM = "metadata"
_BYTES_TAG = "__bytes_base64__"
_PRIMARY_HOST = 0


# ---------------------------------------------------------------- pytrees and metadata


def abstract_like(tree: PyTree) -> PyTree:
    """The abstract restore target of a state tree.

    Args:
        tree: pytree whose leaves are `jax.Array`s (any shape/dtype, possibly sharded),
            numpy arrays or scalars, or `jax.ShapeDtypeStruct`s (kept as they are).

    Returns:
        The same structure with `jax.ShapeDtypeStruct(shape, dtype, sharding=x.sharding)` for
        each `jax.Array` (restored as a jax.Array with that sharding) and
        `jax.ShapeDtypeStruct(shape, dtype)` without sharding for numpy leaves (restored as
        numpy arrays).

    Raises:
        TypeError: a leaf is a typed PRNG key array or not an array.
    """
    def one(path, x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        _check_leaf(path, x)
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        arr = np.asarray(x)
        return jax.ShapeDtypeStruct(arr.shape, arr.dtype)

    return jax.tree_util.tree_map_with_path(one, tree)


def _check_leaf(path, x) -> None:
    """Raises TypeError unless `x` is an array leaf that orbax can save."""
    where = jax.tree_util.keystr(path) or "<root>"
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(
                f"state leaf {where} is a typed PRNG key array ({x.dtype}); save "
                "jax.random.key_data(key) instead and rebuild it with jax.random.wrap_key_data")
        return
    if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
        if np.asarray(x).dtype == object:
            raise TypeError(f"state leaf {where} is a numpy array of dtype object")
        return
    raise TypeError(
        f"state leaf {where} has type {type(x).__name__}; expected a jax.Array, numpy array "
        "or scalar (put strings and other non-array values in `metadata`)")


def _array_entries(tree: PyTree) -> list[dict]:
    """[{"path", "shape", "dtype"}] for every leaf of an array or ShapeDtypeStruct tree."""
    entries = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = x.shape if hasattr(x, "shape") else np.shape(x)
        dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        entries.append({"path": jax.tree_util.keystr(path), "shape": [int(d) for d in shape],
                        "dtype": str(np.dtype(dtype))})
    return entries


def encode_metadata(metadata: dict) -> dict:
    """Makes `metadata` JSON-safe: `bytes` become {"__bytes_base64__": str}.

    Args:
        metadata: dict of JSON values (str/int/float/bool/None, lists, tuples, dicts with str
            keys) and `bytes`, nested to any depth.

    Returns:
        A new dict with only JSON values; `decode_metadata` inverts it.

    Raises:
        TypeError: `metadata` is not a dict, or holds a value JSON cannot store; the message
            names the key path.
    """
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    return _encode(metadata, "metadata")


def _encode(x, where: str):
    if isinstance(x, (bytes, bytearray)):
        return {_BYTES_TAG: base64.b64encode(bytes(x)).decode("ascii")}
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-str key {k!r}; JSON keys must be str")
            if k == _BYTES_TAG:
                raise TypeError(f"{where} uses the reserved key {_BYTES_TAG!r}")
            out[k] = _encode(v, f"{where}[{k!r}]")
        return out
    if isinstance(x, (list, tuple)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    raise TypeError(f"{where} has type {type(x).__name__}, which JSON cannot store "
                    "(use str, int, float, bool, None, list, dict or bytes)")


def decode_metadata(encoded: dict) -> dict:
    """Inverse of `encode_metadata`: {"__bytes_base64__": str} back to `bytes`."""
    if isinstance(encoded, dict):
        if set(encoded) == {_BYTES_TAG}:
            return base64.b64decode(encoded[_BYTES_TAG])
        return {k: decode_metadata(v) for k, v in encoded.items()}
    if isinstance(encoded, list):
        return [decode_metadata(v) for v in encoded]
    return encoded


def metadata_checksum(encoded: dict) -> str:
    """SHA-256 hex digest of the canonical JSON form (sorted keys) of encoded metadata."""
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- manifest files


def _read_manifest(step_dir: epath.Path, step: int) -> dict | None:
    """The manifest of a step directory, or None when missing or invalid."""
    path = step_dir / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("step") != step:
        return None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("arrays"), list):
        return None
    if not isinstance(manifest.get("metadata_sha256"), str):
        return None
    return manifest


def _write_manifest(step_dir: epath.Path, manifest: dict) -> None:
    """Writes the manifest to a temporary name, then renames it into place."""
    tmp = step_dir / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.rename(step_dir / MANIFEST_NAME)


def _compare_to_manifest(manifest: dict, abstract: PyTree, where: str,
                         partial: bool = False) -> None:
    """Raises ValueError when the abstract tree's paths or shapes differ from the manifest.

    With `partial`, the abstract tree may hold a subset of the saved paths.
    """
    saved = {e["path"]: e["shape"] for e in manifest["arrays"]}
    wanted = {e["path"]: e["shape"] for e in _array_entries(abstract)}
    problems = [] if partial else [
        f"missing from abstract_state: {p}" for p in saved if p not in wanted]
    problems += [f"not in the checkpoint: {p}" for p in wanted if p not in saved]
    problems += [f"shape of {p}: saved {saved[p]}, requested {wanted[p]}"
                 for p in wanted if p in saved and saved[p] != wanted[p]]
    if problems:
        shown = "; ".join(problems[:8]) + ("; ..." if len(problems) > 8 else "")
        raise ValueError(f"abstract_state does not match the checkpoint {where}: {shown}")


# ---------------------------------------------------------------- the checkpointer


class Checkpointer:
    """Saves and restores (state pytree, JSON metadata) pairs by integer step.

    Call it on every process of a multi-host job (like `orbax.checkpoint.CheckpointManager`):
    array shards are written by the processes that hold them, JSON files by the primary.
    Not thread-safe. Use as a context manager or call `close()`.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 3, save_interval_steps: int = 1,
                 async_save: bool = False):
        """Opens (lazily creates) a checkpoint directory.

        Args:
            directory: root directory (local path or gs://...); created on the first save.
            max_to_keep: keep the newest this many steps, delete older ones (>= 1).
            save_interval_steps: `save` writes when step % this == 0, when the directory has
                no step yet, at a JAX preemption sync point, or with `force`.
            async_save: write arrays in a background thread; `save` returns after the device
                arrays were copied to host.
        """
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep must be an int >= 1, got {max_to_keep!r}")
        if not isinstance(save_interval_steps, int) or save_interval_steps < 1:
            raise ValueError(
                f"save_interval_steps must be an int >= 1, got {save_interval_steps!r}")
        self._directory = epath.Path(directory)
        self._options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_interval_steps,
            preservation_policy=ocp.checkpoint_managers.LatestN(n=max_to_keep),
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._async = async_save
        self._mngr: ocp.CheckpointManager | None = None
        self._pending: dict[int, dict] = {}  # step -> manifest not yet written
        self._barrier_count = 0
        # Steps left without a manifest by an earlier run (killed mid-save). Computed once, so
        # every process agrees on it; `save` moves those in its way aside.
        self._stale_steps: set[int] = set()
        if self._directory.exists():
            mngr = self._manager()
            self._stale_steps = {s for s in mngr.all_steps() if self._manifest(s) is None}

    @property
    def directory(self) -> epath.Path:
        """The root directory of the checkpoints."""
        return self._directory

    # ---------------------------------------------------------------- queries

    def all_steps(self) -> list[int]:
        """Ascending steps that orbax finalized AND that have a valid manifest."""
        mngr = self._manager(create=False)
        if mngr is None:
            return []
        self._flush_manifests(block=False)
        return sorted(s for s in mngr.all_steps() if self._manifest(s) is not None)

    def latest_step(self) -> int | None:
        """The newest complete step (see `all_steps`), or None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # ---------------------------------------------------------------- save

    def save(self, step: int, state: PyTree, metadata: dict, *, force: bool = False) -> bool:
        """Saves `state` and `metadata` as `step`.

        Args:
            step: int >= 0, greater than every step already in the directory.
            state: pytree of jax.Arrays (possibly sharded over a Mesh), numpy arrays and scalars,
                e.g. {"params", "opt_state", "rng": key_data uint32 array, "step": int32 []}.
            metadata: JSON-like dict (see `encode_metadata`; bytes are allowed).
            force: save even when `save_interval_steps` would skip this step.

        Returns:
            True when a checkpoint was started (finished, unless async_save), False when the
            save interval skipped this step or `step` is the latest saved step already.

        Raises:
            TypeError: a state leaf or a metadata value cannot be saved.
            ValueError: `step` is negative, before the latest step in the directory, or equal
                to it with `force`.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        step = int(step)
        jax.tree_util.tree_map_with_path(_check_leaf, state)
        encoded = encode_metadata(metadata)
        manifest = {"format": MANIFEST_FORMAT, "step": step, "arrays": _array_entries(state),
                    "metadata_sha256": metadata_checksum(encoded),
                    "orbax_version": ocp.__version__, "saved_at_unix": time.time()}

        mngr = self._manager()
        self._flush_manifests(block=False)
        self._move_stale_steps(at_or_after=step)
        latest = max(mngr.all_steps(), default=None)
        if latest is not None and (step < latest or (step == latest and force)):
            raise ValueError(
                f"cannot save step {step} in {self._directory}: it is not after the latest "
                f"saved step {latest} (steps present: {sorted(mngr.all_steps())})")
        if step == latest:
            return False  # already saved, e.g. the step a resumed run restored
        items = {_STATE_ITEM: ocp.args.StandardSave(state),
                 _METADATA_ITEM: ocp.args.JsonSave(encoded)}
        saved = mngr.save(step, args=ocp.args.Composite(**items), force=force)
        if saved:
            # orbax.save waited for every earlier save before starting this one.
            self._write_pending(s for s in list(self._pending) if s < step)
            self._pending[step] = manifest
            if not self._async:
                self._write_pending([step])
                self._barrier(f"saved_{step}")
        return saved

    def _move_stale_steps(self, at_or_after: int) -> None:
        """Renames stale manifest-less steps >= `at_or_after` to '<step>.incomplete[-n]'."""
        stale = sorted(s for s in self._stale_steps if s >= at_or_after)
        if not stale:
            return
        if ocp.multihost.is_primary_host(_PRIMARY_HOST):
            for s in stale:
                src = self._step_dir(s)
                if src.exists():
                    dst = self._directory / f"{s}.incomplete"
                    n = 1
                    while dst.exists():
                        dst, n = self._directory / f"{s}.incomplete-{n}", n + 1
                    src.rename(dst)
        self._stale_steps -= set(stale)
        self._barrier("moved_stale")
        self._manager().reload()

    # ---------------------------------------------------------------- restore

    def restore(self, step: int | None = None, *, abstract_state: PyTree,
                partial: bool = False) -> tuple[PyTree, dict]:
        """Restores a step: arrays go straight into the shardings of `abstract_state`.

        Args:
            step: the step to restore; None = `latest_step()`.
            abstract_state: the target tree, e.g. `abstract_like(live_state)`: leaves are
                `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(...))` (restored as
                jax.Arrays with that sharding, which need not be the one used at save time) or
                without sharding (restored as numpy arrays); live arrays are also accepted. Same
                paths and shapes as the saved state; a different dtype casts on restore.
            partial: `abstract_state` names a subset of the saved tree (e.g. only the params
                of a training state); only that subset is read.

        Returns:
            (state, metadata): state with the structure of `abstract_state` (namedtuples of
            optax states included); metadata as given to `save` (bytes restored).

        Raises:
            FileNotFoundError: the directory does not exist, holds no complete step, or `step`
                is not one of its complete steps (the message lists the available steps).
            ValueError: `abstract_state` does not match the saved arrays, or the metadata does
                not match its checksum. Nothing is ever deleted or written by a failed restore.
        """
        if not self._directory.exists():
            raise FileNotFoundError(f"checkpoint directory {self._directory} does not exist")
        available = self.all_steps()
        if step is None:
            if not available:
                raise FileNotFoundError(
                    f"no complete checkpoint in {self._directory} (steps without a valid "
                    f"{MANIFEST_NAME}: {self._incomplete_steps()})")
            step = available[-1]
        if step not in available:
            why = ("it has no valid " + MANIFEST_NAME + " (the save did not finish)"
                   if self._step_dir(step).exists() else "it does not exist")
            raise FileNotFoundError(
                f"cannot restore step {step} from {self._directory}: {why}; "
                f"available steps: {available}")
        manifest = self._manifest(step)
        abstract = abstract_like(abstract_state)
        _compare_to_manifest(manifest, abstract, f"{self._step_dir(step)}", partial)
        state_args = (ocp.args.PyTreeRestore(
            abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
            partial_restore=True) if partial else ocp.args.StandardRestore(abstract))
        items = {_STATE_ITEM: state_args,
                 _METADATA_ITEM: ocp.args.JsonRestore()}
        restored = self._manager().restore(step, args=ocp.args.Composite(**items))
        encoded = restored[_METADATA_ITEM]
        if metadata_checksum(encoded) != manifest["metadata_sha256"]:
            raise ValueError(
                f"metadata of step {step} in {self._step_dir(step)} does not match the checksum "
                f"in its {MANIFEST_NAME}; the checkpoint is corrupted")
        return restored[_STATE_ITEM], decode_metadata(encoded)

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata of a complete step (None = latest), without reading arrays."""
        available = self.all_steps()
        step = available[-1] if step is None and available else step
        if step not in available:
            raise FileNotFoundError(
                f"no complete step {step} in {self._directory}; available steps: {available}")
        encoded = self._manager().restore(
            step, args=ocp.args.Composite(**{_METADATA_ITEM: ocp.args.JsonRestore()}))
        encoded = encoded[_METADATA_ITEM]
        if metadata_checksum(encoded) != self._manifest(step)["metadata_sha256"]:
            raise ValueError(f"metadata of step {step} in {self._step_dir(step)} does not match "
                             f"the checksum in its {MANIFEST_NAME}; the checkpoint is corrupted")
        return decode_metadata(encoded)

    # ---------------------------------------------------------------- lifecycle

    def wait_until_finished(self) -> None:
        """Blocks until async saves are finalized and their manifests are written."""
        if self._mngr is None:
            return
        self._flush_manifests(block=True)
        self._barrier("wait_until_finished")

    def close(self) -> None:
        """Waits for pending saves, then releases orbax's resources."""
        if self._mngr is None:
            return
        self.wait_until_finished()
        self._mngr.close()
        self._mngr = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _manager(self, create: bool = True) -> ocp.CheckpointManager | None:
        """The orbax manager, built on first use; None if the directory is absent and not
        `create`."""
        if self._mngr is None:
            if not create and not self._directory.exists():
                return None
            self._mngr = ocp.CheckpointManager(self._directory, options=self._options)
        return self._mngr

    def _step_dir(self, step: int) -> epath.Path:
        return self._directory / str(step)

    def _manifest(self, step: int) -> dict | None:
        return _read_manifest(self._step_dir(step), step)

    def _incomplete_steps(self) -> list[int]:
        mngr = self._manager(create=False)
        if mngr is None:
            return []
        return sorted(s for s in mngr.all_steps() if self._manifest(s) is None)

    def _flush_manifests(self, *, block: bool) -> None:
        """Writes manifests of pending steps whose orbax save has finished."""
        if not self._pending or (not block and self._mngr.is_saving_in_progress()):
            return
        try:
            # Returns at once when no save is running; re-raises the error of a failed async
            # save, whose step then never gets a manifest.
            self._mngr.wait_until_finished()
        except BaseException:
            self._pending.clear()
            raise
        self._write_pending(list(self._pending))

    def _write_pending(self, steps) -> None:
        """Writes (primary process only) the manifests of `steps`, all finalized by orbax."""
        finalized = set(self._mngr.all_steps())
        for s in steps:
            manifest = self._pending.pop(s)
            if (s in finalized and ocp.multihost.is_primary_host(_PRIMARY_HOST)
                    and self._step_dir(s).exists()):
                _write_manifest(self._step_dir(s), manifest)

    def _barrier(self, name: str) -> None:
        """Synchronizes all processes (no-op with one process); names are unique per call."""
        self._barrier_count += 1
        ocp.multihost.sync_global_processes(f"jaxrl_checkpointer_{name}_{self._barrier_count}")
