"""Tokenizers: SentencePiece `.model` and Hugging Face `tokenizer.json` behind one interface.

Two kinds, with the same operations and attributes (`encode`, `encode_batch`, `decode`,
`token_id`, `vocab_size`, `pad_id`/`bos_id`/`eos_id`/`unk_id`, `eos_ids`, `chat_template`,
`serialized`, `save`, `save_dir`, pickling):

- `Tokenizer`: a SentencePiece model (Gemma, Llama 2, and every tokenizer trained here).
- `HFTokenizer`: a `tokenizer.json` (Qwen2.5/Qwen3, Llama 3) read by the Hugging Face
  `tokenizers` library, the format's reference implementation. It is an optional extra:
  `pip install 'jaxrl-reason[hf]'` (with jinja2, which chat templates need).

`load_tokenizer(path)` reads a model directory in the Hugging Face layout: the vocabulary
file (`tokenizer.model` when present, else `tokenizer.json`) and the side files real
checkpoints ship: `tokenizer_config.json` (special tokens, `add_bos_token`, `chat_template`,
`added_tokens_decoder`), `special_tokens_map.json`, `chat_template.jinja` and
`generation_config.json` (its `eos_token_id`, one id or a list, joins `eos_ids`). Text is
split on the model's added tokens first, as Hugging Face does, so `"<|im_end|>"` or
`"<start_of_turn>"` in a prompt is one id. `tokenizer_from_serialized(data)` rebuilds either
kind from `tok.serialized` (what checkpoints store). `apply_chat_template` renders a model's
Jinja chat template as transformers does; `r1_messages` / `r1_chat_prompt` put a problem to a
chat model with the R1 instruction of `jaxrl_reason.data.templates`.

Tokenizers trained here (`train_tokenizer`) are built for reasoning tasks:

- every digit is its own token (`split_digits`), which arithmetic tasks need;
- the reasoning tags `<think>`, `</think>`, `<answer>`, `</answer>` are one token each;
- `byte_fallback` means no text is ever unknown, and with the identity normalizer and
  no whitespace folding `decode(encode(s)) == s` for any text that does not itself contain
  the SentencePiece meta symbol U+2581 ("▁");
- ids 0, 1, 2, 3 are pad, bos, eos, unk;
- training is deterministic: the same texts give byte-identical models.

Models loaded from a file keep their own ids. SentencePiece models often have no pad
piece (`pad_id() == -1`); then `pad_id` falls back to the eos id, or to 0 when the model
has no eos either. `bos_id`/`eos_id`/`unk_id` are -1 when the model has no such token.
Side files override the vocabulary file's own special ids (`"bos_token": null` means none).

`serialized` is the `.model` file itself for a SentencePiece model without side files (the
form of every checkpoint written before model directories were supported); otherwise it is
a bundle: a magic line, then zlib-compressed JSON side files and the vocabulary file.
"""
from __future__ import annotations

import datetime
import functools
import io
import json
import operator
import os
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sentencepiece as spm

from jaxrl_reason.data.templates import TEMPLATES

SPECIAL_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # for tokenizers we train
HF_INSTALL_HINT = "pip install 'jaxrl-reason[hf]'"
SP_FILE, HF_FILE = "tokenizer.model", "tokenizer.json"
KINDS = ("sentencepiece", "tokenizer.json")
_KIND_FILES = dict(zip(KINDS, (SP_FILE, HF_FILE)))

_NUM_META_PIECES = 4  # pad, bos, eos, unk
_NUM_BYTE_PIECES = 256  # <0x00> ... <0xFF> from byte_fallback
_MODEL_TYPES = ("bpe", "unigram")
_DEFAULT_MAX_SENTENCE_LENGTH = 4192  # sentencepiece's default, in bytes

_CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_MAP_FILE = "special_tokens_map.json"
_GENERATION_FILE = "generation_config.json"
_SPECIAL_NAMES = ("bos", "eos", "unk", "pad")
_BUNDLE_MAGIC = b"jaxrl-reason tokenizer bundle v1\n"


