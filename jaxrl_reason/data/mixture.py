"""Domain mixing: one training stream drawn from several tasks with sampling weights.

A mixture is `config.task.name = "mixture"` with `config.task.mixture` listing its domains,
each `(task, weight)` or `(task, weight, levels)`:

    c.task.name = "mixture"
    c.task.mixture = (("arithmetic", 0.4), ("countdown", 0.3, (1, 2)),
                      ("knights_knaves", 0.2, (2,)), ("code", 0.1, (1, 2)))

- task: a registered procedural task (not "file" or "mixture"); each at most once.
- weight: a positive number; weights are relative (normalized to sum to 1).
- levels: the domain's training levels (default `task.train_levels`); its held-out
  evaluation set is the eval split of the same levels, named "<task>: levels 1-2 (held-out)".

Item i of a `MixtureSource` belongs to the domain that a uniform number drawn from
(seed, i) by a counter-based hash (splitmix64) selects by the normalized weights, and is
item i of that domain's own source. So an item is a pure function of (seed, i): a grain
iterator over the source (`data.pipeline.example_iterator`) keeps exact resume through its
index state, every seed gives one fixed stream, and the domains' shares of any long stretch
of items match the weights. Every example carries its "domain" (the task name) and the
"verifier" that scores it (the task's reward), which the `domain_verifier` reward dispatches
on; the tokenizer of a mixture is trained on the union of its domains' corpora.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Example = dict[str, Any]

MIXTURE_TASK = "mixture"
MIXTURE_VERIFIER = "domain_verifier"  # the reward that scores each row with its own verifier
_NOT_DOMAINS = ("file", MIXTURE_TASK)
_STREAM_TAG = 0x4D4958  # "MIX": separates this hash stream from other uses of the seed


@dataclasses.dataclass(frozen=True)
class Domain:
    """One task of a mixture: its name, normalized weight in (0, 1], training levels and the
    reward that verifies it."""

    name: str
    weight: float
    levels: tuple[int, ...]
    verifier: str


# ----------------------------------------------------------------------------- config


def _entry_problems(i: int, entry: Any, train_levels: Any,
                    get_task: Callable[[str], Any]) -> list[str]:
    key = f"task.mixture[{i}]"
    if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
        return [f"{key}: must be (task, weight) or (task, weight, levels), got {entry!r}"]
    name, weight = entry[0], entry[1]
    problems = []
    if not isinstance(name, str) or name in _NOT_DOMAINS:
        return [f"{key}: the task must be a procedural task name (not 'file' or 'mixture'), "
                f"got {name!r}"]
    try:
        task = get_task(name)
    except ValueError as e:
        return [f"{key}: {e}"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
            or not np.isfinite(weight) or weight <= 0:
        problems.append(f"{key}: the weight of {name!r} must be a positive number, got "
                        f"{weight!r}")
    levels = entry[2] if len(entry) == 3 else train_levels
    source = "its levels" if len(entry) == 3 else "task.train_levels (its default levels)"
    if not isinstance(levels, (tuple, list)) or not levels or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= task.max_level
            for v in levels):
        problems.append(f"{key}: {source} must be a non-empty list of {name} levels in "
                        f"1..{task.max_level}, got {levels!r}")
    return problems


def mixture_problems(task_cfg: Mapping[str, Any], reward_weights: Mapping[str, Any],
                     get_task: Callable[[str], Any]) -> list[str]:
    """Every problem of a mixture config, as 'key: message' strings (empty when valid).

    Args:
      task_cfg: `config.task` (name "mixture", `mixture`, `train_levels`).
      reward_weights: `config.rewards.weights`; a mixture must weight "domain_verifier" and
        must not weight a domain's own verifier (it would score every other domain's rows
        too).
      get_task: the task registry's lookup (`data.tasks.get_task`).
    """
    entries = task_cfg.get("mixture", ())
    if not isinstance(entries, (tuple, list)) or not entries:
        return ["task.mixture: task.name='mixture' needs a non-empty list of (task, weight) "
                f"or (task, weight, levels) entries, got {entries!r}"]
    problems, names = [], []
    for i, entry in enumerate(entries):
        entry_problems = _entry_problems(i, entry, task_cfg.get("train_levels", ()), get_task)
        problems += entry_problems
        if not entry_problems:
            names.append(entry[0])
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"task.mixture: each task may appear once; repeated: {repeated} "
                        "(give one entry a larger weight instead)")
    weights = dict(reward_weights or {})
    if MIXTURE_VERIFIER not in weights:
        problems.append(f"rewards.weights: a task mixture is scored by {MIXTURE_VERIFIER!r} "
                        "(each row by its own domain's verifier); weight it, e.g. "
                        f"{{{MIXTURE_VERIFIER!r}: 1.0, 'format_strict': 0.1}}")
    own = sorted({get_task(n).verifier for n in names} & set(weights))
    if own:
        problems.append(f"rewards.weights: {own} would score every row of the mixture, other "
                        f"domains' too; use {MIXTURE_VERIFIER!r} instead")
    return problems


def parse_mixture(task_cfg: Mapping[str, Any],
                  get_task: Callable[[str], Any]) -> tuple[Domain, ...]:
    """The domains of `config.task` (validated; weights normalized to sum to 1).

    Raises ValueError listing every problem of the entries."""
    problems = mixture_problems(task_cfg, {MIXTURE_VERIFIER: 1.0}, get_task)
    if problems:
        raise ValueError("invalid task mixture:\n  - " + "\n  - ".join(problems))
    entries = list(task_cfg["mixture"])
    total = float(sum(float(e[1]) for e in entries))
    return tuple(
        Domain(name=e[0], weight=float(e[1]) / total,
               levels=tuple(int(v) for v in (e[2] if len(e) == 3
                                             else task_cfg["train_levels"])),
               verifier=get_task(e[0]).verifier)
        for e in entries)


# ----------------------------------------------------------------------------- sampling


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 [N] (wrapping arithmetic): a bijective hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, indices: Any) -> np.ndarray:
    """Uniform numbers in [0, 1) of the items `indices` (int [N] >= 0) of stream `seed`:
    float64 [N], a pure function of (seed, index) (counter-based, no generator state)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and idx.min() < 0:
        raise ValueError(f"uniforms: indices must be >= 0, got {int(idx.min())}")
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([int(seed) % 2**64 ^ _STREAM_TAG], np.uint64))
        bits = _splitmix64(idx.astype(np.uint64) ^ key)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def domain_indices(weights: Sequence[float], seed: int, indices: Any) -> np.ndarray:
    """The domain of each item: int [N] in [0, D), domain d with probability weights[d]
    (normalized), a pure function of (weights, seed, index).

    Args:
      weights: D positive floats.
      seed: the stream's seed.
      indices: int [N] item indices >= 0.
    """
    w = np.asarray(weights, np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"domain_indices: weights must be positive finite floats, got "
                         f"{list(weights)!r}")
    edges = np.cumsum(w / w.sum())[:-1]
    return np.searchsorted(edges, uniforms(seed, indices), side="right").astype(np.int64)


