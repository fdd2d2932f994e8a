"""Tool-use rollouts (`sampling/tool_loop.py`) on a random toy model: a row that emits a closing
tag gets the host's result tokens in place, the loop continues with the KV cache kept, and
that continuation is the one a fresh prefill of the whole prefix gives; the result tokens
are exactly where `tool_mask` (and so the loss mask) says; without calls the tool sampler
is the plain sampler."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import Sampler, left_pad, positions_from_valid, stage_ends
from jaxrl_reason.sampling.tool_loop import (ToolSampler, result_token_ids, tail_matches,
                                         tool_loss_mask)
from jaxrl_reason.tools import ToolRunner
from numerics import decoder_tolerance

PAD, RESULT_OPEN_ID, RESULT_CLOSE_ID = 0, 1, 2
PROMPT_LENGTHS = (6, 3, 1, 4)
BUCKET, G, L, R = 6, 2, 16, 6
CFG = models.get_preset("test", init_std=0.5)  # large weights: diverse, non-repeating outputs


class ToyTokenizer:
    """Id i is the text "[i]", except the tag ids; other characters (error messages)
    encode to one id each."""

    def __init__(self, tags: dict[int, str]):
        self.pieces = {**tags, RESULT_OPEN_ID: "<result>", RESULT_CLOSE_ID: "</result>"}
        self.ids = {v: k for k, v in self.pieces.items()}

    def decode(self, ids):
        return "".join(self.pieces.get(int(i), f"[{int(i)}]") for i in ids)

    def encode(self, text):
        out = []
        for piece in re.findall(r"</?\w+>|\[\d+\]|.", text, re.S):
            if piece in self.ids:
                out.append(self.ids[piece])
            elif piece.startswith("["):
                out.append(int(piece[1:-1]))
            else:
                out += [10 + ord(c) % 100 for c in piece]
        return out


def toy_search(query: str) -> str:
    """Three result ids that depend on the query."""
    return "".join(f"[{(7 * len(query) + k) % 50 + 60}]" for k in range(3))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    lists = [list(rng.integers(3, CFG.vocab_size, n)) for n in PROMPT_LENGTHS]
    return left_pad(lists, BUCKET, PAD)


@pytest.fixture(scope="module")
def mesh():
    return shd.make_mesh({"data": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def params(mesh):
    return models.init_params(CFG, jax.random.key(0), mesh, shd.DEFAULT_RULES)


@pytest.fixture(scope="module")
def plain(mesh):
    return Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD, mesh=mesh, decode_stages=2)


@pytest.fixture(scope="module")
def tags(plain, params, prompts):
    """(open id, close id, stop id): the first greedy token of a prompt opens a call that a
    later token of that row, at column 2..5, closes (so that row calls the tool); the stop
    id is a token of another prompt's greedy row that the calling row does not emit."""
    greedy = np.asarray(plain(params, *prompts, jax.random.key(0), num_samples=G,
                              max_new_tokens=L, temperature=0.0).tokens)[::G]
    for r, row in enumerate(greedy):
        for col in range(2, 6):
            open_id, close_id = int(row[0]), int(row[col])
            if close_id == open_id or close_id in row[:col] or open_id in row[1:col] \
                    or min(open_id, close_id) <= 2:
                continue
            stops = [int(t) for other in np.delete(greedy, r, axis=0) for t in other[1:L - 2]
                     if t not in row and t > 2 and t not in (open_id, close_id)]
            if stops:
                return open_id, close_id, stops[0]
    raise AssertionError(f"no usable tags in {greedy}")


def make_tool_sampler(tags, mesh, max_calls=2, stages=2):
    open_id, close_id, eos_id = tags
    tok = ToyTokenizer({open_id: "<search>", close_id: "</search>"})
    sampler = Sampler(Transformer(CFG), eos_id=eos_id, pad_id=PAD, mesh=mesh,
                      decode_stages=stages)
    return ToolSampler(sampler, ToolRunner({"search": toy_search}), tok, max_calls=max_calls,
                       max_result_tokens=R)


@pytest.fixture(scope="module")
def greedy_run(tags, mesh, params, prompts):
    tools = make_tool_sampler(tags, mesh)
    out = tools(params, *prompts, jax.random.key(1), num_samples=G, max_new_tokens=L,
                temperature=0.0)
    return tools, jax.tree.map(np.asarray, out)


def _repeat(x):
    return np.repeat(np.asarray(x), G, axis=0)


