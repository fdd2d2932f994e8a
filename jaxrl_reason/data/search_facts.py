"""Procedurally generated questions about invented places: the facts exist only in a local
corpus, so the way to answer is to call the search tool (`<search>query</search>`).

The world is fixed (WORLD_SEED, not the run's seed): NUM_ENTITIES invented countries, each
with a capital, a leader, a main river and a founding year; names are 2-3 syllables of a
small consonant-vowel inventory (so a tokenizer trained on the corpus spells each in 2-3
pieces), every name used once. The corpus (`corpus_documents`, registered as the search
corpus "search_facts") holds one sentence per fact:

    The capital of Vaneva is Masuno.        The leader of Vaneva is Badula.
    The main river of Vaneva is the Zunupu. Vaneva was founded in 1840.

    level 1: "What is the capital of Vaneva?"                 -> Masuno
             (capital, leader or main river; one search)
    level 2: "In what year did Vaneva turn 100 years old?"    -> 1940
             (a search for the founding year, then the calculator)

SFT traces demonstrate the tool on a fraction `task.tool_demo_fraction` of the examples
(default 0.25, chosen by a hash of the example id); the others state the fact from memory,
which only works for facts the model has memorized (with 2,000 countries, hardly any):

    tool:   <think><search>capital of Vaneva</search><result>The capital of Vaneva is
            Masuno.</result></think><answer>Masuno</answer>
    memory: <think>The capital of Vaneva is Masuno.</think><answer>Masuno</answer>
    level 2 with the tools: <think><search>founding of Vaneva</search><result>Vaneva was
            founded in 1840.</result><calc>1840+100</calc><result>1940</result></think>
            <answer>1940</answer>

A trace's result blocks are what the tool runner returns for its calls (BM25 top-1 over the
corpus, the calculator; `result_block` formatting): the cold start sees the very text RL
rollouts get. Train and eval problems are disjoint by country (a hash of its name puts 1
in EVAL_BUCKETS of them in the eval split), so held-out questions ask about countries never
seen in training: there, only the tool knows the answer. The verifier is `exact_match`.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from jaxrl_reason.data.levels import LevelSource
from jaxrl_reason.rewards import tool_use  # noqa: F401  (registers exact_match, tool_use)
from jaxrl_reason.tools.calculator import calculate
from jaxrl_reason.tools.retriever import BM25Retriever, register_corpus
from jaxrl_reason.tools.runner import result_block

TASK = "search_facts"
MAX_LEVEL = 2
WORLD_SEED = 20261123
NUM_ENTITIES = 2000
EVAL_BUCKETS = 5
DEFAULT_TOOL_FRACTION = 0.25  # SFT traces that demonstrate the tool
SPLITS = ("train", "eval")

# Names are 2-3 syllables from a small consonant-vowel inventory: a tokenizer trained on
# the corpus learns each syllable as a piece, so copying a name is copying 2-3 tokens.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")

# relation -> (fact template, question template, query template); level-1 relations.
RELATIONS = {
    "capital": ("The capital of {x} is {y}.", "What is the capital of {x}?", "capital of {x}"),
    "leader": ("The leader of {x} is {y}.", "Who is the leader of {x}?", "leader of {x}"),
    "river": ("The main river of {x} is the {y}.", "What is the main river of {x}?",
              "main river of {x}"),
}
FOUNDED = "{x} was founded in {y}."
ANNIVERSARIES = (50, 100, 150, 200, 250, 300, 500)


def _name(rng: np.random.Generator, syllables: int) -> str:
    parts = [_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
             for _ in range(syllables)]
    return "".join(parts).capitalize()


@functools.lru_cache(maxsize=1)
def world() -> tuple[dict[str, Any], ...]:
    """The countries: ({"name", "capital", "leader", "river", "founded"}, ...), fixed by
    WORLD_SEED; every name distinct from every other."""
    rng = np.random.default_rng(WORLD_SEED)
    used: set[str] = set()

    def fresh(syllables: tuple[int, int]) -> str:
        while True:
            name = _name(rng, int(rng.integers(syllables[0], syllables[1] + 1)))
            if name not in used:
                used.add(name)
                return name

    return tuple({"name": fresh((3, 3)), "capital": fresh((2, 3)), "leader": fresh((2, 3)),
                  "river": fresh((2, 3)), "founded": int(rng.integers(1000, 1900))}
                 for _ in range(NUM_ENTITIES))


def facts(country: dict[str, Any]) -> list[str]:
    """The corpus sentences about one country."""
    x = country["name"]
    return [RELATIONS[r][0].format(x=x, y=country[r]) for r in RELATIONS] + [
        FOUNDED.format(x=x, y=country["founded"])]


@functools.lru_cache(maxsize=1)
def corpus_documents() -> tuple[str, ...]:
    """The search corpus: one fact per document, every country's facts in world order."""
    return tuple(doc for country in world() for doc in facts(country))


