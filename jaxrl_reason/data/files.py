r"""Example sources read from local JSONL and parquet files (GSM8K, MATH, generic).

`read_examples(path, fields=...)` reads every record into memory and maps it to an example
dict with "id", "prompt" and "answer" (strings) plus the record's other fields. The
mapping is a preset, optionally with renamed source fields:

    preset    source fields (defaults)      example
    generic   prompt, answer                answer = the field (a number becomes a str)
    gsm8k     question, answer              answer = the text after the last "####"
                                            ("72", "1,000": the verifier drops commas);
                                            solution = the worked text before it, with
                                            the `<<48/2=24>>` calculator notes removed
    math      problem, solution             answer = the last \boxed{...} / \fbox{...} of
                                            the solution; solution = the solution text;
                                            level/type are kept as other fields

A malformed record (bad JSON, NaN/Infinity, nesting deeper than 64 levels, an integer over
Python's digit limit, not an object, a missing or ill-typed field, no "####" answer, no
boxed answer, non-UTF-8 text or a lone surrogate escape, a field the template needs) raises a ValueError
naming `file:line` (JSONL, 1-based) or `file:row N` (parquet, 0-based), or with
`on_error="skip"` is left out and recorded in `source.skipped`. A source with no examples
always raises.

Parquet needs pyarrow (`pip install 'jaxrl-reason[parquet]'`); it is read one record batch
at a time, without pandas.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from jaxrl_reason.data.templates import Template, get_template

Example = dict[str, Any]
Format = Literal["auto", "jsonl", "parquet"]
OnError = Literal["raise", "skip"]

_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_PARQUET_BATCH_ROWS = 1024
_MAX_DEPTH = 64  # nesting levels of a record's values (deeper lines are malformed)
_CALCULATOR_NOTE = re.compile(r"<<[^<>\n]*>>")  # GSM8K `<<48/2=24>>`


class _Malformed(ValueError):
    """One bad record; `read_examples` prefixes its location or skips it."""


# ----------------------------------------------------------------------------- presets


def _text_field(record: Mapping[str, Any], name: str, *, numbers_ok: bool) -> str:
    if name not in record:
        raise _Malformed(f"missing field {name!r} (fields: {sorted(record)})")
    value = record[name]
    if isinstance(value, str):
        return value
    if numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    kinds = "a string or a number" if numbers_ok else "a string"
    raise _Malformed(f"field {name!r} must be {kinds}, got {value!r}")


def _generic_answer(text: str, field: str) -> Example:
    return {"answer": text}


def _gsm8k_answer(text: str, field: str) -> Example:
    head, sep, tail = text.rpartition("####")
    answer = tail.strip()
    if not sep or not answer or "\n" in answer:
        raise _Malformed(f"field {field!r} does not end with a '#### <answer>' line")
    solution = _CALCULATOR_NOTE.sub("", head).strip()
    return {"answer": answer, "solution": solution}


def _math_answer(text: str, field: str) -> Example:
    # Imported here so that reading generic/GSM8K data never imports the rewards package.
    from jaxrl_reason.rewards.latex import last_boxed

    answer = last_boxed(text)
    if not answer:
        raise _Malformed(f"field {field!r} has no \\boxed{{...}} answer")
    return {"answer": answer, "solution": text}


@dataclasses.dataclass(frozen=True)
class _Preset:
    prompt: str  # default source field of the prompt
    answer: str  # default source field the answer is taken from
    numbers_ok: bool  # whether that field may be a JSON number
    parse: Callable[[str, str], Example]  # (field text, field name) -> answer fields


PRESETS: dict[str, _Preset] = {
    "generic": _Preset("prompt", "answer", True, _generic_answer),
    "gsm8k": _Preset("question", "answer", False, _gsm8k_answer),
    "math": _Preset("problem", "solution", False, _math_answer),
}


@dataclasses.dataclass(frozen=True)
class FieldMap:
    """Which preset parses the records, and the source field names it reads.

    Attributes:
      preset: "generic", "gsm8k" or "math" (see the module docstring).
      prompt: source field of the problem text; None for the preset's default.
      answer: source field the answer comes from (the answer itself for "generic", the
        `####` solution for "gsm8k", the boxed solution for "math"); None for the default.
    """

    preset: str = "generic"
    prompt: str | None = None
    answer: str | None = None

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}: use one of {sorted(PRESETS)}")
        for key in ("prompt", "answer"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"field name {key}={value!r} must be a non-empty string")

    @property
    def prompt_field(self) -> str:
        """The source field name of the prompt."""
        return self.prompt or PRESETS[self.preset].prompt

    @property
    def answer_field(self) -> str:
        """The source field name the answer is taken from."""
        return self.answer or PRESETS[self.preset].answer


def field_map(fields: FieldMap | str | Mapping[str, str]) -> FieldMap:
    """A `FieldMap` from a preset name, a mapping, or a `FieldMap`.

    Args:
      fields: a preset name ("generic", "gsm8k", "math"); a mapping with any of the keys
        "preset" (default "generic"), "prompt", "answer", e.g.
        `{"prompt": "question", "answer": "final"}` or `{"preset": "gsm8k", "prompt": "q"}`
        (empty values mean the preset's default; an `ml_collections.ConfigDict` works
        too); or a `FieldMap`.

    Returns:
      The `FieldMap`.

    Raises:
      ValueError: an unknown preset or key, or an empty field name.
    """
    if isinstance(fields, FieldMap):
        return fields
    if isinstance(fields, str):
        return FieldMap(preset=fields)
    if hasattr(fields, "to_dict"):  # an ml_collections.ConfigDict, e.g. config.task.fields
        fields = fields.to_dict()
    if isinstance(fields, Mapping):
        unknown = set(fields) - {"preset", "prompt", "answer"}
        if unknown:
            raise ValueError(
                f"fields has unknown keys {sorted(unknown)}: use 'preset', 'prompt', 'answer'"
            )
        return FieldMap(
            preset=fields.get("preset") or "generic",
            prompt=fields.get("prompt") or None,
            answer=fields.get("answer") or None,
        )
    raise TypeError(f"fields must be a preset name or a mapping, got {type(fields).__name__}")


# ----------------------------------------------------------------------------- source


class FileSource(Sequence):
    """The examples of one or more files: a random-access sequence of example dicts.

    Works as `example_iterator(source, ...)`'s source. Attributes:
      files: the files read, in order.
      skipped: `(location, reason)` of each malformed record left out with
        `on_error="skip"`, e.g. `("data/train.jsonl:17", "malformed JSON (...)")`.
    """

    def __init__(self, examples: list[Example], files: Sequence[str],
                 skipped: list[tuple[str, str]]):
        self._examples = examples
        self.files = tuple(files)
        self.skipped = skipped

    @property
    def num_skipped(self) -> int:
        """How many malformed records were skipped."""
        return len(self.skipped)

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, index):
        return self._examples[index]

    def __repr__(self) -> str:
        files = self.files[0] if len(self.files) == 1 else f"{len(self.files)} files"
        return f"FileSource({files}, {len(self)} examples, {self.num_skipped} skipped)"


def _resolve_files(path: str, fmt: str) -> list[str]:
    """A file, or the sorted data files of a directory or a glob pattern."""
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        files = [os.path.join(path, n) for n in names
                 if os.path.splitext(n)[1].lower() in _EXTENSIONS
                 and (fmt == "auto" or _EXTENSIONS[os.path.splitext(n)[1].lower()] == fmt)]
        if not files:
            raise FileNotFoundError(
                f"{path}: directory holds no {'/'.join(sorted(_EXTENSIONS))} files"
            )
        return files
    if os.path.exists(path) or not glob.has_magic(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        return [path]
    files = sorted(p for p in glob.glob(path) if os.path.isfile(p))
    if not files:
        raise FileNotFoundError(f"{path}: no files match the pattern")
    return files


def _file_format(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise ValueError(
            f"{path}: cannot tell the format from the extension {ext!r}; pass "
            "format='jsonl' or format='parquet'"
        )
    return _EXTENSIONS[ext]


def _reject_constant(name: str):
    raise _Malformed(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _parse_line(raw: bytes) -> Any:
    """The JSON object of one JSONL line (bytes), or a _Malformed saying why not: not
    UTF-8, bad JSON, NaN/Infinity, too deep for the parser, an integer over Python's
    digit limit, not an object, or text the rest of the pipeline cannot encode."""
    try:
        record = json.loads(raw.decode("utf-8-sig"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        return _Malformed(f"not UTF-8 text ({e.reason})")
    except json.JSONDecodeError as e:
        return _Malformed(f"malformed JSON ({e.msg} at column {e.colno})")
    except _Malformed as e:
        return e
    except RecursionError:
        return _Malformed("JSON nested too deeply to parse")
    except ValueError as e:  # an integer literal over sys.get_int_max_str_digits()
        return _Malformed(f"unreadable JSON value ({e})")
    if not isinstance(record, dict):
        return _Malformed(f"expected a JSON object, got {type(record).__name__}")
    return _check_values(record)


def _check_values(record: dict) -> dict | _Malformed:
    """`record`, or a _Malformed naming the first problem of its keys and values (to any
    depth): nesting deeper than `_MAX_DEPTH`, or a string that is not valid Unicode (a
    lone surrogate such as "\\ud800", which JSON escapes allow but UTF-8 cannot encode)."""
    stack: list[tuple[str, Any, int]] = [("", record, 0)]
    while stack:
        where, value, depth = stack.pop()
        if depth > _MAX_DEPTH:
            top = re.split(r"[.\[]", where, maxsplit=1)[0]
            return _Malformed(f"field {top!r} is nested more than {_MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            for k, v in value.items():
                key = f"{where}.{k}" if where else str(k)
                if not _encodable(k):
                    return _Malformed(f"key {k!r} is not valid Unicode (lone surrogate)")
                stack.append((key, v, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str) and not _encodable(value):
            return _Malformed(f"field {where!r} is not valid Unicode (a lone surrogate "
                              f"escape such as \\ud800)")
    return record


def _encodable(text: Any) -> bool:
    """Whether a str encodes as UTF-8 (no lone surrogates); non-strings are fine."""
    if not isinstance(text, str):
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def jsonl_records(path: str) -> Iterator[tuple[str, int, Any]]:
    """(location, line number, record or _Malformed) per non-blank line."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            yield f"{path}:{line_no}", line_no, _parse_line(raw)


