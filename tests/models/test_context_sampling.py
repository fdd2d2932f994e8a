"""The sampler under context parallelism: decoding keeps whole sequences, so the context
axis splits the sampler's rows instead (`sharding.sampling_rules`): each context shard
decodes, and keeps the KV cache of, its own rows. Same tokens and log-probs as at context 1;
the config refuses slots that do not split over data x context."""
import dataclasses
import os

import jax
import numpy as np

from packed_rows import packed_rows
from jaxrl_reason.cli import parse
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.params import cache_shardings, init_params
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.sampling.sampler import Sampler

RULES = shd.DEFAULT_RULES
SMOKE = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "arith_grpo.py") + ":smoke"


def test_sampling_rules_move_the_context_axis_from_length_to_batch():
    cp = shd.make_mesh({"data": 2, "context": 4})
    rules = dict(shd.sampling_rules(RULES, cp))
    assert rules["batch"] == ("data", "fsdp", "context") and rules["length"] is None
    assert {k: v for k, v in rules.items() if k not in ("batch", "length")} == \
        {k: v for k, v in RULES if k not in ("batch", "length")}
    # context 1 (or no mesh): the rules as they are
    assert shd.sampling_rules(RULES, shd.make_mesh({"data": 8})) == tuple(RULES)
    assert shd.sampling_rules(RULES, None) == tuple(RULES)
    # 16 rows of KV cache: 2 per device at data 2 x context 4 (not 8 per context group)
    cfg = get_preset("test")
    sharding = cache_shardings(cfg, cp, shd.sampling_rules(RULES, cp), 16, 32)
    k = jax.tree.leaves(sharding, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))[0]
    shape = (cfg.n_layers, 16, cfg.n_kv_heads, 32, cfg.head_dim) if cfg.scan_layers else \
        (16, cfg.n_kv_heads, 32, cfg.head_dim)
    rows_axis = 1 if cfg.scan_layers else 0
    assert k.shard_shape(shape)[rows_axis] == 2


def test_sampling_under_context_parallelism_equals_context_one():
    """Data 2 x context 4 with the sampling rules against data 2 alone: the same tokens and
    log-probs (row-wise programs; the rows just live on more devices), and the output rows
    are split over all 8 devices."""
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    model = Transformer(cfg)
    prompt, valid, _, _, _ = packed_rows(0, 64, 4, 4, 6, 11)
    outs = []
    for mesh in (shd.make_mesh({"data": 2}, jax.devices()[:2]),
                 shd.make_mesh({"data": 2, "context": 4})):
        rules = shd.sampling_rules(RULES, mesh)
        params = init_params(cfg, jax.random.key(0), mesh, RULES)
        sampler = Sampler(model, eos_ids=(1,), pad_id=0, mesh=mesh, rules=rules)
        out = sampler(params, shd.put_batch(mesh, RULES, prompt),
                      shd.put_batch(mesh, RULES, valid), jax.random.key(1), num_samples=2,
                      max_new_tokens=8, temperature=1.0)
        outs.append((np.asarray(out.tokens), np.asarray(out.logprobs)))
        if mesh.shape["context"] > 1:
            rows = out.tokens.sharding.shard_shape(out.tokens.shape)[0]
            assert rows == len(out.tokens) // 8, out.tokens.sharding
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=0, atol=1e-6)


def test_slots_must_split_over_data_and_context():
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    config = fv.config
    config.rl.packing, config.rl.pack_tokens = True, 256
    config.mesh.data, config.mesh.context = 2, 4
    config.rl.max_num_seqs = 8
    assert not [p for p in validate_config(config, 8) if "max_num_seqs" in p]
    config.rl.max_num_seqs = 4
    problems = [p for p in validate_config(config, 8) if "max_num_seqs" in p]
    assert problems and "2 data-parallel shards x 4 context shards" in problems[0], problems
