"""The command line end to end on CPU: resume, eval, sample, export, bad input, and the same
RL numbers on 1 and 8 devices (every config's smoke run: tests/e2e/test_configs_smoke.py).

Smoke runs are shared between tests through module-scoped caches (one run costs ~20-30 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cli_runs import (ARITH, QUIET, REPO, phase, read_metrics, run_cli,
                      smoke_runs)
from jaxrl_reason import cli
from jaxrl_reason.checkpoints.checkpointer import Checkpointer


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """config path -> workdir of a finished `train --config PATH:smoke` run (cached)."""
    return smoke_runs(tmp_path_factory)


@pytest.fixture(scope="module")
def resumed_run(smoke_run, tmp_path_factory):
    """(before, after): the arith smoke run's metrics, and a copy of it resumed to 4 RL steps."""
    source = smoke_run(ARITH)
    workdir = tmp_path_factory.mktemp("resumed") / "run"
    shutil.copytree(source, workdir)
    before = read_metrics(workdir)
    rc = run_cli("train", "--config", f"{ARITH}:smoke", "--workdir", str(workdir), "--resume",
                 "--config.rl.steps=4", *QUIET)
    assert rc == 0
    return before, workdir


DEVICE_RUN_FLAGS = ("--config.rl.steps=4", "--config.eval.seeds=(0,)",
                    "--config.eval.num_problems=8", "--config.eval.batch_prompts=8",
                    "--config.log.tensorboard=False", *QUIET)


@pytest.fixture(scope="module")
def device_runs(tmp_path_factory):
    """{1: workdir, 8: workdir}: the same smoke run in subprocesses with 1 and 8 CPU devices
    (`config.cpu_devices`: no device count in their environment)."""
    root = tmp_path_factory.mktemp("devices")
    procs = {}
    for n in (1, 8):
        env = {k: v for k, v in os.environ.items()
               if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
        env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, "-m", "jaxrl_reason.cli", "train", "--config",
               f"{ARITH}:smoke", "--workdir", str(root / f"d{n}"), f"--config.cpu_devices={n}",
               *DEVICE_RUN_FLAGS]
        procs[n] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
    for n, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{n}-device run failed:\n{out[-3000:]}"
        assert f"'data': {n}" in out, out[:500]
    return {n: root / f"d{n}" for n in procs}


# --------------------------------------------------------------------------- smoke runs


@pytest.mark.slow
def test_resume_continues_rl_without_rerunning_sft(resumed_run):
    before, workdir = resumed_run
    after = read_metrics(workdir)
    assert phase(after, "sft") == phase(before, "sft")           # SFT not re-run
    assert phase(after, "rl")[:2] == phase(before, "rl")          # old lines untouched
    assert [m["step"] for m in phase(after, "rl")] == [1, 2, 3, 4]
    assert Checkpointer(os.path.join(workdir, "checkpoints", "rl")).latest_step() == 4
    with open(os.path.join(workdir, "eval.json")) as f:
        assert set(json.load(f)["reports"]) == {"sft", "rl"}


def test_train_on_existing_workdir_needs_resume(smoke_run, capsys):
    workdir = smoke_run(ARITH)
    capsys.readouterr()
    assert run_cli("train", "--config", f"{ARITH}:smoke", "--workdir", str(workdir)) != 0
    err = capsys.readouterr().err
    assert "already holds checkpoints" in err and "--resume" in err
    assert "Traceback" not in err


def test_sample_prints_a_completion(smoke_run, capsys):
    workdir = smoke_run(ARITH)
    capsys.readouterr()
    rc = run_cli("sample", "--checkpoint", str(workdir), "--prompt", "What is 2+3?", "--greedy",
                 "--max-new-tokens", "8")
    assert rc == 0
    out = capsys.readouterr().out
    assert out.strip()


