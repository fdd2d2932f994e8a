"""What a checkpoint step holds besides orbax's files, and the checks that read it.

- Metadata encoding: JSON-safe dicts (`bytes` base64-tagged), their SHA-256
  (`metadata_checksum`), and the abstract tree of a pytree (`abstract_like`).
- The manifest ``<step>/jaxrl_manifest.json`` (format 2: the step, every array's path, shape
  and dtype, the metadata checksum, and every file's relative path, size and SHA-256; format
  1, without the file list, is still read), written once a step is final, and the checks
  of a step's files and arrays against it. Symbolic links are never followed out of a
  step directory: one pointing outside is a problem naming it.

`checkpointing.Checkpointer` uses these; the module docstring there says when a manifest is
written and what a damaged step does.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from jaxrl_reason.runtime import paths

PyTree = Any

MANIFEST_NAME = "jaxrl_manifest.json"
MANIFEST_FORMAT = 2  # 2: + "files" [{"path", "size", "sha256"}]; 1 is still read
_READ_FORMATS = (1, 2)
_HASH_CHUNK = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MAX_REASON_CHARS = 400
STATE_ITEM = "state"
METADATA_ITEM = "metadata"
_BYTES_TAG = "__bytes_base64__"
PRIMARY_HOST = 0
_ITEMS = (STATE_ITEM, METADATA_ITEM)


class Damaged(Exception):
    """Internal: a step failed a check; `problems` says why."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


class CheckpointCorruptError(ValueError):
    """A checkpoint step (or every step tried) failed verification or restore.

    Attributes:
        directory: the checkpoint root directory.
        problems: {step: [problem, ...]} for every step tried, newest first.
    """

    def __init__(self, message: str, directory, problems: dict[int, list[str]]):
        super().__init__(message)
        self.directory, self.problems = directory, problems


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
        check_leaf(path, x)
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        arr = np.asarray(x)
        return jax.ShapeDtypeStruct(arr.shape, arr.dtype)

    return jax.tree_util.tree_map_with_path(one, tree)


def check_leaf(path, x) -> None:
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


def array_entries(tree: PyTree) -> list[dict]:
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


def read_manifest(step_dir: epath.Path, step: int) -> dict | None:
    """The manifest of a step directory, or None when missing or invalid."""
    path = step_dir / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("step") != step:
        return None
    if manifest.get("format") not in _READ_FORMATS or not isinstance(manifest.get("arrays"),
                                                                      list):
        return None
    if not isinstance(manifest.get("metadata_sha256"), str):
        return None
    if manifest["format"] >= 2 and not _valid_file_entries(manifest.get("files")):
        return None
    return manifest


def _valid_file_entries(files) -> bool:
    """Whether `files` is a list of {"path": relative posix path, "size", "sha256"}."""
    if not isinstance(files, list):
        return False
    for e in files:
        if not isinstance(e, dict) or not isinstance(e.get("path"), str):
            return False
        parts = e["path"].split("/")
        if (e["path"].startswith("/") or any(p in ("", ".", "..") for p in parts)
                or parts == [MANIFEST_NAME]):
            return False
        size = e.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return False
        if not isinstance(e.get("sha256"), str) or not _SHA256_RE.fullmatch(e["sha256"]):
            return False
    return True


def write_manifest(step_dir: epath.Path, manifest: dict) -> None:
    """Writes the manifest to a temporary name, then renames it into place."""
    tmp = step_dir / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.rename(step_dir / MANIFEST_NAME)


class SymlinkOutsideError(OSError):
    """A symbolic link inside a step directory points outside it (never followed)."""


def _local_path(path: epath.Path) -> str | None:
    """The local filesystem path of `path`, or None on an object store (no symlinks)."""
    text = os.fspath(path)
    return None if paths.is_remote(text) else text


def _check_link(child: epath.Path, rel: str, root: str | None) -> bool:
    """Whether `child` is a symbolic link (local paths only). Raises SymlinkOutsideError
    naming it when its target resolves outside `root` (the step directory's real path)."""
    local = _local_path(child)
    if root is None or local is None or not os.path.islink(local):
        return False
    target = os.path.realpath(local)
    if os.path.commonpath([target, root]) != root:
        raise SymlinkOutsideError(f"{rel}: a symbolic link to {target}, outside the step "
                                  f"directory (not followed)")
    return True


