"""Tests for model-directory tokenizers: tokenizer.json (HFTokenizer), tokenizer.model with
side files, serialization, chat templates and the R1 prompt.

Every fixture is built here: a byte-level BPE tokenizer.json trained with the `tokenizers`
library (the layout of Qwen2.5 / Llama 3), a SentencePiece model shaped like Gemma's, and
tokenizer_config.json files whose chat templates copy the structure of Qwen2.5's, Gemma 3's
and Llama 3's. Tests that need `tokenizers` skip only when it is not installed.
"""
import io
import json
import pickle
import re
import sys

import pytest
import sentencepiece as spm

from jaxrl_reason.data.templates import TEMPLATES
from jaxrl_reason.tokenizers import (
    HFTokenizer,
    Tokenizer,
    VocabularyMismatchError,
    apply_chat_template,
    load_tokenizer,
    r1_chat_prompt,
    r1_instruction,
    r1_messages,
    tokenizer_from_serialized,
    train_tokenizer,
)

try:
    import tokenizers  # noqa: F401  (the optional extra: pip install 'jaxrl-reason[hf]')
    HAS_HF = True
except ImportError:
    HAS_HF = False
try:
    import jinja2  # noqa: F401  (chat templates; in the same extra)
    HAS_JINJA2 = True
except ImportError:
    HAS_JINJA2 = False
needs_jinja2 = pytest.mark.skipif(
    not HAS_JINJA2, reason="jinja2 is not installed (pip install 'jaxrl-reason[hf]')")
needs_hf = pytest.mark.skipif(
    not HAS_HF, reason="the `tokenizers` library is not installed (pip install 'jaxrl-reason[hf]')")

CORPUS = [
    "Hello world! The answer is 42. Think step by step.",
    "café π ∑ 数学 😀 naïve — “quotes” and tabs\tand\nnewlines",
    "<think>12 * 3 = 36, then 36 + 4 = 40</think><answer>40</answer>",
    "def add(a, b):\n    return a + b",
] * 10
UNICODE_TEXTS = [
    "",
    " ",
    "Hello world! The answer is 42.",
    "café π ∑ 数学 😀 naïve",
    "  leading and trailing  \n\n\ttabs\r\n",
    "日本語のテキスト, עברית, Ελληνικά, 🚀🔥",
    "<think>7+9=16</think><answer>16</answer>",
]

# The structure of Qwen2.5-Instruct's template (tool branch shortened).
QWEN_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# The structure of Gemma 3's template (the system turn folds into the first user turn).
GEMMA_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Gemma 2's template rejects a system turn outright.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# The structure of Llama 3.2's template (strftime_now, trim); `continue` exercises loop controls.
LLAMA_TEMPLATE = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] == 'ipython' %}{%- continue %}{%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

SYSTEM_USER = [
    {"role": "system", "content": "You are a careful solver."},
    {"role": "user", "content": "What is 2+3?"},
]


def _write_json(path, value):
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2), encoding="utf-8")


def _added_tokens_decoder(tok, contents, special=True):
    return {str(tok.token_to_id(c)): {"content": c, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False, "special": special}
            for c in contents}


