"""BM25 retriever: scores against a hand computation, ranking, ties, empty queries and
corpus files."""
import json
import math

import numpy as np
import pytest

from jaxrl_reason.tools.retriever import (BM25Retriever, available_corpora, load_corpus,
                                          register_corpus, terms)

DOCS = ["The capital of Velmora is Quandis.", "The leader of Velmora is Orsk.",
        "The capital of Drask is Pell.", "Rivers and rivers and rivers."]


def test_terms():
    assert terms("The capital of Velmora?") == ["the", "capital", "of", "velmora"]
    assert terms("x_1, Ärger 42!") == ["x", "1", "ärger", "42"]


def test_scores_match_the_formula():
    r = BM25Retriever(DOCS, k1=1.2, b=0.75)
    lengths = [len(terms(d)) for d in DOCS]
    avg = sum(lengths) / len(lengths)
    query = "capital velmora rivers"
    want = np.zeros(len(DOCS))
    for i, doc in enumerate(DOCS):
        words = terms(doc)
        for term in terms(query):
            n = sum(term in terms(d) for d in DOCS)
            tf = words.count(term)
            if tf:
                idf = math.log(1 + (len(DOCS) - n + 0.5) / (n + 0.5))
                want[i] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[i] / avg))
    np.testing.assert_allclose(r.scores(query), want, rtol=1e-5)


def test_search_ranks_and_formats():
    r = BM25Retriever(DOCS, top_k=1)
    assert r.search("capital of Velmora", k=2)[0][0] == 0
    assert r("capital of velmora") == DOCS[0]
    assert r("Who leads Velmora? leader") == DOCS[1]
    assert BM25Retriever(DOCS, top_k=2)("capital of Drask").startswith(DOCS[2] + " ")
    assert r("zebra") == "no results"
    with pytest.raises(ValueError, match="empty search query"):
        r("?! ...")
    # Ties go to the earlier document.
    assert BM25Retriever(["a b", "a b"]).search("a", k=2)[0][0] == 0
    with pytest.raises(ValueError):
        BM25Retriever([])


def test_load_corpus(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"title": "Velmora", "text": "capital Quandis"}) + "\n\n"
                     + json.dumps({"text": "plain"}) + "\n")
    assert load_corpus(str(jsonl)) == ["Velmora: capital Quandis", "plain"]
    txt = tmp_path / "docs.txt"
    txt.write_text("one doc\n\n  two doc \n")
    assert load_corpus(str(txt)) == ["one doc", "two doc"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_corpus(str(bad))
    with pytest.raises(FileNotFoundError, match="neither a built-in corpus"):
        load_corpus(str(tmp_path / "missing.txt"))
    register_corpus("unit_test_corpus", lambda: ["x y"])
    assert "unit_test_corpus" in available_corpora()
    assert load_corpus("unit_test_corpus") == ["x y"]
