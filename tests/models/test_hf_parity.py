"""Hugging Face checkpoints: numerical parity with transformers on tiny random-weight models of
each family (fixtures written by scripts/make_parity_fixtures.py; no torch needed here), greedy
generation, import -> export -> import round trips, sharded loading onto the 8-device mesh, and
clear errors for bad checkpoints."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import hf
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import Sampler, left_pad

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FAMILIES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text")
RULES = shd.DEFAULT_RULES
LOGIT_TOL = 1e-4


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def mesh8():
    return shd.make_mesh({"fsdp": 4, "tensor": 2})


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, mesh1):
    family = request.param
    path = os.path.join(FIXTURES, family)
    cfg, params = hf.load_hf_checkpoint(path, mesh1, RULES)
    return family, path, cfg, params, dict(np.load(os.path.join(path, "reference.npz")))


def _leaves(params):
    return jax.tree_util.tree_flatten_with_path(params)[0]


def _assert_bit_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), (_, y) in zip(_leaves(a), _leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


# ----------------------------------------------------------------------------- parity


def test_fixture_configs_map_to_the_family_switches(loaded):
    family, _, cfg, _, _ = loaded
    assert cfg.qkv_bias == (family == "qwen2")
    assert cfg.qk_norm == (family in ("qwen3", "gemma3_text"))
    gemma = family.startswith("gemma")
    assert (cfg.norm_plus_one, cfg.post_norms, cfg.embed_scale) == (gemma,) * 3
    assert (cfg.sliding_window is not None) == gemma
    expected = {"llama": dict(rope_scaling="llama3", rope_original_max_position=64,
                              tie_embeddings=False),
                "gemma2": dict(sliding_window=6, sliding_window_pattern=2,
                               attn_logit_softcap=4.0, final_logit_softcap=8.0,
                               query_pre_attn_scalar=24.0),
                "gemma3_text": dict(sliding_window=6, sliding_window_pattern=6,
                                    rope_scaling="linear", rope_scaling_factor=4.0,
                                    rope_theta=1e6, rope_local_theta=1e4,
                                    attn_logit_softcap=None)}.get(family, {})
    for name, value in expected.items():
        assert getattr(cfg, name) == value, name
    params = loaded[3]
    assert models.count_params(params) == cfg.num_params
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}


def test_logits_match_transformers(loaded):
    family, _, cfg, params, ref = loaded
    tokens = jnp.asarray(ref["input_ids"])
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    valid = jnp.ones(tokens.shape, bool)
    logits, _ = jax.jit(Transformer(cfg).apply)({"params": params}, tokens, positions, valid)
    diff = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    print(f"{family}: max |logit diff| vs transformers = {diff:.3g}")
    assert diff < LOGIT_TOL, f"{family}: max |logit diff| {diff:.3g}"


def _assert_greedy_matches(family, cfg, params, ref, mesh):
    """Our KV-cached sampler (prompts left-padded by 4 slots, so slots != positions) gives
    transformers' greedy continuation token for token, sliding windows included."""
    prompts = [list(row) for row in ref["input_ids"]]
    tokens, valid = left_pad(prompts, len(prompts[0]) + 4, pad_id=0)
    sampler = Sampler(Transformer(cfg), eos_id=-1, pad_id=0, mesh=mesh, rules=RULES)
    out = sampler(params, tokens, valid, jax.random.key(0),
                  max_new_tokens=ref["greedy"].shape[1], temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref["greedy"], err_msg=family)
    assert not np.any(np.asarray(out.truncated) == 0)


def test_greedy_generation_matches_transformers(loaded, mesh1):
    family, _, cfg, params, ref = loaded
    _assert_greedy_matches(family, cfg, params, ref, mesh1)


# ----------------------------------------------------------------------------- round trips