def expected_results(tools, tokens):
    """Replays the protocol on the host: bool [N, L] result positions and their ids."""
    close_id = tools.closers[0][0]
    mask, ids = np.zeros(tokens.shape, bool), np.zeros(tokens.shape, np.int32)
    for r, row in enumerate(tokens):
        calls, t = 0, 0
        while t < L:
            if row[t] == close_id and calls < tools.max_calls:
                calls += 1
                text = tools.runner.run(tools.tokenizer.decode(row[:t + 1])).text
                result = result_token_ids(text, tools.tokenizer, R, tools.result_close)
                result = result[:L - t - 1]
                mask[r, t + 1:t + 1 + len(result)] = True
                ids[r, t + 1:t + 1 + len(result)] = result
                t += len(result)
            t += 1
    return mask, ids


# ----------------------------------------------------------------------------- the tool loop


def test_result_tokens_and_mask(greedy_run):
    tools, out = greedy_run
    assert out.tool_calls.sum() >= 2 and out.tool_mask.any() and not out.tool_mask.all()
    assert out.tool_mask.dtype == bool and out.tool_mask.shape == out.tokens.shape
    mask, ids = expected_results(tools, out.tokens)
    np.testing.assert_array_equal(out.tool_mask, mask)
    np.testing.assert_array_equal(out.tokens[mask], ids[mask])
    np.testing.assert_array_equal(out.tool_calls, [tools.tokenizer.decode(row).count(
        "</search><result>") for row in out.tokens])
    # The loss mask: 1 on sampled tokens within the length, 0 on result tokens and padding.
    loss_mask = np.asarray(tool_loss_mask(out.lengths, L, out.tool_mask))
    want = (np.arange(L)[None] < out.lengths[:, None]) & ~mask
    assert np.all(out.logprobs[~want] == 0)
    np.testing.assert_array_equal(loss_mask, want.astype(np.float32))
    assert tools.last_stats["calls"] == out.tool_calls.sum()
    # A row that sampled the stop id ended there and waited (pads, log-prob 0).
    for r in np.flatnonzero(~out.truncated):
        n = out.lengths[r]
        assert out.tokens[r, n - 1] == tools.eos_ids[0] and np.all(out.tokens[r, n:] == PAD)
    assert (~out.truncated).any()


