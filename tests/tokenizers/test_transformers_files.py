"""An exported SentencePiece tokenizer also as tokenizer.json: same ids, same text."""
import json

import pytest

from jaxrl_reason.data.arithmetic import tokenizer_corpus
from jaxrl_reason.tokenizers import load_tokenizer, train_tokenizer
from jaxrl_reason.tokenizers.hf import sentencepiece_tokenizer_json, write_transformers_files

tokenizers = pytest.importorskip("tokenizers")

EDGE = ["", " ", "  x", "x  ", "a  b c", "héllo\nwörld\t!", "What is 12+345?",
        "<think> a</think>  <answer>5 </answer>", "<answer><answer>", "日本 9", "▁x ▁"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(our tokenizer, tokenizers.Tokenizer of the written tokenizer.json, directory)."""
    ours = train_tokenizer(tokenizer_corpus(600, seed=3), 320)
    directory = tmp_path_factory.mktemp("export")
    ours.save_dir(directory)
    assert write_transformers_files(ours, str(directory))
    theirs = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    return ours, theirs, directory


def test_same_ids_and_text(exported):
    ours, theirs, _ = exported
    texts = tokenizer_corpus(1500, seed=11) + EDGE
    for text in texts:
        ids = ours.encode(text, add_bos=ours.add_bos_token)
        assert theirs.encode(text).ids == ids, text
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids), text


def test_tags_are_not_special_and_config_names_the_class(exported):
    _, theirs, directory = exported
    special = {t.content for t in theirs.get_added_tokens_decoder().values() if t.special}
    assert special == {"<pad>", "<s>", "</s>", "<unk>"}
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    # our own loader still reads the SentencePiece model (its ids are the reference)
    assert load_tokenizer(str(directory)).KIND == "sentencepiece"


def test_kinds_it_cannot_reproduce_are_left_alone(tmp_path):
    unigram = train_tokenizer(tokenizer_corpus(300, seed=5), 296, model_type="unigram")
    assert sentencepiece_tokenizer_json(unigram.serialized, add_bos=True) is None
    unigram.save_dir(tmp_path)
    assert not write_transformers_files(unigram, str(tmp_path))
    assert not (tmp_path / "tokenizer.json").exists()