def test_import_export_import_is_bit_identical(loaded, mesh1, tmp_path):
    family, path, cfg, params, _ = loaded
    written = hf.export_hf_checkpoint(cfg, params, str(tmp_path))
    assert sorted(os.path.basename(f) for f in written) == ["config.json", "model.safetensors"]
    cfg2, params2 = hf.load_hf_checkpoint(str(tmp_path), mesh1, RULES)
    assert cfg2 == cfg
    _assert_bit_identical(params, params2)
    # The exported tensors are the original checkpoint's, name for name and bit for bit.
    original = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(os.path.join(str(tmp_path), "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    config = json.load(open(os.path.join(str(tmp_path), "config.json")))
    assert config["model_type"] == family and config["torch_dtype"] == "float32"


def test_sharded_export_loads_onto_the_8_device_mesh(mesh1, mesh8, tmp_path):
    path = os.path.join(FIXTURES, "gemma2")
    cfg, params = hf.load_hf_checkpoint(path, mesh1, RULES)
    written = hf.export_hf_checkpoint(cfg, params, str(tmp_path), max_shard_bytes=100_000)
    shards = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(shards) >= 5 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.load(open(os.path.join(str(tmp_path), "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) == set(shards)
    assert len(written) == len(shards) + 2

    cfg8, params8 = hf.load_hf_checkpoint(str(tmp_path), mesh8, RULES)
    assert cfg8 == cfg
    expected = models.param_shardings(cfg, mesh8, RULES)
    devices = set(mesh8.devices.flat)
    sharded = 0
    for (name, x), (_, want), (_, full) in zip(_leaves(params8), _leaves(expected),
                                               _leaves(params)):
        assert x.sharding == want, name
        assert {s.device for s in x.addressable_shards} == devices, name
        reference = np.asarray(full)
        for shard in x.addressable_shards:  # each device holds exactly its slice
            np.testing.assert_array_equal(np.asarray(shard.data), reference[shard.index])
        sharded += any(axis is not None for axis in want.spec)
    assert sharded >= len(_leaves(params8)) // 2  # kernels, embeddings and norms are split
    assert expected["embedding"].spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def test_bfloat16_load_and_export(mesh1, tmp_path):
    path = os.path.join(FIXTURES, "qwen2")
    cfg, params = hf.load_hf_checkpoint(path, mesh1, RULES)
    cfg16, params16 = hf.load_hf_checkpoint(path, mesh1, RULES, dtype="bfloat16")
    assert (cfg16.param_dtype, cfg16.dtype) == ("bfloat16", "bfloat16")
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params16)):
        assert y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x).astype(ml_dtypes.bfloat16))
    hf.export_hf_checkpoint(cfg, params, str(tmp_path), dtype="bfloat16")
    assert json.load(open(os.path.join(str(tmp_path), "config.json")))["torch_dtype"] == \
        "bfloat16"
    cfg_b, params_b = hf.load_hf_checkpoint(str(tmp_path), mesh1, RULES, dtype="bfloat16",
                                            compute_dtype="float32")
    assert (cfg_b.param_dtype, cfg_b.dtype) == ("bfloat16", "float32")
    _assert_bit_identical(params16, params_b)  # BF16 tensors read raw, bit for bit


def test_gemma3_multimodal_layout_loads_the_text_tower(mesh1, tmp_path):
    path = os.path.join(FIXTURES, "gemma3_text")
    text_config = json.load(open(os.path.join(path, "config.json")))
    json.dump({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
               "text_config": text_config, "vision_config": {"model_type": "siglip_vision_model"}},
              open(tmp_path / "config.json", "w"))
    tensors = {name.replace("model.", "model.language_model.", 1): value
               for name, value in load_file(os.path.join(path, "model.safetensors")).items()}
    tensors["model.vision_tower.patch_embedding.weight"] = np.zeros((2, 3), np.float32)
    tensors["model.multi_modal_projector.mm_soft_emb_norm.weight"] = np.zeros(3, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg, params = hf.load_hf_checkpoint(path, mesh1, RULES)
    cfg_mm, params_mm = hf.load_hf_checkpoint(str(tmp_path), mesh1, RULES)
    assert cfg_mm == cfg
    _assert_bit_identical(params, params_mm)


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen2.5-7b", "qwen3-1.7b", "llama3-8b",
                                  "llama3.1-8b", "llama3.2-1b", "gemma2-2b", "gemma3-1b"])
def test_presets_round_trip_through_hf_config(name):
    cfg = models.get_preset(name)
    assert hf.config_from_hf(hf.hf_config(cfg)) == cfg


