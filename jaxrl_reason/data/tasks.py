"""The registry of tasks: where a run's problems come from and which reward verifies them.

A task is a name in `config.task.name`. Built-in procedural tasks generate seeded problems
by difficulty level with disjoint train/eval splits and worked SFT traces ("completion"):

| task             | verifier (reward name) | levels                                |
|------------------|------------------------|---------------------------------------|
| `arithmetic`     | `correctness`          | 1-5 (see `data/arithmetic.py`)        |
| `countdown`      | `countdown`            | 1-5: 2-6 numbers (see `data/countdown.py`) |
| `knights_knaves` | `knights_knaves`       | 1-5: 2-6 people (see `data/knights_knaves.py`) |
| `code`           | `code`                 | 1-5: one-line Python functions with hidden tests (see `data/code.py`) |
| `file`           | `correctness`          | none: problems from local JSONL/parquet (`task.train_file`, `task.eval_files`; GSM8K, MATH or generic fields, see `data/files.py`) |
| `mixture`        | `domain_verifier`      | per domain: several procedural tasks with sampling weights (`task.mixture`, see `data/mixture.py`); each row is scored by its own domain's verifier |

`task_source(config, split, levels, size, seed)` is the one entry point the trainer, SFT
and evaluation use; it also applies `config.task.length_targets` (L1/LCPO: a per-problem
token budget appended to the prompt as "Think for N tokens." and kept in
`example["target_length"]`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from jaxrl_reason.data import arithmetic, code, countdown, knights_knaves, mixture, search_facts

Example = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in task.

    Attributes:
      name: the `config.task.name` that selects it.
      verifier: the registered reward deciding whether a completion is correct (used by
        evaluation, by the `accuracy` metric and by length shaping).
      make_source: (config, split, levels, size, seed) -> random-access sequence of examples.
      corpus: (config, num_examples) -> texts to train the task tokenizer on.
      max_level: levels are 1..max_level.
    """

    name: str
    verifier: str
    make_source: Callable[..., Sequence[Example]]
    corpus: Callable[[ml_collections.ConfigDict, int], list[str]]
    max_level: int


_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Adds `task` to the registry (a later registration of the same name replaces it)."""
    _TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The task registered as `name`; ValueError listing the known tasks otherwise."""
    if name not in _TASKS:
        raise ValueError(f"task.name={name!r} is not a built-in task (built-in: "
                         f"{sorted(_TASKS)})")
    return _TASKS[name]


def available_tasks() -> list[str]:
    """Sorted names of the registered tasks."""
    return sorted(_TASKS)


CORPUS_SEED = 12345  # procedural tasks: seed of the tokenizer corpus (not a training seed)


def procedural_task(name: str, verifier: str, source_cls, corpus_fn, max_level: int) -> Task:
    """A Task from a generator module's Source class and tokenizer_corpus function."""
    return Task(name, verifier,
                lambda config, split, levels, size, seed: source_cls(split, levels, size, seed),
                lambda config, n: corpus_fn(n, CORPUS_SEED), max_level)


register_task(procedural_task("arithmetic", "correctness", arithmetic.ArithmeticSource,
                              arithmetic.tokenizer_corpus, arithmetic.MAX_LEVEL))
register_task(procedural_task("countdown", "countdown", countdown.CountdownSource,
                              countdown.tokenizer_corpus, countdown.MAX_LEVEL))
register_task(procedural_task("knights_knaves", "knights_knaves",
                              knights_knaves.KnightsKnavesSource,
                              knights_knaves.tokenizer_corpus, knights_knaves.MAX_LEVEL))
register_task(procedural_task("code", "code", code.CodeSource, code.tokenizer_corpus,
                              code.MAX_LEVEL))
register_task(Task("search_facts", "exact_match", search_facts.make_source,
                   search_facts.tokenizer_corpus, search_facts.MAX_LEVEL))


# ------------------------------------------------------------------------ file tasks


class SftTargets:
    """A file source whose examples have an SFT "completion": kept when the record has one,
    else `<think>{solution}</think><answer>{answer}</answer>` when it has a "solution"
    (GSM8K, MATH), else none (such examples serve RL and evaluation only)."""

    def __init__(self, source: Sequence[Example]):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Example:
        example = dict(self.source[index])
        if "completion" not in example and isinstance(example.get("solution"), str):
            example["completion"] = (f"<think>{example['solution'].strip()}</think>"
                                     f"<answer>{example['answer']}</answer>")
        return example


def read_task_file(config: ml_collections.ConfigDict, path: str) -> Sequence[Example]:
    """The examples of one data file (or directory / glob) with the config's field mapping,
    template and error policy (`task.format`, `task.preset`, `task.prompt_field`,
    `task.answer_field`, `task.id_field`, `task.on_error`, `task.template`)."""
    from jaxrl_reason.data.files import read_examples

    t = config.task
    if not path:
        raise ValueError("task.name='file' needs task.train_file (a JSONL/parquet path)")
    source = read_examples(
        path, format=t.format, on_error=t.on_error, template=t.template or None,
        fields={"preset": t.preset, "prompt": t.prompt_field, "answer": t.answer_field},
        id_field=t.id_field or None)
    if source.num_skipped:
        location, reason = source.skipped[0]
        print(f"[data] {path}: skipped {source.num_skipped} malformed record(s) "
              f"(task.on_error='skip'); first: {location}: {reason}", flush=True)
    return SftTargets(source)