def test_kept_cache_continues_like_a_fresh_prefill(greedy_run, params, prompts, mesh):
    """Every sampled token (greedy) is the argmax of a cache-free forward over the whole
    sequence, result tokens in place, with the same log-prob; and a fresh sampler prefilled
    with the prompt, the call and its result continues with the very same tokens."""
    _, out = greedy_run
    model = Transformer(CFG)
    tokens = np.concatenate([_repeat(prompts[0]), out.tokens], axis=1)
    valid = np.concatenate([_repeat(prompts[1]), np.ones_like(out.tokens, bool)], axis=1)
    logits = model.apply({"params": params}, jnp.asarray(tokens),
                         positions_from_valid(jnp.asarray(valid)), jnp.asarray(valid))[0]
    logp = np.asarray(jax.nn.log_softmax(logits[:, BUCKET - 1:-1]))  # predicts column t
    sampled = ~out.tool_mask & (np.arange(L)[None] < out.lengths[:, None])
    np.testing.assert_array_equal(np.argmax(logp, -1)[sampled], out.tokens[sampled])
    chosen = np.take_along_axis(logp, out.tokens[..., None], -1)[..., 0]
    # Cached decode vs a cache-free forward: other summation orders (tests/numerics.py).
    atol = decoder_tolerance(CFG, params, tokens=BUCKET + L)
    np.testing.assert_allclose(out.logprobs[sampled], chosen[sampled], rtol=0, atol=atol)

    # One compile: every prefix padded to one bucket, L new tokens, the window compared.
    fresh = Sampler(model, eos_id=-1, pad_id=PAD, mesh=mesh, decode_stages=1)
    continuation_atol = decoder_tolerance(CFG, params, tokens=BUCKET + 2 * L)
    checked = 0
    for r in np.flatnonzero(out.tool_mask.any(axis=1)):
        end = int(np.flatnonzero(out.tool_mask[r])[0])
        while end < L and out.tool_mask[r, end]:
            end += 1  # end of the first result block
        stop = end
        while stop < L and not out.tool_mask[r, stop]:
            stop += 1  # up to the next result block (not the model's choice)
        if stop - end < 2:
            continue
        prefix = list(prompts[0][r // G][prompts[1][r // G]]) + list(out.tokens[r, :end])
        pt, pv = left_pad([prefix], BUCKET + L, PAD)
        cont = fresh(params, pt, pv, jax.random.key(2), num_samples=1, max_new_tokens=L,
                     temperature=0.0)
        n = stop - end
        np.testing.assert_array_equal(np.asarray(cont.tokens)[0, :n], out.tokens[r, end:stop])
        np.testing.assert_allclose(np.asarray(cont.logprobs)[0, :n], out.logprobs[r, end:stop],
                                   rtol=0, atol=continuation_atol)
        checked += 1
    assert checked >= 1


def test_without_calls_equals_plain_sampler(greedy_run, plain, tags, params, prompts):
    """max_calls = 0 (a traced value: the same programs): nothing pauses, and sampling
    (T = 1, fixed key) gives the plain sampler's rows (cut at the stop id) exactly."""
    tools, _ = greedy_run
    atol = decoder_tolerance(CFG, params, tokens=BUCKET + L)  # other cache sizes and orders
    size = tools._decode._cache_size()
    a, b = (jax.tree.map(np.asarray, s(params, *prompts, jax.random.key(3), num_samples=G,
                                       max_new_tokens=L, temperature=1.0, **kw))
            for s, kw in ((plain, {}), (tools, {"max_calls": 0})))
    for r in range(len(a.tokens)):
        hits = np.flatnonzero(a.tokens[r] == tags[2])
        n = hits[0] + 1 if hits.size else L
        assert b.lengths[r] == n and b.truncated[r] == (not hits.size)
        np.testing.assert_array_equal(b.tokens[r, :n], a.tokens[r, :n])
        np.testing.assert_allclose(b.logprobs[r, :n], a.logprobs[r, :n], rtol=0, atol=atol)
        assert np.all(b.tokens[r, n:] == PAD) and np.all(b.logprobs[r, n:] == 0)
    assert not b.tool_mask.any() and not b.tool_calls.any()
    assert tools._decode._cache_size() == size


@pytest.mark.slow
def test_sampling_on_eight_devices(tags, params, prompts):
    """T = 1 on a data x fsdp x tensor mesh: a bounded number of calls per row, log-probs
    equal the trainer's scoring of the same sequences (result tokens masked), one decode
    program per stage."""
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = models.init_params(CFG, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    tools = make_tool_sampler(tags, mesh, max_calls=1)
    outs = [jax.tree.map(np.asarray, tools(sharded, *prompts, jax.random.key(seed),
                                           num_samples=G, max_new_tokens=L, temperature=1.0))
            for seed in (4, 5)]
    assert tools._decode._cache_size() <= len(stage_ends(L, tools.sampler.decode_stages))
    for out in outs:
        assert out.tool_calls.max() <= 1
        # The trainer scores the whole sequence (results in place: the validity mask is the
        # lengths') and applies the loss mask afterwards.
        logp, _ = scoring.completion_logprobs(
            Transformer(CFG), params, _repeat(prompts[0]), _repeat(prompts[1]),
            jnp.asarray(out.tokens), tool_loss_mask(out.lengths, L), with_entropy=False)
        loss_mask = tool_loss_mask(out.lengths, L, out.tool_mask)
        np.testing.assert_allclose(out.logprobs, np.asarray(logp) * loss_mask, atol=1e-4)
    assert any(out.tool_mask.any() for out in outs)


# ----------------------------------------------------------------------------- helpers


def test_tail_matches():
    tokens = jnp.asarray([[5, 6, 7, 0], [6, 7, 6, 7], [7, 7, 7, 7]], jnp.int32)
    got = [np.asarray(tail_matches(tokens, jnp.int32(s), (6, 7))).tolist() for s in range(4)]
    assert got == [[False, False, False], [False, True, False], [True, False, False],
                   [False, True, False]]
    assert np.asarray(tail_matches(tokens, jnp.int32(0), (7,))).tolist() == [False, False, True]


def test_result_token_ids_are_cut_to_the_budget():
    tok = ToyTokenizer({})
    ids = result_token_ids("<result>[9][8][7][6][5]</result>", tok, 5, (RESULT_CLOSE_ID,))
    assert ids == [RESULT_OPEN_ID, 9, 8, 7, RESULT_CLOSE_ID]
    assert result_token_ids("<result>[9]</result>", tok, 5, (RESULT_CLOSE_ID,)) == [
        RESULT_OPEN_ID, 9, RESULT_CLOSE_ID]
    with pytest.raises(ValueError, match="cannot hold"):
        ToolSampler(Sampler(Transformer(CFG), eos_id=-1, pad_id=PAD),
                    ToolRunner({"search": toy_search}), tok, max_result_tokens=1)
