"""Finding and rebuilding tokenizers: `load_tokenizer` (a model directory or one file),
`tokenizer_from_serialized` (checkpoint metadata) and the side files of a model directory.
"""
from __future__ import annotations

import json
import os

from jaxrl_reason.tokenizers.base import (
    CONFIG_FILE,
    GENERATION_FILE,
    SPECIAL_MAP_FILE,
    HF_FILE,
    KINDS,
    SP_FILE,
    VocabularyMismatchError,
    is_bundle,
    unbundle,
)
from jaxrl_reason.tokenizers.hf import HFTokenizer
from jaxrl_reason.tokenizers.sentencepiece import Tokenizer, NotSentencePiece

_KIND_FILES = dict(zip(KINDS, (SP_FILE, HF_FILE)))


def load_tokenizer(path: str | os.PathLike, *, kind: str | None = None) -> Tokenizer | HFTokenizer:
    """The tokenizer of a model directory (Hugging Face layout), or of one vocabulary file.

    Args:
      path: a directory holding `tokenizer.model` and/or `tokenizer.json` plus optional
        side files (see the module docstring), or a `.model` / `.json` file (read alone).
      kind: "sentencepiece" or "tokenizer.json" to force a kind; None picks
        `tokenizer.model` when present (no optional dependency; Gemma ships both), unless
        tokenizer_config.json adds tokens it lacks and a `tokenizer.json` is there.

    Returns:
      A `Tokenizer` or an `HFTokenizer`, with `source` = `path`.

    Raises:
      FileNotFoundError: `path` does not exist, or holds no vocabulary file (the message
        lists what it holds).
      ValueError: a file is corrupt (named in the message), or the side files do not match
        the vocabulary (VocabularyMismatchError).
      ImportError: a tokenizer.json is needed and `tokenizers` is not installed.
    """
    path = os.fspath(path)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
    if os.path.isfile(path):
        as_json = kind == "tokenizer.json" or (kind is None and path.endswith(".json"))
        return HFTokenizer.load(path) if as_json else Tokenizer.load(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} does not exist")
    present = {k: os.path.isfile(os.path.join(path, f)) for k, f in _KIND_FILES.items()}
    if kind is not None and not present[kind]:
        raise FileNotFoundError(f"{path!r} has no {_KIND_FILES[kind]}")
    if not any(present.values()):
        found = sorted(os.listdir(path))
        raise FileNotFoundError(
            f"{path!r} has no tokenizer: expected {HF_FILE} (Qwen, Llama 3) or {SP_FILE} "
            f"(Gemma, Llama 2); it holds {found[:12] if found else 'nothing'}"
            + (f" (+{len(found) - 12} more)" if len(found) > 12 else ""))
    side = _read_side_files(path)
    if kind != "tokenizer.json" and present["sentencepiece"]:
        file = os.path.join(path, SP_FILE)
        with open(file, "rb") as f:
            data = f.read()
        try:
            return Tokenizer(data, **side, source=path)
        except VocabularyMismatchError:
            if kind is not None or not present["tokenizer.json"]:
                raise
        except NotSentencePiece as e:
            raise ValueError(f"{file!r} is not a SentencePiece model ({e})") from None
    with open(os.path.join(path, HF_FILE), "rb") as f:
        data = f.read()
    return HFTokenizer(data, **side, source=path)


def tokenizer_from_serialized(data: bytes) -> Tokenizer | HFTokenizer:
    """Rebuilds either kind from `tok.serialized` (checkpoint metadata).

    Accepts a bundle, a bare `.model` file (every older checkpoint) or bare `tokenizer.json`
    bytes. Raises ValueError for anything else (ImportError for a tokenizer.json bundle
    without the `tokenizers` library).
    """
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"serialized tokenizer must be bytes, got {type(data).__name__}")
    if is_bundle(data):
        return from_bundle(data)
    if bytes(data[:1]) == b"{":  # a ModelProto starts with a field tag, never "{"
        return HFTokenizer.from_serialized(data)
    return Tokenizer.from_serialized(data)


def from_bundle(data: bytes, want: type | None = None) -> Tokenizer | HFTokenizer:
    kind, vocabulary, side = unbundle(data)
    cls = Tokenizer if kind == Tokenizer.KIND else HFTokenizer
    if want is not None and cls is not want:
        raise ValueError(f"data holds a {kind} tokenizer, not a {want.KIND} one: rebuild it "
                         "with tokenizer_from_serialized(data)")
    tok = cls(vocabulary, **side, source=f"serialized {kind} tokenizer")
    tok._serialized = bytes(data)  # the same bytes again, without compressing anew
    return tok


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path!r} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path!r} must hold a JSON object, got {type(value).__name__}")
    return value


def _read_side_files(directory: str) -> dict[str, dict]:
    """tokenizer_config (with a chat template from chat_template.jinja/.json folded in),
    special_tokens_map and generation_config of a model directory; {} for a missing file."""
    config = _read_json(os.path.join(directory, CONFIG_FILE)) or {}
    if config.get("chat_template") is None:
        jinja_file = os.path.join(directory, "chat_template.jinja")
        from_json = _read_json(os.path.join(directory, "chat_template.json")) or {}
        if os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                config["chat_template"] = f.read()
        elif from_json.get("chat_template") is not None:
            config["chat_template"] = from_json["chat_template"]
    return {
        "tokenizer_config": config,
        "special_tokens_map": _read_json(os.path.join(directory, SPECIAL_MAP_FILE)) or {},
        "generation_config": _read_json(os.path.join(directory, GENERATION_FILE)) or {},
    }
