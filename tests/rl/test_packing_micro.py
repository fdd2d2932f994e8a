"""Micro-batched packed passes (rl.packing with rl.micro_batches = k > 1): the packs split
into strided micro-batches of a fixed number of packs (k of them for the run's largest
batch, fewer for lighter ones), each row's loss counted in the one micro-batch holding its
pack. Against the one-micro-batch packed pass (itself checked against the padded one in
tests/rl/test_packing_update.py): log-probs, loss, every metric and the gradients, in
float32, for every GRPO-family aggregation. The micro-batched update's metrics are the
whole batch's (not means of micro-batch metrics), padded and packed."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from packed_rows import packed_rows
from trainer_support import SMOKE
from jaxrl_reason.cli import parse
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.params import init_params
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.batches import to_micro
from jaxrl_reason.rl.micro import micro_batch_count, micro_pack_index
from jaxrl_reason.rl.update import make_logprob_fn, make_packed_logprob_fn, make_update_fn
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import decoder_grad_tolerance, decoder_tolerance

PROMPTS, GROUP, TP, LENGTH, T = 4, 4, 6, 11, 24


def test_micro_pack_index_addresses_each_token_in_exactly_one_micro_batch():
    rng = np.random.default_rng(0)
    packs, t, k = 8, 5, 4
    values = rng.normal(size=(packs, t)).astype(np.float32)
    index = rng.integers(-1, packs * t, (6, 7)).astype(np.int32)
    micro = np.asarray(to_micro(jnp.asarray(values), k))           # [k, packs / k, t]
    seen = np.zeros(index.shape, int)
    for i in range(k):
        local = np.asarray(micro_pack_index(jnp.asarray(index), i, k, t))
        mine = local >= 0
        seen += mine
        # the micro-batch's slot holds the value the whole-batch slot holds
        np.testing.assert_array_equal(micro[i].reshape(-1)[local[mine]],
                                      values.reshape(-1)[index[mine]])
        np.testing.assert_array_equal(mine, (index >= 0) & ((index // t) % k == i))
    np.testing.assert_array_equal(seen, (index >= 0).astype(int))


def _setup(devices):
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:devices])
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    return mesh, cfg, init_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)


def _put(mesh, x):
    x = np.asarray(x)
    if len(x) % shd.data_parallel_size(mesh, shd.DEFAULT_RULES):
        return shd.put_replicated(mesh, x)
    return shd.put_batch(mesh, shd.DEFAULT_RULES, x)


def _packs(mesh, rows, multiple):
    """The rows' packs, the pack count a multiple of `multiple` (data-parallel x k)."""
    prompt, valid, completion, lengths, _ = rows
    counts = packing.PackBuckets(packing.max_packs(len(completion), TP + LENGTH - 1, T),
                                 multiple)
    packs = packing.pack(prompt, valid, completion, lengths, T, counts)
    assert packs.num_packs > 2, "the rows must fill several packs"
    return {name: _put(mesh, x) for name, x in packs.arrays().items()}


def _rl(loss_type, micro_batches):
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    rl = fv.config.rl
    rl.loss_type, rl.beta, rl.num_iterations = loss_type, 0.04, 2
    rl.entropy_coef, rl.epsilon_high, rl.max_new_tokens = 0.01, 0.28, LENGTH
    rl.micro_batches = micro_batches
    return rl


def _batch(mesh, model, params, rl, rows, packs):
    prompt, valid, completion, _, mask = rows
    rng = np.random.default_rng(3)
    logp0 = np.asarray(make_logprob_fn(model, rl.temperature)(
        params, *(jnp.asarray(x) for x in (prompt, valid, completion, mask))))
    host = {"mask": mask, "loss_mask": mask,
            "advantages": rng.normal(size=len(mask)).astype(np.float32),
            "old_logp": (logp0 + rng.normal(0, 0.3, mask.shape) * mask).astype(np.float32),
            "ref_logp": (logp0 + rng.normal(0, 0.2, mask.shape) * mask).astype(np.float32),
            "sampler_logp": logp0}
    batch = {name: _put(mesh, x) for name, x in host.items()}
    batch.update(num_sequences=np.float32(len(mask)), num_tokens=np.float32(mask.sum()),
                 beta=np.float32(rl.beta), **packs)
    return batch