def _import_pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(
            "reading parquet files needs pyarrow: pip install 'jaxrl-reason[parquet]' "
            "(or pip install pyarrow)"
        ) from e
    return pq


def _parquet_records(path: str) -> Iterator[tuple[str, int, Any]]:
    """(location, 0-based row, record dict) per row, one record batch at a time."""
    pq = _import_pyarrow_parquet()
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
        row = 0
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for record in batch.to_pylist():
                yield f"{path}:row {row}", row, record
                row += 1
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None


def _to_example(record: dict, fm: FieldMap, preset: _Preset, id_field: str | None,
                default_id: str, template: Template | None) -> Example:
    prompt_key, answer_key = fm.prompt_field, fm.answer_field
    renamed = (prompt_key, answer_key, id_field)
    example = {k: v for k, v in record.items() if k not in renamed}
    example["prompt"] = _text_field(record, prompt_key, numbers_ok=False)
    answer_text = _text_field(record, answer_key, numbers_ok=preset.numbers_ok)
    example.update(preset.parse(answer_text, answer_key))
    if id_field is None:
        example["id"] = default_id
    else:
        example["id"] = _text_field(record, id_field, numbers_ok=True)
    if template is not None:
        rendered = template.render(example)
        example["problem"] = example["prompt"]
        example["prompt"] = rendered
    return example


