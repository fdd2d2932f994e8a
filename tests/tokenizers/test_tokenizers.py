"""Tests for jaxrl_reason.tokenizers: training, round-trips, ids, loading foreign models."""
import io
import pickle
import string

import numpy as np
import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_reason.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TAGS,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)

GLUED = "<think>7+9=16, write 6 carry 1.\n</think><answer>936</answer>"
CORPUS = [
    GLUED,
    "<think>\n12 * 3 = 36\n36 + 4 = 40\n</think>\n<answer>40</answer>",
    "Question: what is 128 + 457?  Think step by step.\n\nAnswer below.",
    "def add(a, b):\n    return a + b\n\n\tprint(add(1, 2))",
    "The answer is 42; the sum (7 + 35) = 42! Isn't it? [yes] {ok} #### 42",
] * 20
VOCAB = 400


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, VOCAB)


def test_special_ids_and_tags_are_single_tokens(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert tok.vocab_size == VOCAB
    ids = [tok.token_id(tag) for tag in SPECIAL_TAGS]
    assert ids == [4, 5, 6, 7]
    for tag, i in zip(SPECIAL_TAGS, ids):
        assert tok.encode(tag) == [i]
    encoded = tok.encode(GLUED)
    for i in ids:
        assert encoded.count(i) == 1


def test_digits_are_split(tok):
    digit_ids = {tok.token_id(str(d)) for d in range(10)}
    assert len(digit_ids) == 10
    ids = tok.encode("1234567890 936")
    assert [i for i in ids if i in digit_ids] == [tok.token_id(c) for c in "1234567890936"]
    for piece_id in ids:
        if piece_id not in digit_ids:
            assert tok.decode([piece_id]).strip() == ""


@pytest.mark.parametrize(
    "text",
    [
        GLUED,
        "",
        " ",
        "   leading and trailing   ",
        "multiple   spaces\n\n\nand\tnewlines\r\n",
        "\n",
        "x\n ",
        "~`|^_@$%&*()[]{}<>/\\'\"",
        "<think><think></answer>",
        "caf\u00e9 \u03c0 \u2211 \u6570\u5b66 \U0001f600",
    ],
)
def test_roundtrip_examples(tok, text):
    assert tok.decode(tok.encode(text)) == text


# Printable ASCII, with whitespace runs, digits and tags made frequent on purpose.
_TEXT = st.lists(
    st.one_of(
        st.text(alphabet=string.printable, max_size=20),
        st.text(alphabet=" \n\t\r0123456789", max_size=6),
        st.sampled_from(SPECIAL_TAGS),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(_TEXT)
def test_roundtrip_printable_ascii(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_bos_eos_and_decode_stops(tok):
    ids = tok.encode("1+1", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert tok.decode(ids) == "1+1"
    padded = ids + [PAD_ID] * 3 + tok.encode("junk")
    assert tok.decode(padded) == "1+1"
    assert tok.decode([PAD_ID, *tok.encode("a b"), PAD_ID]) == "a b"
    assert tok.decode(np.asarray(ids, np.int32)) == "1+1"


def test_encode_batch_matches_encode(tok):
    texts = [GLUED, "", "a  b\n"]
    assert tok.encode_batch(texts, add_eos=True) == [tok.encode(t, add_eos=True) for t in texts]


def test_bad_inputs(tok):
    with pytest.raises(ValueError, match="outside"):
        tok.decode([VOCAB])
    with pytest.raises(ValueError, match="outside"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="ids\\[1\\]"):
        tok.decode([4, 1.5])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match="texts\\[1\\]"):
        tok.encode_batch(["a", 3])
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        tok.token_id("<no such piece>")


def test_training_is_deterministic():
    a = train_tokenizer(CORPUS, VOCAB)
    b = train_tokenizer(iter(CORPUS), VOCAB)
    assert a.serialized == b.serialized
    c = train_tokenizer(CORPUS, 320, model_type="unigram")
    d = train_tokenizer(CORPUS, 320, model_type="unigram")
    assert c.serialized == d.serialized
    assert c.decode(c.encode(GLUED)) == GLUED
    assert c.encode("<answer>") == [c.token_id("<answer>")]


def test_save_load_and_serialized(tok, tmp_path):
    path = tmp_path / "tok.model"
    tok.save(str(path))
    loaded = Tokenizer.load(str(path))
    assert loaded.serialized == tok.serialized == path.read_bytes()
    assert loaded.encode(GLUED) == tok.encode(GLUED)
    again = Tokenizer.from_serialized(tok.serialized)
    assert again.encode(GLUED) == tok.encode(GLUED)
    unpickled = pickle.loads(pickle.dumps(tok))
    assert unpickled.encode(GLUED) == tok.encode(GLUED)
    # Any SentencePiece reader accepts the saved file.
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert sp.encode(GLUED) == tok.encode(GLUED)


def _foreign_model(**kwargs) -> bytes:
    """A model trained with sentencepiece's defaults (normalization, dummy prefix...)."""
    f = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=f, vocab_size=60,
        num_threads=1, minloglevel=2, **kwargs,
    )
    return f.getvalue()


def test_load_foreign_model_without_pad(tmp_path):
    path = tmp_path / "foreign.model"
    path.write_bytes(_foreign_model(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    tok = Tokenizer.load(path)
    assert (tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.pad_id == tok.eos_id  # documented fallback
    assert tok.vocab_size == 60
    ids = tok.encode("the answer is 42", add_bos=True)
    assert ids[0] == 1
    assert tok.decode(ids) == "the answer is 42"


def test_load_foreign_model_with_other_ids():
    tok = Tokenizer.from_serialized(
        _foreign_model(unk_id=3, pad_id=5, bos_id=-1, eos_id=7)
    )
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (5, -1, 7, 3)
    with pytest.raises(ValueError, match="no bos"):
        tok.encode("x", add_bos=True)
    ids = tok.encode("answer", add_eos=True)
    assert ids[-1] == 7 and tok.decode(ids + [9, 9]) == "answer"
    no_eos = Tokenizer.from_serialized(_foreign_model(pad_id=-1, eos_id=-1))
    assert no_eos.pad_id == 0


def test_load_rejects_non_model(tmp_path):
    path = tmp_path / "not_a_model.model"
    path.write_bytes(b"this is not a protobuf at all \xff\xfe")
    with pytest.raises(ValueError, match="not_a_model.model.*not a SentencePiece model"):
        Tokenizer.load(str(path))
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        Tokenizer.from_serialized(b"")
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(str(tmp_path / "missing.model"))


def test_vocab_size_errors():
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(CORPUS, 100)
    with pytest.raises(ValueError, match="vocab_size=5000 does not fit"):
        train_tokenizer(CORPUS, 5000)
    with pytest.raises(ValueError, match="model_type"):
        train_tokenizer(CORPUS, VOCAB, model_type="word")
    with pytest.raises(ValueError, match="non-empty"):
        train_tokenizer(["", ""], VOCAB)
    with pytest.raises(TypeError):
        train_tokenizer("a single string", VOCAB)
    with pytest.raises(ValueError, match="duplicates"):
        train_tokenizer(CORPUS, VOCAB, extra_symbols=["<a>", "<a>"])
    with pytest.raises(ValueError, match="reserved"):
        train_tokenizer(CORPUS, VOCAB, extra_symbols=["</s>"])


def test_smallest_vocab_is_accepted():
    """The size check is exact: the smallest size it accepts trains."""
    texts = ["<answer>12</answer> ab"]
    # 4 meta + 4 tags + 256 bytes + {1, 2, ▁, a, b}
    tok = train_tokenizer(texts, 4 + 4 + 256 + 5)
    assert tok.decode(tok.encode(texts[0])) == texts[0]
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(texts, 4 + 4 + 256 + 4)


def test_whitespace_runs_are_pieces(tok):
    """allow_whitespace_only_pieces: indentation seen in training is one token."""
    assert len(tok.encode("    ")) == 1