def test_export_then_sample_the_hf_directory_gives_the_same_completion(smoke_run, tmp_path,
                                                                         capsys):
    """`export` writes a Hugging Face directory (config.json, safetensors, tokenizer files);
    `sample --model` on it decodes exactly what `sample --checkpoint` does (greedy)."""
    workdir = smoke_run(ARITH)
    out_dir = tmp_path / "hf"
    capsys.readouterr()
    assert run_cli("export", "--checkpoint", str(workdir), "--out", str(out_dir)) == 0
    written = sorted(os.listdir(out_dir))  # a new directory: every file is this export's
    assert {"config.json", "model.safetensors", "tokenizer.model", "tokenizer.json",
            "tokenizer_config.json"} <= set(written)
    assert f"wrote {len(written)} files to {out_dir}: {', '.join(written)}" in \
        capsys.readouterr().out
    # into the same directory again: every file is rewritten, and listed
    assert run_cli("export", "--checkpoint", str(workdir), "--out", str(out_dir)) == 0
    assert f"wrote {len(written)} files" in capsys.readouterr().out
    completions = []
    for source in (("--checkpoint", str(workdir)), ("--model", str(out_dir))):
        assert run_cli("sample", *source, "--prompt", "What is 2+3?", "--greedy",
                       "--max-new-tokens", "8") == 0
        completions.append(capsys.readouterr().out)
    assert completions[0].strip() and completions[0] == completions[1]
    _fails(capsys, ["sample", "--checkpoint", str(workdir), "--model", str(out_dir),
                    "--prompt", "x"], "exactly one of --checkpoint")
    _fails(capsys, ["sample", "--model", str(tmp_path / "nope"), "--prompt", "x"], "nope")


def test_train_from_a_hugging_face_directory(smoke_run, tmp_path, capsys):
    """config.hf_model: RL starts from the directory's weights (no cold-start SFT) with its
    tokenizer; the starting point evaluates as the exported policy did."""
    workdir = smoke_run(ARITH)
    hf_dir, run = tmp_path / "hf", tmp_path / "from_hf"
    assert run_cli("export", "--checkpoint", str(workdir), "--out", str(hf_dir)) == 0
    assert run_cli("train", "--config", f"{ARITH}:smoke", "--workdir", str(run),
                   f"--config.hf_model={hf_dir}", "--config.rl.steps=2") == 0
    reports = json.load(open(run / "eval.json"))["reports"]
    assert set(reports) == {"base", "rl"}
    original = json.load(open(workdir / "eval.json"))["reports"]["rl"]
    assert reports["base"] == original
    assert not (run / "checkpoints" / "sft").exists()
    _fails(capsys, ["train", "--config", f"{ARITH}:smoke", "--workdir", str(tmp_path / "x"),
                    f"--config.hf_model={tmp_path / 'missing'}"], "missing")


def test_every_stop_id_of_a_hugging_face_directory_reaches_the_sampler(smoke_run, tmp_path):
    """generation_config.json's eos list (real models have several stop tokens) becomes the
    sampler's stop ids in training and in `sample`."""
    from jaxrl_reason.runtime.build import build_runtime

    hf_dir = tmp_path / "hf"
    assert run_cli("export", "--checkpoint", str(smoke_run(ARITH)), "--out", str(hf_dir)) == 0
    eos = json.load(open(hf_dir / "config.json")).get("eos_token_id", 2)
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 7]}))
    _, fv = cli.parse(["jaxrl-reason", "train", "--config", f"{ARITH}:smoke",
                       f"--config.hf_model={hf_dir}"])
    rt = build_runtime(fv.config, str(tmp_path / "rt"))
    assert rt.tokenizer.eos_ids == (eos, 7)
    assert rt.sampler.eos_ids == (eos, 7)


def test_eval_on_a_jsonl_file_writes_a_report(smoke_run, tmp_path, capsys):
    workdir = smoke_run(ARITH)
    data = tmp_path / "probe.jsonl"
    data.write_text('{"prompt": "What is 2+3?", "answer": "5"}\n'
                    '{"prompt": "What is 17+25?", "answer": 42}\n'
                    '{"prompt": "What is 9+9?", "answer": "18"}\n')
    out = tmp_path / "report.json"
    capsys.readouterr()
    rc = run_cli("eval", "--checkpoint", str(workdir), "--data", str(data), "--out", str(out))
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["checkpoint"].endswith(os.path.join("checkpoints", "rl"))
    (summary,) = report["report"]["sets"].values()
    assert list(report["report"]["sets"]) == ["probe.jsonl"]
    assert 0.0 <= summary["pass@1"]["mean"] <= 1.0
    assert "probe.jsonl" in capsys.readouterr().out


