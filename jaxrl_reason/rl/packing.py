"""Padding-free packing of the training-side passes (host side, numpy).

A row of an RL batch is a prompt (left-padded, shared by a group of G consecutive rows) and
a completion (right-padded to L). The padded passes run every row at the batch's longest
length; packing concatenates the tokens the passes actually read into packs of at most T
tokens, so that the work follows the real tokens.

Layout of a pack (`share_prompts=True`, the default with the reference attention):

  [prompt g[:-1]] [g[-1], c_0 .. c_{n-2}] [g[-1], c'_0 .. c'_{n'-2}] ... [prompt h[:-1]] ...
   prompt segment  completion segment      completion segment (sibling)

A group's prompt appears once per pack that holds some of its completions: its tokens but
the last form the prompt segment. Each completion segment starts with the prompt's last
token (its hidden state predicts completion token 0, and each completion has its own) and
goes on with the completion's tokens but the last (the last token predicts nothing that is
scored). A completion token attends causally to its own segment and to its group's prompt
segment, never to a sibling completion: `prompt_segment_ids` names that prompt segment (a
prompt token, and a completion whose prompt has one token, name their own segment). Values
equal the padded pass's up to float summation order: same keys, same RoPE positions.
With `share_prompts=False` (the splash / cuDNN kernels, which know only "same segment
attends") every row is one segment, prompt and completion, and `prompt_segment_ids` equals
`segment_ids`.

Packing is first-fit decreasing: rows sorted by their size (prompt + completion tokens, the
pack space a row needs alone) decreasing, ties by row index increasing; each row goes to the
first pack (in opening order) that already holds its group's prompt and has room for its
completion segment, else to the first pack with room for its prompt and its completion,
else to a new pack. Rows that read no token (length 0: masked, skipped or padding rows) are
placed nowhere. Inside a pack, groups are in increasing group order, each its prompt segment
then its completions in increasing row order; segments are numbered 1, 2, ... in that order.

Any-fit bound: a pack is opened only for a row that fits in no open pack, so at most one
pack is at most half full and K <= max(1, ceil(2 S / T)) for S tokens placed. `max_packs`
bounds K over a run from its largest possible row: M packs at most. A run's pack counts
come from a fine ladder (`pack_ladder`: M divided by 2**(1/4) again and again, rounded up
to a multiple of the data-parallel size, or with micro-batches of a micro-batch's packs),
and `PackBuckets` picks at most 4 of its rungs as the batches come, the top always among
the allowed ones: a run compiles at most 4 shapes, and a batch pays for a rung (about 19 %)
of empty packs at most, not for the next power of two.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

logger = logging.getLogger(__name__)
NUM_BUCKETS = 4
LADDER_RATIO = 2 ** 0.25  # pack counts one rung apart differ by about 19 %


@dataclasses.dataclass(frozen=True)
class Packs:
    """The packed inputs of a log-prob pass. K packs of T tokens; N rows of L completion
    tokens.

    tokens int32 [K, T]; positions int32 [K, T] (RoPE positions, restarting per sequence:
    a completion continues its prompt's); segment_ids int32 [K, T] (>= 1, 0 for padding);
    prompt_segment_ids int32 [K, T] (the other segment a token attends to, see the module
    docstring; 0 for padding); targets int32 [K, T] (the completion token the hidden state
    at this slot predicts, 0 where none); index int32 [N, L] (the flat slot k * T + t
    predicting completion token j of row i, -1 where row i reads no token j); num_packs:
    the packs holding tokens (K minus the bucket's empty packs).
    """
    tokens: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    prompt_segment_ids: np.ndarray
    targets: np.ndarray
    index: np.ndarray
    num_packs: int

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a packed pass takes, by name (`pack_*`)."""
        return {"pack_tokens": self.tokens, "pack_positions": self.positions,
                "pack_segments": self.segment_ids,
                "pack_prompt_segments": self.prompt_segment_ids,
                "pack_targets": self.targets, "pack_index": self.index}


def row_sizes(prompt_lengths: np.ndarray, lengths: np.ndarray, group: int) -> np.ndarray:
    """int64 [N]: the pack tokens row i needs alone, prompt_lengths[i // group] + lengths[i]
    - 1 (0 for a row of length 0).

    prompt_lengths: int [P], real prompt tokens; lengths: int [N], completion tokens read."""
    lengths = np.asarray(lengths, np.int64)
    sizes = np.repeat(np.asarray(prompt_lengths, np.int64), group) + lengths - 1
    return np.where(lengths > 0, sizes, 0)


def assign_packs(prompt_lengths: np.ndarray, lengths: np.ndarray, group: int,
                 pack_tokens: int, share_prompts: bool = True) -> list[list[int]]:
    """First-fit decreasing (module docstring): the rows of each pack, in opening order.

    Args:
      prompt_lengths: int [P], the real tokens of each prompt (>= 1 where a row reads).
      lengths: int [N], N = P * group, the completion tokens each row reads (0: not placed).
      group: G, rows per prompt. pack_tokens: T. share_prompts: see the module docstring.
    Returns: list of K lists of row indices (unordered within a pack).
    Raises ValueError naming the row when it needs more than T tokens or its prompt has none.
    """
    prompt_lengths = np.asarray(prompt_lengths, np.int64)
    sizes = row_sizes(prompt_lengths, lengths, group)
    for i in np.flatnonzero(sizes > 0):
        if prompt_lengths[i // group] < 1:
            raise ValueError(f"packing: row {i} reads {lengths[i]} completion tokens but its "
                             f"prompt {i // group} has no token")
        if sizes[i] > pack_tokens:
            raise ValueError(
                f"packing: row {i} needs {sizes[i]} tokens (prompt {prompt_lengths[i // group]}"
                f" + completion {lengths[i]} - 1), more than rl.pack_tokens = {pack_tokens}")
    order = sorted(np.flatnonzero(sizes > 0).tolist(), key=lambda i: (-sizes[i], i))
    packs: list[list[int]] = []
    free: list[int] = []
    groups: list[set[int]] = []
    for i in order:
        g, cost = i // group, int(sizes[i])
        shared = int(lengths[i])  # its completion segment alone, next to its prompt
        target = None
        if share_prompts:
            target = next((k for k in range(len(packs))
                           if g in groups[k] and free[k] >= shared), None)
            if target is not None:
                cost = shared
        if target is None:
            target = next((k for k in range(len(packs)) if free[k] >= cost), None)
        if target is None:
            packs.append([])
            free.append(pack_tokens)
            groups.append(set())
            target = len(packs) - 1
        packs[target].append(i)
        free[target] -= cost
        groups[target].add(g)
    return packs


def max_packs(num_rows: int, max_row_tokens: int, pack_tokens: int) -> int:
    """The most packs `assign_packs` can open for num_rows rows of at most max_row_tokens
    tokens each: min(num_rows, max(1, ceil(2 * num_rows * max_row_tokens / pack_tokens)))
    (one pack per row at worst; the any-fit bound of the module docstring)."""
    if max_row_tokens > pack_tokens:
        raise ValueError(f"packing: rows of up to {max_row_tokens} tokens do not fit in "
                         f"rl.pack_tokens = {pack_tokens}")
    bound = -(-2 * num_rows * max_row_tokens // pack_tokens)
    return max(1, min(num_rows, bound))


def pack_buckets(most: int, multiple: int = 1, count: int = NUM_BUCKETS) -> tuple[int, ...]:
    """The pack counts a run compiles for: ceil(most / 2**k) for k < count, each rounded up
    to a multiple of `multiple` (the data-parallel size), deduplicated, increasing. At most
    `count` sizes; the largest holds `most` packs."""
    sizes = {-(-(-(-most // 2 ** k)) // multiple) * multiple for k in range(count)}
    return tuple(sorted(sizes))


def bucket_for(num_packs: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= num_packs; ValueError when none holds it."""
    for size in buckets:
        if size >= num_packs:
            return size
    raise ValueError(f"packing: {num_packs} packs exceed the largest pack bucket "
                     f"{buckets[-1]} (buckets {buckets})")


def pack_ladder(most: int, multiple: int = 1, ratio: float = LADDER_RATIO) -> tuple[int, ...]:
    """The pack counts a run may compile for: ceil(most / ratio**k) for k = 0, 1, ... down
    to 1, each rounded up to a multiple of `multiple` (the data-parallel size),
    deduplicated, increasing. The largest holds `most` packs."""
    if most < 1 or multiple < 1 or ratio <= 1:
        raise ValueError(f"packing: pack_ladder needs most >= 1, multiple >= 1 and ratio > 1, "
                         f"got {most}, {multiple}, {ratio}")
    sizes, size = set(), float(most)
    while True:
        sizes.add(-(-int(np.ceil(size - 1e-9)) // multiple) * multiple)
        if size <= 1:
            return tuple(sorted(sizes))
        size = max(1.0, size / ratio)


class PackBuckets:
    """A run's pack counts: at most `count` rungs of `pack_ladder(most, multiple)`, chosen
    as batches come (the same batches give the same choices on every process).

    For a batch of K packs, with r the smallest rung >= K:
      - an already chosen rung among r and the next one up is reused (the smallest);
      - else, while fewer than count - 1 rungs below the top are chosen, a new one is:
        r itself, or for the last free one the rung halfway (in rungs) between r and the
        top, so that batches growing later still find a rung below the top;
      - else the smallest chosen rung >= K, or the top (the ladder's largest, always
        allowed).
    So at most `count` distinct sizes come out, each >= K and a multiple of `multiple`.
    """

    def __init__(self, most: int, multiple: int = 1, count: int = NUM_BUCKETS):
        if count < 2:
            raise ValueError(f"packing: PackBuckets needs count >= 2, got {count}")
        self.ladder, self.count = pack_ladder(most, multiple), count
        self.chosen: set[int] = set()  # rungs below the top picked so far
        self.used: set[int] = set()  # every pack count returned so far (at most count)

    def __call__(self, num_packs: int) -> int:
        """The pack count (>= num_packs) a batch of `num_packs` packs is padded to."""
        size = self._choose(num_packs)
        self.used.add(size)
        return size

    def _choose(self, num_packs: int) -> int:
        ladder, top = self.ladder, self.ladder[-1]
        if num_packs > top:
            raise ValueError(f"packing: {num_packs} packs exceed the largest pack bucket "
                             f"{top} (ladder {ladder})")
        i = next(k for k, size in enumerate(ladder) if size >= num_packs)
        near = [size for size in ladder[i:i + 2] if size in self.chosen]
        if near:
            return near[0]
        free = self.count - 1 - len(self.chosen - {top})
        if free > 0:
            size = ladder[i] if free > 1 else ladder[(i + len(ladder) - 1) // 2]
            self.chosen.add(size)
            return size
        return min(size for size in self.chosen | {top} if size >= num_packs)


def pack(prompt_tokens: np.ndarray, prompt_valid: np.ndarray, completion_tokens: np.ndarray,
         lengths: np.ndarray, pack_tokens: int, buckets: tuple[int, ...] | None = None,
         share_prompts: bool = True) -> Packs:
    """Packs a batch (module docstring), padded to a bucket of pack counts.

    Args:
      prompt_tokens: int32 [P, Tp]; prompt_valid: bool [P, Tp] (a prompt's real tokens, in
        order; left-padded in practice); P = N / G, a prompt per group of G consecutive rows
        (G = 1: a prompt per row).
      completion_tokens: int32 [N, L]; lengths: int [N], the completion tokens each row reads
        (its mask is arange(L) < lengths).
      pack_tokens: T. buckets: `pack_buckets`' sizes, a `PackBuckets` (any callable from
        the packs needed to the pack count), or None (exactly the packs needed).
      share_prompts: a prompt once per pack for its group (True) or once per row (False).
    Returns: `Packs` with K = bucket_for(packs needed, buckets) (or buckets(packs needed)).
    """
    prompt_tokens, prompt_valid = np.asarray(prompt_tokens), np.asarray(prompt_valid, bool)
    completion_tokens, lengths = np.asarray(completion_tokens), np.asarray(lengths, np.int64)
    num_rows, length = completion_tokens.shape
    if num_rows % len(prompt_tokens) or lengths.shape != (num_rows,):
        raise ValueError(f"packing: {num_rows} completion rows (lengths {lengths.shape}) "
                         f"cannot share {len(prompt_tokens)} prompts")
    if lengths.min(initial=0) < 0 or lengths.max(initial=0) > length:
        raise ValueError(f"packing: lengths must be in [0, {length}], got "
                         f"[{lengths.min()}, {lengths.max()}]")
    group = num_rows // len(prompt_tokens)
    prompts = [row[valid] for row, valid in zip(prompt_tokens, prompt_valid)]
    rows_of = assign_packs(np.array([len(p) for p in prompts]), lengths, group, pack_tokens,
                           share_prompts)
    k = (len(rows_of) if buckets is None else buckets(len(rows_of)) if callable(buckets)
         else bucket_for(len(rows_of), buckets))
    out = {name: np.zeros((k, pack_tokens), np.int32)
           for name in ("tokens", "positions", "segments", "prompt_segments", "targets")}
    index = np.full((num_rows, length), -1, np.int32)
    for p, rows in enumerate(rows_of):
        slot, segment = 0, 0

        def put(tokens, start, prompt_segment=None):
            nonlocal slot, segment
            segment += 1
            span = slice(slot, slot + len(tokens))
            out["tokens"][p, span] = tokens
            out["positions"][p, span] = start + np.arange(len(tokens))
            out["segments"][p, span] = segment
            out["prompt_segments"][p, span] = prompt_segment or segment
            slot += len(tokens)
            return span

        for g in sorted({i // group for i in rows}):
            prompt = prompts[g]
            prompt_segment = None
            if share_prompts and len(prompt) > 1:
                put(prompt[:-1], 0)
                prompt_segment = segment
            for i in sorted(r for r in rows if r // group == g):
                n = int(lengths[i])
                if share_prompts:
                    seq, first = np.concatenate([prompt[-1:], completion_tokens[i, :n - 1]]), 0
                    span = put(seq, len(prompt) - 1, prompt_segment)
                else:
                    seq = np.concatenate([prompt, completion_tokens[i, :n - 1]])
                    span = put(seq, 0)
                    first = len(prompt) - 1
                scored = np.arange(span.start + first, span.start + first + n)
                out["targets"][p, scored] = completion_tokens[i, :n]
                index[i, :n] = p * pack_tokens + scored
    return Packs(out["tokens"], out["positions"], out["segments"], out["prompt_segments"],
                 out["targets"], index, len(rows_of))


def unpack(packed: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Per-slot values [K, T] (numpy; the device side gathers the same way) -> per-row
    values [N, L]: packed.reshape(-1)[index], 0 where index is -1."""
    flat = np.asarray(packed).reshape(-1)
    return np.where(index >= 0, flat[np.maximum(index, 0)], 0).astype(flat.dtype)


def packs_per_micro_batch(most: int, data_parallel: int, micro_batches: int) -> int | None:
    """The packs of one micro-batch when a run's largest batch (`most` packs) is split
    into `micro_batches` (rl.micro_batches): ceil(most / micro_batches) rounded up to a
    multiple of `data_parallel` (each shard gets as many); None for one micro-batch (all
    of a batch's packs at once, however many)."""
    if micro_batches <= 1:
        return None
    per = -(-most // micro_batches)
    return -(-per // data_parallel) * data_parallel


class Packer:
    """The packer of a run: `pack` with the run's T, pack counts (`PackBuckets`) and prompt
    sharing. `buckets`: the pack counts chosen so far (at most 4).

    With micro-batches, a micro-batch holds `packs_per_micro` packs (the peak activation
    memory of the training passes) and pack counts are multiples of it: a batch of K packs
    runs K / packs_per_micro micro-batches, rl.micro_batches for the largest batch, fewer
    for lighter ones.

    Args:
      pack_tokens: T (rl.pack_tokens). num_rows: N, the rows of an update batch.
      max_row_tokens: the largest row a run can have (longest prompt + completion budget
        - 1): with N it bounds the pack count (`max_packs`).
      multiple: the data-parallel size (pack counts are multiples of it).
      share_prompts: `shares_prompts(model config)`.
      micro_batches: rl.micro_batches (`packs_per_micro_batch`).
    """

    def __init__(self, pack_tokens: int, num_rows: int, max_row_tokens: int, multiple: int,
                 share_prompts: bool, micro_batches: int = 1):
        self.pack_tokens, self.share_prompts = int(pack_tokens), bool(share_prompts)
        most = max_packs(num_rows, max_row_tokens, pack_tokens)
        self.packs_per_micro = packs_per_micro_batch(most, multiple, int(micro_batches))
        self.counts = PackBuckets(most, self.packs_per_micro or multiple)

    @property
    def buckets(self) -> tuple[int, ...]:
        """The pack counts this run has used so far, increasing (at most 4)."""
        return tuple(sorted(self.counts.used))

    def __call__(self, prompt_tokens, prompt_valid, completion_tokens, lengths) -> Packs:
        """`pack` (same arguments) into this run's pack counts."""
        return pack(prompt_tokens, prompt_valid, completion_tokens, lengths, self.pack_tokens,
                    self.counts, self.share_prompts)


def packer_for(config, model_cfg, data_parallel: int) -> Packer | None:
    """The run's `Packer` with `config.rl.packing` (None without): T = rl.pack_tokens, N =
    rl.batch_prompts * rl.num_generations rows of at most max(task.prompt_buckets) +
    rl.max_new_tokens - 1 tokens, pack counts multiples of `data_parallel`, or with
    rl.micro_batches > 1 of the packs of a micro-batch (`Packer`)."""
    rl = config.rl
    if not rl.get("packing", False):
        return None
    return Packer(rl.pack_tokens, rl.batch_prompts * rl.num_generations,
                  max(config.task.prompt_buckets) + rl.max_new_tokens - 1, data_parallel,
                  shares_prompts(model_cfg), int(rl.get("micro_batches", 1)))


_NOTED: set[str] = set()


def shares_prompts(model_cfg) -> bool:
    """Whether packs may share a group's prompt among its completions: only under the
    reference attention (its mask takes `prompt_segment_ids`) and without sliding-window
    layers (whose window counts slots, and a shared prompt sits further back in the pack
    than in its row). The splash and cuDNN kernels know only "same segment attends": under
    them, or with a window, each row repeats its prompt (more tokens, same values); one INFO
    line says so, once per process."""
    from jaxrl_reason.models.attention import resolve_impl

    impl = resolve_impl(model_cfg.attention_impl)
    why = (f"{impl} attention has no shared-prompt mask" if impl != "reference" else
           "sliding-window layers count slots" if model_cfg.sliding_window else None)
    if why is None:
        return True
    if why not in _NOTED:
        _NOTED.add(why)
        logger.info("packing: %s; each packed row repeats its prompt", why)
    return False
