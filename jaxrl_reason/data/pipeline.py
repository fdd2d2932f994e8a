"""Grain input pipelines of prompt/answer examples, sharded per process and resumable.

An example is a dict of python values, e.g.
`{"id": "a-17", "prompt": "What is 7+9?", "answer": "16", "level": 2}`. Batches are
plain `list[dict]` (strings stay python strings); tokenization and padding to static
shapes happen later, next to the model.

`example_iterator` returns a grain `DatasetIterator`; `it.get_state()` is a small
JSON-serializable dict (`{"next_index": int}`) and `it.set_state(state)` on a fresh
iterator built with the same arguments resumes with exactly the batches the
uninterrupted run would have produced. Orbax stores it with the other training state.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grain

from jaxrl_reason.data.files import read_examples

Example = dict[str, Any]


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value >= high):
        upper = "" if high is None else f" and < {high}"
        raise ValueError(f"{name} must be >= {low}{upper}, got {value}")
    return value


def _as_example(index: int, item: Any, *, length: int) -> Example:
    """A shallow copy of a source item, so callers may mutate batches freely."""
    if not isinstance(item, Mapping):
        raise TypeError(
            f"source[{index % length}] is {type(item).__name__}; example_iterator needs "
            "a sequence of dicts"
        )
    return dict(item)


def _as_list(examples: Sequence[Example]) -> list[Example]:
    """Grain batch_fn: keeps a batch as a python list instead of stacking arrays."""
    return list(examples)


def example_iterator(
    source: Sequence[Example],
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
    drop_remainder: bool = True,
) -> grain.DatasetIterator:
    """A resumable iterator of example batches for this process.

    Args:
      source: random-access sequence (`len` and `__getitem__`) of example dicts, e.g. a
        list or `files.read_examples(...)`.
      batch_size: examples per batch (per process).
      seed: shuffle seed, an int in [0, 2**32). Each epoch is shuffled differently.
      shuffle: False keeps source order (still sharded).
      num_epochs: passes over the data; None repeats forever. Batches may span the
        boundary between two epochs, so no example is skipped within a run.
      shard_index, shard_count: this process's shard. Shard k holds the examples
        `k, k + shard_count, ...` of the first `len(source) // shard_count * shard_count`
        (every shard is the same size, so all processes take the same number of steps;
        at most `shard_count - 1` trailing examples are never used).
      drop_remainder: drop a final batch shorter than `batch_size` (only reachable when
        `num_epochs` is finite).

    Returns:
      A `grain.DatasetIterator` yielding `list[dict]` batches of `batch_size` examples
      (each dict a fresh shallow copy of a source item), with `get_state()` /
      `set_state(state)` for checkpointing.

    Raises:
      TypeError: a non-sequence source or a non-dict item (when it is read).
      ValueError: bad sizes or shard, an empty shard, or finite epochs too short for
        a single full batch with `drop_remainder`.
    """
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            f"source must support len() and indexing, got {type(source).__name__}"
        )
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0, 2**32)
    _check_int("shard_count", shard_count, 1)
    _check_int("shard_index", shard_index, 0, shard_count)
    if num_epochs is not None:
        _check_int("num_epochs", num_epochs, 1)
    length = len(source)
    per_shard = length // shard_count
    if per_shard == 0:
        raise ValueError(
            f"source has {length} examples, fewer than shard_count={shard_count}: "
            "every shard needs at least one"
        )
    if num_epochs is not None and drop_remainder and per_shard * num_epochs < batch_size:
        raise ValueError(
            f"shard {shard_index} has {per_shard} examples x {num_epochs} epochs, fewer "
            f"than batch_size={batch_size}: with drop_remainder it would yield no batch"
        )

    ds = grain.MapDataset.source(source)
    ds = ds.map_with_index(functools.partial(_as_example, length=length))
    ds = ds[shard_index : per_shard * shard_count : shard_count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_as_list)
    # In-memory examples: reading threads would only contend for the GIL.
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return iter(ds.to_iter_dataset(read_options))


def jsonl_source(
    path: str | os.PathLike,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    id_field: str | None = None,
) -> list[Example]:
    """Reads a local JSONL file of {prompt, answer} examples into memory.

    A shorthand for `files.read_examples(path, format="jsonl", fields={"prompt":
    prompt_field, "answer": answer_field}, id_field=id_field)` (see it for presets,
    parquet, templates and skipping malformed records). Each non-blank line must be a JSON
    object with `prompt_field` (a string) and `answer_field` (a string or a number,
    converted with `str`). The result maps them to the keys "prompt" and "answer" and adds
    "id": `str(record[id_field])`, or "<file stem>-<line number>" when `id_field` is None.
    Other fields are kept as they are; the source names of renamed fields are dropped.

    Returns:
      A list with one example dict per non-blank line, in file order.

    Raises:
      ValueError: a malformed line, a non-object line, or a missing/ill-typed field,
        naming the file and the 1-based line number; or a file with no examples.
    """
    source = read_examples(
        path,
        format="jsonl",
        fields={"prompt": prompt_field, "answer": answer_field},
        id_field=id_field,
    )
    return list(source)