class MixtureSource:
    """Random-access source of a mixture's examples (the grain data-source protocol).

    Item i is item i of domain `domain_indices(weights, seed, [i])`'s source (built by
    `make_source(domain, size)`), with "domain" and "verifier" added.

    Args:
      domains: the mixture's domains (`parse_mixture`).
      make_source: (Domain, size) -> that domain's random-access source of `size` items.
      size: number of items.
      seed: seed of the domain stream.
    """

    def __init__(self, domains: Sequence[Domain],
                 make_source: Callable[[Domain, int], Sequence[Example]], size: int,
                 seed: int):
        if not domains:
            raise ValueError("MixtureSource needs at least one domain")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"mixture source size must be a positive int, got {size!r}")
        self.domains, self.size, self.seed = tuple(domains), size, int(seed)
        self.weights = [d.weight for d in self.domains]
        self.sources = [make_source(d, size) for d in self.domains]

    def __len__(self) -> int:
        return self.size

    def domain_of(self, index: int) -> Domain:
        """The domain of item `index`."""
        return self.domains[int(domain_indices(self.weights, self.seed, [index])[0])]

    def __getitem__(self, index: int) -> Example:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for source of size {self.size}")
        k = int(domain_indices(self.weights, self.seed, [index])[0])
        return tag_example(self.sources[k][index], self.domains[k])

    def __repr__(self) -> str:
        parts = ", ".join(f"{d.name}: {d.weight:.3g}" for d in self.domains)
        return f"MixtureSource({{{parts}}}, size={self.size}, seed={self.seed})"


def tag_example(example: Mapping[str, Any], domain: Domain) -> Example:
    """A copy of `example` with "domain" (the task name) and "verifier" (its reward)."""
    return {**example, "domain": domain.name, "verifier": domain.verifier}


def mixture_corpus(domains: Sequence[Domain], corpus: Callable[[str, int], list[str]],
                   num_examples: int) -> list[str]:
    """The tokenizer corpus of a mixture: the union of each domain's corpus of
    `num_examples` examples (`corpus(task name, n)`), so every domain's text is covered
    whatever its weight."""
    texts: list[str] = []
    for d in domains:
        texts += corpus(d.name, num_examples)
    return texts