class VocabularyMismatchError(ValueError):
    """The side files name tokens or ids that the vocabulary file does not have."""


class _NotSentencePiece(ValueError):
    """Bytes that sentencepiece cannot read as a model."""


# ---------------------------------------------------------------- what both kinds share


class _TokenizerBase:
    """Special tokens from side files, the encode/decode rules, serializing and pickling.

    A subclass sets `vocab_size` and `source`, implements `_encode_texts`, `_decode_ids`,
    `_piece`, `_lookup`, `_native_special_ids`, `_default_add_bos` and `_vocabulary_bytes`,
    and calls `_setup`.
    """

    KIND: str
    FILE: str
    _SPLITS: bool  # whether `encode` must split text on added tokens itself
    source: str
    vocab_size: int

    def _setup(self, own_ids: Mapping[str, int], tokenizer_config: Mapping | None,
               special_tokens_map: Mapping | None, generation_config: Mapping | None) -> None:
        self.tokenizer_config: dict = dict(tokenizer_config or {})
        self.special_tokens_map: dict = dict(special_tokens_map or {})
        self.generation_config: dict = dict(generation_config or {})
        self._serialized: bytes | None = None
        added = self._added_tokens()
        ids = {name: self._special_id(name, own_ids.get(name, -1)) for name in _SPECIAL_NAMES}
        self.bos_id: int = ids["bos"]
        self.eos_id: int = ids["eos"]
        self.unk_id: int = ids["unk"]
        self.pad_id: int = ids["pad"] if ids["pad"] >= 0 else max(self.eos_id, 0)
        for name in _SPECIAL_NAMES:  # the token strings, for chat templates
            setattr(self, f"{name}_token", self._piece(ids[name]) if ids[name] >= 0 else None)
        stops = self._generation_ids("eos_token_id")
        self.eos_ids: tuple[int, ...] = tuple(
            dict.fromkeys(i for i in (self.eos_id, *stops) if i >= 0))
        self.special_ids: frozenset[int] = frozenset(
            self._native_special_ids() | {i for i, (_, special) in added.items() if special})
        self.add_bos_token: bool = _flag(self.tokenizer_config, "add_bos_token",
                                         self._default_add_bos(), self.source)
        self.add_eos_token: bool = _flag(self.tokenizer_config, "add_eos_token", False,
                                         self.source)
        self.chat_template: str | None = _template_text(
            self.tokenizer_config.get("chat_template"), self.source)
        # SentencePiece knows no added tokens: split text on them ourselves, as HF does
        # (a chat template writes "<bos>", a control piece sentencepiece would spell out).
        named = [getattr(self, f"{n}_token") for n in _SPECIAL_NAMES]
        self._split_tokens = {} if not (self._SPLITS and self._has_side_files()) else {
            t: self._lookup(t) for t in [c for c, _ in added.values()] + [t for t in named if t]}

    def _has_side_files(self) -> bool:
        return bool(self.tokenizer_config or self.special_tokens_map or self.generation_config)

    def _added_tokens(self) -> dict[int, tuple[str, bool]]:
        """`added_tokens_decoder` of tokenizer_config.json, checked against the vocabulary."""
        decoder = self.tokenizer_config.get("added_tokens_decoder") or {}
        where = f"{self.source}: {_CONFIG_FILE} added_tokens_decoder"
        if not isinstance(decoder, Mapping):
            raise ValueError(f"{where} must be an object, got {type(decoder).__name__}")
        added = {}
        for key, entry in decoder.items():
            content = _token_text(entry, f"{where}[{key!r}]")
            if not str(key).isdigit() or content is None:
                raise ValueError(f"{where}: bad entry {key!r}: {entry!r}")
            found = self._lookup(content)
            if found != int(key):
                has = "lacks it" if found is None else f"has it as id {found}"
                raise VocabularyMismatchError(
                    f"{where} has {content!r} as id {key}, but {self.FILE} {has}: the "
                    "side files and the vocabulary file come from different tokenizers")
            added[int(key)] = (content, bool(isinstance(entry, Mapping) and entry.get("special")))
        return added

    def _special_id(self, name: str, own: int) -> int:
        key = f"{name}_token"
        for file, config in ((_CONFIG_FILE, self.tokenizer_config),
                             (_SPECIAL_MAP_FILE, self.special_tokens_map)):
            if key not in config:
                continue
            token = _token_text(config[key], f"{self.source}: {file} {key}")
            if token is None:
                return -1
            i = self._lookup(token)
            if i is None:
                raise VocabularyMismatchError(
                    f"{self.source}: {file} names {key} {token!r}, which is not in the "
                    f"vocabulary of {self.FILE}")
            return i
        if own >= 0:
            return own
        from_generation = self._generation_ids(f"{name}_token_id")
        return from_generation[0] if from_generation else -1

    def _generation_ids(self, key: str) -> list[int]:
        value = self.generation_config.get(key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.vocab_size:
                raise VocabularyMismatchError(
                    f"{self.source}: {_GENERATION_FILE} {key} = {value!r}: each id must be an "
                    f"int in [0, {self.vocab_size})")
        return values

    # ------------------------------------------------------------ the operations

    def _check_special(self, add_bos: bool, add_eos: bool) -> None:
        if add_bos and self.bos_id < 0:
            raise ValueError("add_bos=True but this tokenizer's model has no bos piece")
        if add_eos and self.eos_id < 0:
            raise ValueError("add_eos=True but this tokenizer's model has no eos piece")

    def _encode_split(self, text: str) -> list[int]:
        """Ids of `text`, its added tokens (from side files) mapped to their ids directly."""
        if not self._split_tokens:
            return self._encode_texts([text])[0]
        pattern = self.__dict__.get("_split_re")
        if pattern is None:
            alternatives = sorted(self._split_tokens, key=len, reverse=True)
            pattern = self._split_re = re.compile("|".join(map(re.escape, alternatives)))
        ids, start = [], 0
        for match in pattern.finditer(text):
            if match.start() > start:
                ids += self._encode_texts([text[start:match.start()]])[0]
            ids.append(self._split_tokens[match.group()])
            start = match.end()
        if start < len(text):
            ids += self._encode_texts([text[start:]])[0]
        return ids

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids (list of python ints) of `text`, optionally with bos first / eos last.

        Text is encoded as it is: a chat template's output already holds the bos token
        when the model wants one, so encode it with `add_bos=False`; for plain text use
        `add_bos=tok.add_bos_token` (the model's convention).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        self._check_special(add_bos, add_eos)
        return [self.bos_id] * add_bos + self._encode_split(text) + [self.eos_id] * add_eos

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """`encode` of each text: a list of `len(texts)` ragged lists of python ints."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"encode_batch: texts[{i}] is {type(text).__name__}, not str")
        self._check_special(add_bos, add_eos)
        rows = ([self._encode_split(t) for t in texts] if self._split_tokens
                else self._encode_texts(texts))
        return [[self.bos_id] * add_bos + r + [self.eos_id] * add_eos for r in rows]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of a 1-D sequence of ids (list or integer array of shape [L]).

        Pad and bos ids are dropped and decoding stops at the first id of `eos_ids`, so a
        padded completion row decodes to just its text. `skip_special_tokens` also drops
        every special token (`special_ids`, e.g. `<|im_start|>`; not `<think>`).
        """
        stops = set(self.eos_ids)
        dropped = {self.pad_id, self.bos_id} | (self.special_ids if skip_special_tokens else set())
        out = []
        for position, raw in enumerate(ids):
            try:
                i = operator.index(raw)
            except TypeError:
                raise TypeError(
                    f"decode: ids[{position}] is {type(raw).__name__}, not an integer"
                ) from None
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"decode: ids[{position}] = {i} is outside [0, {self.vocab_size})"
                )
            if i in stops:
                break
            if i not in dropped:
                out.append(i)
        return self._decode_ids(out)

    def token_id(self, piece: str) -> int:
        """Id of the vocabulary piece `piece`, e.g. `token_id("</answer>")`.

        Raises ValueError if the piece is not in the vocabulary (never returns unk for it).
        """
        i = self._lookup(piece)
        if i is None:
            raise ValueError(f"piece {piece!r} is not in the tokenizer's vocabulary")
        return i

    # ------------------------------------------------------------ storing

    @property
    def serialized(self) -> bytes:
        """Bytes that `tokenizer_from_serialized` (or `from_serialized`) rebuilds this from."""
        if self._serialized is None:
            self._serialized = _bundle(self.KIND, self._vocabulary_bytes(), {
                "tokenizer_config": self.tokenizer_config,
                "special_tokens_map": self.special_tokens_map,
                "generation_config": self.generation_config,
            })
        return self._serialized

    def save(self, path: str | os.PathLike) -> None:
        """Writes the vocabulary file (`.model` or `tokenizer.json` bytes) to `path`,
        atomically: a process killed mid-write leaves no truncated tokenizer behind."""
        _write_atomic(path, self._vocabulary_bytes())

    def save_dir(self, directory: str | os.PathLike) -> None:
        """Writes the model-directory form that `load_tokenizer` and Hugging Face read.

        The vocabulary file (`tokenizer.model` or `tokenizer.json`), `tokenizer_config.json`
        (the loaded one unchanged; without one, the special tokens and `add_bos_token`),
        `special_tokens_map.json` when there was one, and `generation_config.json` when
        there was one and `directory` has none (a model exporter may write its own).
        """
        os.makedirs(directory, exist_ok=True)
        self.save(os.path.join(directory, self.FILE))
        config = self.tokenizer_config or {
            **{f"{n}_token": getattr(self, f"{n}_token") for n in _SPECIAL_NAMES
               if getattr(self, f"{n}_token") is not None},
            "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token}
        files = {_CONFIG_FILE: config, _SPECIAL_MAP_FILE: self.special_tokens_map}
        if not os.path.exists(os.path.join(directory, _GENERATION_FILE)):
            files[_GENERATION_FILE] = self.generation_config
        for name, content in files.items():
            if content:
                _write_atomic(os.path.join(directory, name),
                              json.dumps(content, indent=2, ensure_ascii=False).encode())

    def __reduce__(self):
        return (tokenizer_from_serialized, (self.serialized,))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )


# ---------------------------------------------------------------- SentencePiece


class Tokenizer(_TokenizerBase):
    """A SentencePiece model with the few operations the library needs.

    Build one with `Tokenizer.load(path)`, `Tokenizer.from_serialized(data)`,
    `load_tokenizer(model_dir)` or `train_tokenizer(...)`. Ids are python ints in
    `[0, vocab_size)`.

    Attributes:
      serialized: the `.model` file contents (a serialized `ModelProto`), bytes; a bundle
        with the side files when it was loaded from a model directory.
      vocab_size: number of pieces, int.
      pad_id: the model's pad id; if it has none, its eos id; if neither, 0.
      bos_id, eos_id, unk_id: the model's ids, -1 when the model has no such piece.
      eos_ids: ids that end a completion (eos_id and generation_config's), tuple of ints.
      add_bos_token: whether the model expects a bos first (tokenizer_config's, else
        whether it has a bos piece).
      chat_template: the Jinja chat template (str) or None.
      special_ids: ids of control pieces and of tokens the side files mark special.
      tokenizer_config, special_tokens_map, generation_config: the side files (dicts,
        empty when there were none).
    """

    KIND, FILE, _SPLITS = "sentencepiece", SP_FILE, True

    def __init__(self, serialized: bytes, *, tokenizer_config: Mapping | None = None,
                 special_tokens_map: Mapping | None = None,
                 generation_config: Mapping | None = None, source: str = "SentencePiece model"):
        """Wraps `.model` file contents (bytes) and optional side files (dicts)."""
        if not isinstance(serialized, (bytes, bytearray)):
            raise TypeError(
                f"Tokenizer needs the serialized model as bytes, got {type(serialized).__name__}"
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(serialized))
        except (RuntimeError, OSError) as e:
            raise _NotSentencePiece(f"data is not a SentencePiece model: {e}") from None
        self._sp = processor
        self._model = bytes(serialized)
        self.source = source
        self.vocab_size: int = processor.get_piece_size()
        own = {"bos": processor.bos_id(), "eos": processor.eos_id(),
               "unk": processor.unk_id(), "pad": processor.pad_id()}
        self._setup(own, tokenizer_config, special_tokens_map, generation_config)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Reads a SentencePiece `.model` file; ValueError if it is not one."""
        with open(path, "rb") as f:
            data = f.read()
        try:
            return cls(data, source=os.fspath(path))
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)!r} is not a SentencePiece model ({e})") from None

    @classmethod
    def from_serialized(cls, data: bytes) -> "Tokenizer":
        """Builds a tokenizer from `tok.serialized` (`.model` file contents or a bundle)."""
        return _from_bundle(data, cls) if _is_bundle(data) else cls(data)

    @property
    def serialized(self) -> bytes:
        return super().serialized if self._has_side_files() else self._model

    def _vocabulary_bytes(self) -> bytes:
        return self._model

    def __reduce__(self):
        return (Tokenizer.from_serialized, (self.serialized,))

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts, num_threads=1)

    def _decode_ids(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def _piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)

    def _lookup(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)
        return i if self._sp.id_to_piece(i) == piece else None

    def _native_special_ids(self) -> set[int]:
        return {i for i in range(self.vocab_size) if self._sp.is_control(i)}

    def _default_add_bos(self) -> bool:
        return self.bos_id >= 0


# ---------------------------------------------------------------- tokenizer.json


def _import_hf_tokenizers(source: str):
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            f"{source}: reading a tokenizer.json needs the Hugging Face `tokenizers` "
            f"library: {HF_INSTALL_HINT}") from None
    return tokenizers


class HFTokenizer(_TokenizerBase):
    """A `tokenizer.json` (Qwen, Llama 3, ...) read by the Hugging Face `tokenizers` library.

    Same operations and attributes as `Tokenizer` (see there). Build one with
    `load_tokenizer(model_dir)`, `HFTokenizer.load(path)` or `tokenizer_from_serialized`.
    `encode` never runs the file's post-processor (Llama 3's adds `<|begin_of_text|>`):
    bos and eos come only from `add_bos`/`add_eos`; `add_bos_token` says whether the model
    expects a bos (tokenizer_config's, else whether the post-processor adds one).
    `vocab_size` is the largest id + 1, added tokens included.
    """

    KIND, FILE, _SPLITS = "tokenizer.json", HF_FILE, False  # the library splits itself

    def __init__(self, tokenizer_json: bytes | str, *, tokenizer_config: Mapping | None = None,
                 special_tokens_map: Mapping | None = None,
                 generation_config: Mapping | None = None, source: str = "tokenizer.json"):
        """Wraps `tokenizer.json` contents (bytes or str) and optional side files (dicts)."""
        tokenizers = _import_hf_tokenizers(source)
        if isinstance(tokenizer_json, (bytes, bytearray)):
            try:
                tokenizer_json = bytes(tokenizer_json).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{source}: not a valid tokenizer.json (not UTF-8: {e})") from None
        if not isinstance(tokenizer_json, str):
            raise TypeError(f"HFTokenizer needs tokenizer.json contents as bytes or str, got "
                            f"{type(tokenizer_json).__name__}")
        try:
            self._tk = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # the library raises a bare Exception for malformed files
            raise ValueError(f"{source}: not a valid tokenizer.json ({e})") from None
        self._json = tokenizer_json.encode("utf-8")
        self.source = source
        vocab = self._tk.get_vocab(with_added_tokens=True)
        if not vocab:
            raise ValueError(f"{source}: tokenizer.json has an empty vocabulary")
        self.vocab_size: int = max(vocab.values()) + 1
        unk = getattr(self._tk.model, "unk_token", None)
        own_unk = self._tk.token_to_id(unk) if isinstance(unk, str) else None
        self._setup({"unk": -1 if own_unk is None else own_unk},
                    tokenizer_config, special_tokens_map, generation_config)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HFTokenizer":
        """Reads a `tokenizer.json` file alone (no side files); ValueError if it is not one."""
        with open(path, "rb") as f:
            return cls(f.read(), source=os.fspath(path))

    @classmethod
    def from_serialized(cls, data: bytes) -> "HFTokenizer":
        """Builds a tokenizer from `tok.serialized` (a bundle) or `tokenizer.json` bytes."""
        if _is_bundle(data):
            return _from_bundle(data, cls)
        return cls(data, source="serialized tokenizer.json")

    def _vocabulary_bytes(self) -> bytes:
        return self._json

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        if len(texts) == 1:
            return [self._tk.encode(texts[0], add_special_tokens=False).ids]
        return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=False)]

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tk.decode(ids, skip_special_tokens=False)

    def _piece(self, i: int) -> str | None:
        return self._tk.id_to_token(i)

    def _lookup(self, piece: str) -> int | None:
        return self._tk.token_to_id(piece)

    def _native_special_ids(self) -> set[int]:
        return {i for i, t in self._tk.get_added_tokens_decoder().items() if t.special}

    def _default_add_bos(self) -> bool:
        ids = self._tk.encode("", add_special_tokens=True).ids
        return self.bos_id >= 0 and ids[:1] == [self.bos_id]


# ---------------------------------------------------------------- loading and rebuilding


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
        except _NotSentencePiece as e:
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
    if _is_bundle(data):
        return _from_bundle(data)
    if bytes(data[:1]) == b"{":  # a ModelProto starts with a field tag, never "{"
        return HFTokenizer.from_serialized(data)
    return Tokenizer.from_serialized(data)


def _bundle(kind: str, vocabulary: bytes, side: Mapping[str, Any]) -> bytes:
    header = json.dumps({"kind": kind, **side}, sort_keys=True, separators=(",", ":"))
    return _BUNDLE_MAGIC + zlib.compress(header.encode("ascii") + b"\n" + vocabulary, 6)


def _from_bundle(data: bytes, want: type | None = None) -> Tokenizer | HFTokenizer:
    kind, vocabulary, side = _unbundle(data)
    cls = Tokenizer if kind == Tokenizer.KIND else HFTokenizer
    if want is not None and cls is not want:
        raise ValueError(f"data holds a {kind} tokenizer, not a {want.KIND} one: rebuild it "
                         "with tokenizer_from_serialized(data)")
    tok = cls(vocabulary, **side, source=f"serialized {kind} tokenizer")
    tok._serialized = bytes(data)  # the same bytes again, without compressing anew
    return tok


def _is_bundle(data: bytes) -> bool:
    return isinstance(data, (bytes, bytearray)) and data[:len(_BUNDLE_MAGIC)] == _BUNDLE_MAGIC


def _unbundle(data: bytes) -> tuple[str, bytes, dict[str, dict]]:
    try:
        header, vocabulary = zlib.decompress(bytes(data[len(_BUNDLE_MAGIC):])).split(b"\n", 1)
        fields = json.loads(header)
    except (zlib.error, ValueError) as e:
        raise ValueError(f"corrupt serialized tokenizer bundle ({type(e).__name__}: {e})") from None
    side = ("tokenizer_config", "special_tokens_map", "generation_config")
    if not isinstance(fields, dict) or fields.get("kind") not in KINDS or not all(
            isinstance(fields.get(k), dict) for k in side):
        raise ValueError("corrupt serialized tokenizer bundle (bad header)")
    return fields["kind"], vocabulary, {k: fields[k] for k in side}


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
    config = _read_json(os.path.join(directory, _CONFIG_FILE)) or {}
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
        "special_tokens_map": _read_json(os.path.join(directory, _SPECIAL_MAP_FILE)) or {},
        "generation_config": _read_json(os.path.join(directory, _GENERATION_FILE)) or {},
    }


def _token_text(value: Any, where: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a str, {"content": str} or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{where} must be a string, {{\"content\": string}} or null, got {value!r}")


def _flag(config: Mapping, key: str, default: bool, source: str) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {_CONFIG_FILE} {key} must be true or false, got {value!r}")
    return value


def _template_text(value: Any, source: str) -> str | None:
    """chat_template as a str: HF also allows a list of {"name", "template"} (use "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, Mapping) for t in value):
        named = {t.get("name"): t.get("template") for t in value}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(f"{source}: chat_template must be a string or a list of named templates "
                     "with a 'default' one")


def _write_atomic(path: str | os.PathLike, data: bytes) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------- chat templates


def _import_jinja2():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise ImportError(f"chat templates need jinja2: {HF_INSTALL_HINT}") from None
    return jinja2


@functools.lru_cache(maxsize=16)
def _compiled_template(text: str):
    """The template compiled as transformers does: sandboxed, trim/lstrip blocks, loop
    controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text."""
    jinja2 = _import_jinja2()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(text)


def apply_chat_template(tokenizer: str | os.PathLike | Tokenizer | HFTokenizer,
                        messages: Sequence[Mapping[str, Any]],
                        add_generation_prompt: bool = True, **variables: Any) -> str:
    """Renders a model's Jinja chat template for `messages`, as transformers does.

    Args:
      tokenizer: a `Tokenizer`/`HFTokenizer` or a model directory (`load_tokenizer`).
      messages: a non-empty list of dicts with "role" ("system", "user", "assistant", ...)
        and "content" (usually a str).
      add_generation_prompt: end with the header of an assistant turn (to sample from).
      **variables: more template variables, e.g. `enable_thinking=False` (Qwen3),
        `tools=[...]`, `date_string="26 Jul 2024"` (Llama 3).

    Returns:
      The prompt text. It holds the bos token when the template writes one (Gemma,
      Llama 3), so encode it with `add_bos=False`.

    Raises:
      ValueError: the tokenizer has no chat template, the template is not valid Jinja, or
        it rejects the conversation (its `raise_exception` message, e.g. Gemma's "Conversation
        roles must alternate"). TypeError: malformed messages. ImportError: no jinja2.
    """
    tok = tokenizer if isinstance(tokenizer, _TokenizerBase) else load_tokenizer(tokenizer)
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TypeError(f"messages[{i}] must be a dict with a str 'role', got {m!r}")
    if tok.chat_template is None:
        raise ValueError(
            f"{tok.source} has no chat template ({_CONFIG_FILE} has no 'chat_template' and "
            "there is no chat_template.jinja): a base model takes a plain prompt template "
            "(jaxrl_reason.data.templates) instead")
    jinja2 = _import_jinja2()
    context = {f"{n}_token": getattr(tok, f"{n}_token") for n in _SPECIAL_NAMES}
    context = {k: v for k, v in context.items() if v is not None}
    context.update(tools=None, documents=None)
    context.update(variables)
    try:
        template = _compiled_template(tok.chat_template)
        return template.render(messages=[dict(m) for m in messages],
                               add_generation_prompt=add_generation_prompt, **context)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template of {tok.source}: {type(e).__name__}: {e}") from None


def r1_instruction() -> str:
    """The R1 instruction (reason in <think> </think>, answer in <answer> </answer>): the
    "r1" prompt template of `jaxrl_reason.data.templates` without its User/Assistant frame."""
    head, frame, _ = TEMPLATES["r1"].partition("\nUser: {prompt}")
    if not frame:
        raise RuntimeError("TEMPLATES['r1'] no longer ends in '\\nUser: {prompt}...'; "
                           "update r1_instruction")
    return head


def r1_messages(problem: str, *, system: bool = True) -> list[dict[str, str]]:
    """A chat asking for `<think>...</think><answer>...</answer>` about `problem`.

    With `system=True` the R1 instruction is the system message and the problem the user
    message (the Open-R1 convention); with False both go in one user message (for models
    whose template rejects a system role, e.g. Gemma 2, or that were trained without one).
    """
    if not isinstance(problem, str):
        raise TypeError(f"problem must be a str, got {type(problem).__name__}")
    if system:
        return [{"role": "system", "content": r1_instruction()},
                {"role": "user", "content": problem}]
    return [{"role": "user", "content": f"{r1_instruction()}\n\n{problem}"}]


def r1_chat_prompt(tokenizer: str | os.PathLike | Tokenizer | HFTokenizer, problem: str, *,
                   system: bool = True) -> str:
    """`apply_chat_template(tokenizer, r1_messages(problem, system=system))`: the prompt
    text, ending with the assistant header; encode it with `add_bos=False`."""
    return apply_chat_template(tokenizer, r1_messages(problem, system=system),
                               add_generation_prompt=True)


# ---------------------------------------------------------------- training


def _check_symbols(extra_symbols: Sequence[str]) -> list[str]:
    symbols = list(extra_symbols)
    reserved = {"<pad>", "<s>", "</s>", "<unk>"}
    for i, s in enumerate(symbols):
        if not isinstance(s, str) or not s:
            raise ValueError(f"extra_symbols[{i}] must be a non-empty str, got {s!r}")
        if s in reserved:
            raise ValueError(f"extra_symbols[{i}] = {s!r} is reserved for pad/bos/eos/unk")
    if len(set(symbols)) != len(symbols):
        raise ValueError(f"extra_symbols has duplicates: {symbols}")
    return symbols


def _check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of str, not a single str")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
    if not any(texts):
        raise ValueError("train_tokenizer needs at least one non-empty text")
    return texts


def _distinct_chars(texts: list[str], symbols: list[str]) -> set[str]:
    """Characters SentencePiece must keep as pieces: those outside the extra symbols."""
    pattern = re.compile("|".join(re.escape(s) for s in sorted(symbols, key=len, reverse=True)))
    joined = "".join(pattern.sub("", t) if symbols else t for t in texts)
    return set(joined.replace(" ", "\u2581"))


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    model_type: str = "bpe",
    extra_symbols: Sequence[str] = SPECIAL_TAGS,
) -> Tokenizer:
    """Trains a SentencePiece tokenizer in memory, deterministically.

    Args:
      texts: training texts (any iterable of str; read once into memory).
      vocab_size: total number of pieces. It must hold the 4 pad/bos/eos/unk pieces,
        `extra_symbols`, the 256 byte pieces and every distinct character of `texts`;
        BPE also cannot learn more merges than the texts contain.
      model_type: "bpe" or "unigram".
      extra_symbols: strings that always become exactly one token each.

    Returns:
      A `Tokenizer` with pad/bos/eos/unk at ids 0/1/2/3, `extra_symbols` from id 4 on,
      digits split, byte fallback, and exact round-trips of text.

    Raises:
      ValueError: vocab_size too small or too large for the texts, a bad model_type or
        extra_symbols, no non-empty texts.
    """
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"model_type must be one of {_MODEL_TYPES}, got {model_type!r}")
    symbols = _check_symbols(extra_symbols)
    texts = _check_texts(texts)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    chars = _distinct_chars(texts, symbols)
    needed = _NUM_META_PIECES + len(symbols) + _NUM_BYTE_PIECES + len(chars)
    if vocab_size < needed:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: it must hold 4 pad/bos/eos/unk pieces, "
            f"{len(symbols)} extra symbols, {_NUM_BYTE_PIECES} byte pieces and the "
            f"{len(chars)} distinct characters of the texts ({needed} in all)"
        )
    max_len = max(len(t.encode("utf-8")) for t in texts) + 1
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            user_defined_symbols=symbols,
            split_digits=True,
            byte_fallback=True,
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            # Determinism: one thread, every sentence, in the given order.
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=max(max_len, _DEFAULT_MAX_SENTENCE_LENGTH),
            minloglevel=2,
        )
    except RuntimeError as e:
        message = str(e)
        if "Vocabulary size" in message:
            raise ValueError(
                f"vocab_size={vocab_size} does not fit these texts: {message.split('] ')[-1]}"
            ) from None
        raise
    return Tokenizer(model.getvalue())
