"""SentencePiece `.model` tokenizers: `Tokenizer` (Gemma, Llama 2) and `train_tokenizer`.

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
has no eos either.
"""
from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence

import sentencepiece as spm

from jaxrl_reason.tokenizers.base import SP_FILE, is_bundle, TokenizerBase

SPECIAL_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # for tokenizers we train

_NUM_META_PIECES = 4  # pad, bos, eos, unk
_NUM_BYTE_PIECES = 256  # <0x00> ... <0xFF> from byte_fallback
_MODEL_TYPES = ("bpe", "unigram")
_DEFAULT_MAX_SENTENCE_LENGTH = 4192  # sentencepiece's default, in bytes


class NotSentencePiece(ValueError):
    """Bytes that sentencepiece cannot read as a model."""


class Tokenizer(TokenizerBase):
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
            raise NotSentencePiece(f"data is not a SentencePiece model: {e}") from None
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
        from jaxrl_reason.tokenizers.files import from_bundle  # files imports us
        return from_bundle(data, cls) if is_bundle(data) else cls(data)

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
