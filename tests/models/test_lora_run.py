"""configs/arith_grpo_lora.py end to end: SFT, GRPO with adapters over an int8 base and a KL
to the base-as-reference, adapter-only checkpoints, an exact resume, export, and the RL
options LoRA refuses."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

from cli_runs import QUIET, REPO, load_config, phase, read_metrics, run_cli
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.models import lora as lora_lib, lora_params
from jaxrl_reason.checkpoints.phases import load_params, phase_dir

LORA = os.path.join(REPO, "configs", "arith_grpo_lora.py")
FLAGS = ("--config.rl.beta=0.04", "--config.model.lora.base_quant=int8",
         "--config.eval.seeds=(0,)", "--config.eval.num_problems=8",
         "--config.eval.batch_prompts=8", "--config.log.tensorboard=False", *QUIET)


def _train(workdir, *extra):
    rc = run_cli("train", "--config", f"{LORA}:smoke", "--workdir", str(workdir), *FLAGS,
                 *extra)
    assert rc == 0
    return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"full": a 4-step RL run, "resumed": 2 steps, then resumed to 4}."""
    root = tmp_path_factory.mktemp("lora_runs")
    full = _train(root / "full", "--config.rl.steps=4")
    resumed = _train(root / "resumed", "--config.rl.steps=2")
    shutil.copy(os.path.join(resumed, "metrics.jsonl"), root / "metrics_2.jsonl")
    _train(resumed, "--config.rl.steps=4", "--resume")
    return {"full": full, "resumed": resumed, "root": root}


def test_rl_trains_adapters_against_the_base_as_reference(runs):
    rl = phase(read_metrics(runs["full"]), "rl")
    assert [m["step"] for m in rl] == [1, 2, 3, 4]
    assert rl[0]["kl"] == 0.0  # B = 0: the policy is its reference, the base
    assert any(m["kl"] > 0 for m in rl[1:])  # the adapters moved it away
    assert all(m["update_skipped"] == 0 for m in rl)


def test_checkpoints_hold_only_the_adapters_and_a_fingerprinted_base(runs):
    directory = phase_dir(str(runs["full"]), "rl")
    with Checkpointer(directory) as ckpt:
        meta = ckpt.metadata()
    base = meta["lora_base"]
    assert base["kind"] == "checkpoint" and base["path"] == phase_dir(str(runs["full"]), "sft")
    mesh = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    params, cfg, _, _ = load_params(str(runs["full"]), mesh, shd.DEFAULT_RULES)
    assert cfg.lora.base_quant == "int8" and lora_lib.has_adapters(params)
    assert "kernel_int8" in params["layer_0"]["attn"]["q_proj"]
    # every array saved: the adapters, their Adam moments, counters and the RNG key
    with open(os.path.join(directory, "4", "state", "_METADATA")) as f:
        saved = list(json.load(f)["tree_metadata"])
    arrays = [k for k in saved if "'params'" in k or "'mu'" in k or "'nu'" in k]
    assert arrays and all("'lora_a'" in k or "'lora_b'" in k for k in arrays), arrays[:5]
    assert not any("ref_params" in k or "kernel" in k or "embedding" in k for k in saved)
    n_adapters = len(jax.tree.leaves(lora_lib.split_adapters(params)[0]))
    assert len(arrays) == 3 * n_adapters


def test_resume_is_exact(runs):
    full = phase(read_metrics(runs["full"]), "rl")
    resumed = phase(read_metrics(runs["resumed"]), "rl")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for key in ("loss", "kl", "grad_norm", "reward/mean", "completion/length_mean"):
        np.testing.assert_allclose([m[key] for m in resumed], [m[key] for m in full],
                                   rtol=1e-6, atol=1e-9, err_msg=key)


def test_a_different_base_is_refused(runs):
    """The adapters' checkpoint fingerprints its base: another SFT step does not pass."""
    with Checkpointer(phase_dir(str(runs["full"]), "rl")) as ckpt:
        fingerprint = ckpt.metadata()["lora_base"]["fingerprint"]
    mesh = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    sft = phase_dir(str(runs["full"]), "sft")
    for step in (4, 2):  # the base is SFT's newest step; step 2 is another model
        params, cfg, _, _ = load_params(sft, mesh, shd.DEFAULT_RULES, step=step)
        params = lora_params.quantize_base(cfg, params, mesh, shd.DEFAULT_RULES)
        if step == 4:
            lora_params.check_base_fingerprint(fingerprint, params, "test")
        else:
            with pytest.raises(ValueError, match="test: the base model differs"):
                lora_params.check_base_fingerprint(fingerprint, params, "test")


