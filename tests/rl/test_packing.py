"""The packer of rl/packing.py (host numpy): first-fit decreasing, capacity, every token
placed once, the shared-prompt layout, bucketing, refusals."""
import numpy as np
import pytest

from jaxrl_reason.rl import packing


def _batch(seed=0, prompts=5, group=4, tp=7, length=13, vocab=50):
    """Left-padded prompts [P, Tp] (1..Tp real tokens) and completions [N, L] with lengths
    in [0, L] (some rows read nothing)."""
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(1, tp + 1, prompts)
    valid = np.arange(tp)[None, :] >= (tp - prompt_len)[:, None]
    prompt = np.where(valid, rng.integers(3, vocab, (prompts, tp)), 0).astype(np.int32)
    completion = rng.integers(3, vocab, (prompts * group, length)).astype(np.int32)
    lengths = rng.integers(0, length + 1, prompts * group)
    lengths[1] = 0
    lengths[2] = length
    return prompt, valid, completion, lengths


def _segments(packs, p):
    """{segment id: (tokens, positions, prompt segment)} of pack p."""
    out = {}
    for s in np.unique(packs.segment_ids[p]):
        if s == 0:
            continue
        at = packs.segment_ids[p] == s
        out[int(s)] = (packs.tokens[p, at], packs.positions[p, at],
                       np.unique(packs.prompt_segment_ids[p, at]))
    return out


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_every_token_placed_once_within_capacity_and_rows_rebuilt(share, seed):
    prompt, valid, completion, lengths = _batch(seed)
    t = 24
    packs = packing.pack(prompt, valid, completion, lengths, t, share_prompts=share)
    n, length = completion.shape
    group = n // len(prompt)
    # every scored slot is used once, and the slots are exactly the rows' read tokens
    used = packs.index[packs.index >= 0]
    assert len(np.unique(used)) == len(used) == lengths.sum()
    assert np.array_equal(packs.index >= 0, np.arange(length)[None, :] < lengths[:, None])
    # the targets gathered back are the completions; capacity is never exceeded
    want = np.where(np.arange(length)[None, :] < lengths[:, None], completion, 0)
    assert np.array_equal(packing.unpack(packs.targets, packs.index), want)
    assert packs.tokens.shape[1] == t and packs.num_packs == len(packs.tokens)
    assert np.all((packs.segment_ids > 0).sum(axis=1) <= t)
    # each row's sequence, read off its segments, is its prompt then its completion
    for i in np.flatnonzero(lengths):
        p, first = divmod(int(packs.index[i, 0]), t)
        seg = packs.segment_ids[p, first]
        tokens, positions, prompt_seg = _segments(packs, p)[int(seg)]
        prompt_i = prompt[i // group][valid[i // group]]
        if share:
            shared = prompt_seg[prompt_seg != seg]
            before = _segments(packs, p)[int(shared[0])] if len(shared) else (
                np.zeros(0, np.int32), np.zeros(0, np.int32), None)
            assert len(prompt_seg) == 1
            seq = np.concatenate([before[0], tokens])
            pos = np.concatenate([before[1], positions])
        else:
            assert np.array_equal(prompt_seg, [seg])
            seq, pos = tokens, positions
        assert np.array_equal(seq, np.concatenate([prompt_i, completion[i, :lengths[i] - 1]]))
        assert np.array_equal(pos, np.arange(len(seq)))


def test_a_group_prompt_appears_once_per_pack_and_siblings_never_share_a_segment():
    prompt, valid, completion, lengths = _batch(1, prompts=3, group=4, length=6)
    lengths[:] = 3
    packs = packing.pack(prompt, valid, completion, lengths, 64)
    assert packs.num_packs == 1
    prompt_lens = valid.sum(axis=1)
    # three prompt segments (len - 1 tokens each, none when the prompt has one token) and
    # twelve completion segments of 3 tokens: the prompts are not repeated
    assert (packs.segment_ids[0] > 0).sum() == (prompt_lens - 1).sum() + 12 * 3
    first_slots = packs.index[:, 0]
    assert len(set(packs.segment_ids[0, first_slots])) == 12


def test_first_fit_decreasing_is_deterministic_and_ordered_as_documented():
    prompt_lengths = np.array([1, 1, 1, 1])
    lengths = np.array([5, 3, 5, 2])            # sizes 5, 3, 5, 2 (prompt 1 + n - 1)
    packs = packing.assign_packs(prompt_lengths, lengths, 1, 8)
    # sorted (-size, row): rows 0, 2, 1, 3 -> pack 0 {0, 1} (5 + 3), pack 1 {2, 3}
    assert packs == [[0, 1], [2, 3]]
    a = packing.pack(*_batch(3), 20)
    b = packing.pack(*_batch(3), 20)
    for x, y in zip(a.arrays().values(), b.arrays().values()):
        assert np.array_equal(x, y)


def test_a_sibling_prefers_the_pack_holding_its_prompt():
    # group 0: prompt 4 tokens, rows 0, 1; group 1: prompt 4 tokens, rows 2, 3
    prompt_lengths, lengths = np.array([4, 4]), np.array([6, 2, 5, 1])
    packs = packing.assign_packs(prompt_lengths, lengths, 2, 12)
    # row 0 (size 9) opens pack 0; row 2 (8) opens pack 1; row 1 (size 5) fits pack 0 as a
    # completion segment of 2 next to its prompt; row 3 joins pack 1 the same way
    assert packs == [[0, 1], [2, 3]]


def test_buckets_are_at_most_four_and_hold_the_bound():
    for most in (1, 3, 16, 100, 1000):
        for multiple in (1, 2, 8):
            buckets = packing.pack_buckets(most, multiple)
            assert 1 <= len(buckets) <= 4
            assert buckets[-1] >= most and all(b % multiple == 0 for b in buckets)
    assert packing.pack_buckets(64, 2) == (8, 16, 32, 64)
    assert packing.bucket_for(9, (8, 16, 32, 64)) == 16
    with pytest.raises(ValueError, match="exceed the largest pack bucket"):
        packing.bucket_for(65, (8, 16, 32, 64))


def test_the_ladder_is_fine_and_holds_the_bound():
    assert packing.pack_ladder(64) == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 23, 27, 32,
                                       39, 46, 54, 64)
    assert packing.pack_ladder(64, 8) == (8, 16, 24, 32, 40, 48, 56, 64)
    assert packing.pack_ladder(1) == (1,)
    for most in (1, 3, 13, 100):
        for multiple in (1, 2, 8):
            ladder = packing.pack_ladder(most, multiple)
            assert ladder[-1] >= most and all(b % multiple == 0 for b in ladder)
            # neighbouring rungs differ by a rung's ratio at most (or one multiple)
            assert all(b <= max(a + multiple, np.ceil(a * packing.LADDER_RATIO) + multiple)
                       for a, b in zip(ladder, ladder[1:]))
    with pytest.raises(ValueError, match="pack_ladder needs most >= 1"):
        packing.pack_ladder(0)