def _train_bpe(special_tokens):
    """A byte-level BPE tokenizer.json (the Qwen2.5 / Llama 3 layout), trained here."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=360, special_tokens=special_tokens, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer)
    raw.add_tokens(["<think>", "</think>"])  # Qwen3 has them as added, non-special tokens
    return raw


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A Qwen2.5-Instruct-like directory: tokenizer.json, tokenizer_config.json,
    generation_config.json with a list of eos ids."""
    raw = _train_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    d = tmp_path_factory.mktemp("qwen")
    raw.save(str(d / "tokenizer.json"))
    _write_json(d / "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": _added_tokens_decoder(
            raw, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        | _added_tokens_decoder(raw, ["<think>", "</think>"], special=False),
        "bos_token": None,
        "chat_template": QWEN_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })
    end, im_end = raw.token_to_id("<|endoftext|>"), raw.token_to_id("<|im_end|>")
    _write_json(d / "generation_config.json", {
        "bos_token_id": end, "eos_token_id": [im_end, end], "pad_token_id": end,
        "do_sample": True, "temperature": 0.7})
    (d / "config.json").write_text("{}")
    return d


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A Llama-3-Instruct-like directory: its post-processor adds <|begin_of_text|>, the
    config has no add_bos_token, the eos list comes from generation_config."""
    from tokenizers import processors

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    raw = _train_bpe(specials)
    bos = raw.token_to_id("<|begin_of_text|>")
    raw.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    d = tmp_path_factory.mktemp("llama")
    raw.save(str(d / "tokenizer.json"))
    _write_json(d / "tokenizer_config.json", {
        "added_tokens_decoder": _added_tokens_decoder(raw, specials),
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA_TEMPLATE,
        "eos_token": "<|eot_id|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    _write_json(d / "generation_config.json", {
        "bos_token_id": bos,
        "eos_token_id": [raw.token_to_id(t) for t in ("<|end_of_text|>", "<|eot_id|>")]})
    return d


def _gemma_model() -> bytes:
    """A SentencePiece model with Gemma's conventions (pad 0, eos 1, bos 2, unk 3, turn
    markers as user-defined pieces, byte fallback, no dummy prefix)."""
    f = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=f, vocab_size=400, model_type="bpe",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        byte_fallback=True, split_digits=True, add_dummy_prefix=False,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        character_coverage=1.0, num_threads=1, minloglevel=2)
    return f.getvalue()


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma")
    (d / "tokenizer.model").write_bytes(_gemma_model())
    decoder = {str(i): {"content": c, "special": True}
               for i, c in enumerate(["<pad>", "<eos>", "<bos>", "<unk>",
                                      "<start_of_turn>", "<end_of_turn>"])}
    _write_json(d / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "chat_template": GEMMA_TEMPLATE,
        "tokenizer_class": "GemmaTokenizer"})
    _write_json(d / "generation_config.json", {"bos_token_id": 2, "eos_token_id": [1, 5],
                                               "pad_token_id": 0})
    return d


# ---------------------------------------------------------------- tokenizer.json


@needs_hf
@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_hf_roundtrip_and_parity_with_the_library(qwen_dir, text):
    from tokenizers import Tokenizer as RawTokenizer

    tok = load_tokenizer(qwen_dir)
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode(text)
    assert ids == RawTokenizer.from_file(str(qwen_dir / "tokenizer.json")).encode(text).ids
    assert tok.decode(ids) == text


@needs_hf
def test_hf_special_tokens_are_single_ids(qwen_dir):
    tok = load_tokenizer(qwen_dir)
    start, end, pad = (tok.token_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<think>x</think>")
    assert ids[0] == start and ids.count(end) == 1
    assert tok.token_id("<think>") in ids and tok.token_id("</think>") in ids
    assert tok.special_ids == {start, end, pad}  # <think> is added but not special
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (-1, end, pad, -1)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (None, "<|im_end|>", "<|endoftext|>")
    assert tok.vocab_size == 362


@needs_hf
def test_hf_bos_eos_and_decode_rules(qwen_dir, llama_dir):
    qwen = load_tokenizer(qwen_dir)
    end, im_end = qwen.token_id("<|endoftext|>"), qwen.token_id("<|im_end|>")
    assert qwen.eos_ids == (im_end, end)  # tokenizer_config's eos, then generation_config's
    assert qwen.add_bos_token is False
    with pytest.raises(ValueError, match="no bos"):
        qwen.encode("x", add_bos=True)  # "bos_token": null wins over generation_config
    ids = qwen.encode("The answer is 42.", add_eos=True)
    assert ids[-1] == im_end
    assert qwen.decode(ids + qwen.encode("junk")) == "The answer is 42."
    assert qwen.decode(qwen.encode("a b") + [end, 7, 8]) == "a b"  # any eos id stops
    chat = qwen.encode("<|im_start|>assistant\n<think>ok</think>")
    assert qwen.decode(chat) == "<|im_start|>assistant\n<think>ok</think>"
    assert qwen.decode(chat, skip_special_tokens=True) == "assistant\n<think>ok</think>"
    assert qwen.encode_batch(UNICODE_TEXTS, add_eos=True) == [
        qwen.encode(t, add_eos=True) for t in UNICODE_TEXTS]

    llama = load_tokenizer(llama_dir)
    bos = llama.token_id("<|begin_of_text|>")
    assert llama.add_bos_token is True  # from the post-processor: the config does not say
    assert llama.encode("hi")[0] != bos  # encode never runs the post-processor
    assert llama.encode("hi", add_bos=True) == [bos] + llama.encode("hi")
    assert llama.eos_ids == tuple(llama.token_id(t) for t in ("<|eot_id|>", "<|end_of_text|>"))
    assert llama.pad_id == llama.eos_id  # no pad token: the documented fallback


@needs_hf
def test_hf_serialize_rebuild_and_pickle(qwen_dir, tmp_path):
    tok = load_tokenizer(qwen_dir)
    text = "<|im_start|>user\ncafé 😀 42<|im_end|>"
    for again in (tokenizer_from_serialized(tok.serialized),
                  HFTokenizer.from_serialized(tok.serialized),
                  pickle.loads(pickle.dumps(tok))):
        assert isinstance(again, HFTokenizer)
        assert again.encode(text) == tok.encode(text)
        assert again.serialized == tok.serialized
        assert (again.eos_ids, again.pad_id, again.chat_template, again.special_ids) == (
            tok.eos_ids, tok.pad_id, tok.chat_template, tok.special_ids)
    with pytest.raises(ValueError, match="tokenizer_from_serialized"):
        Tokenizer.from_serialized(tok.serialized)
    bare = tokenizer_from_serialized((qwen_dir / "tokenizer.json").read_bytes())
    assert bare.encode(text) == tok.encode(text) and bare.chat_template is None
    out = tmp_path / "exported"
    tok.save_dir(out)
    again = load_tokenizer(out)
    assert again.encode(text) == tok.encode(text) and again.eos_ids == tok.eos_ids
    assert apply_chat_template(again, SYSTEM_USER) == apply_chat_template(tok, SYSTEM_USER)


@needs_hf
def test_hf_errors(qwen_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", ')
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path))}: not a valid tokenizer"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((qwen_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",')
    with pytest.raises(ValueError, match="tokenizer_config.json.*not valid JSON"):
        load_tokenizer(tmp_path)
    _write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|eot_id|>"})
    with pytest.raises(VocabularyMismatchError, match="eos_token '<\\|eot_id\\|>'"):
        load_tokenizer(tmp_path)
    _write_json(tmp_path / "tokenizer_config.json", {})
    _write_json(tmp_path / "generation_config.json", {"eos_token_id": [5, 10**6]})
    with pytest.raises(ValueError, match="generation_config.json eos_token_id"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="corrupt serialized tokenizer"):
        tokenizer_from_serialized(load_tokenizer(qwen_dir).serialized[:60])


def test_missing_tokenizers_library_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install 'jaxrl-reason[hf]'")):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------- tokenizer.model + side files


def test_sentencepiece_dir(gemma_dir, tmp_path):
    tok = load_tokenizer(gemma_dir)
    assert isinstance(tok, Tokenizer)
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.eos_ids == (1, 5) and tok.add_bos_token is True
    for text in UNICODE_TEXTS:
        assert tok.decode(tok.encode(text)) == text
    # Added tokens in text are one id each, control pieces (<bos>) included, as in HF.
    ids = tok.encode("<bos><start_of_turn>user\nhi<end_of_turn>\n")
    assert ids[:2] == [2, 4] and ids.count(5) == 1
    texts = ["<bos>a<end_of_turn>", *UNICODE_TEXTS]
    assert tok.encode_batch(texts, add_bos=True) == [tok.encode(t, add_bos=True) for t in texts]
    assert tok.decode(tok.encode("hi", add_bos=True, add_eos=True)) == "hi"
    assert tok.decode([4, *tok.encode("hi"), 5, 9]) == "<start_of_turn>hi"
    assert tok.decode([4, *tok.encode("hi")], skip_special_tokens=True) == "hi"
    # Serialized: a bundle that both rebuild functions read; pickling; save() writes .model.
    for again in (Tokenizer.from_serialized(tok.serialized),
                  tokenizer_from_serialized(tok.serialized), pickle.loads(pickle.dumps(tok))):
        assert again.encode("<bos>x<end_of_turn>") == tok.encode("<bos>x<end_of_turn>")
        assert (again.eos_ids, again.chat_template) == (tok.eos_ids, tok.chat_template)
    tok.save(tmp_path / "t.model")
    assert (tmp_path / "t.model").read_bytes() == (gemma_dir / "tokenizer.model").read_bytes()
    tok.save_dir(tmp_path / "out")
    assert load_tokenizer(tmp_path / "out").encode("<bos>a") == tok.encode("<bos>a")


def test_trained_tokenizer_keeps_its_plain_form():
    """A tokenizer without side files serializes to the bare .model file, as before."""
    tok = train_tokenizer(CORPUS, 400)
    assert spm.SentencePieceProcessor(model_proto=tok.serialized).get_piece_size() == 400
    again = tokenizer_from_serialized(tok.serialized)
    assert isinstance(again, Tokenizer) and again.serialized == tok.serialized
    assert tok.eos_ids == (tok.eos_id,) and tok.chat_template is None
    assert tok.encode("<s>") != [tok.bos_id]  # no side files: text is not split on them


def test_sentencepiece_side_file_mismatch(gemma_dir, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes((gemma_dir / "tokenizer.model").read_bytes())
    _write_json(tmp_path / "tokenizer_config.json", {
        "added_tokens_decoder": {"400": {"content": "<|im_start|>", "special": True}}})
    with pytest.raises(VocabularyMismatchError, match="'<\\|im_start\\|>' as id 400.*lacks it"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="tokenizer.model.*not a SentencePiece model"):
        load_tokenizer(tmp_path)


@needs_hf
def test_kind_choice_when_both_files_exist(gemma_dir, qwen_dir, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes((gemma_dir / "tokenizer.model").read_bytes())
    (tmp_path / "tokenizer.json").write_bytes((qwen_dir / "tokenizer.json").read_bytes())
    assert isinstance(load_tokenizer(tmp_path), Tokenizer)
    assert isinstance(load_tokenizer(tmp_path, kind="tokenizer.json"), HFTokenizer)
    # The config adds a token the .model lacks: tokenizer.json is the one that matches.
    (tmp_path / "tokenizer_config.json").write_bytes(
        (qwen_dir / "tokenizer_config.json").read_bytes())
    assert isinstance(load_tokenizer(tmp_path), HFTokenizer)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError,
                       match=r"has no tokenizer: expected tokenizer\.json .* or tokenizer\.model"
                             r".*\['config\.json'\]"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no tokenizer.model"):
        load_tokenizer(tmp_path, kind="sentencepiece")
    with pytest.raises(ValueError, match="kind must be"):
        load_tokenizer(tmp_path, kind="bpe")


# ---------------------------------------------------------------- chat templates


@needs_hf
def test_qwen_chat_template(qwen_dir):
    expected = ("<|im_start|>system\nYou are a careful solver.<|im_end|>\n"
                "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert apply_chat_template(qwen_dir, SYSTEM_USER, add_generation_prompt=True) == expected
    tok = load_tokenizer(qwen_dir)
    assert apply_chat_template(tok, SYSTEM_USER, add_generation_prompt=False) == (
        expected.removesuffix("<|im_start|>assistant\n"))
    assert apply_chat_template(tok, SYSTEM_USER[1:]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b"}}]
    with_tools = apply_chat_template(tok, SYSTEM_USER, tools=tools)
    assert '\n{"type": "function", "function": {"name": "add", "description": "a + b"}}\n' in (
        with_tools)
    ids = tok.encode(expected)
    assert ids.count(tok.token_id("<|im_start|>")) == 3


@needs_hf
def test_llama_chat_template(llama_dir):
    tok = load_tokenizer(llama_dir)
    text = apply_chat_template(tok, SYSTEM_USER + [{"role": "ipython", "content": "skipped"}])
    date = r"\d\d [A-Z][a-z]{2} \d{4}"
    assert re.fullmatch(
        "<\\|begin_of_text\\|><\\|start_header_id\\|>system<\\|end_header_id\\|>\n\n"
        f"Today Date: {date}\n\nYou are a careful solver.<\\|eot_id\\|>"
        "<\\|start_header_id\\|>user<\\|end_header_id\\|>\n\nWhat is 2\\+3\\?<\\|eot_id\\|>"
        "<\\|start_header_id\\|>assistant<\\|end_header_id\\|>\n\n", text), text
    fixed = apply_chat_template(tok, SYSTEM_USER, date_string="26 Jul 2024")
    assert "Today Date: 26 Jul 2024\n\n" in fixed
    ids = tok.encode(fixed)
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1  # encode with add_bos=False


@needs_jinja2
def test_gemma_chat_template(gemma_dir):
    tok = load_tokenizer(gemma_dir)
    expected = ("<bos><start_of_turn>user\nYou are a careful solver.\n\nWhat is 2+3?"
                "<end_of_turn>\n<start_of_turn>model\n")
    assert apply_chat_template(gemma_dir, SYSTEM_USER) == expected
    assert apply_chat_template(tok, SYSTEM_USER, True) == expected
    ids = tok.encode(expected)
    assert ids[:2] == [tok.bos_id, tok.token_id("<start_of_turn>")]
    with pytest.raises(ValueError, match="Conversation roles must alternate"):
        apply_chat_template(tok, [{"role": "user", "content": "a"}] * 2)


@needs_jinja2
def test_chat_template_errors(gemma_dir, tmp_path):
    plain = train_tokenizer(CORPUS, 400)
    with pytest.raises(ValueError, match="has no chat template"):
        apply_chat_template(plain, SYSTEM_USER)
    (tmp_path / "tokenizer.model").write_bytes((gemma_dir / "tokenizer.model").read_bytes())
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path))} has no chat template"):
        apply_chat_template(tmp_path, SYSTEM_USER)
    _write_json(tmp_path / "tokenizer_config.json", {"chat_template": "{% for m in messages %}"})
    with pytest.raises(ValueError, match="chat template of .*TemplateSyntaxError"):
        apply_chat_template(tmp_path, SYSTEM_USER)
    # A template in chat_template.jinja (newer transformers save it there) is found.
    _write_json(tmp_path / "tokenizer_config.json", {"bos_token": "<bos>"})
    (tmp_path / "chat_template.jinja").write_text(GEMMA2_TEMPLATE)
    with pytest.raises(ValueError, match="System role not supported"):
        apply_chat_template(tmp_path, SYSTEM_USER)
    with pytest.raises(TypeError, match="messages"):
        apply_chat_template(tmp_path, "What is 2+3?")
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        apply_chat_template(tmp_path, [{"content": "no role"}])


# ---------------------------------------------------------------- the R1 prompt


def test_r1_messages_reuse_the_r1_template_wording():
    instruction = r1_instruction()
    assert TEMPLATES["r1"].startswith(instruction)
    assert "<think> reasoning process here </think>" in instruction
    assert "{prompt}" not in instruction and "User:" not in instruction
    assert r1_messages("What is 2+3?") == [
        {"role": "system", "content": instruction},
        {"role": "user", "content": "What is 2+3?"}]
    assert r1_messages("Q", system=False) == [
        {"role": "user", "content": f"{instruction}\n\nQ"}]


@needs_hf
def test_r1_chat_prompt(qwen_dir, gemma_dir):
    assert r1_chat_prompt(qwen_dir, "What is 2+3?") == (
        f"<|im_start|>system\n{r1_instruction()}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert r1_chat_prompt(gemma_dir, "What is 2+3?", system=False) == (
        f"<bos><start_of_turn>user\n{r1_instruction()}\n\nWhat is 2+3?<end_of_turn>\n"
        "<start_of_turn>model\n")
