"""The random-access source shared by the procedural tasks (arithmetic, countdown, logic).

A task module provides `make_example(split, level, index, seed) -> dict` and `MAX_LEVEL`;
`LevelSource` turns that into a grain data source, and `level_corpus` into the texts its
tokenizer is trained on.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

SPLITS = ("train", "eval")
MakeExample = Callable[[str, int, int, int], dict[str, Any]]


class LevelSource:
    """Random-access source of generated problems (the grain data-source protocol).

    Item i has level `levels[i % len(levels)]` (every level equally represented) and is
    `make_example(split, level, i // len(levels), seed)`.

    Args:
      task: name for messages and repr.
      make_example: the task's deterministic generator.
      max_level: levels are 1..max_level.
      split: "train" or "eval".
      levels: difficulty levels to draw from.
      size: number of items (len of the source).
      seed: generator seed; two sources with the same arguments hold identical items.
    """

    def __init__(self, task: str, make_example: MakeExample, max_level: int, split: str,
                 levels: tuple[int, ...] | list[int], size: int, seed: int):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not levels:
            raise ValueError(f"{task} source needs at least one level")
        for level in levels:
            if isinstance(level, bool) or not isinstance(level, int) \
                    or not 1 <= level <= max_level:
                raise ValueError(f"{task} level must be in 1..{max_level}, got {level!r}")
        if size <= 0:
            raise ValueError(f"{task} source size must be positive, got {size}")
        self.task, self._make = task, make_example
        self.split, self.levels, self.size, self.seed = split, tuple(levels), int(size), seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for source of size {self.size}")
        level = self.levels[index % len(self.levels)]
        return self._make(self.split, level, index // len(self.levels), self.seed)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(split={self.split!r}, levels={self.levels}, "
                f"size={self.size}, seed={self.seed})")


def level_corpus(make_example: MakeExample, max_level: int, num_examples: int,
                 seed: int) -> list[str]:
    """Texts to train a task tokenizer on: prompts and completions of every level."""
    texts = []
    for i in range(num_examples):
        example = make_example("train", 1 + i % max_level, i, seed)
        texts.append(example["prompt"])
        texts.append(example["completion"])
    return texts
