"""A LoRA model exported as a PEFT adapter (+ its base) and as a merged Hugging Face model,
loaded back in transformers and peft: float32 logits within 1e-4 of ours. Needs torch,
transformers and peft (`pip install torch peft`); skipped without them."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import lora as lora_lib, lora_export
from jaxrl_reason.models.transformer import Transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LOGIT_TOL = 1e-4


def _model(quant):
    cfg = models.get_preset("test", init_std=0.05, tie_embeddings=False).replace(
        lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj",
                                                          "down_proj"], "base_quant": quant})
    mesh = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = models.init_params(cfg, jax.random.key(0), mesh, shd.DEFAULT_RULES)
    adapters, base = lora_lib.split_adapters(params)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return cfg, lora_lib.merge_trees(jax.tree.unflatten(treedef, leaves), base)


def _torch_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_peft_adapter_and_merged_model_load_in_transformers(quant, tmp_path):
    cfg, params = _model(quant)
    files = lora_export.export_lora(cfg, params, str(tmp_path), dtype="float32")
    adapter_dir = os.path.join(tmp_path, "adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["r"] == 4 and config["lora_alpha"] == 8
    assert sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]
    assert len(files["adapter"]) == 2

    tokens = jax.random.randint(jax.random.key(2), (2, 9), 1, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    ours = np.asarray(Transformer(cfg).apply({"params": params}, tokens, positions,
                                             jnp.ones((2, 9), bool))[0])
    ours_base = np.asarray(Transformer(cfg).apply(
        {"params": lora_lib.without_adapters(params)}, tokens, positions,
        jnp.ones((2, 9), bool))[0])

    merged = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(tmp_path, "merged"), torch_dtype=torch.float32)
    np.testing.assert_allclose(_torch_logits(merged, tokens), ours, rtol=0, atol=LOGIT_TOL)

    base = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(tmp_path, "base"), torch_dtype=torch.float32)
    np.testing.assert_allclose(_torch_logits(base, tokens), ours_base, rtol=0, atol=LOGIT_TOL)
    adapted = peft.PeftModel.from_pretrained(base, adapter_dir)
    adapted.eval()
    np.testing.assert_allclose(_torch_logits(adapted, tokens), ours, rtol=0, atol=LOGIT_TOL)
    assert np.abs(ours - ours_base).max() > 100 * LOGIT_TOL  # the adapter matters


def test_export_without_adapters_is_refused():
    cfg = models.get_preset("test")
    with pytest.raises(ValueError, match="no LoRA adapters"):
        lora_export.peft_tensors(cfg, {})
