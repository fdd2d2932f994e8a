"""Every shipped config's smoke run end to end through the command line (a module of its own
so the test runner can spread these minutes-long runs beside tests/cli/test_cli.py's)."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from cli_runs import (CONFIGS, MIXED, REPO, RL_KEYS, load_config, phase, read_metrics,
                      run_cli, smoke_runs)
from jaxrl_reason.checkpoints.checkpointer import Checkpointer

SEARCH = os.path.join(REPO, "configs", "search_grpo.py")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return smoke_runs(tmp_path_factory)


@pytest.mark.slow
# r1_pipeline.py's `train` is arith_grpo.py's run; its stages run in tests/e2e/test_r1_pipeline.py.
@pytest.mark.parametrize("config_path", [c for c in CONFIGS if not c.endswith("r1_pipeline.py")],
                         ids=os.path.basename)
def test_smoke_train_writes_every_artifact(smoke_run, config_path):
    workdir = smoke_run(config_path)
    config = load_config(config_path)
    lines = read_metrics(workdir)
    sft, rl = phase(lines, "sft"), phase(lines, "rl")
    assert [m["step"] for m in sft] == list(range(1, config.sft.steps + 1))
    assert [m["step"] for m in rl] == list(range(1, config.rl.steps + 1))
    assert all(np.isfinite(m["loss"]) for m in sft)
    for m in rl:
        missing = [k for k in RL_KEYS if k not in m]
        assert not missing, f"RL step {m['step']} lacks {missing}"
        assert all(np.isfinite(m[k]) for k in RL_KEYS), m
        assert 0.0 <= m["accuracy"] <= 1.0 and 0.0 <= m["format_rate"] <= 1.0
        assert m["completion/length_max"] <= config.rl.max_new_tokens

    with open(os.path.join(workdir, "eval.json")) as f:
        report = json.load(f)
    assert set(report["reports"]) == {"sft", "rl"}
    for rep in report["reports"].values():
        expected = (len(config.task.eval_files) if config.task.name == "file"
                    else len(config.task.mixture) if config.task.name == "mixture"
                    else len(config.task.eval_levels))
        assert len(rep["sets"]) == expected
        for summary in rep["sets"].values():
            assert 0.0 <= summary["pass@1"]["mean"] <= 1.0
            assert len(summary["pass@1"]["values"]) == len(config.eval.seeds)
    assert "pass@1" in report["table"]

    assert glob.glob(os.path.join(workdir, "tb", "events.out.tfevents*"))
    for name, steps in (("sft", config.sft.steps), ("rl", config.rl.steps)):
        assert Checkpointer(os.path.join(workdir, "checkpoints", name)).latest_step() == steps


@pytest.mark.slow
def test_mixture_run_logs_and_evaluates_every_domain(smoke_run):
    """The mixture's smoke run (shared with the every-config test): each RL step logs
    per-domain accuracy, reward, length and share; eval.json has one set per domain."""
    workdir = smoke_run(MIXED)
    config = load_config(MIXED)
    names = {entry[0] for entry in config.task.mixture}
    seen = set()
    for m in phase(read_metrics(workdir), "rl"):
        domains = {k.split("/", 1)[1] for k in m if k.startswith("frac/")}
        assert domains and domains <= names, m
        assert sum(m[f"frac/{d}"] for d in domains) == pytest.approx(1.0)
        for d in domains:
            assert 0.0 <= m[f"accuracy/{d}"] <= 1.0 and np.isfinite(m[f"reward/{d}"])
            assert m[f"length/{d}"] <= config.rl.max_new_tokens
        seen |= domains
    assert len(seen) >= 2
    with open(os.path.join(workdir, "eval.json")) as f:
        report = json.load(f)
    for rep in report["reports"].values():
        assert [name.split(":")[0] for name in rep["sets"]] == [e[0] for e in config.task.mixture]
    assert os.path.getsize(os.path.join(workdir, "tokenizer.model")) > 0


@pytest.mark.slow
def test_sample_runs_the_tools_a_checkpoint_was_trained_with(smoke_run, capsys):
    """`sample` on the search config's run wraps the sampler in the tool loop of its stored
    config (search, calc); --notools decodes without it."""
    from jaxrl_reason.data import search_facts

    workdir = smoke_run(SEARCH)
    prompt = search_facts.make_example("eval", 1, 0, 0)["prompt"]
    capsys.readouterr()
    args = ("sample", "--checkpoint", str(workdir), "--prompt", prompt, "--max-new-tokens",
            "48", "--num_samples", "4")
    assert run_cli(*args) == 0
    captured = capsys.readouterr()
    assert "[sample] tools search, calc:" in captured.err and captured.out.strip()
    assert run_cli(*args, "--notools") == 0
    assert "[sample] tools" not in capsys.readouterr().err