def test_pack_buckets_pick_tight_rungs_and_at_most_four():
    counts = packing.PackBuckets(64)
    # 12 and 13 packs get their own rungs, 11 reuses 12, the last free rung is halfway
    # between 16 (the rung for 15) and 64, and beyond it everything goes to the top
    assert [counts(k) for k in (12, 13, 11, 14, 15, 17, 33, 3)] == [12, 14, 12, 14, 32, 32,
                                                                      64, 12]
    assert counts.used == {12, 14, 32, 64}
    with pytest.raises(ValueError, match="65 packs exceed the largest pack bucket 64"):
        counts(65)


@pytest.mark.parametrize("seed", range(4))
def test_pack_buckets_never_exceed_four_sizes(seed):
    rng = np.random.default_rng(seed)
    for most, multiple in ((64, 1), (91, 8), (5, 2)):
        counts, again = packing.PackBuckets(most, multiple), packing.PackBuckets(most, multiple)
        needs = rng.integers(1, most + 1, 200)
        sizes = [counts(int(k)) for k in needs]
        assert all(size >= k and size % multiple == 0 for size, k in zip(sizes, needs))
        assert 1 <= len(counts.used) <= 4 and set(sizes) == counts.used
        assert [again(int(k)) for k in needs] == sizes  # the same batches, the same choices


@pytest.mark.parametrize("seed", range(6))
def test_packs_never_exceed_the_any_fit_bound(seed):
    rng = np.random.default_rng(seed)
    prompts, group, t = 8, 4, 40
    prompt_lengths = rng.integers(1, 12, prompts)
    lengths = rng.integers(0, 29, prompts * group)
    most_tokens = int(prompt_lengths.max()) + 28 - 1
    for share in (True, False):
        packs = packing.assign_packs(prompt_lengths, lengths, group, t, share)
        assert len(packs) <= packing.max_packs(prompts * group, most_tokens, t)
        sizes = packing.row_sizes(prompt_lengths, lengths, group)
        assert len(packs) <= max(1, -(-2 * int(sizes.sum()) // t))


def test_a_batch_is_padded_to_its_bucket_with_empty_packs():
    prompt, valid, completion, lengths = _batch(2)
    packs = packing.pack(prompt, valid, completion, lengths, 24, buckets=(64,))
    assert packs.tokens.shape == (64, 24)
    assert np.all(packs.segment_ids[packs.num_packs:] == 0)


def test_a_row_longer_than_the_pack_is_refused_by_name():
    prompt, valid, completion, lengths = _batch(0, tp=7, length=13)
    lengths[:] = 0
    lengths[6] = 13
    need = valid[6 // 4].sum() + 12
    with pytest.raises(ValueError, match=f"row 6 needs {need} tokens .* rl.pack_tokens = 10"):
        packing.pack(prompt, valid, completion, lengths, 10)
    with pytest.raises(ValueError, match="do not fit in rl.pack_tokens = 10"):
        packing.max_packs(16, 11, 10)


def test_empty_batches_and_promptless_rows():
    prompt, valid, completion, lengths = _batch(0)
    packs = packing.pack(prompt, valid, completion, np.zeros_like(lengths), 24,
                         buckets=(2, 4))
    assert packs.num_packs == 0 and packs.tokens.shape == (2, 24)
    assert np.all(packs.index == -1)
    valid = valid.copy()
    valid[1] = False
    lengths[4:8] = 0
    packing.pack(prompt, valid, completion, lengths, 24)  # group 1 reads nothing: fine
    lengths[5] = 2
    with pytest.raises(ValueError, match="row 5 reads 2 completion tokens but its prompt 1 "
                                         "has no token"):
        packing.pack(prompt, valid, completion, lengths, 24)


def test_config_validation_names_packing_problems():
    from trainer_support import SMOKE
    from jaxrl_reason.cli import parse
    from jaxrl_reason.config.validation import validate_config

    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, "--config.rl.packing=True"])
    config = fv.config
    assert validate_config(config, 1) == []
    config.rl.advantage_estimator = "gae"  # the PPO critic's passes are packed too
    assert validate_config(config, 1) == []
    config.rl.micro_batches = 2  # micro-batches of packs
    assert validate_config(config, 1) == []
    config.rl.pack_tokens = 40
    problems = "\n".join(validate_config(config, 1))
    assert "rl.pack_tokens: 40 cannot hold the longest row, 63 tokens" in problems
