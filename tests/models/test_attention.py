"""models/attention.py: the jnp reference with segment ids against a numpy masked softmax,
the splash kernel (Pallas interpreter on CPU) against the reference (values and gradients,
segments, sliding window, softcap, a cache offset, per device under a mesh), the cuDNN
fallback off GPU, the choice by platform, and the splash path compiled ahead of time for a
TPU v5e slice inside the log-prob and update programs."""
import dataclasses
import importlib.util
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.kernels import platform
from jaxrl_reason.models import attention
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.runtime import sharding as shd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(REPO, "configs", "arith_grpo.py")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install "
                                         "'jaxrl-reason[tpu]'); CI installs it")


def _qkv(cfg, b, t, s=None, seed=0):
    """q [B, T, K, G, hd], k, v [B, S, K, hd], standard normal float32."""
    s = t if s is None else s
    kv, g, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (b, t, kv, g, hd)),
            jax.random.normal(keys[1], (b, s, kv, hd)),
            jax.random.normal(keys[2], (b, s, kv, hd)))


# Two rows: three packed segments and tail padding; left padding and one long segment.
SEGMENTS = np.array([[1] * 40 + [2] * 35 + [3] * 15 + [0] * 10,
                     [0] * 7 + [5] * 93], np.int32)


def _numpy_attention(q, k, v, allowed, scale, softcap):
    """float64 masked softmax attention: q [B, T, K, G, hd], k, v [B, S, K, hd], allowed bool
    [B, T, S] -> [B, T, K, G, hd]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("btkgd,bskd->bkgts", q, k) * scale
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(allowed[:, None, None], scores, -np.inf)
    seen = allowed.any(-1)[:, None, None, :, None]               # a query seeing no key: 0
    probs = np.exp(scores - np.where(seen, scores.max(-1, keepdims=True), 0.0))
    probs /= np.maximum(probs.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bkgts,bskd->btkgd", probs, v)


@pytest.mark.parametrize("softcap,window,chunk", [(None, None, 0), (20.0, 24, 0),
                                                  (None, None, 32)])
def test_reference_with_segments_equals_numpy_masked_softmax(softcap, window, chunk):
    """Causal inside a segment, never across: every real query against float64 numpy."""
    cfg = models.get_preset("test", attention_impl="reference", attn_logit_softcap=softcap,
                            attention_chunk=chunk)
    q, k, v = _qkv(cfg, *SEGMENTS.shape)
    seg = jnp.asarray(SEGMENTS)
    out = attention.attend(cfg, q, k, v, seg > 0, 0, window, head_major=False, first_slot=0,
                           segment_ids=seg)
    t = SEGMENTS.shape[1]
    slot = np.arange(t)
    allowed = ((slot[None, :, None] >= slot[None, None, :])
               & (SEGMENTS[:, :, None] == SEGMENTS[:, None, :]) & (SEGMENTS[:, None, :] > 0))
    if window is not None:
        allowed &= slot[None, :, None] - slot[None, None, :] < window
    want = _numpy_attention(q, k, v, allowed, cfg.head_dim ** -0.5, softcap)
    real = (SEGMENTS > 0)[:, :, None, None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, want, 0), rtol=0,
                               atol=2e-5)


def test_packed_rows_equal_the_rows_run_alone():
    """A pack of two sequences (segment ids, positions restarting per segment) gives each
    sequence's logits exactly as when it runs alone in its own padded row."""
    cfg = models.get_preset("test", attention_impl="reference")
    model = Transformer(cfg)
    lengths = (23, 17)
    tokens = jax.random.randint(jax.random.key(1), (1, sum(lengths)), 0, cfg.vocab_size)
    params = model.init(jax.random.key(0), tokens, jnp.zeros_like(tokens),
                        jnp.ones(tokens.shape, bool))["params"]
    seg = jnp.asarray([[1] * lengths[0] + [2] * lengths[1]])
    positions = jnp.asarray([list(range(lengths[0])) + list(range(lengths[1]))])
    packed, _ = model.apply({"params": params}, tokens, positions, seg > 0, segment_ids=seg)
    start = 0
    for n in lengths:
        alone, _ = model.apply({"params": params}, tokens[:, start:start + n],
                               jnp.arange(n)[None], jnp.ones((1, n), bool))
        np.testing.assert_allclose(packed[:, start:start + n], alone, rtol=1e-5, atol=1e-5)
        start += n


