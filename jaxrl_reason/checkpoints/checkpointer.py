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
the step, every array's path, shape and dtype, a SHA-256 of the metadata and (format 2)
the relative path, size and SHA-256 of every file of the step directory but the manifest
itself. A step without a valid manifest (a save killed before it finished) is invisible to
`latest_step`, `all_steps` and `restore`. With ``async_save=True`` the manifest of a step is
written at the next `save`, `wait_until_finished` or `close`, so a process killed before
then resumes from the step before (never from a half-written one).

Damaged checkpoints. `verify(step)` re-hashes a step's files against its manifest (a
missing, truncated, tampered or unexpected file is a problem; unexpected files count only
inside the orbax item directories ``state/`` and ``metadata/``, where orbax could read
them, not next to them, e.g. a user's notes). `restore()` without a step tries the newest
step first; when its files, its metadata checksum or orbax's own restore fail, it logs a
warning naming the step directory and the problem and falls back to the next older step
(`last_restored_step` / `last_skipped` tell which). With an explicit step it raises
`CheckpointCorruptError` instead. A damaged step is never deleted or rewritten: a later
`save` at the same step renames it to ``<step>.corrupt`` (kept for inspection), a save at a
higher step leaves it in place, and orbax's max_to_keep retention treats it like any step.
Manifests of format 1 (no file list, written by older versions) are still read: those steps
are valid but their files unverified (orbax's restore and the metadata checksum still
apply). `latest_step`/`all_steps` only read manifests (no hashing).

Multi-host: the checkpoint directory must be storage every process sees (as orbax needs).
Every process calls `save`, `restore`, `metadata`, `wait_until_finished` and `close` at the
same points (they are collectives). Only the primary process writes the manifest and hashes
files (at save and at verify), then all processes meet at a barrier, so none reads a
manifest before it exists; the other processes follow the primary's verdict, and all
processes agree on the step a fallback restores. On storage that is not shared, the file
list would only cover what the primary can see. With `async_save`, a step's manifest
appears at a later `save` / `wait_until_finished`; query steps after those.

RNG keys: typed key arrays are not saved directly. Pass ``jax.random.key_data(key)`` (a
uint32 array, e.g. shape [2] for threefry) in the state and rebuild the key after restore
with ``jax.random.wrap_key_data(restored["rng"])``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jaxrl_reason.runtime import paths
from jaxrl_reason.checkpoints.manifest import (
    METADATA_ITEM, PRIMARY_HOST, STATE_ITEM, MANIFEST_FORMAT, MANIFEST_NAME,
    CheckpointCorruptError, array_entries, check_leaf, compare_to_manifest, Damaged,
    file_entries, read_manifest, short_error, verify_files, write_manifest, abstract_like,
    decode_metadata, encode_metadata, metadata_checksum)

