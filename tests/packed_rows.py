"""Rows for the packing tests (tests/rl/test_packing_update.py and the context-parallel
tests): a few groups of completions with uneven lengths over left-padded prompts."""

from __future__ import annotations

import numpy as np


def packed_rows(seed: int = 0, vocab: int = 64, prompts: int = 4, group: int = 4,
                prompt_len: int = 6, length: int = 11):
    """Left-padded prompts int32 [P, Tp] (valid lengths 6, 1, 4, 3: one a single token),
    their validity bool [P, Tp], completions int32 [P * G, L], lengths int [P * G] in
    [0, L] (row 3 reads nothing, row 5 all L) and the completion mask float32 [P * G, L]."""
    rng = np.random.default_rng(seed)
    valid_len = np.array([6, 1, 4, 3])[:prompts]
    valid = np.arange(prompt_len)[None, :] >= (prompt_len - valid_len)[:, None]
    prompt = np.where(valid, rng.integers(3, vocab, (prompts, prompt_len)), 0).astype(np.int32)
    completion = rng.integers(3, vocab, (prompts * group, length)).astype(np.int32)
    lengths = rng.integers(1, length + 1, prompts * group)
    lengths[3], lengths[5] = 0, length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    return prompt, valid, completion, lengths, mask