def _loss_and_grads(cfg, q, k, v, key_valid, cot, **kw):
    def loss(q, k, v):
        out = attention.attend(cfg, q, k, v, key_valid, 0, kw.get("window"),
                               head_major=kw.get("head_major", False), first_slot=0,
                               segment_ids=kw.get("segment_ids"))
        return jnp.sum(out * cot)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("softcap,window", [(None, None), (20.0, 24)])
def test_splash_interpreted_equals_reference_values_and_gradients(softcap, window):
    """GQA (2 kv heads x 2), three segments and padding in 100 positions (padded to a
    128-tile inside), causal or a 24-slot window with a softcap."""
    cfg = models.get_preset("test", attention_impl="splash", attn_logit_softcap=softcap)
    ref_cfg = dataclasses.replace(cfg, attention_impl="reference")
    q, k, v = _qkv(cfg, *SEGMENTS.shape)
    seg = jnp.asarray(SEGMENTS)
    real = jnp.asarray(SEGMENTS > 0)[:, :, None, None, None]
    cot = jnp.where(real, jax.random.normal(jax.random.key(9), q.shape), 0.0)
    got = _loss_and_grads(cfg, q, k, v, seg > 0, cot, window=window, segment_ids=seg)
    want = _loss_and_grads(ref_cfg, q, k, v, seg > 0, cot, window=window, segment_ids=seg)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-4)
    for name, a, w in zip("qkv", got[1], want[1]):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4, err_msg=f"d{name}")


def test_splash_prefill_into_a_cache_equals_reference():
    """Prefill: 100 queries at slot 0 of a 160-slot head-major cache, left-padded rows
    (no segment ids): the kernel sees the first 100 keys, the rest is never attended."""
    cfg = models.get_preset("test", attention_impl="splash")
    b, t, s = 2, 100, 160
    q, k, v = _qkv(cfg, b, t, s, seed=3)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)                  # [B, K, S, hd]
    key_valid = (jnp.arange(s)[None] >= jnp.array([0, 9])[:, None]) & (jnp.arange(s) < t)
    got = attention.attend(cfg, q, k, v, key_valid, 0, None, head_major=True, first_slot=0)
    want = attention.attend(dataclasses.replace(cfg, attention_impl="reference"), q, k, v,
                            key_valid, 0, None, head_major=True, first_slot=0)
    real = key_valid[:, :t, None, None, None]
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), rtol=1e-5,
                               atol=2e-5)


def test_splash_in_the_scanned_gemma_stack_with_local_and_global_layers():
    """scan_layers with alternating sliding-window layers: the per-layer window is traced,
    and the splash path picks the local or the causal kernel with lax.cond."""
    cfg = models.get_preset("test", attention_impl="splash", scan_layers=True,
                            sliding_window=16, sliding_window_pattern=2,
                            attn_logit_softcap=30.0)
    model = Transformer(cfg)
    b, t = 2, 60
    tokens = jax.random.randint(jax.random.key(4), (b, t), 0, cfg.vocab_size)
    valid = jnp.arange(t)[None] >= jnp.array([0, 6])[:, None]
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    params = model.init(jax.random.key(0), tokens, positions, valid)["params"]
    got, _ = jax.jit(model.apply)({"params": params}, tokens, positions, valid)
    ref = Transformer(dataclasses.replace(cfg, attention_impl="reference"))
    want, _ = jax.jit(ref.apply)({"params": params}, tokens, positions, valid)
    np.testing.assert_allclose(np.where(valid[..., None], got, 0),
                               np.where(valid[..., None], want, 0), rtol=1e-4, atol=1e-4)