def test_export_writes_merged_base_and_adapter(runs, tmp_path, capsys):
    out = tmp_path / "export"
    capsys.readouterr()
    assert run_cli("export", "--checkpoint", str(runs["full"]), "--out", str(out)) == 0
    written = sorted(os.path.join(sub, name) for sub in os.listdir(out)
                     for name in os.listdir(out / sub))
    for path in ("merged/model.safetensors", "base/model.safetensors",
                 "adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                 "merged/tokenizer.model", "merged/tokenizer_config.json"):
        assert path in written, path
    assert f"wrote {len(written)} files to {out}: {', '.join(written)}" in \
        capsys.readouterr().out


def test_export_of_the_full_fine_tuning_sft_phase_is_a_plain_model(runs, tmp_path, capsys):
    """The SFT phase of a LoRA run (sft.lora False) has no adapters: one HF directory."""
    out = tmp_path / "sft_export"
    capsys.readouterr()
    assert run_cli("export", "--checkpoint", phase_dir(str(runs["full"]), "sft"),
                   "--out", str(out)) == 0
    assert (f"wrote 5 files to {out}: config.json, model.safetensors, tokenizer.json, "
            f"tokenizer.model, tokenizer_config.json") in capsys.readouterr().out


@pytest.mark.parametrize("override,message", [
    ("--config.rl.ref_sync_every=2", "ref_sync_every=2: mixing the reference"),
])
def test_rl_options_lora_cannot_do_are_refused(override, message, tmp_path):
    from jaxrl_reason.models import get_preset
    cfg = get_preset("test", lora={"rank": 2})
    rl = load_config(LORA).rl
    key, value = override.split("=")
    rl[key.split(".")[-1]] = int(value) if value.isdigit() else value
    with pytest.raises(ValueError, match=message):
        lora_params.check_rl_config(cfg, rl)


def test_sft_with_adapters_then_rl_continues_them(tmp_path):
    """sft.lora: SFT trains adapters too (on the seed's random base here); RL continues the
    same adapters; both phases' checkpoints load back as base + adapters."""
    workdir = _train(tmp_path / "sft_lora", "--config.sft.lora=True", "--config.rl.steps=2")
    mesh = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    sft_dir, rl_dir = (phase_dir(str(workdir), p) for p in ("sft", "rl"))
    with Checkpointer(sft_dir) as ckpt:
        assert ckpt.metadata()["lora_base"]["kind"] == "init"
    sft_params, cfg, _, _ = load_params(sft_dir, mesh, shd.DEFAULT_RULES)
    rl_params, _, _, _ = load_params(rl_dir, mesh, shd.DEFAULT_RULES)
    sft_adapters, sft_base = lora_lib.split_adapters(sft_params)
    rl_adapters, rl_base = lora_lib.split_adapters(rl_params)
    for x, y in zip(jax.tree.leaves(sft_base), jax.tree.leaves(rl_base)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # one frozen base
    b = sft_adapters["layer_0"]["attn"]["q_proj"]["lora_b"]
    assert float(np.abs(np.asarray(b)).max()) > 0  # SFT trained the adapters


def test_rl_with_adapters_starts_from_a_checkpoint_without_them(tmp_path):
    """`train --init_checkpoint` of a full fine-tuning SFT run (no adapters in its params or
    its model config) with a LoRA config: fresh adapters on that base, not a config clash."""
    arith = os.path.join(REPO, "configs", "arith_grpo.py")
    sft = tmp_path / "sft"
    assert run_cli("sft", "--config", f"{arith}:smoke", "--workdir", str(sft), *QUIET) == 0
    workdir = _train(tmp_path / "rl", "--config.rl.steps=1", "--init_checkpoint", str(sft))
    assert [m["step"] for m in phase(read_metrics(workdir), "rl")] == [1]
    mesh = shd.make_mesh({"data": 1}, devices=jax.devices()[:1])
    params, cfg, _, _ = load_params(str(workdir), mesh, shd.DEFAULT_RULES)
    assert cfg.lora is not None and lora_lib.has_adapters(params)