def _file_source(config, split, levels, size, seed) -> Sequence[Example]:
    if split == "train":
        return read_task_file(config, config.task.train_file)
    raise ValueError("file tasks take their evaluation sets from task.eval_files")


def _file_corpus(config, n: int) -> list[str]:
    source = read_task_file(config, config.task.train_file)
    texts = []
    for i in range(min(n, len(source))):
        example = source[i]
        texts += [example["prompt"], example.get("completion", example["answer"])]
    return texts


register_task(Task("file", "correctness", _file_source, _file_corpus, max_level=0))


# ------------------------------------------------------------------------ mixtures


def mixture_domains(config: ml_collections.ConfigDict) -> tuple[mixture.Domain, ...]:
    """The validated domains of a mixture config (`task.mixture`, weights normalized)."""
    return mixture.parse_mixture(config.task, get_task)


def _domain_source(config, domain: mixture.Domain, split: str, size: int,
                   seed: int) -> Sequence[Example]:
    return get_task(domain.name).make_source(config, split, domain.levels, size, seed)


def _mixture_source(config, split, levels, size, seed) -> Sequence[Example]:
    """A mixture's stream; `levels` is unused: each domain has its own (`task.mixture`)."""
    return mixture.MixtureSource(
        mixture_domains(config),
        lambda domain, n: _domain_source(config, domain, split, n, seed), size, seed)


def _mixture_corpus(config, n: int) -> list[str]:
    return mixture.mixture_corpus(mixture_domains(config),
                                  lambda name, k: get_task(name).corpus(config, k), n)


register_task(Task(mixture.MIXTURE_TASK, mixture.MIXTURE_VERIFIER, _mixture_source,
                   _mixture_corpus, max_level=0))


# ------------------------------------------------------------------ length targets


def length_target(example_id: str, low: int, high: int) -> int:
    """A deterministic target length in [low, high] for an example id (hash-uniform)."""
    digest = hashlib.sha256(str(example_id).encode()).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low + 1)


class LengthTargetSource:
    """A source whose examples carry an L1/LCPO token budget.

    Item i is `source[i]` with "target_length" = `length_target(id, low, high)` and the
    prompt followed by " Think for N tokens." (the L1 paper's instruction).
    """

    def __init__(self, source: Sequence[Example], low: int, high: int):
        if not 0 < low <= high:
            raise ValueError(f"length targets need 0 < low <= high, got ({low}, {high})")
        self.source, self.low, self.high = source, low, high

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Example:
        example = dict(self.source[index])
        n = length_target(example.get("id", index), self.low, self.high)
        example["target_length"] = n
        example["prompt"] = f"{example['prompt']} Think for {n} tokens."
        return example


def with_length_targets(source: Sequence[Example], targets: Sequence[int]) -> Sequence[Example]:
    """`source` with L1 targets when `targets` = (low, high) is not (0, 0)."""
    low, high = (int(t) for t in targets)
    if (low, high) == (0, 0):
        return source
    return LengthTargetSource(source, low, high)


def task_source(config: ml_collections.ConfigDict, split: str, levels: Sequence[int],
                size: int, seed: int) -> Sequence[Example]:
    """The random-access example source of the configured task (with length targets)."""
    task = get_task(config.task.name)
    source = task.make_source(config, split, tuple(levels), size, seed)
    return with_length_targets(source, config.task.get("length_targets", (0, 0)))


def eval_sources(config: ml_collections.ConfigDict, size: int, seed: int,
                 set_name: Callable[[Sequence[int], Sequence[int]], str]
                 ) -> dict[str, Sequence[Example]]:
    """Named evaluation sets: the eval split of each `task.eval_levels` group (procedural
    tasks; `set_name(levels, train_levels)` names it), each file of `task.eval_files` (file
    tasks; its first `size` examples), or, for a mixture, the eval split of each domain's
    training levels, named "<domain>: <set_name>" (its examples carry "domain" and
    "verifier")."""
    if config.task.name == mixture.MIXTURE_TASK:
        targets = config.task.get("length_targets", (0, 0))
        return {f"{d.name}: {set_name(d.levels, d.levels)}": with_length_targets(
                    [mixture.tag_example(x, d) for x in _domain_source(config, d, "eval",
                                                                       size, seed)],
                    targets)
                for d in mixture_domains(config)}
    if config.task.name == "file":
        sets = {}
        for name, path in dict(config.task.eval_files).items():
            source = with_length_targets(read_task_file(config, path),
                                         config.task.get("length_targets", (0, 0)))
            sets[name] = [source[i] for i in range(min(size, len(source)))]
        return sets
    return {set_name(levels, config.task.train_levels):
            task_source(config, "eval", levels, size, seed)
            for levels in config.task.eval_levels}


def task_verifier(config: ml_collections.ConfigDict | Mapping) -> str:
    """The reward name that decides correctness for the configured task."""
    return get_task(config["task"]["name"]).verifier
