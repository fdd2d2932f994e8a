"""SFT micro-batches (sft.micro_batches: gradient accumulation over rows, or with
sft.packing over packs): one step equals the one-micro-batch step in float32 (the loss,
its token count, the gradients), and config validation names the knob."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from test_packing_sft import LENGTH, ROWS, T, TP, _batch, _setup
from trainer_support import SMOKE
from jaxrl_reason.cli import parse
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.recipes.sft import make_sft_step, packed_sft_batch
from jaxrl_reason.rl import packing
from jaxrl_reason.runtime.train_state import create_train_state
from numerics import decoder_grad_tolerance, decoder_tolerance


def _step(model, params, batch, share=None, **micro):
    sgd = optax.sgd(1.0)
    step = make_sft_step(model, sgd, share_prompts=share, **micro)
    new, metrics = step(create_train_state(jax.tree.map(jnp.copy, params), sgd),
                        jax.tree.map(jnp.asarray, batch))
    return jax.device_get(metrics), jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b),
                                                 params, new.params)


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batched_sft_step_equals_one_micro_batch(packed):
    _, cfg, params = _setup()
    model, batch = Transformer(cfg), _batch(1)
    if packed:  # a run sized for 6 micro-batches (a row per pack at worst): 1 pack each
        packer = packing.Packer(T, ROWS, TP + LENGTH - 1, 1, True, micro_batches=6)
        batch = packed_sft_batch(batch, packer)
        count = batch["pack_tokens"].shape[0] // packer.packs_per_micro
        assert count >= 2, (batch["pack_tokens"].shape, packer.packs_per_micro)
        share, micro = True, {"micro_batches": 6, "packs_per_micro": packer.packs_per_micro}
    else:
        share, micro = None, {"micro_batches": 3}
    m_one, g_one = _step(model, params, batch, share)
    m_k, g_k = _step(model, params, batch, share, **micro)
    atol = decoder_tolerance(cfg, params, tokens=T)
    assert m_k["tokens"] == m_one["tokens"] == np.sum(batch["completion_mask"])
    np.testing.assert_allclose(m_k["loss"], m_one["loss"], rtol=1e-6, atol=atol)
    grad_atol = decoder_grad_tolerance(cfg, g_one, tokens=T, rows=ROWS)
    assert max(np.abs(g).max() for g in jax.tree.leaves(g_one)) > 100 * grad_atol
    for a, b in zip(jax.tree.leaves(g_one), jax.tree.leaves(g_k)):
        np.testing.assert_allclose(b, a, rtol=0, atol=grad_atol)


def test_config_validation_names_sft_micro_batches():
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    config = fv.config
    config.sft.micro_batches = 2
    assert validate_config(config, 1) == []
    config.sft.micro_batches = 3  # 16 rows
    problems = "\n".join(validate_config(config, 1))
    assert "sft.micro_batches: sft.batch_size 16 does not split into 3 micro-batches" in problems
    config.sft.packing = True  # packs: any count
    assert validate_config(config, 1) == []
    config.sft.micro_batches = 0
    assert "sft.micro_batches: must be an int >= 1" in "\n".join(validate_config(config, 1))
    with pytest.raises(ValueError, match="packs of a micro-batch"):
        make_sft_step(None, optax.sgd(1.0), share_prompts=True, micro_batches=2)
