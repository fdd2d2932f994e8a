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

Tokenizers trained here (`train_tokenizer`) split every digit, keep the reasoning tags
`<think>`, `</think>`, `<answer>`, `</answer>` as one token each, round-trip text exactly,
put pad/bos/eos/unk at ids 0/1/2/3 and are deterministic (see `sentencepiece`).

Models loaded from a file keep their own ids. `pad_id` falls back to the eos id (or 0) when
the model has no pad token; `bos_id`/`eos_id`/`unk_id` are -1 when the model has no such
token. Side files override the vocabulary file's own special ids (`"bos_token": null` means
none).

`serialized` is the `.model` file itself for a SentencePiece model without side files (the
form of every checkpoint written before model directories were supported); otherwise it is
a bundle: a magic line, then zlib-compressed JSON side files and the vocabulary file.

Modules:
  base            the shared interface (`TokenizerBase`), side-file values, the bundle format
  sentencepiece   `Tokenizer`, `train_tokenizer`
  hf              `HFTokenizer`
  files           `load_tokenizer`, `tokenizer_from_serialized`
  chat            `apply_chat_template`, the R1 chat prompt
"""
from jaxrl_reason.tokenizers.base import (
    HF_FILE,
    HF_INSTALL_HINT,
    KINDS,
    SP_FILE,
    VocabularyMismatchError,
)
from jaxrl_reason.tokenizers.chat import (
    apply_chat_template,
    r1_chat_prompt,
    r1_instruction,
    r1_messages,
)
from jaxrl_reason.tokenizers.files import load_tokenizer, tokenizer_from_serialized
from jaxrl_reason.tokenizers.hf import HFTokenizer
from jaxrl_reason.tokenizers.sentencepiece import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TAGS,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "HF_FILE",
    "HF_INSTALL_HINT",
    "KINDS",
    "PAD_ID",
    "SPECIAL_TAGS",
    "SP_FILE",
    "UNK_ID",
    "HFTokenizer",
    "Tokenizer",
    "VocabularyMismatchError",
    "apply_chat_template",
    "load_tokenizer",
    "r1_chat_prompt",
    "r1_instruction",
    "r1_messages",
    "tokenizer_from_serialized",
    "train_tokenizer",
]