def read_examples(
    path: str | os.PathLike,
    *,
    format: Format = "auto",  # noqa: A002 (the natural name of the option)
    fields: FieldMap | str | Mapping[str, str] = "generic",
    on_error: OnError = "raise",
    template: str | Template | None = None,
    id_field: str | None = None,
) -> FileSource:
    """Reads local JSONL / parquet examples into memory.

    Args:
      path: a file; a directory (its `.jsonl`/`.ndjson`/`.parquet`/`.pq` files, sorted by
        name); or a glob pattern such as `"data/train-*.parquet"` (matches sorted).
      format: "jsonl", "parquet", or "auto" (from each file's extension).
      fields: the preset and source field names, see `field_map`: "generic" (default),
        "gsm8k", "math", or e.g. `{"prompt": "question", "answer": "final"}`.
      on_error: "raise" a ValueError at the first malformed record, or "skip" it and
        record `(location, reason)` in `source.skipped`.
      template: None keeps the prompt as read; otherwise a template name ("plain", "r1",
        "boxed") or a format string with `{prompt}` (see `templates.apply_template`):
        "prompt" becomes the rendered text and "problem" the raw one.
      id_field: source field holding a unique id (string or number, stored as str);
        None gives "<file stem>-<line>" (JSONL, 1-based) or "<file stem>-<row>"
        (parquet, 0-based).

    Returns:
      A `FileSource` of example dicts in file order: "id", "prompt", "answer" (str), the
      preset's extra fields ("solution" for gsm8k and math; "problem" with a template),
      and the record's other fields as read (the source prompt/answer/id fields are
      dropped once renamed).

    Raises:
      FileNotFoundError: no such file, or nothing matches the directory/pattern.
      ValueError: a bad option or template; a malformed record (with on_error="raise"),
        naming `file:line` / `file:row N`; an unreadable parquet file; no examples.
      ImportError: a parquet file without pyarrow installed.
    """
    if format not in ("auto", "jsonl", "parquet"):
        raise ValueError(f"format must be 'auto', 'jsonl' or 'parquet', got {format!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    fm = field_map(fields)
    preset = PRESETS[fm.preset]
    tpl = None if template is None else get_template(template)
    path = os.fspath(path)
    files = _resolve_files(path, format)

    examples: list[Example] = []
    skipped: list[tuple[str, str]] = []
    for file in files:
        fmt = _file_format(file, format)
        stem = os.path.splitext(os.path.basename(file))[0]
        records = jsonl_records(file) if fmt == "jsonl" else _parquet_records(file)
        for where, number, record in records:
            try:
                if isinstance(record, _Malformed):
                    raise record
                examples.append(
                    _to_example(record, fm, preset, id_field, f"{stem}-{number}", tpl)
                )
            except ValueError as e:  # _Malformed, or a template field the record lacks
                if on_error == "raise":
                    raise ValueError(f"{where}: {e}") from None
                skipped.append((where, str(e)))
    if not examples:
        what = path if len(files) == 1 else f"{path} ({len(files)} files)"
        if skipped:
            raise ValueError(
                f"{what}: no examples: all {len(skipped)} records are malformed (first: "
                f"{skipped[0][0]}: {skipped[0][1]})"
            )
        raise ValueError(f"{what}: no examples (the file is empty or blank)")
    return FileSource(examples, files, skipped)
