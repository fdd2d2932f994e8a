"""Run directories on local disks or object stores: `gs://bucket/run`, or any `etils.epath` path.

A run's files (config.json, metrics.jsonl, eval.json, tokenizer.model, checkpoints) go
through `etils.epath.Path`, which orbax uses too, so one workdir string works for every
file of a run. Local paths keep what only makes sense there: atomic replace by rename, append
to an open file, free-space checks. On an object store a whole-object write is already
atomic (readers see the old or the new object), appends do not exist, and there is no disk to
measure.
"""

from __future__ import annotations

import os
import re

from etils import epath

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` names an object store or other URI (`gs://`, `s3://`, ...), not a
    local file."""
    return bool(_SCHEME.match(os.fspath(path))) and not os.fspath(path).startswith("file://")


def as_path(path: str | os.PathLike, *parts: str) -> epath.Path:
    """`path` (joined with `parts`) as an `etils.epath.Path` (local or remote)."""
    return epath.Path(path).joinpath(*parts)


def join(path: str | os.PathLike, *parts: str) -> str:
    """`path / part / ...` as a string (`os.path.join` for local paths)."""
    if is_remote(path):
        return os.fspath(as_path(path).joinpath(*parts))
    return os.path.join(os.fspath(path), *parts)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` so that a reader never sees a partial file: temp file + rename locally,
    one object write remotely. Creates missing parent directories."""
    target = as_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_remote(path):
        target.write_bytes(data)
        return
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.fspath(path))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """`write_bytes_atomic` of UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))