def test_eval_on_a_gsm8k_format_file(smoke_run, tmp_path, capsys):
    workdir = smoke_run(ARITH)
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "What is 2+3?", "answer": "2+3=<<2+3=5>>5\\n#### 5"}\n'
                    '{"question": "What is 1,000+1?", "answer": "So 1,001.\\n#### 1,001"}\n')
    out = tmp_path / "report.json"
    rc = run_cli("eval", "--checkpoint", str(workdir), "--data", str(data), "--data_preset",
                 "gsm8k", "--out", str(out))
    assert rc == 0
    assert list(json.loads(out.read_text())["report"]["sets"]) == ["gsm.jsonl"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no final line"}\n')
    capsys.readouterr()
    assert run_cli("eval", "--checkpoint", str(workdir), "--data", str(bad), "--data_preset",
                   "gsm8k") != 0
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_eval_with_seeds_reports_mean_std_and_interval(smoke_run, tmp_path, capsys):
    workdir = smoke_run(ARITH)
    out = tmp_path / "report.json"
    capsys.readouterr()
    assert run_cli("eval", "--checkpoint", str(workdir), "--seeds", "3", "--num_problems", "4",
                   "--out", str(out)) == 0
    report = json.loads(out.read_text())["report"]
    assert report["config"]["seeds"] == [0, 1, 2]
    for summary in report["sets"].values():
        assert len(summary["pass@1"]["values"]) == 3
        assert {"mean", "std", "ci95"} <= set(summary["pass@1"])
    printed = capsys.readouterr().out
    assert "over 3 sampling seeds [0, 1, 2]" in printed
    _fails(capsys, ["eval", "--checkpoint", str(workdir), "--seeds", "1,1"], "--seeds", "repeat")
    _fails(capsys, ["eval", "--checkpoint", str(workdir), "--num_samples", "0"],
           "--num_samples")


def test_compare_sft_and_rl_checkpoints(smoke_run, tmp_path, capsys):
    workdir = smoke_run(ARITH)
    out = tmp_path / "compare.json"
    capsys.readouterr()
    rc = run_cli("compare", "--a", str(workdir / "checkpoints" / "sft"), "--b", str(workdir),
                 "--seeds", "0,5", "--num_problems", "6", "--num_samples", "4",
                 "--resamples", "300", "--out", str(out))
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["a"].endswith(os.path.join("checkpoints", "sft"))
    assert report["b"].endswith(os.path.join("checkpoints", "rl"))
    assert report["config"]["seeds"] == [0, 5] and report["config"]["num_samples"] == 4
    for name, tests in report["tests"].items():
        assert set(tests) == {"pass@1", "pass@2", "pass@4"}
        assert tests["pass@1"]["num_problems"] == 6 and tests["pass@1"]["num_seeds"] == 2
        assert 0 < tests["pass@1"]["p_value"] <= 1
        assert report["pass_at_k"][name]["k"] == [1, 2, 3, 4]
    if report["plot"]:
        assert os.path.getsize(report["plot"]) > 0
    printed = capsys.readouterr().out
    assert "paired bootstrap over problems and seeds (300 resamples), B - A" in printed
    assert "p-value" in printed and "k=4:" in printed
    _fails(capsys, ["compare", "--a", str(workdir)], "--b", code=2)
    _fails(capsys, ["compare", "--a", str(workdir), "--b", str(workdir), "--resamples", "0"],
           "--resamples")
    _fails(capsys, ["compare", "--a", str(tmp_path / "nope"), "--b", str(workdir)],
           "does not exist")


# --------------------------------------------------------------------------- bad input


def _fails(capsys, args, *needles, code=None):
    """Runs the CLI, expects a non-zero exit whose stderr names the problem, no traceback."""
    capsys.readouterr()
    rc = run_cli(*args)
    err = capsys.readouterr().err
    assert rc not in (0, None), f"exit code {rc} for {args}"
    if code is not None:
        assert rc == code
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in stderr:\n{err}"
    return err


SMOKE = f"{ARITH}:smoke"


@pytest.mark.parametrize("override, needles", [
    ("--config.rl.not_a_key=1", ("not_a_key", "--config.rl.not_a_key")),
    ("--config.no_such_block.x=1", ("no_such_block",)),
    ("--config.rl.steps=many", ("rl.steps",)),
])
def test_bad_override_is_a_flag_error(capsys, tmp_path, override, needles):
    _fails(capsys, ["train", "--config", SMOKE, "--workdir", str(tmp_path / "w"), override],
           *needles, code=2)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("overrides, needles", [
    (["--config.rl.num_generations=1"], ("rl.num_generations", "at least 2")),
    # 3 prompts x 4 generations = 12 rows on 8 data-parallel shards.
    (["--config.rl.batch_prompts=3"], ("rl.batch_prompts", "12 rows", "8 data-parallel")),
    (["--config.sft.batch_size=12"], ("sft.batch_size", "8 data-parallel")),
    (["--config.rl.loss_type=nope"], ("rl.loss_type", "nope")),
])
def test_invalid_config_is_refused_before_any_work(capsys, tmp_path, overrides, needles):
    _fails(capsys, ["train", "--config", SMOKE, "--workdir", str(tmp_path / "w"), *overrides],
           "invalid config", *needles, code=1)
    assert not (tmp_path / "w").exists()


def test_prompt_longer_than_every_bucket(capsys, tmp_path):
    _fails(capsys, ["train", "--config", SMOKE, "--workdir", str(tmp_path / "w"),
                    "--config.task.prompt_buckets=(4,)", *QUIET],
           "task.prompt_buckets=(4,)", "longer than")


@pytest.mark.parametrize("command", ["eval", "sample", "train"])
def test_missing_checkpoint(capsys, tmp_path, command):
    missing = str(tmp_path / "nowhere")
    args = {"eval": ["eval", "--checkpoint", missing],
            "sample": ["sample", "--checkpoint", missing, "--prompt", "What is 1+1?"],
            "train": ["train", "--config", SMOKE, "--workdir", str(tmp_path / "w"),
                      "--init_checkpoint", missing]}[command]
    _fails(capsys, args, missing, "does not exist")
    assert not (tmp_path / "w").exists()


def test_checkpoint_dir_without_checkpoints(capsys, tmp_path):
    _fails(capsys, ["eval", "--checkpoint", str(tmp_path)], "no complete checkpoint")


@pytest.mark.parametrize("argv", [["bogus"], ["trian"], []])
def test_unknown_or_missing_command(capsys, argv):
    err = _fails(capsys, argv, "usage: jaxrl-reason COMMAND", code=2)
    assert "train " in err and "pipeline " in err  # the commands are listed
    if argv:
        assert f"unknown command {argv[0]!r}" in err
    if argv == ["trian"]:
        assert "did you mean train?" in err


def test_bad_config_argument(capsys, tmp_path):
    _fails(capsys, ["train", "--config", f"{ARITH}:bogus", "--workdir", str(tmp_path / "w")],
           "bogus", "smoke", code=2)


def test_missing_config_file(capsys, tmp_path):
    _fails(capsys, ["train", "--config", str(tmp_path / "nope.py"),
                    "--workdir", str(tmp_path / "w")], "nope.py", code=2)


def test_missing_required_flags(capsys):
    _fails(capsys, ["train"], "--config", code=2)
    _fails(capsys, ["sample", "--checkpoint", "x"], "--prompt", code=2)


# --------------------------------------------------------------------------- determinism


def _rl_numbers(workdir) -> dict[str, np.ndarray]:
    rl = phase(read_metrics(workdir), "rl")
    return {k: np.array([m[k] for m in rl]) for k in
            ("loss", "pg_loss", "kl", "entropy", "grad_norm", "reward/mean", "accuracy",
             "format_rate", "completion/length_mean", "completion/length_max")}


EXACT = ("reward/mean", "accuracy", "format_rate", "completion/length_mean",
         "completion/length_max")


def _assert_same_rl(a, b):
    for key in a:
        if key in EXACT:   # same sampled tokens -> the very same rewards and lengths
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            # A gradient norm that is ~0 (only the KL term, policy == reference) is float32
            # reduction noise whose value depends on the device count; O(1) norms must match.
            atol = 1e-5 if key == "grad_norm" else 1e-6
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=atol, err_msg=key)


@pytest.mark.slow
def test_one_and_eight_devices_train_the_same(device_runs):
    one, eight = (_rl_numbers(device_runs[n]) for n in (1, 8))
    assert len(one["loss"]) == 4
    _assert_same_rl(one, eight)
    sft = [[m["loss"] for m in phase(read_metrics(device_runs[n]), "sft")] for n in (1, 8)]
    np.testing.assert_allclose(sft[0], sft[1], rtol=1e-4)


@pytest.mark.slow
def test_resumed_run_matches_an_uninterrupted_one(resumed_run, device_runs):
    _, workdir = resumed_run
    _assert_same_rl(_rl_numbers(workdir), _rl_numbers(device_runs[8]))
