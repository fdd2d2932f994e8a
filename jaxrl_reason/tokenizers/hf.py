"""`tokenizer.json` tokenizers (Qwen2.5/Qwen3, Llama 3): `HFTokenizer`.

The file is read by the Hugging Face `tokenizers` library, the format's reference
implementation. It is an optional extra: `pip install 'jaxrl-reason[hf]'`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from jaxrl_reason.tokenizers.base import HF_FILE, HF_INSTALL_HINT, is_bundle, TokenizerBase


def _import_hf_tokenizers(source: str):
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            f"{source}: reading a tokenizer.json needs the Hugging Face `tokenizers` "
            f"library: {HF_INSTALL_HINT}") from None
    return tokenizers


class HFTokenizer(TokenizerBase):
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
        from jaxrl_reason.tokenizers.files import from_bundle  # files imports us
        if is_bundle(data):
            return from_bundle(data, cls)
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
