"""`tokenizer.json` tokenizers (Qwen2.5/Qwen3, Llama 3): `HFTokenizer`.

The file is read by the Hugging Face `tokenizers` library, the format's reference
implementation. It is an optional extra: `pip install 'jaxrl-reason[hf]'`.
"""
from __future__ import annotations

import json
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


# SentencePiece piece types (sentencepiece_model.proto).
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_BYTE = 1, 2, 3, 4, 6
_SP_BPE = 2
_SP_WORD = "▁*[^▁]+|▁+"  # a word: a run of spaces ("▁") and the text up to the next space


def _sp_proto(model: bytes):
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:  # it needs protobuf
        raise ImportError(f"reading a SentencePiece model's settings needs protobuf ({e})") from None
    return sentencepiece_model_pb2.ModelProto.FromString(model)


def sentencepiece_tokenizer_json(model: bytes, *, add_bos: bool) -> str | None:
    """The `tokenizer.json` of a SentencePiece BPE model of the kind `train_tokenizer` writes,
    so that transformers' `AutoTokenizer` loads it without sentencepiece; None for any other
    kind (unigram, a dummy prefix, a normalization rule, whitespace as suffix, no splitting on
    whitespace), which this conversion does not reproduce exactly.

    `model` is the `.model` file's bytes. BPE merges are the pairs of pieces that make a
    normal piece, ranked by that piece's score (SentencePiece merges the best-scoring pair
    first); words split before each run of spaces, as SentencePiece's with whitespace-only
    pieces allowed; user-defined pieces are added tokens (not special), control and unknown
    pieces special ones; bytes fall back to `<0xNN>`; `add_bos` adds a post-processor that
    puts the bos piece first.
    """
    proto = _sp_proto(model)
    ts, ns = proto.trainer_spec, proto.normalizer_spec
    if (ts.model_type != _SP_BPE or ns.add_dummy_prefix or ns.remove_extra_whitespaces
            or ns.name != "identity" or not ns.escape_whitespaces
            or ts.treat_whitespace_as_suffix or not ts.split_by_whitespace
            or not ts.allow_whitespace_only_pieces):
        return None
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    merges = []
    for i, (piece, score, kind) in enumerate(pieces):
        if kind != _SP_NORMAL or len(piece) < 2:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                  if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(-score, i, vocab[a], vocab[b], a, b) for a, b in splits]
    merges.sort()
    unk = next((p for p, _, k in pieces if k == _SP_UNKNOWN), None)
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": k != _SP_USER_DEFINED}
             for i, (p, _, k) in enumerate(pieces)
             if k in (_SP_CONTROL, _SP_UNKNOWN, _SP_USER_DEFINED)]
    bos = pieces[ts.bos_id][0] if 0 <= ts.bos_id < len(pieces) else None
    post = None
    if add_bos and bos is not None:
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [ts.bos_id], "tokens": [bos]}}}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": _SP_WORD},
                          "behavior": "Isolated", "invert": False},
        "post_processor": post,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for *_, a, b in merges]},
    }, ensure_ascii=False)


def write_transformers_files(tokenizer: TokenizerBase, directory: str) -> bool:
    """Next to a SentencePiece tokenizer's files in `directory` (after `save_dir`): its
    `tokenizer.json` and `tokenizer_class` "PreTrainedTokenizerFast" in
    tokenizer_config.json, so transformers loads it with the `tokenizers` library alone.
    Returns False (and writes nothing) for a tokenizer.json tokenizer, one whose
    tokenizer_config names its own class, or a model `sentencepiece_tokenizer_json` cannot
    convert."""
    if tokenizer.KIND != "sentencepiece" or "tokenizer_class" in tokenizer.tokenizer_config:
        return False
    text = sentencepiece_tokenizer_json(tokenizer._vocabulary_bytes(), add_bos=tokenizer.add_bos_token)
    if text is None:
        return False
    with open(os.path.join(directory, HF_FILE), "w", encoding="utf-8") as f:
        f.write(text)
    config_path = os.path.join(directory, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return True
