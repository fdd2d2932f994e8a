"""What both tokenizer kinds share: special tokens from side files, the encode/decode
rules, the serialization bundle, saving and pickling.

A subclass (`sentencepiece.Tokenizer`, `hf.HFTokenizer`) wraps one vocabulary file format;
the side files (`tokenizer_config.json`, `special_tokens_map.json`, `generation_config.json`)
are read the same way for both.

`serialized` is a bundle: a magic line, then zlib-compressed JSON side files and the
vocabulary file (a SentencePiece model without side files serializes as its bare `.model`).
"""
from __future__ import annotations

import json
import operator
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

HF_INSTALL_HINT = "pip install 'jaxrl-reason[hf]'"
SP_FILE, HF_FILE = "tokenizer.model", "tokenizer.json"
KINDS = ("sentencepiece", "tokenizer.json")

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_MAP_FILE = "special_tokens_map.json"
GENERATION_FILE = "generation_config.json"
SPECIAL_NAMES = ("bos", "eos", "unk", "pad")
_BUNDLE_MAGIC = b"jaxrl-reason tokenizer bundle v1\n"


class VocabularyMismatchError(ValueError):
    """The side files name tokens or ids that the vocabulary file does not have."""


class TokenizerBase:
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
        ids = {name: self._special_id(name, own_ids.get(name, -1)) for name in SPECIAL_NAMES}
        self.bos_id: int = ids["bos"]
        self.eos_id: int = ids["eos"]
        self.unk_id: int = ids["unk"]
        self.pad_id: int = ids["pad"] if ids["pad"] >= 0 else max(self.eos_id, 0)
        for name in SPECIAL_NAMES:  # the token strings, for chat templates
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
        named = [getattr(self, f"{n}_token") for n in SPECIAL_NAMES]
        self._split_tokens = {} if not (self._SPLITS and self._has_side_files()) else {
            t: self._lookup(t) for t in [c for c, _ in added.values()] + [t for t in named if t]}

    def _has_side_files(self) -> bool:
        return bool(self.tokenizer_config or self.special_tokens_map or self.generation_config)

    def _added_tokens(self) -> dict[int, tuple[str, bool]]:
        """`added_tokens_decoder` of tokenizer_config.json, checked against the vocabulary."""
        decoder = self.tokenizer_config.get("added_tokens_decoder") or {}
        where = f"{self.source}: {CONFIG_FILE} added_tokens_decoder"
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
        for file, config in ((CONFIG_FILE, self.tokenizer_config),
                             (SPECIAL_MAP_FILE, self.special_tokens_map)):
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
                    f"{self.source}: {GENERATION_FILE} {key} = {value!r}: each id must be an "
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
            **{f"{n}_token": getattr(self, f"{n}_token") for n in SPECIAL_NAMES
               if getattr(self, f"{n}_token") is not None},
            "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token}
        files = {CONFIG_FILE: config, SPECIAL_MAP_FILE: self.special_tokens_map}
        if not os.path.exists(os.path.join(directory, GENERATION_FILE)):
            files[GENERATION_FILE] = self.generation_config
        for name, content in files.items():
            if content:
                _write_atomic(os.path.join(directory, name),
                              json.dumps(content, indent=2, ensure_ascii=False).encode())

    def __reduce__(self):
        from jaxrl_reason.tokenizers.files import tokenizer_from_serialized  # files imports us
        return (tokenizer_from_serialized, (self.serialized,))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )


# ---------------------------------------------------------------- the serialization bundle


def _bundle(kind: str, vocabulary: bytes, side: Mapping[str, Any]) -> bytes:
    header = json.dumps({"kind": kind, **side}, sort_keys=True, separators=(",", ":"))
    return _BUNDLE_MAGIC + zlib.compress(header.encode("ascii") + b"\n" + vocabulary, 6)


def is_bundle(data: bytes) -> bool:
    return isinstance(data, (bytes, bytearray)) and data[:len(_BUNDLE_MAGIC)] == _BUNDLE_MAGIC


def unbundle(data: bytes) -> tuple[str, bytes, dict[str, dict]]:
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


# ---------------------------------------------------------------- side-file values


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
        raise ValueError(f"{source}: {CONFIG_FILE} {key} must be true or false, got {value!r}")
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
