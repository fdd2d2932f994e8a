"""SFT (and the distilled student's SFT) on padding-free packs (sft.packing) against the
padded step, in float32 on one device: the loss, its token count and the gradients agree
within the float-reordering bounds of tests/numerics.py; config validation names
sft.packing's problems; distill.student_packing turns the student's sft.packing on."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cached_params import params_on
from trainer_support import SMOKE
from jaxrl_reason.cli import parse
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.recipes import distill, distill_student
from jaxrl_reason.recipes.sft import make_sft_step, packed_sft_batch, sft_loss
from jaxrl_reason.rl import packing
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import decoder_grad_tolerance, decoder_tolerance

ROWS, TP, LENGTH, T = 6, 5, 9, 24


def _batch(seed=0, vocab=64):
    """`sft_batch`'s layout: a left-padded prompt per row (row 2's of one token) and
    right-padded completions of 1..L tokens (row 4: all L)."""
    rng = np.random.default_rng(seed)
    prompt_len = np.array([5, 3, 1, 4, 2, 5])
    valid = np.arange(TP)[None, :] >= (TP - prompt_len)[:, None]
    prompt = np.where(valid, rng.integers(3, vocab, (ROWS, TP)), 0).astype(np.int32)
    lengths = rng.integers(1, LENGTH + 1, ROWS)
    lengths[4] = LENGTH
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.float32)
    completion = np.where(mask > 0, rng.integers(3, vocab, (ROWS, LENGTH)), 0).astype(np.int32)
    return {"prompt_tokens": prompt, "prompt_valid": valid, "completion_tokens": completion,
            "completion_mask": mask}


def _setup():
    mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference")
    return mesh, cfg, params_on(cfg, mesh)


@pytest.mark.parametrize("share", [True, False])
def test_packed_sft_loss_and_gradients_equal_padded(share):
    mesh, cfg, params = _setup()
    model, batch = Transformer(cfg), _batch()
    packer = packing.Packer(T, ROWS, TP + LENGTH - 1, 1, share)
    packed = packed_sft_batch(batch, packer)
    assert packed["pack_tokens"].shape[0] < ROWS  # rows really share packs
    grad = jax.jit(jax.value_and_grad(sft_loss, argnums=1, has_aux=True),
                   static_argnums=(0, 4))
    (loss_a, m_a), g_a = grad(model, params, jax.tree.map(jnp.asarray, batch), None, None)
    (loss_b, m_b), g_b = grad(model, params, jax.tree.map(jnp.asarray, packed), None, share)
    atol = decoder_tolerance(cfg, params, tokens=T)
    assert float(loss_a) > 100 * atol  # a real comparison
    np.testing.assert_allclose(loss_b, loss_a, rtol=0, atol=atol)
    assert float(m_a["tokens"]) == float(m_b["tokens"]) == batch["completion_mask"].sum()
    grad_atol = decoder_grad_tolerance(cfg, g_a, tokens=T, rows=ROWS)
    for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def test_packed_sft_step_matches_the_padded_step():
    """The jitted, donated step of run_sft: one SGD step at rate 1 from the same params."""
    mesh, cfg, params = _setup()
    model, batch, sgd = Transformer(cfg), _batch(1), optax.sgd(1.0)
    packer = packing.Packer(T, ROWS, TP + LENGTH - 1, 1, True)
    out = []
    for share, rows in ((None, batch), (True, packed_sft_batch(batch, packer))):
        step = make_sft_step(model, sgd, mesh, shd.DEFAULT_RULES, share_prompts=share)
        state = create_train_state(jax.tree.map(jnp.copy, params), sgd)
        new, metrics = step(state, {k: shd.put_batch(mesh, shd.DEFAULT_RULES, v)
                                    for k, v in rows.items()})
        grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
        out.append((jax.device_get(metrics), grads))
    (m_a, g_a), (m_b, g_b) = out
    assert set(m_a) == set(m_b) and m_b["update_skipped"] == m_a["update_skipped"] == 0
    np.testing.assert_allclose(m_b["loss"], m_a["loss"], rtol=0,
                               atol=decoder_tolerance(cfg, params, tokens=T))
    grad_atol = decoder_grad_tolerance(cfg, g_a, tokens=T, rows=ROWS)
    np.testing.assert_allclose(m_b["grad_norm"], m_a["grad_norm"], rtol=0,
                               atol=grad_atol * np.sqrt(sum(np.size(g)
                                                            for g in jax.tree.leaves(g_a))))
    for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def _config(*flags):
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, *flags])
    return fv.config


def test_validation_names_sft_packing_problems():
    assert not validate_config(_config("--config.sft.packing=True"), 1)
    problems = validate_config(_config("--config.sft.packing=True",
                                       "--config.sft.pack_tokens=100"), 1)
    assert any("sft.pack_tokens: 100 cannot hold the longest row, 127 tokens" in p
               for p in problems), problems
    problems = validate_config(_config("--config.sft.packing=True",
                                       "--config.sft.pack_tokens=0"), 1)
    assert any(p.startswith("sft.pack_tokens: must be an int >= 1") for p in problems)


def test_student_packing_turns_the_students_sft_packing_on(monkeypatch):
    config, seen = _config(), {}

    def fake_distill_student(config, data_path, workdir, **kwargs):
        seen.update(kwargs["sft"])
        return None, None

    monkeypatch.setattr(distill_student, "distill_student", fake_distill_student)
    settings = distill.settings_from(config, student_packing=True, max_new_tokens=300)
    distill.train_student(config, "unused.jsonl", "unused", tokenizer=None,
                          teacher_params=None, teacher_model=get_preset("test"),
                          settings=settings)
    # the student's completions may be the teacher's budget + 16 tokens: its longest row
    # is 32 + 316 - 1 tokens, more than sft.pack_tokens (256)
    assert seen["packing"] is True and seen["pack_tokens"] == 347
    assert seen["max_completion_length"] == 316
    config.mesh.context = 4  # packs split over 4 chips: a multiple of 4 that holds the row
    distill.train_student(config, "unused.jsonl", "unused", tokenizer=None,
                          teacher_params=None, teacher_model=get_preset("test"),
                          settings=settings)
    assert seen["pack_tokens"] == 348
    with pytest.raises(ValueError, match="distill.student_packing: must be True or False"):
        distill.settings_from(config, student_packing="yes")
