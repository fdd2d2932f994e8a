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


def absolute(path: str | os.PathLike) -> str:
    """A local `path` made absolute against the current directory (`~` expanded); remote
    paths (`gs://...`) and "" are returned as they are. Orbax refuses relative paths, and a
    run's subprocesses and resumed runs may start elsewhere, so local paths are resolved once,
    where they enter (the CLI, the checkpointer)."""
    text = os.fspath(path)
    if not text or is_remote(text):
        return text
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(os.path.expanduser(text))


# Config fields that hold local paths or URIs (dotted; `*` = every entry of a dict).
CONFIG_PATH_FIELDS = ("hf_model", "tokenizer.path", "rewards.reward_model_dir",
                      "task.train_file", "task.eval_files.*", "pipeline.init_checkpoint")


def _is_module_file(entry: str) -> bool:
    """Whether a `rewards.modules` entry names a .py file (made absolute) rather than an
    importable module name (kept)."""
    return entry.endswith(".py") or os.sep in entry


def absolutize_config(config) -> None:
    """Makes the local paths of `config` (an ml_collections ConfigDict, locked or not) absolute
    in place: the fields in `CONFIG_PATH_FIELDS` and the .py files of `rewards.modules`.
    Absent fields are skipped (not every config has every block)."""
    for field in CONFIG_PATH_FIELDS:
        *parents, leaf = field.split(".")
        node = config
        for name in parents:
            node = node.get(name) if hasattr(node, "get") else None
            if node is None:
                break
        if node is None or not hasattr(node, "keys"):
            continue
        keys = list(node.keys()) if leaf == "*" else [leaf] if leaf in node else []
        for key in keys:
            if isinstance(node[key], str) and node[key]:
                node[key] = absolute(node[key])
    rewards = config.get("rewards") if hasattr(config, "get") else None
    modules = rewards.get("modules") if rewards is not None else None
    if modules:
        rewards.modules = tuple(absolute(m) if _is_module_file(m) else m for m in modules)