def test_splash_runs_per_device_under_a_mesh():
    """Under `activation_sharding` on 8 devices (rows over data=4, kv heads over tensor=2)
    the kernel runs inside shard_map; same values and gradients as without a mesh."""
    cfg = models.get_preset("test", attention_impl="splash")
    seg = jnp.asarray(np.concatenate([SEGMENTS, SEGMENTS[::-1]], axis=0))     # [4, 100]
    q, k, v = _qkv(cfg, *seg.shape, seed=5)
    cot = jnp.where((seg > 0)[:, :, None, None, None],
                    jax.random.normal(jax.random.key(8), q.shape), 0.0)
    mesh = shd.make_mesh({"data": 4, "fsdp": 1, "tensor": 2})
    with shd.activation_sharding(mesh, shd.DEFAULT_RULES):
        got = jax.jit(lambda *a: _loss_and_grads(cfg, *a, seg > 0, cot, segment_ids=seg))(
            q, k, v)
        assert "shard_map" in str(jax.make_jaxpr(
            lambda *a: _loss_and_grads(cfg, *a, seg > 0, cot, segment_ids=seg))(q, k, v))
    want = _loss_and_grads(cfg, q, k, v, seg > 0, cot, segment_ids=seg)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-5)
    for a, w in zip(got[1], want[1]):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)


# One pack: a prompt segment (1), two sibling completions attending to it (2, 3), a second
# prompt (4) with one completion (5), padding.
PACK_SEG = np.array([[1] * 9 + [2] * 20 + [3] * 14 + [4] * 6 + [5] * 11 + [0] * 4], np.int32)
PACK_PROMPT = np.array([[1] * 9 + [1] * 20 + [1] * 14 + [4] * 6 + [4] * 11 + [0] * 4],
                       np.int32)


@pytest.mark.parametrize("chunk", [0, 16])
def test_reference_with_a_shared_prompt_equals_numpy_masked_softmax(chunk):
    """prompt_segment_ids: a completion attends causally to itself and to its group's prompt
    segment, never to a sibling completion or another group."""
    cfg = models.get_preset("test", attention_impl="reference", attention_chunk=chunk)
    q, k, v = _qkv(cfg, *PACK_SEG.shape, seed=3)
    seg, prompt = jnp.asarray(PACK_SEG), jnp.asarray(PACK_PROMPT)
    out = attention.attend(cfg, q, k, v, seg > 0, 0, None, head_major=False, first_slot=0,
                           segment_ids=seg, prompt_segment_ids=prompt)
    slot = np.arange(PACK_SEG.shape[1])
    allowed = ((slot[None, :, None] >= slot[None, None, :]) & (PACK_SEG[:, None, :] > 0)
               & ((PACK_SEG[:, :, None] == PACK_SEG[:, None, :])
                  | (PACK_PROMPT[:, :, None] == PACK_SEG[:, None, :])))
    assert not allowed[0, 30, 10] and allowed[0, 30, 5] and not allowed[0, 55, 5]
    want = _numpy_attention(q, k, v, allowed, cfg.head_dim ** -0.5, None)
    real = (PACK_SEG > 0)[:, :, None, None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, want, 0), rtol=0,
                               atol=2e-5)


def test_a_shared_prompt_mask_under_a_kernel_falls_back_once(monkeypatch, caplog):
    """Splash knows segment equality only: with prompt_segment_ids it logs one line naming
    the shared-prompt mask and runs the reference (bit-identical)."""
    monkeypatch.setattr(attention, "_NOTED", set())
    cfg = models.get_preset("test", attention_impl="splash")
    q, k, v = _qkv(cfg, *PACK_SEG.shape)
    seg, prompt = jnp.asarray(PACK_SEG), jnp.asarray(PACK_PROMPT)
    run = lambda c: attention.attend(c, q, k, v, seg > 0, 0, None, head_major=False,  # noqa
                                     first_slot=0, segment_ids=seg, prompt_segment_ids=prompt)
    with caplog.at_level(logging.INFO, logger=attention.__name__):
        outs = [run(cfg) for _ in range(2)]
    lines = [r for r in caplog.records if r.name == attention.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "shared-prompt mask" in lines[0].getMessage()
    want = run(dataclasses.replace(cfg, attention_impl="reference"))
    for out in outs:
        np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="prompt_segment_ids need segment_ids and a layer "
                                         "without a sliding window"):
        attention.attend(cfg, q, k, v, seg > 0, 0, 8, head_major=False, first_slot=0,
                         segment_ids=seg, prompt_segment_ids=prompt)