def test_transformers_4_config_keys():
    """Configs saved by transformers 4 (rope_theta + rope_scaling, rope_local_base_freq)."""
    llama31 = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "max_position_embeddings": 131072, "tie_word_embeddings": False,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192,
                                "rope_type": "llama3"}}
    assert hf.config_from_hf(llama31) == models.get_preset("llama3.1-8b")
    gemma3_4b_text = {"model_type": "gemma3_text", "hidden_size": 2560,
                      "intermediate_size": 10240, "num_hidden_layers": 34,
                      "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                      "sliding_window": 1024}
    cfg = hf.config_from_hf({"model_type": "gemma3", "text_config": gemma3_4b_text})
    assert (cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (262208, 8, 4, 256)
    assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_theta, cfg.rope_local_theta) == \
        ("linear", 8.0, 1e6, 1e4)
    assert (cfg.sliding_window, cfg.sliding_window_pattern) == (1024, 6)
    assert [cfg.layer_is_sliding(i) for i in range(6)] == [True] * 5 + [False]


def _fixture_config(family):
    return json.load(open(os.path.join(FIXTURES, family, "config.json")))


@pytest.mark.parametrize("family, changes, match", [
    ("llama", dict(model_type="mistral"), "unsupported model_type 'mistral'"),
    ("llama", dict(model_type=None), "unsupported model_type None"),
    ("llama", dict(attention_bias=True), "attention_bias=true"),
    ("llama", dict(mlp_bias=True), "mlp_bias=true"),
    ("llama", dict(hidden_act="relu"), "hidden_act='relu'"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     "rope type 'yarn'"),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window=true"),
    ("gemma2", dict(layer_types=["full_attention", "sliding_attention"] * 2),
     "only every-p-th-layer-global"),
    ("gemma3_text", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("qwen3", dict(num_key_value_heads=3), "n_kv_heads=3 must divide n_heads=4"),
    ("qwen3", dict(hidden_size=None), "missing field 'hidden_size'"),
])
def test_unsupported_configs_name_the_field_and_file(family, changes, match):
    config = {**_fixture_config(family), **changes}
    with pytest.raises(ValueError, match=match) as info:
        hf.config_from_hf(config, source="/models/x/config.json")
    assert "/models/x/config.json" in str(info.value)


def test_export_rejects_configs_no_family_represents(mesh1, tmp_path):
    for changes in (dict(qkv_bias=True, qk_norm=True), dict(final_logit_softcap=30.0),
                    dict(embed_scale=True), dict(sliding_window=4)):
        with pytest.raises(ValueError, match="family"):
            hf.hf_config(models.get_preset("test", **changes))


# ----------------------------------------------------------------------------- bad checkpoints


@pytest.fixture
def llama_copy(tmp_path):
    directory = tmp_path / "llama"
    shutil.copytree(os.path.join(FIXTURES, "llama"), directory)
    return directory


def _rewrite(directory, edit):
    file = str(directory / "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return file


def test_missing_tensor(llama_copy, mesh1):
    _rewrite(llama_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)


def test_misshaped_tensor(llama_copy, mesh1):
    def truncate(t):
        name = "model.layers.0.self_attn.o_proj.weight"
        t[name] = t[name][:, :32]
    file = _rewrite(llama_copy, truncate)
    with pytest.raises(ValueError, match=r"o_proj\.weight has shape \[64, 32\], expected "
                                         r"\[64, 64\]") as info:
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)
    assert file in str(info.value)


def test_unexpected_tensor(llama_copy, mesh1):
    file = _rewrite(llama_copy, lambda t: t.update(
        {"model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor model\.layers\.0\.self_attn\."
                                         r"o_proj\.bias") as info:
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)
    assert file in str(info.value)


def test_unsupported_tensor_dtype(llama_copy, mesh1):
    _rewrite(llama_copy, lambda t: t.update(
        {"model.norm.weight": t["model.norm.weight"].astype(np.int8)}))
    with pytest.raises(ValueError, match=r"model\.norm\.weight has dtype I8"):
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)


@pytest.mark.parametrize("content, error, match", [
    ("{not json", ValueError, "config.json: not valid JSON"),
    ("[1, 2]", ValueError, "expected a JSON object"),
    (None, FileNotFoundError, "no config.json"),
])
def test_bad_config_json(llama_copy, mesh1, content, error, match):
    file = llama_copy / "config.json"
    if content is None:
        file.unlink()
    else:
        file.write_text(content)
    with pytest.raises(error, match=match) as info:
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)
    assert str(llama_copy) in str(info.value)


def test_bad_weight_files(llama_copy, mesh1):
    (llama_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)
    (llama_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="lists model-00001-of-00002.safetensors"):
        hf.load_hf_checkpoint(str(llama_copy), mesh1, RULES)


# ----------------------------------------------------------------------------- scanned layers


@pytest.fixture(scope="module", params=FAMILIES)
def loaded_scanned(request, mesh1):
    family = request.param
    path = os.path.join(FIXTURES, family)
    cfg, params = hf.load_hf_checkpoint(path, mesh1, RULES, scan_layers=True)
    return family, path, cfg, params, dict(np.load(os.path.join(path, "reference.npz")))


def test_scanned_layers_match_transformers(loaded_scanned, mesh1, tmp_path):
    """scan_layers=True: the stacked import gives transformers' logits and greedy tokens
    (Gemma's alternating sliding windows as traced per-layer flags), and exports the original
    tensors bit for bit."""
    family, path, cfg, params, ref = loaded_scanned
    assert cfg.scan_layers and set(params) >= {"layers"}
    assert not any(k.startswith("layer_") for k in params)
    q = params["layers"]["attn"]["q_proj"]["kernel"]
    assert q.shape[0] == cfg.n_layers
    tokens = jnp.asarray(ref["input_ids"])
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits, _ = jax.jit(Transformer(cfg).apply)({"params": params}, tokens, positions,
                                                jnp.ones(tokens.shape, bool))
    diff = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    assert diff < LOGIT_TOL, f"{family}: max |logit diff| {diff:.3g}"

    _assert_greedy_matches(family, cfg, params, ref, mesh1)

    hf.export_hf_checkpoint(cfg, params, str(tmp_path))
    original = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(os.path.join(str(tmp_path), "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    assert "scan_layers" not in json.load(open(os.path.join(str(tmp_path), "config.json")))