def _update(model, rl, mesh, batch, params, packed=True, per_micro=None):
    sgd = optax.sgd(1.0)
    update = make_update_fn(model, sgd, rl, mesh, shd.DEFAULT_RULES, packed=packed,
                            packs_per_micro=per_micro)
    new, metrics = update(create_train_state(jax.tree.map(jnp.copy, params), sgd), batch)
    grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
    return jax.device_get(metrics), grads


@pytest.mark.parametrize("devices,k,loss_type", [
    (8, 2, "grpo"), (8, 2, "bnpo"), (8, 2, "dr_grpo"), (8, 2, "dapo"), (1, 4, "dapo")])
def test_micro_batched_packed_update_equals_one_micro_batch(devices, k, loss_type):
    """One SGD step at rate 1 with the KL term, the entropy bonus and clipping engaged:
    k micro-batches of packs against all packs at once, on the same packs."""
    mesh, cfg, params = _setup(devices)
    model, rows = Transformer(cfg), packed_rows(2, 64, PROMPTS, GROUP, TP, LENGTH)
    packs = _packs(mesh, rows, devices * k)
    assert packs["pack_tokens"].shape[0] % k == 0
    batch = _batch(mesh, model, params, _rl(loss_type, 1), rows, packs)
    m_one, g_one = _update(model, _rl(loss_type, 1), mesh, batch, params)
    m_k, g_k = _update(model, _rl(loss_type, k), mesh, batch, params,
                       per_micro=packs["pack_tokens"].shape[0] // k)
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    assert set(m_k) == set(m_one)
    assert abs(m_one["pg_loss"]) > 1e-3 and abs(m_one["loss"]) > 1e-3
    for name in m_one:  # the whole batch's values, not means over micro-batches
        np.testing.assert_allclose(m_k[name], m_one[name], rtol=1e-5, atol=10 * atol,
                                   err_msg=name)
    grad_atol = decoder_grad_tolerance(cfg, g_one, tokens=T, rows=len(rows[-1]))
    assert max(np.abs(g).max() for g in jax.tree.leaves(g_one)) > 100 * grad_atol
    for a, b in zip(jax.tree.leaves(g_one), jax.tree.leaves(g_k)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def test_micro_batched_padded_update_reports_the_whole_batch_metrics():
    """The padded update's metrics with k micro-batches are the whole batch's: pg_loss is
    the batch's loss term (it used to be the mean of the micro-batches' shares, 1/k of
    it), ratio_max the batch's maximum, the token means weighted by tokens."""
    mesh, cfg, params = _setup(8)
    model, rows = Transformer(cfg), packed_rows(2, 64, PROMPTS, GROUP, TP, LENGTH)
    prompt, valid, completion, _, _ = rows
    padded = {name: _put(mesh, x) for name, x in (
        ("prompt_tokens", prompt), ("prompt_valid", valid), ("completion_tokens", completion))}
    batch = {**_batch(mesh, model, params, _rl("grpo", 1), rows, {}), **padded}
    m_one, g_one = _update(model, _rl("grpo", 1), mesh, batch, params, packed=False)
    m_k, g_k = _update(model, _rl("grpo", 2), mesh, batch, params, packed=False)
    assert abs(m_one["pg_loss"]) > 1e-3
    for name in m_one:
        np.testing.assert_allclose(m_k[name], m_one[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("devices,k", [(8, 2), (1, 4)])
def test_micro_batched_packed_logprob_pass_equals_one_pass(devices, k):
    mesh, cfg, params = _setup(devices)
    model, rows = Transformer(cfg), packed_rows(1, 64, PROMPTS, GROUP, TP, LENGTH)
    packs = _packs(mesh, rows, devices * k)
    per_micro = packs["pack_tokens"].shape[0] // k
    one = make_packed_logprob_fn(model, 0.7, True, mesh, shd.DEFAULT_RULES)(params, packs)
    micro = make_packed_logprob_fn(model, 0.7, True, mesh, shd.DEFAULT_RULES,
                                   per_micro)(params, packs)
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    assert np.abs(np.asarray(one)).max() > 100 * atol
    np.testing.assert_allclose(micro, one, rtol=0, atol=atol)
    assert np.all(np.asarray(micro)[rows[-1] == 0] == 0)


def test_a_pack_count_that_does_not_split_into_micro_batches_is_refused():
    mesh, cfg, params = _setup(1)
    model, rows = Transformer(cfg), packed_rows(1, 64, PROMPTS, GROUP, TP, LENGTH)
    packs = _packs(mesh, rows, 1)
    per = packs["pack_tokens"].shape[0] + 1
    with pytest.raises(ValueError, match=f"do not split into micro-batches of {per} packs"):
        make_packed_logprob_fn(model, 0.7, True, mesh, shd.DEFAULT_RULES, per)(params, packs)
    with pytest.raises(ValueError, match="packs of a micro-batch"):
        make_update_fn(model, optax.sgd(1.0), _rl("grpo", 2), packed=True)


def test_the_packer_sizes_micro_batches_from_the_largest_batch():
    """64 rows of up to 17,407 tokens in packs of 17,408 (a row per pack at worst), 4
    data-parallel shards, 16 micro-batches: 4 packs a micro-batch (one per shard); every
    pack count is a multiple of 4, so a light batch of 9 packs runs 3 micro-batches, not 16."""
    packer = packing.Packer(17408, 64, 17407, 4, True, micro_batches=16)
    assert packer.packs_per_micro == 4
    assert packer.counts.ladder[-1] == 64 and all(n % 4 == 0 for n in packer.counts.ladder)
    light = packer.counts(9)
    assert light == 12 and micro_batch_count({"pack_tokens": np.zeros((light, 1))}, 4) == 3
    # rounding: 10 packs at most, 3 micro-batches, 2 shards -> 4 packs a micro-batch
    assert packing.packs_per_micro_batch(10, 2, 3) == 4
    assert packing.packs_per_micro_batch(10, 2, 1) is None
    assert packing.Packer(64, 16, 20, 2, True).packs_per_micro is None


def test_a_light_batch_runs_fewer_micro_batches_with_the_same_result():
    """A run sized for 8 micro-batches of 2 packs on 2 devices; a batch needing few packs
    runs as many micro-batches as its packs fill, and equals one micro-batch."""
    mesh, cfg, params = _setup(2)
    model, rows = Transformer(cfg), packed_rows(4, 64, PROMPTS, GROUP, TP, LENGTH)
    prompt, valid, completion, lengths, _ = rows
    packer = packing.Packer(T, len(completion), TP + LENGTH - 1, 2, True, micro_batches=8)
    host = packer(prompt, valid, completion, lengths)
    per, count = packer.packs_per_micro, len(host.tokens)
    assert per == 2 and 1 < count // per < 8, (per, count, packer.counts.ladder)
    packs = {name: _put(mesh, x) for name, x in host.arrays().items()}
    batch = _batch(mesh, model, params, _rl("dapo", 1), rows, packs)
    m_one, g_one = _update(model, _rl("dapo", 1), mesh, batch, params)
    m_k, g_k = _update(model, _rl("dapo", 8), mesh, batch, params, per_micro=per)
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    for name in m_one:
        np.testing.assert_allclose(m_k[name], m_one[name], rtol=1e-5, atol=10 * atol,
                                   err_msg=name)
    grad_atol = decoder_grad_tolerance(cfg, g_one, tokens=T, rows=len(lengths))
    for a, b in zip(jax.tree.leaves(g_one), jax.tree.leaves(g_k)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)
