"""LoRA distillation (`recipes/distill.py` with `model.lora`): a student initialized from the
teacher trains only adapters on the teacher's frozen base, its checkpoints hold the adapters
and a fingerprinted reference to the teacher's checkpoint, and they load and resume; a new
(random) student is trained fully, with a warning that says so."""

from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np
import pytest

from cli_runs import REPO
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.checkpoints.phases import load_params, phase_dir
from jaxrl_reason.cli import parse
from jaxrl_reason.data.tasks import task_source
from jaxrl_reason.models import get_preset, lora as lora_lib
from jaxrl_reason.recipes import distill
from jaxrl_reason.recipes.sft import run_sft, sft_batch, sft_loss
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.runtime.metrics import MetricsWriter

LORA = os.path.join(REPO, "configs", "arith_grpo_lora.py") + ":smoke"
TINY = ("--config.sft.steps=1", "--config.sft.batch_size=8", "--config.sft.num_examples=8",
        "--config.log.progress_bar=False", "--config.log.tensorboard=False")


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _student(setup, workdir, steps, **settings):
    """`distill.train_student` of the teacher's fresh params on the distilled file."""
    rt, teacher_dir, data_path = setup
    teacher, _, _, _ = load_params(teacher_dir, rt.mesh, rt.rules)
    s = distill.DistillSettings(student_steps=steps, max_new_tokens=32, **settings)
    return distill.train_student(rt.config, data_path, str(workdir), tokenizer=rt.tokenizer,
                                 teacher_params=teacher, teacher_model=rt.model_cfg,
                                 settings=s, teacher_checkpoint=teacher_dir)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(teacher runtime, its 1-step full SFT checkpoint directory, a distilled JSONL)."""
    root = tmp_path_factory.mktemp("lora_distill")
    _, fv = parse(["jaxrl-reason", "sft", "--config", LORA, *TINY])
    rt = build_runtime(fv.config, str(root / "teacher"))
    assert rt.model_cfg.lora is not None and not fv.config.sft.lora
    with MetricsWriter(str(root / "teacher"), tensorboard=False, console=False) as writer:
        run_sft(rt, writer)
    # the task's worked solutions stand in for verified teacher samples
    examples = task_source(rt.config, "train", (1,), 8, seed=0)
    records = [{"id": e["id"], "prompt": e["prompt"], "answer": str(e["answer"]),
                "completion": e["completion"]} for e in (examples[i] for i in range(8))]
    data_path = str(root / "distill.jsonl")
    distill.write_sft_jsonl(data_path, records)
    return rt, phase_dir(str(root / "teacher"), "sft"), data_path


def test_student_of_the_teacher_trains_only_adapters_and_resumes(setup, tmp_path):
    rt, teacher_dir, data_path = setup
    teacher = _host(load_params(teacher_dir, rt.mesh, rt.rules)[0])
    assert not lora_lib.has_adapters(teacher)  # a full fine-tuning teacher: fresh adapters
    params, student_rt = _student(setup, tmp_path, 2, student_init="teacher")
    adapters, base = lora_lib.split_adapters(_host(params))
    jax.tree.map(np.testing.assert_array_equal, base, teacher)  # the base is bit-identical
    assert max(float(np.abs(b).max()) for b in jax.tree.leaves(adapters)) > 0  # B moved

    directory = phase_dir(str(tmp_path), "sft")
    with Checkpointer(directory) as ckpt:
        source = ckpt.metadata()["lora_base"]
    assert (source["kind"], source["path"]) == ("checkpoint", teacher_dir)
    with open(os.path.join(directory, "2", "state", "_METADATA")) as f:
        saved = list(json.load(f)["tree_metadata"])
    arrays = [k for k in saved if "'params'" in k or "'mu'" in k or "'nu'" in k]
    assert len(arrays) == 3 * len(jax.tree.leaves(adapters))  # params, Adam mu and nu
    assert all("'lora_a'" in k or "'lora_b'" in k for k in arrays), arrays[:4]

    # the checkpoint loads (base rebuilt from the teacher's, fingerprint checked) and scores
    loaded, cfg, _, _ = load_params(str(tmp_path), rt.mesh, rt.rules)
    assert cfg.lora == rt.model_cfg.lora
    jax.tree.map(np.testing.assert_array_equal, _host(loaded), _host(params))
    records = distill.read_sft_jsonl(data_path)
    batch = sft_batch(student_rt, [records[i] for i in range(8)], 64, 16)
    batch = {k: rt.put(v) for k, v in batch.items()}
    loss = jax.jit(lambda p: sft_loss(student_rt.model, p, batch)[0])
    loss_a, loss_b = float(loss(loaded)), float(loss(params))
    assert np.isfinite(loss_a) and loss_a == loss_b

    # resumed to 3 steps: one more adapter update on the same base
    resumed, _ = _student(setup, tmp_path, 3, student_init="teacher")
    adapters_3, base_3 = lora_lib.split_adapters(_host(resumed))
    jax.tree.map(np.testing.assert_array_equal, base_3, teacher)
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(adapters_3), jax.tree.leaves(adapters)))
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if line.strip()]
    assert steps == [1, 2, 3]


def test_a_random_student_is_trained_fully_and_says_so(setup, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=distill.__name__):
        params, _ = _student(setup, tmp_path, 1, student_init="random")
    assert "student_init=random makes a new student" in caplog.text
    assert "trained fully" in caplog.text
    assert not lora_lib.has_adapters(params)
    with Checkpointer(phase_dir(str(tmp_path), "sft")) as ckpt:
        assert "lora_base" not in ckpt.metadata()


def test_student_lora_rules_and_a_missing_teacher_checkpoint():
    _, fv = parse(["jaxrl-reason", "sft", "--config", LORA])
    lora_model = get_preset("test", lora={"rank": 2})
    rule = distill.student_lora
    assert rule(lora_model, distill.DistillSettings(student_init="teacher"), False) == (True, "")
    assert rule(lora_model, distill.DistillSettings(), True) == (True, "")  # sft.lora
    lora, note = rule(lora_model, distill.DistillSettings(student_preset="test"), False)
    assert not lora and "student_preset='test' makes a new model" in note
    assert rule(get_preset("test"), distill.DistillSettings(student_init="teacher"),
                False) == (False, "")
    with pytest.raises(ValueError, match="needs the teacher's checkpoint directory"):
        distill.train_student(fv.config, "unused.jsonl", "unused", tokenizer=None,
                              teacher_params=None, teacher_model=lora_model,
                              settings=distill.DistillSettings(student_init="teacher"))