@functools.lru_cache(maxsize=1)
def retriever() -> BM25Retriever:
    """The BM25 retriever over `corpus_documents` with top_k = 1 (the tool of the traces)."""
    return BM25Retriever(corpus_documents(), top_k=1)


register_corpus(TASK, lambda: list(corpus_documents()))


def entity_split(name: str) -> str:
    """'eval' or 'train' for a country (a hash of its name)."""
    bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return "eval" if bucket % EVAL_BUCKETS == 0 else "train"


@functools.lru_cache(maxsize=2)
def _split_entities(split: str) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(world()) if entity_split(c["name"]) == split)


def _uses_tool(example_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"tool-demo:{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < fraction


def _search(query: str, expected: str) -> str:
    """The result block the search tool returns for `query`; AssertionError when it is not
    the fact `expected` (a self-check of the world: names are unique)."""
    block = result_block(retriever()(query))
    if block != result_block(expected):
        raise AssertionError(f"search_facts: {query!r} retrieves {block!r}, not {expected!r}")
    return block


def make_example(split: str, level: int, index: int, seed: int,
                 tool_fraction: float = DEFAULT_TOOL_FRACTION) -> dict[str, Any]:
    """The `index`-th question of `split` at `level` for `seed` (deterministic).

    Returns a dict of python values: id, prompt, answer, completion (the SFT trace: with
    the tool for a `tool_fraction` of ids, else from memory), level, task, entity,
    relation, query (the search query the tool trace uses), uses_tool (bool).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level not in (1, 2):
        raise ValueError(f"search_facts level must be in 1..{MAX_LEVEL}, got {level!r}")
    rng = np.random.default_rng([seed, SPLITS.index(split), level, index, 0x5EA])
    entities = _split_entities(split)
    country = world()[entities[int(rng.integers(len(entities)))]]
    x = country["name"]
    example_id = f"{TASK}-{split}-L{level}-s{seed}-{index}"
    use_tool = _uses_tool(example_id, tool_fraction)
    if level == 1:
        relation = ("capital", "leader", "river")[int(rng.integers(3))]
        fact_t, question_t, query_t = RELATIONS[relation]
        fact, query, answer = fact_t.format(x=x, y=country[relation]), query_t.format(x=x), \
            country[relation]
        prompt = question_t.format(x=x)
        steps = f"<search>{query}</search>{_search(query, fact)}" if use_tool else fact
    else:
        relation = "founded"
        years = ANNIVERSARIES[int(rng.integers(len(ANNIVERSARIES)))]
        fact, query = FOUNDED.format(x=x, y=country["founded"]), f"founding of {x}"
        expression = f"{country['founded']}+{years}"
        answer = calculate(expression)
        prompt = f"In what year did {x} turn {years} years old?"
        steps = (f"<search>{query}</search>{_search(query, fact)}"
                 f"<calc>{expression}</calc>{result_block(answer)}" if use_tool
                 else f"{fact} {expression}={answer}.")
    return {
        "id": example_id,
        "prompt": prompt,
        "answer": answer,
        "completion": f"<think>{steps}</think><answer>{answer}</answer>",
        "level": level,
        "task": TASK,
        "entity": x,
        "relation": relation,
        "query": query,
        "uses_tool": use_tool,
    }


class SearchFactsSource(LevelSource):
    """Random-access source of search_facts questions (see `LevelSource`)."""

    def __init__(self, split: str, levels, size: int, seed: int,
                 tool_fraction: float = DEFAULT_TOOL_FRACTION):
        make = functools.partial(make_example, tool_fraction=tool_fraction)
        super().__init__(TASK, make, MAX_LEVEL, split, levels, size, seed)


def make_source(config, split: str, levels, size: int, seed: int) -> SearchFactsSource:
    """The task's source for a run config (`task.tool_demo_fraction`, default 0.25)."""
    fraction = float(config.task.get("tool_demo_fraction", DEFAULT_TOOL_FRACTION))
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"task.tool_demo_fraction must be in [0, 1], got {fraction}")
    return SearchFactsSource(split, levels, size, seed, tool_fraction=fraction)


def tokenizer_corpus(config, num_examples: int) -> list[str]:
    """Texts to train the task tokenizer on: the corpus, and prompts and both kinds of
    traces of every level."""
    texts = list(corpus_documents())
    for i in range(num_examples):
        for fraction in (0.0, 1.0):
            example = make_example("train", 1 + i % MAX_LEVEL, i, 12345, fraction)
            texts += [example["prompt"], example["completion"]]
    return texts