def test_cudnn_falls_back_on_cpu_with_one_log_line(monkeypatch, caplog):
    """Asked for by name off GPU, cuDNN attention logs one WARNING naming the reason, then
    the reference runs: bit-identical to attention_impl="reference"."""
    monkeypatch.setattr(attention, "_NOTED", set())
    cfg = models.get_preset("test", attention_impl="cudnn")
    q, k, v = _qkv(cfg, 2, 20)
    key_valid = jnp.ones((2, 20), bool)
    with caplog.at_level(logging.INFO, logger=attention.__name__):
        outs = [attention.attend(cfg, q, k, v, key_valid, 0, None, head_major=False,
                                 first_slot=0) for _ in range(3)]
    lines = [r for r in caplog.records if r.name == attention.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "cuDNN attention runs only on GPU (platform: cpu)" in lines[0].getMessage()
    want = attention.attend(dataclasses.replace(cfg, attention_impl="reference"), q, k, v,
                            key_valid, 0, None, head_major=False, first_slot=0)
    for out in outs:
        np.testing.assert_array_equal(out, want)


def test_auto_choice_and_fallback_reasons_by_platform():
    cfg = models.get_preset("test")
    assert cfg.attention_impl == "auto"
    assert attention.resolve_impl("auto") == "reference"   # this CPU host
    with platform.target("tpu"):
        assert attention.resolve_impl("auto") == "splash"
        assert attention.fallback_reason("splash", cfg, dtype=jnp.bfloat16, first_slot=0,
                                         window=jnp.int32(4)) is None
        assert "traced" in attention.fallback_reason("splash", cfg, dtype=jnp.bfloat16,
                                                     first_slot=None, window=None)
    with platform.target("gpu"):
        assert attention.resolve_impl("auto") == "cudnn"
        reason = lambda c, dtype=jnp.bfloat16: attention.fallback_reason(  # noqa: E731
            "cudnn", c, dtype=dtype, first_slot=0, window=None)
        assert reason(cfg) is None
        assert "bfloat16 or float16" in reason(cfg, jnp.float32)
        assert "softcap" in reason(dataclasses.replace(cfg, attn_logit_softcap=50.0))
        assert "head_dim" in reason(dataclasses.replace(cfg, head_dim=12))
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        models.get_preset("test", attention_impl="flash")


def test_segment_ids_with_a_decode_cache_are_refused():
    cfg = models.get_preset("test", attention_impl="reference")
    q, k, v = _qkv(cfg, 1, 4, 8)
    with pytest.raises(ValueError, match="segment_ids need keys = queries"):
        attention.attend(cfg, q, k, v, jnp.ones((1, 8), bool), 0, None, head_major=False,
                         first_slot=0, segment_ids=jnp.ones((1, 4), jnp.int32))


def test_config_validation_names_a_bad_attention_impl():
    from jaxrl_reason.cli import parse
    _, fv = parse(["jaxrl-reason", "train", "--config", f"{ARITH}:smoke"])
    config = fv.config
    config.model.attention_impl = "flash"
    problems = validate_config(config, 8)
    assert any(p.startswith("model.attention_impl: must be one of") for p in problems)


@needs_libtpu
def test_splash_compiles_for_tpu_v5e_inside_the_logprob_and_update_programs():
    """`plan` for a v5e 2x4 slice (Mosaic, ahead of time from this CPU): with
    attention_impl="splash" the log-prob pass holds the forward kernel and the update the
    forward, dq and dkv kernels of every layer, per device under shard_map."""
    from jaxrl_reason.cli import parse
    from jaxrl_reason.runtime import plan as planner

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    reports = {}
    for impl in ("splash", "reference"):
        _, fv = parse(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology",
                       "v5e:2x4", f"--config.model.attention_impl={impl}"])
        report = planner.plan(fv.config, "v5e:2x4", programs=("log-prob pass", "update"))
        reports[impl] = {p.name: p for p in report["programs"]}
        n_layers = fv.config.model.n_layers
    splash, ref = reports["splash"], reports["reference"]
    assert splash["log-prob pass"].mosaic_calls - ref["log-prob pass"].mosaic_calls == n_layers
    assert splash["update"].mosaic_calls - ref["update"].mosaic_calls == 3 * n_layers
    for name, prog in splash.items():
        assert 0 < prog.total_bytes < report["chip"].hbm_bytes, name
        assert prog.flops > 0, name
