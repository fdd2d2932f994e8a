"""SentencePiece tokenizers: load any `.model` file, or train a small one in memory.

Tokenizers trained here (`train_tokenizer`) are built for reasoning tasks:

- every digit is its own token (`split_digits`), which arithmetic tasks need;
- the reasoning tags `<think>`, `</think>`, `<answer>`, `</answer>` are one token each;
- `byte_fallback` means no text is ever unknown, and with the identity normalizer and
  no whitespace folding `decode(encode(s)) == s` for any text that does not itself contain
  the SentencePiece meta symbol U+2581 ("▁");
- ids 0, 1, 2, 3 are pad, bos, eos, unk;
- training is deterministic: the same texts give byte-identical models.

Models loaded from a file keep their own ids. SentencePiece models often have no pad
piece (`pad_id() == -1`); then `Tokenizer.pad_id` falls back to the eos id, or to 0 when
the model has no eos either. `bos_id`/`eos_id` are -1 when the model has no such piece.
"""
from __future__ import annotations

import io
import operator
import os
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm

SPECIAL_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # for tokenizers we train

_NUM_META_PIECES = 4  # pad, bos, eos, unk
_NUM_BYTE_PIECES = 256  # <0x00> ... <0xFF> from byte_fallback
_MODEL_TYPES = ("bpe", "unigram")
_DEFAULT_MAX_SENTENCE_LENGTH = 4192  # sentencepiece's default, in bytes


class Tokenizer:
    """A SentencePiece model with the few operations the library needs.

    Build one with `Tokenizer.load(path)`, `Tokenizer.from_serialized(data)` or
    `train_tokenizer(...)`. Ids are python ints in `[0, vocab_size)`.

    Attributes:
      serialized: the `.model` file contents (a serialized `ModelProto`), bytes.
      vocab_size: number of pieces, int.
      pad_id: the model's pad id; if it has none, its eos id; if neither, 0.
      bos_id, eos_id, unk_id: the model's ids, -1 when the model has no such piece.
    """

    def __init__(self, serialized: bytes):
        """Wraps a serialized SentencePiece model (bytes); prefer `from_serialized`."""
        if not isinstance(serialized, (bytes, bytearray)):
            raise TypeError(
                f"Tokenizer needs the serialized model as bytes, got {type(serialized).__name__}"
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(serialized))
        except (RuntimeError, OSError) as e:
            raise ValueError(f"data is not a SentencePiece model: {e}") from None
        self._sp = processor
        self.serialized: bytes = bytes(serialized)
        self.vocab_size: int = processor.get_piece_size()
        self.bos_id: int = processor.bos_id()
        self.eos_id: int = processor.eos_id()
        self.unk_id: int = processor.unk_id()
        pad = processor.pad_id()
        self.pad_id: int = pad if pad >= 0 else (self.eos_id if self.eos_id >= 0 else 0)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Reads a SentencePiece `.model` file; ValueError if it is not one."""
        with open(path, "rb") as f:
            data = f.read()
        try:
            return cls(data)
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)!r} is not a SentencePiece model ({e})") from None

    @classmethod
    def from_serialized(cls, data: bytes) -> "Tokenizer":
        """Builds a tokenizer from `.model` file contents (bytes), e.g. `tok.serialized`."""
        return cls(data)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the `.model` bytes to `path` (loadable by any SentencePiece reader),
        atomically: a process killed mid-write leaves no truncated tokenizer behind."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "wb") as f:
            f.write(self.serialized)
        os.replace(tmp, path)

    def __reduce__(self):
        return (Tokenizer.from_serialized, (self.serialized,))

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )

    def _check_special(self, add_bos: bool, add_eos: bool) -> None:
        if add_bos and self.bos_id < 0:
            raise ValueError("add_bos=True but this tokenizer's model has no bos piece")
        if add_eos and self.eos_id < 0:
            raise ValueError("add_eos=True but this tokenizer's model has no eos piece")

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids (list of python ints) of `text`, optionally with bos first / eos last."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        self._check_special(add_bos, add_eos)
        return self._sp.encode(text, add_bos=add_bos, add_eos=add_eos)

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """`encode` of each text: a list of `len(texts)` ragged lists of python ints."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"encode_batch: texts[{i}] is {type(text).__name__}, not str")
        self._check_special(add_bos, add_eos)
        return self._sp.encode(texts, add_bos=add_bos, add_eos=add_eos, num_threads=1)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a 1-D sequence of ids (list or integer array of shape [L]).

        Pad and bos ids are dropped and decoding stops at the first eos, so a padded
        completion row decodes to just its text.
        """
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
            if i == self.eos_id:
                break
            if i == self.pad_id or i == self.bos_id:
                continue
            out.append(i)
        return self._sp.decode(out)

    def token_id(self, piece: str) -> int:
        """Id of the vocabulary piece `piece`, e.g. `token_id("</answer>")`.

        Raises ValueError if the piece is not in the vocabulary (never returns unk for it).
        """
        i = self._sp.piece_to_id(piece)
        if self._sp.id_to_piece(i) != piece:
            raise ValueError(f"piece {piece!r} is not in the tokenizer's vocabulary")
        return i


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
