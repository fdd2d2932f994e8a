"""Rejection-sampling distillation: only verified completions are kept, shortest selection,
the SFT file round trip through data/files.py, and a tiny sample -> filter -> SFT-a-student run."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.recipes import distill
from jaxrl_reason.cli import parse
from jaxrl_reason.data.arithmetic import make_example
from jaxrl_reason.data.tasks import task_source
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.params import abstract_params, init_params
from jaxrl_reason.rewards import correctness, register_reward
from jaxrl_reason.checkpoints.phases import load_params
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.recipes.sft import sft_batch, sft_examples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"
PIPELINE = os.path.join(REPO, "configs", "r1_pipeline.py")


@register_reward("distill_test_nonempty", overwrite=True)
def _nonempty(completion, example):
    """Accepts any non-empty completion: lets a random teacher produce a data set."""
    return float(bool(completion.strip()))


def _samples(example):
    """Four completions of one arithmetic example: long correct, short correct, wrong,
    and correct again (a duplicate of the first)."""
    answer, full = example["answer"], example["completion"]
    wrong = str(int(answer) + 1)
    return [full, f"<answer>{answer}</answer>", full.replace(f"<answer>{answer}<",
                                                              f"<answer>{wrong}<"), full]


@pytest.fixture(scope="module")
def problems():
    examples = [make_example("train", level, i, 0) for i, level in enumerate((1, 2, 3))]
    texts = [t for e in examples for t in _samples(e)]
    lengths = [len(t) for t in texts]  # any length measure works for selection
    rows = [e for e in examples for _ in range(4)]
    correct = distill.verify_completions(texts, rows, ["correctness"])
    return examples, texts, lengths, correct


def test_verifier_verdicts(problems):
    _, _, _, correct = problems
    np.testing.assert_array_equal(correct, [True, True, False, True] * 3)


def test_kept_set_is_exactly_the_verified_completions(problems):
    examples, texts, lengths, correct = problems
    records = distill.select_completions(examples, texts, lengths, correct, num_samples=4,
                                         dedupe=False)
    assert [(r["source_id"], r["sample"]) for r in records] == \
        [(e["id"], j) for e in examples for j in (0, 1, 3)]
    by_id = {e["id"]: e for e in examples}
    for r in records:
        assert correctness(r["completion"], by_id[r["source_id"]]).score == 1.0
        assert r["prompt"] == by_id[r["source_id"]]["prompt"]
        assert r["answer"] == by_id[r["source_id"]]["answer"]
        assert r["level"] == by_id[r["source_id"]]["level"]  # scalar fields are kept
    # dedupe drops the repeat of sample 0; truncated rows are dropped unless asked not to.
    deduped = distill.select_completions(examples, texts, lengths, correct, num_samples=4)
    assert [r["sample"] for r in deduped] == [0, 1] * 3
    truncated = [j == 1 for _ in examples for j in range(4)]
    kept = distill.select_completions(examples, texts, lengths, correct, num_samples=4,
                                      truncated=truncated)
    assert [r["sample"] for r in kept] == [0] * 3
    kept = distill.select_completions(examples, texts, lengths, correct, num_samples=4,
                                      truncated=truncated, drop_truncated=False)
    assert [r["sample"] for r in kept] == [0, 1] * 3


def test_shortest_keeps_one_shortest_correct_per_prompt(problems):
    examples, texts, lengths, correct = problems
    records = distill.select_completions(examples, texts, lengths, correct, num_samples=4,
                                         keep="shortest")
    assert [r["sample"] for r in records] == [1, 1, 1]  # "<answer>N</answer>"
    assert all(r["completion"] == f"<answer>{e['answer']}</answer>"
               for r, e in zip(records, examples))
    # A prompt with no correct sample contributes nothing; ties go to the first sample.
    none_right = np.array(correct)
    none_right[:4] = False
    records = distill.select_completions(examples, texts, [5] * 12, none_right,
                                         num_samples=4, keep="shortest")
    assert [(r["source_id"], r["sample"]) for r in records] == \
        [(examples[1]["id"], 0), (examples[2]["id"], 0)]


def test_bad_arguments(problems):
    examples, texts, lengths, correct = problems
    with pytest.raises(ValueError, match="keep must be"):
        distill.select_completions(examples, texts, lengths, correct, num_samples=4,
                                   keep="longest")
    with pytest.raises(ValueError, match="completions has 11 rows"):
        distill.select_completions(examples, texts[:-1], lengths, correct, num_samples=4)


def test_sft_file_round_trip_through_the_file_task(problems, tmp_path):
    examples, texts, lengths, correct = problems
    records = distill.select_completions(examples, texts, lengths, correct, num_samples=4)
    path = str(tmp_path / "distilled.jsonl")
    assert distill.write_sft_jsonl(path, records) == len(records)
    back = distill.read_sft_jsonl(path)
    assert len(back) == len(records)
    for a, b in zip(records, back):
        for key in ("id", "prompt", "answer", "completion", "source_id", "level"):
            assert a[key] == b[key]
    # The student's run config reads it as a "file" task whose examples are SFT targets.
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])
    c = distill.student_config(fv.config, path, sft={"steps": 3})
    assert c.sft.num_examples == len(records) and c.sft.steps == 3
    source = task_source(c, "train", c.task.train_levels, c.sft.num_examples, seed=0)
    chosen = sft_examples(source, c.sft.num_examples)
    assert [e["completion"] for e in chosen] == [r["completion"] for r in records]
    assert [e["prompt"] for e in chosen] == [r["prompt"] for r in records]
    with pytest.raises(ValueError, match="'stepz' is not an sft field"):
        distill.student_config(fv.config, path, sft={"stepz": 3})
    # A malformed record is named by file and line.
    with open(path, "a") as f:
        f.write(json.dumps({"prompt": "p", "completion": "c"}) + "\n")
    with pytest.raises(ValueError, match=rf"distilled\.jsonl:{len(records) + 1}: .*'answer'"):
        distill.read_sft_jsonl(path)


def test_sample_filter_and_sft_a_student(tmp_path):
    """Random teacher -> 8 samples -> verified records -> 2 SFT steps of a smaller student."""
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])
    rt = build_runtime(fv.config, str(tmp_path / "teacher"))
    params = init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    examples = list(task_source(rt.config, "train", (1,), 4, seed=0))
    sampling = dict(num_samples=2, max_new_tokens=16, batch_prompts=4, seed=0)

    # The task's verifier: a random teacher is (almost) never right; whatever is kept verifies.
    records, stats = distill.rejection_sample(rt, params, examples, **sampling)
    assert (stats.prompts, stats.samples) == (4, 8)
    assert stats.kept == len(records) <= stats.correct
    assert stats.acceptance_rate == pytest.approx(stats.correct / 8)
    by_id = {e["id"]: e for e in examples}
    assert all(correctness(r["completion"], by_id[r["source_id"]]).score == 1.0
               for r in records)

    # An accept-everything verifier: every non-empty sample is kept (truncated ones too: a
    # random teacher rarely stops within 16 tokens, and which rows do depends on the draws).
    sampling["drop_truncated"] = False
    records, stats = distill.rejection_sample(rt, params, examples,
                                              verifiers=["distill_test_nonempty"], **sampling)
    assert stats.kept > 0 and stats.mean_length_all > 0
    assert all(r["length"] <= 16 and r["completion"].strip() for r in records)
    shortest, short_stats = distill.rejection_sample(
        rt, params, examples, verifiers=["distill_test_nonempty"], keep="shortest",
        **sampling)  # same seed: the same samples
    assert short_stats.correct == stats.correct
    assert short_stats.mean_length_kept <= stats.mean_length_kept
    assert len(shortest) == short_stats.prompts_kept <= 4

    path = str(tmp_path / "distilled.jsonl")
    distill.write_sft_jsonl(path, records)
    student = get_preset("test", n_layers=1)
    student_params, student_rt = distill.distill_student(
        rt.config, path, str(tmp_path / "student"), tokenizer=rt.tokenizer, model=student,
        sft={"steps": 2, "batch_size": 8, "warmup_steps": 1})
    assert student_rt.model_cfg.n_layers == 1
    assert student_rt.model_cfg.vocab_size == rt.tokenizer.vocab_size
    assert jax.tree.structure(student_params) == jax.tree.structure(
        abstract_params(student_rt.model_cfg))
    assert "layer_1" in params and "layer_1" not in student_params
    loaded, cfg, tok, _ = load_params(str(tmp_path / "student"), rt.mesh, rt.rules)
    assert cfg == student_rt.model_cfg and tok.serialized == rt.tokenizer.serialized
    with open(os.path.join(tmp_path, "student", "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == 2 and all(np.isfinite(line["loss"]) for line in lines)
    # The batch the student trained on is the teacher's text under the shared tokenizer.
    batch = sft_batch(student_rt, records[:2], 96, 16)
    assert rt.tokenizer.decode(batch["completion_tokens"][0]) == records[0]["completion"]


# ----------------------------------------------------------------------------- runs


def test_settings_from_defaults_config_block_and_overrides():
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])  # no distill block
    assert distill.settings_from(fv.config) == distill.DistillSettings()
    s = distill.settings_from(fv.config, num_samples=3, keep=None, verifiers="a,b")
    assert (s.num_samples, s.keep, s.verifiers) == (3, "all", ("a", "b"))
    assert distill.budget(fv.config, s) == fv.config.rl.max_new_tokens
    _, fv = parse(["jaxrl-reason", "pipeline", "--config", PIPELINE + ":smoke"])
    assert distill.settings_from(fv.config).student_init == "teacher"  # its distill block
    with pytest.raises(ValueError) as e:
        distill.settings_from(fv.config, keep="longest", num_samples=0, student_preset="nope")
    text = str(e.value)
    assert "distill.keep: must be one of ['all', 'shortest'], got 'longest'" in text
    assert "distill.num_samples: must be a positive integer, got 0" in text
    assert "a student initialized from the teacher has the teacher's model" in text
    assert "unknown model preset 'nope'" in text
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['samples'\]"):
        distill.settings_from(fv.config, samples=3)


def _cli(*args: str) -> int:
    try:
        return cli.main(["jaxrl-reason", *args])
    except SystemExit as e:
        return e.code


@pytest.mark.slow
def test_distill_command_end_to_end_then_resumes(tmp_path, capsys):
    """A 4-step SFT teacher -> 8 prompts x 2 unverified samples -> a 2-step student, both
    evaluated; a rerun reuses the data, the student and the evaluations."""
    quiet = ("--config.log.progress_bar=False", "--config.log.tensorboard=False")
    teacher, workdir = str(tmp_path / "teacher"), str(tmp_path / "distill")
    assert _cli("sft", "--config", SMOKE, "--workdir", teacher, *quiet) == 0
    args = ("distill", "--checkpoint", teacher, "--config", SMOKE, "--workdir", workdir,
            "--num_prompts", "8", "--num_samples", "2", "--max-new-tokens", "16",
            "--noverify", "--nodrop_truncated", "--student_preset", "test",
            "--student_steps", "2", "--config.eval.num_problems=8", "--config.eval.seeds=(0,)",
            "--config.eval.batch_prompts=8", *quiet)
    capsys.readouterr()
    assert _cli(*args) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(workdir, "distill.json")) as f:
        report = json.load(f)
    d = report["distill"]
    assert (d["prompts"], d["samples"], d["kept"], d["kept_fraction"]) == (8, 16, 16, 1.0)
    assert d["reused"] is False and report["teacher_checkpoint"].endswith("checkpoints/sft")
    summary = report["summary"]
    assert summary["kept_fraction"] == 1.0
    for who in ("teacher", "student"):
        assert set(summary[who]) == {"levels 1-3 (held-out)", "level 4"}
        for values in summary[who].values():
            assert 0.0 <= values["accuracy"] <= 1.0 and 0 < values["mean_length"] <= 32
    assert "student: level 4" in report["table"] and "teacher: levels 1-3" in printed
    assert "kept 16 of 16 samples (100.0%" in printed
    with open(os.path.join(workdir, "distill.jsonl")) as f:
        assert len(f.readlines()) == 16
    student = os.path.join(workdir, "checkpoints", "sft")
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    assert Checkpointer(student).latest_step() == 2
    metrics, data_mtime = (open(os.path.join(workdir, "metrics.jsonl")).read(),
                           os.path.getmtime(os.path.join(workdir, "distill.jsonl")))

    # The same command again: nothing is sampled, trained or evaluated twice.
    assert _cli(*args) == 0
    assert "(reused)" in capsys.readouterr().out
    assert open(os.path.join(workdir, "metrics.jsonl")).read() == metrics
    assert os.path.getmtime(os.path.join(workdir, "distill.jsonl")) == data_mtime
    with open(os.path.join(workdir, "distill.json")) as f:
        again = json.load(f)
    assert again["reports"] == report["reports"] and again["distill"]["reused"] is True

    # Bad input: one line each.
    assert _cli("distill", "--checkpoint", teacher, "--keep", "longest") == 2
    assert _cli("distill", "--checkpoint", teacher, "--workdir", workdir,
                "--student_preset", "nope") == 1
    assert "unknown model preset 'nope'" in capsys.readouterr().err
    assert _cli("distill", "--checkpoint", str(tmp_path / "none")) == 1
    assert "does not exist" in capsys.readouterr().err