def _step_files(step_dir: epath.Path) -> dict[str, epath.Path]:
    """{relative posix path: path} of every file under `step_dir` but our manifest (and its
    temporary), sorted by path.

    Symbolic links are never followed out of the step: one pointing outside raises
    SymlinkOutsideError naming it; a link to a directory inside is not descended (its files
    are listed under their own paths); a link to a file inside counts as that file.
    """
    found: dict[str, epath.Path] = {}
    local = _local_path(step_dir)
    root = os.path.realpath(local) if local is not None else None

    def walk(d: epath.Path, prefix: str) -> None:
        for child in d.iterdir():
            rel = prefix + child.name
            link = _check_link(child, rel, root)
            if child.is_dir():
                if not link:
                    walk(child, rel + "/")
            elif rel not in (MANIFEST_NAME, MANIFEST_NAME + ".tmp"):
                found[rel] = child

    walk(step_dir, "")
    return dict(sorted(found.items()))


def _hash_file(path: epath.Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex digest), read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def file_entries(step_dir: epath.Path) -> list[dict]:
    """[{"path", "size", "sha256"}] of every file of a finalized step directory."""
    entries = []
    for rel, path in _step_files(step_dir).items():
        size, sha = _hash_file(path)
        entries.append({"path": rel, "size": size, "sha256": sha})
    return entries


def verify_files(step_dir: epath.Path, manifest: dict,
                  items: Sequence[str] | None = None) -> list[str]:
    """Problems of the files of a step directory against its manifest (format 2).

    With `items`, only files at the top of the step directory and under those item
    directories are checked. Files the manifest does not list are problems only inside an
    orbax item directory (orbax could read them); elsewhere they are ignored.
    """
    def wanted(rel: str) -> bool:
        return items is None or "/" not in rel or rel.split("/", 1)[0] in items

    try:
        present = _step_files(step_dir)
    except SymlinkOutsideError as e:
        return [str(e)]
    except OSError as e:
        return [f"cannot list the files: {short_error(e)}"]
    problems = []
    expected = {e["path"]: e for e in manifest["files"] if wanted(e["path"])}
    for rel, entry in expected.items():
        path = present.get(rel)
        if path is None:
            problems.append(f"{rel}: missing (expected {entry['size']} bytes)")
            continue
        try:
            size = path.stat().length
            if size != entry["size"]:
                kind = "truncated" if size < entry["size"] else "grown"
                problems.append(f"{rel}: {size} bytes, expected {entry['size']} ({kind})")
                continue
            size, sha = _hash_file(path)
        except OSError as e:
            problems.append(f"{rel}: cannot be read: {short_error(e)}")
            continue
        if size != entry["size"]:
            problems.append(f"{rel}: {size} bytes read, expected {entry['size']}")
        elif sha != entry["sha256"]:
            problems.append(f"{rel}: content does not match its SHA-256 in {MANIFEST_NAME} "
                            "(modified or corrupted)")
    for rel in present:
        if rel not in expected and "/" in rel and rel.split("/", 1)[0] in _ITEMS and wanted(rel):
            problems.append(f"{rel}: unexpected file (not in {MANIFEST_NAME})")
    return problems


def short_error(e: BaseException) -> str:
    """A one-line, bounded description of an exception."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + " ..."


def compare_to_manifest(manifest: dict, abstract: PyTree, where: str,
                         partial: bool = False) -> None:
    """Raises ValueError when the abstract tree's paths or shapes differ from the manifest.

    With `partial`, the abstract tree may hold a subset of the saved paths.
    """
    saved = {e["path"]: e["shape"] for e in manifest["arrays"]}
    wanted = {e["path"]: e["shape"] for e in array_entries(abstract)}
    problems = [] if partial else [
        f"missing from abstract_state: {p}" for p in saved if p not in wanted]
    problems += [f"not in the checkpoint: {p}" for p in wanted if p not in saved]
    problems += [f"shape of {p}: saved {saved[p]}, requested {wanted[p]}"
                 for p in wanted if p in saved and saved[p] != wanted[p]]
    if problems:
        shown = "; ".join(problems[:8]) + ("; ..." if len(problems) > 8 else "")
        raise ValueError(f"abstract_state does not match the checkpoint {where}: {shown}")