PyTree = Any
_log = logging.getLogger(__name__)


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
        self._directory = epath.Path(paths.absolute(directory))  # orbax: absolute only
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
        # Steps this checkpointer found damaged (the same on every process); a `save` at or
        # before one of them moves it aside to '<step>.corrupt' (never deletes it).
        self._bad_steps: dict[int, list[str]] = {}
        self.last_restored_step: int | None = None
        """The step the last successful `restore`, `metadata` or `latest_good_step` read."""
        self.last_skipped: dict[int, list[str]] = {}
        """Damaged steps that call skipped (newest first): {step: [problem, ...]}."""
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
        """The newest complete step (see `all_steps`), or None when there is none.

        Cheap: reads manifests only. The step's files may still be damaged; `restore()`
        finds out and falls back, `latest_good_step()` checks them.
        """
        steps = self.all_steps()
        return steps[-1] if steps else None

    @property
    def bad_steps(self) -> dict[int, list[str]]:
        """Steps found damaged so far by this checkpointer: {step: [problem, ...]}."""
        return dict(self._bad_steps)

    def verify(self, step: int, *, items: Sequence[str] | None = None) -> list[str]:
        """Checks the files of a step directory against its manifest.

        Reads and hashes every file (about the cost of reading the checkpoint), on the
        calling process only (no cross-process synchronization).

        Args:
            step: the step to check.
            items: only check the files of these orbax items ("state", "metadata") and the
                files at the top of the step directory; None = all files.

        Returns:
            The problems, one string each naming the file relative to the step directory
            (missing, truncated/grown, content not matching its SHA-256, an unexpected file
            inside an item directory, unreadable), or naming a missing/invalid manifest;
            [] when the step is intact. Steps with a format-1 manifest (no file list) have
            nothing to check and give []. Nothing is ever written or deleted.
        """
        step_dir = self._step_dir(step)
        if not step_dir.exists():
            return [f"step directory {step_dir} does not exist"]
        manifest = self._manifest(step)
        if manifest is None:
            return [self._manifest_problem(step)]
        if manifest["format"] < 2:
            return []
        return verify_files(step_dir, manifest, items)

    def latest_good_step(self) -> int | None:
        """The newest complete step whose files and metadata verify, or None.

        Hashes the files of every step it tries; damaged newer steps are logged as warnings
        and listed in `last_skipped`. Call it on every process (it agrees across them).
        Arrays are not restored (a step with a format-1 manifest may still fail in
        `restore`, which then falls back on its own).
        """
        if not self.all_steps():
            return None
        try:
            return self._first_good(None, lambda s: self._check_step(s, None))[0]
        except CheckpointCorruptError:
            return None

    # ---------------------------------------------------------------- save

    def save(self, step: int, state: PyTree, metadata: dict, *, force: bool = False) -> bool:
        """Saves `state` and `metadata` as `step`.

        Args:
            step: int >= 0, greater than every step already in the directory. Steps at or
                after it that this checkpointer found damaged (in `restore`, `metadata`,
                `latest_good_step`) or without a manifest are first renamed aside to
                '<step>.corrupt' / '<step>.incomplete' (kept, never deleted).
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
        jax.tree_util.tree_map_with_path(check_leaf, state)
        encoded = encode_metadata(metadata)
        manifest = {"format": MANIFEST_FORMAT, "step": step, "arrays": array_entries(state),
                    "metadata_sha256": metadata_checksum(encoded),
                    "orbax_version": ocp.__version__, "saved_at_unix": time.time()}

        mngr = self._manager()
        self._flush_manifests(block=False)
        self._move_aside(at_or_after=step)
        latest = max(mngr.all_steps(), default=None)
        if latest is not None and (step < latest or (step == latest and force)):
            raise ValueError(
                f"cannot save step {step} in {self._directory}: it is not after the latest "
                f"saved step {latest} (steps present: {sorted(mngr.all_steps())})")
        if step == latest:
            return False  # already saved, e.g. the step a resumed run restored
        items = {STATE_ITEM: ocp.args.StandardSave(state),
                 METADATA_ITEM: ocp.args.JsonSave(encoded)}
        try:
            saved = mngr.save(step, args=ocp.args.Composite(**items), force=force)
        except OSError as e:  # read-only or full storage: say where, not only orbax's errno
            raise OSError(f"cannot save checkpoint step {step} in {self._directory}: {e} "
                          f"(is the directory writable? `reliability.check_workdir` checks "
                          f"this before a run starts)") from e
        if saved:
            # orbax.save waited for every earlier save before starting this one.
            self._write_pending(s for s in list(self._pending) if s < step)
            self._pending[step] = manifest
            if not self._async:
                self._write_pending([step])
            # No process may look for a manifest before the primary has written it.
            self._barrier(f"saved_{step}")
        return saved

    def _move_aside(self, at_or_after: int) -> None:
        """Renames steps >= `at_or_after` that are in the way of a save, keeping them: stale
        manifest-less steps to '<step>.incomplete[-n]', damaged ones to '<step>.corrupt[-n]'."""
        moves = sorted([(s, "incomplete") for s in self._stale_steps if s >= at_or_after]
                       + [(s, "corrupt") for s in self._bad_steps if s >= at_or_after])
        if not moves:
            return
        if ocp.multihost.is_primary_host(PRIMARY_HOST):
            for s, suffix in moves:
                src = self._step_dir(s)
                if src.exists():
                    dst = self._directory / f"{s}.{suffix}"
                    n = 1
                    while dst.exists():
                        dst, n = self._directory / f"{s}.{suffix}-{n}", n + 1
                    src.rename(dst)
                    if suffix == "corrupt":
                        _log.warning("checkpoint: moved damaged step %d to %s (kept for "
                                     "inspection) to save step %d", s, dst, at_or_after)
        for s, _ in moves:
            self._stale_steps.discard(s)
            self._bad_steps.pop(s, None)
        self._barrier("moved_aside")
        self._manager().reload()

    # ---------------------------------------------------------------- restore

    def restore(self, step: int | None = None, *, abstract_state: PyTree | None = None,
                abstract_state_fn: Callable[[dict], PyTree] | None = None,
                partial: bool = False) -> tuple[PyTree, dict]:
        """Restores a step: arrays go straight into the shardings of `abstract_state`.

        Before reading arrays, the step's files are checked against its manifest (see
        `verify`) and its metadata against its checksum (on multi-host: call it on every
        process; the primary hashes, all agree on the step). Without `step`, a damaged step
        (those checks or orbax's restore fail) is logged as a warning naming its directory
        and problems, and the next older complete step is tried; `last_restored_step` then
        tells which step was restored and `last_skipped` which were skipped and why.

        Args:
            step: the step to restore; None = the newest complete step that is not damaged.
            abstract_state: the target tree, e.g. `abstract_like(live_state)`: leaves are
                `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(...))` (restored as
                jax.Arrays with that sharding, which need not be the one used at save time) or
                without sharding (restored as numpy arrays); live arrays are also accepted. Same
                paths and shapes as the saved state; a different dtype casts on restore.
            abstract_state_fn: instead of `abstract_state`, a function of the step's decoded
                metadata returning it (e.g. built from a saved model config).
            partial: `abstract_state` names a subset of the saved tree (e.g. only the params
                of a training state); only that subset is read.

        Returns:
            (state, metadata): state with the structure of `abstract_state` (namedtuples of
            optax states included); metadata as given to `save` (bytes restored).

        Raises:
            FileNotFoundError: the directory does not exist, holds no complete step, or `step`
                is not one of its complete steps (the message lists the available steps).
            CheckpointCorruptError (a ValueError): the given `step`, or without `step` every
                complete step, is damaged; the message names each step directory and problem.
            ValueError: `abstract_state` does not match the saved arrays (no fallback: that
                is a wrong target, not a damaged checkpoint). Nothing is ever deleted or
                written by a restore.
        """
        if (abstract_state is None) == (abstract_state_fn is None):
            raise TypeError("pass exactly one of abstract_state and abstract_state_fn")
        make_target = abstract_state_fn or (lambda _: abstract_state)

        def attempt(s: int):
            manifest, encoded = self._check_step(s, None)
            abstract = abstract_like(make_target(decode_metadata(encoded)))
            compare_to_manifest(manifest, abstract, f"{self._step_dir(s)}", partial)
            state_args = (ocp.args.PyTreeRestore(
                abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                partial_restore=True) if partial else ocp.args.StandardRestore(abstract))
            problems, restored = [], None
            try:
                restored = self._manager().restore(
                    s, args=ocp.args.Composite(**{STATE_ITEM: state_args}))[STATE_ITEM]
            except Exception as e:  # noqa: BLE001 (any orbax/TensorStore read error)
                problems = [f"{STATE_ITEM}/: orbax could not restore it: {short_error(e)}"]
            self._raise_if_damaged(problems)
            return restored, decode_metadata(encoded)

        _, (state, metadata) = self._first_good(step, attempt)
        return state, metadata

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata of a complete step, without reading arrays.

        The step's metadata files are checked against its manifest and checksum. Without
        `step`, the newest complete step whose metadata is intact (its arrays are not
        checked); damaged newer ones are logged and skipped as in `restore`. Call it on every
        process (it agrees across them).

        Raises:
            FileNotFoundError: no complete step, or `step` is not one.
            CheckpointCorruptError: the metadata of `step` (or of every step) is damaged.
        """
        _, (_, encoded) = self._first_good(
            step, lambda s: self._check_step(s, (METADATA_ITEM,)))
        return decode_metadata(encoded)

    def _check_step(self, step: int, items: Sequence[str] | None) -> tuple[dict, dict]:
        """(manifest, encoded metadata) of a step whose files (of `items`) and metadata
        checksum are intact; raises Damaged otherwise. Collective on multi-host: the
        primary hashes the files, every process reads the metadata, all agree."""
        primary = ocp.multihost.is_primary_host(PRIMARY_HOST)
        self._raise_if_damaged(self.verify(step, items=items) if primary else [])
        manifest = self._manifest(step)
        problems, encoded = [], None
        try:
            encoded = self._manager().restore(
                step, args=ocp.args.Composite(**{METADATA_ITEM: ocp.args.JsonRestore()})
            )[METADATA_ITEM]
        except Exception as e:  # noqa: BLE001 (bad JSON, missing file, orbax errors)
            problems = [f"{METADATA_ITEM}/: orbax could not read it: {short_error(e)}"]
        else:
            if manifest is None:
                problems = [self._manifest_problem(step)]
            elif not isinstance(encoded, dict):
                problems = [f"{METADATA_ITEM}/: holds a {type(encoded).__name__}, not a dict"]
            elif metadata_checksum(encoded) != manifest["metadata_sha256"]:
                problems = [f"{METADATA_ITEM}/: does not match the metadata checksum in "
                            f"{MANIFEST_NAME} (modified or corrupted)"]
        self._raise_if_damaged(problems)
        return manifest, encoded

    def _raise_if_damaged(self, problems: list[str]) -> None:
        """Raises Damaged when `problems` is non-empty on any process (all processes call
        this at the same points; with one process it is local)."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            flags = np.asarray(multihost_utils.process_allgather(np.int32(bool(problems))))
            bad = [int(i) for i in np.flatnonzero(flags.reshape(-1))]
            if bad and not problems:
                problems = [f"damaged according to process(es) {bad} (see their log)"]
        if problems:
            raise Damaged(problems)

    def _first_good(self, step: int | None, attempt: Callable[[int], Any]) -> tuple[int, Any]:
        """(step, attempt(step)) for the given step, or without one for the newest complete
        step whose attempt does not raise Damaged; logs and records the damaged ones."""
        if not self._directory.exists():
            raise FileNotFoundError(f"checkpoint directory {self._directory} does not exist")
        available = self.all_steps()
        if step is None:
            if not available:
                raise FileNotFoundError(
                    f"no complete checkpoint in {self._directory} (steps without a valid "
                    f"{MANIFEST_NAME}: {self._incomplete_steps()})")
            candidates = available[::-1]
            ignored = [s for s in self._incomplete_steps() if s > available[-1]]
            for s in ignored:
                _log.warning("checkpoint: ignoring step %d at %s: %s (a save that did not "
                             "finish, or a damaged manifest)", s, self._step_dir(s),
                             self._manifest_problem(s))
        elif step in available:
            candidates = [step]
        else:
            why = (self._manifest_problem(step) + ": its save did not finish, or the "
                   "manifest was damaged" if self._step_dir(step).exists()
                   else "it does not exist")
            raise FileNotFoundError(
                f"cannot restore step {step} from {self._directory}: {why}; "
                f"available steps: {available}")
        skipped: dict[int, list[str]] = {}
        for i, s in enumerate(candidates):
            try:
                result = attempt(s)
            except Damaged as e:
                skipped[s] = self._bad_steps[s] = e.problems
                if step is not None:
                    raise CheckpointCorruptError(
                        f"checkpoint step {s} at {self._step_dir(s)} is damaged: "
                        + "; ".join(e.problems), self._directory, skipped) from None
                nxt = (f"falling back to step {candidates[i + 1]}" if i + 1 < len(candidates)
                       else "no older step left")
                _log.warning("checkpoint: step %d at %s is damaged (kept in place): %s; %s",
                             s, self._step_dir(s), "; ".join(e.problems), nxt)
                continue
            self.last_restored_step, self.last_skipped = s, skipped
            return s, result
        lines = "\n".join(f"  step {s} at {self._step_dir(s)}: {'; '.join(p)}"
                          for s, p in skipped.items())
        raise CheckpointCorruptError(
            f"no usable checkpoint in {self._directory}: all {len(skipped)} complete steps "
            f"are damaged (left in place for inspection; move them away to start over):\n"
            f"{lines}", self._directory, skipped)

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
        return read_manifest(self._step_dir(step), step)

    def _manifest_problem(self, step: int) -> str:
        """Why a step has no valid manifest (for messages)."""
        if (self._step_dir(step) / MANIFEST_NAME).exists():
            return f"it has no valid {MANIFEST_NAME} (the file is unreadable or inconsistent)"
        return f"it has no valid {MANIFEST_NAME} (the file is missing)"

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
            if (s in finalized and ocp.multihost.is_primary_host(PRIMARY_HOST)
                    and self._step_dir(s).exists()):
                # Orbax has finalized the step: its files no longer change.
                manifest["files"] = file_entries(self._step_dir(s))
                write_manifest(self._step_dir(s), manifest)

    def _barrier(self, name: str) -> None:
        """Synchronizes all processes (no-op with one process); names are unique per call."""
        self._barrier_count += 1
        ocp.multihost.sync_global_processes(f"jaxrl_checkpointer_{name}_{self._barrier_count}")
