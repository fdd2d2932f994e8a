"""Slot refill against the static batch (greedy and T = 1, token for token, several slot
counts, one and eight devices), per-row budgets, their validation, one compile per shape,
and the decode-step count (slot occupancy)."""
import jax
import numpy as np
import pytest

from jaxrl_reason.models.params import init_cache
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import Sampler, resolve_budgets
from numerics import decoder_tolerance
from toy_model import BUCKET, CFG, PAD, PROMPT_LENGTHS

G, L = 4, 12
ROWS = len(PROMPT_LENGTHS) * G


@pytest.fixture(scope="module")
def budgets():
    return np.random.default_rng(3).integers(1, L + 1, ROWS).astype(np.int32)


@pytest.fixture(scope="module")
def eos_id(params, prompts, meshes):
    """A token that some rows emit before their end and others never (so rows stop at
    different steps, by EOS)."""
    out = _sample(Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD, mesh=meshes["1dev"]),
                  params["1dev"], prompts, L, temperature=0.0)
    counts = [(int(((out.tokens[:, :-1] == t).any(1)).sum()), int(t))
              for t in np.unique(out.tokens)]
    usable = [(c, t) for c, t in counts if 0 < c < ROWS]
    assert usable, "no token stops some rows and not others"
    return max(usable)[1]


def _sample(sampler, params, prompts, budgets, seed=1, **kwargs):
    out = sampler(params, *prompts, jax.random.key(seed), num_samples=G,
                  max_new_tokens=budgets, max_len=L, **kwargs)
    return jax.tree.map(np.asarray, out)


def _sampler(mesh, eos_id, slots, every=3):
    return Sampler(Transformer(CFG), eos_id=eos_id, pad_id=PAD, mesh=mesh,
                   max_num_seqs=slots, refill_every=every)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refill_equals_static_batch(params, prompts, meshes, budgets, eos_id, temperature):
    static = _sample(_sampler(meshes["1dev"], eos_id, 0), params["1dev"], prompts, budgets,
                     temperature=temperature)
    assert (static.lengths <= budgets).all()
    assert (static.lengths[static.truncated] == budgets[static.truncated]).all()
    assert (~static.truncated[static.lengths < budgets]).all()  # EOS ended those rows
    assert (~static.truncated).any() and (static.truncated & (static.lengths > 1)).any()
    tol = decoder_tolerance(CFG, params["1dev"], tokens=BUCKET + L,
                            temperature=max(temperature, 1.0))
    for mesh, slots, every in (("1dev", 1, 1), ("1dev", 3, 4), ("1dev", ROWS + 4, 2),
                               ("8dev", 4, 3), ("8dev", 8, 1)):
        sampler = _sampler(meshes[mesh], eos_id, slots, every)
        out = _sample(sampler, params[mesh], prompts, budgets, temperature=temperature)
        where = f"{mesh}, {slots} slots, refill every {every}"
        np.testing.assert_array_equal(out.tokens, static.tokens, err_msg=where)
        np.testing.assert_array_equal(out.lengths, static.lengths, err_msg=where)
        np.testing.assert_array_equal(out.truncated, static.truncated, err_msg=where)
        np.testing.assert_allclose(out.logprobs, static.logprobs, rtol=0, atol=tol,
                                   err_msg=where)
        assert (out.logprobs[np.arange(L)[None] >= out.lengths[:, None]] == 0).all()


