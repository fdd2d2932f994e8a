"""The search tool: Okapi BM25 over a local corpus, in plain python and numpy.

    retriever = BM25Retriever(["The capital of Velmora is Quandis.", ...])
    retriever.search("capital of Velmora", k=1)   # [(doc index, score)], best first
    retriever("capital of Velmora")              # the top_k documents' text, joined

Terms are lower-cased runs of letters and digits. Scores follow Robertson's BM25 with the
non-negative idf of Lucene, idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)), and
tf(k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl)); ties go to the earlier document.
`load_corpus` reads a local file (.jsonl with a "text" field, or text with one document
per line); `register_corpus` names built-in corpora (the `search_facts` task registers its
generated one), so a config can say `tools.search_corpus = "search_facts"`.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

_TERM = re.compile(r"[^\W_]+")
MAX_QUERY_TERMS = 64  # longer queries are cut (a query is model output)

_CORPORA: dict[str, Callable[[], list[str]]] = {}


def terms(text: str) -> list[str]:
    """'The capital of Velmora?' -> ['the', 'capital', 'of', 'velmora']."""
    return _TERM.findall(text.lower())


class BM25Retriever:
    """BM25 over `documents` (list of str), built once (postings as numpy arrays).

    Args:
      documents: the corpus, one str per document (at least one).
      k1, b: BM25's term-frequency saturation and length normalization.
      top_k: documents `__call__` returns.
    """

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75,
                 top_k: int = 1):
        if not documents:
            raise ValueError("BM25Retriever needs at least one document")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.documents = [str(d) for d in documents]
        self.k1, self.b, self.top_k = float(k1), float(b), int(top_k)
        counts = [Counter(terms(d)) for d in self.documents]
        lengths = np.array([sum(c.values()) for c in counts], np.float32)
        norm = self.k1 * (1.0 - self.b + self.b * lengths / max(float(lengths.mean()), 1e-6))
        postings: dict[str, tuple[list[int], list[float]]] = {}
        for i, c in enumerate(counts):
            for term, tf in c.items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(i)
                tfs.append(tf)
        n = len(self.documents)
        # term -> (doc ids int32 [n_t], idf * saturated tf f32 [n_t])
        self._postings = {}
        for term, (ids, tfs) in postings.items():
            ids_a, tf_a = np.array(ids, np.int32), np.array(tfs, np.float32)
            idf = math.log(1.0 + (n - len(ids) + 0.5) / (len(ids) + 0.5))
            self._postings[term] = (ids_a, idf * tf_a * (self.k1 + 1) / (tf_a + norm[ids_a]))

    def scores(self, query: str) -> np.ndarray:
        """f32 [num documents]: the BM25 score of each document for `query`."""
        out = np.zeros(len(self.documents), np.float32)
        for term in terms(query)[:MAX_QUERY_TERMS]:
            if term in self._postings:
                ids, contrib = self._postings[term]
                out[ids] += contrib
        return out

    def search(self, query: str, k: int | None = None) -> list[tuple[int, float]]:
        """The `k` (default top_k) best documents with a positive score: [(index, score)]."""
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k or self.top_k]
        return [(int(i), float(scores[i])) for i in order if scores[i] > 0]

    def __call__(self, query: str) -> str:
        """The text of the top_k documents for `query`, joined by spaces; ValueError for a
        query without terms, 'no results' when no document shares a term with it."""
        if not terms(query):
            raise ValueError("empty search query")
        hits = self.search(query)
        return " ".join(self.documents[i] for i, _ in hits) if hits else "no results"


def register_corpus(name: str, documents: Callable[[], list[str]]) -> None:
    """Names a built-in corpus: `documents()` returns its texts (called when a run builds
    its tools)."""
    _CORPORA[name] = documents


def available_corpora() -> list[str]:
    """Sorted names of the registered built-in corpora."""
    return sorted(_CORPORA)


def load_corpus(name_or_path: str) -> list[str]:
    """The documents of a registered corpus name, or of a local file: `.jsonl` (one JSON
    object per line with a "text" field, and an optional "title" put in front) or any other
    text file (one document per non-blank line). ValueError / FileNotFoundError otherwise."""
    if name_or_path in _CORPORA:
        return list(_CORPORA[name_or_path]())
    if not os.path.isfile(name_or_path):
        raise FileNotFoundError(f"search corpus {name_or_path!r} is neither a built-in corpus "
                                f"{available_corpora()} nor a file")
    docs = []
    with open(name_or_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not name_or_path.endswith(".jsonl"):
                docs.append(line.strip())
                continue
            try:
                record = json.loads(line)
                text = record["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{name_or_path}:{number}: expected a JSON object with a "
                                 f"'text' field ({e})") from None
            title = record.get("title")
            docs.append(f"{title}: {text}" if title else str(text))
    if not docs:
        raise ValueError(f"search corpus {name_or_path!r} holds no documents")
    return docs