def test_int_budget_keeps_the_static_output(params, prompts, meshes, eos_id):
    """An int max_new_tokens and the same value for every row give one output."""
    sampler = _sampler(meshes["1dev"], eos_id, 0)
    a = _sample(sampler, params["1dev"], prompts, L, temperature=1.0)
    b = _sample(sampler, params["1dev"], prompts, np.full(ROWS, L, np.int32), temperature=1.0)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_budgets_cap_every_row(params, prompts, meshes):
    """Without a stop id every row runs exactly to its own budget and is truncated."""
    small = np.tile(np.array([1, 2, 5, L], np.int32), ROWS // 4)
    for slots in (0, 2):
        out = _sample(_sampler(meshes["1dev"], -1, slots), params["1dev"], prompts, small)
        np.testing.assert_array_equal(out.lengths, small)
        assert out.truncated.all()
        assert (out.tokens[np.arange(L)[None] >= small[:, None]] == PAD).all()


def test_decode_steps_and_occupancy(params, prompts, meshes, budgets):
    """One slot decodes exactly sum(lengths - 1) steps (no idle slot-step); more slots run
    at least that work divided by the slots."""
    useful = int(budgets.sum()) - ROWS
    for slots, every in ((1, 5), (4, 1), (4, 4)):
        sampler = _sampler(meshes["1dev"], -1, slots, every)
        _sample(sampler, params["1dev"], prompts, budgets)
        steps = int(sampler.last_decode_steps)
        assert steps * slots >= useful and steps >= budgets.max() - 1
        if slots == 1:
            assert steps == useful


def test_one_compile_across_calls(params, prompts, meshes, budgets):
    sampler = _sampler(meshes["1dev"], -1, 4)
    for seed, temperature, b in ((1, 1.0, budgets), (2, 0.0, np.roll(budgets, 1)),
                                 (3, 0.7, L)):
        _sample(sampler, params["1dev"], prompts, b, seed=seed, temperature=temperature)
    assert sampler._refill._cache_size() == 1


def test_bad_budgets_and_slots_are_refused(meshes):
    with pytest.raises(ValueError, match="row 2 has a budget of 0"):
        resolve_budgets(np.array([3, 1, 0, 2]), 4)
    with pytest.raises(ValueError, match=r"row 1 has a budget of 9 .*above max_len=8"):
        resolve_budgets(np.array([3, 9]), 2, max_len=8)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        resolve_budgets(np.array([3, 1]), 4)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 0"):
        _sampler(meshes["1dev"], -1, -1)


def test_kv_cache_bytes_match_the_caches():
    def nbytes(batch, length):
        return sum(x.nbytes for x in jax.tree.leaves(init_cache(CFG, batch, length)))
    P = len(PROMPT_LENGTHS)
    static = Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD)
    refill = Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD, max_num_seqs=5)
    assert static.kv_cache_bytes(P, BUCKET, G, L) == nbytes(ROWS, BUCKET + L - 1)
    assert refill.kv_cache_bytes(P, BUCKET, G, L) == nbytes(5, BUCKET + L) + nbytes(P, BUCKET)
    # fewer rows than slots: one slot per row
    assert refill.kv_cache_bytes(1, BUCKET, 2, L) == nbytes(2, BUCKET + L) + nbytes(1, BUCKET)


def test_config_knobs_are_validated_and_reach_the_sampler(tmp_path):
    from cli_runs import ARITH, load_config
    from jaxrl_reason.runtime.build import build_runtime
    from jaxrl_reason.config.validation import validate_config

    config = load_config(ARITH)  # smoke: 4 prompts x 4 generations = 16 rows
    assert config.rl.max_num_seqs == 0  # the static batch stays the default
    config.rl.max_num_seqs = 8
    assert validate_config(config, 8) == []
    rt = build_runtime(config, str(tmp_path), devices=jax.devices()[:1])
    assert (rt.sampler.max_num_seqs, rt.sampler.refill_every) == (8, config.rl.refill_every)
    for slots, every, message in ((17, 8, "more than the 16 rows"),
                                  (-1, 8, "must be an int >= 0"),
                                  (8, 0, "rl.refill_every: must be an int >= 1")):
        config.rl.max_num_seqs, config.rl.refill_every = slots, every
        problems = validate_config(config, 8)
        assert any(message in p for p in problems), (slots, every, problems)
    config.rl.max_num_seqs, config.rl.refill_every = 6, 8
    assert any("do not split over the 4 data-parallel" in p and p.startswith("rl.max_num_seqs")
               for p in validate_config(config, 4))


def test_long_tail_benchmark_accounting():
    """benchmarks/sampler.py --workload long_tail on a small copy of the spec's workload:
    every row reaches its length, occupancy and KV-cache bytes are consistent."""
    import argparse
    import copy
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import roofline
    import sampler as bench

    spec = roofline.load_spec()
    if spec is None or not (roofline.SPEC_PATH.parent / "common.py").is_file():
        pytest.skip("the anchors' spec.json and common.py are not on this machine")
    spec = copy.deepcopy(spec)
    spec["long_tail"].update(n_prompts=2, samples_per_prompt=4, rows=8, prompt_len=8,
                             max_new_tokens=16, warmup_calls=0, timed_calls=1)
    spec["long_tail"]["lengths"].update(median=5, min=2, max=16)
    args = argparse.Namespace(spec_data=spec, cache_dtype=None, decode_stages=2, devices=1,
                              slots=4, refill_every=2, sweep_refill_every=[1], quick=False)
    r = bench.long_tail("test", args)
    lengths = bench.long_tail_lengths(spec)
    assert r["useful_tokens"] == lengths.sum() and r["rows"] == 8
    assert r["decode_steps"] * 4 >= lengths.sum() - 8
    assert 0 < r["static_slot_occupancy"] <= r["slot_occupancy"] <= 1
    assert r["kv_cache_bytes"] < r["static_kv_cache_bytes"]
    assert r["refill_every_sweep"][0]["refill_every"] == 1
