"""The smoke runs of the shipped configs other than the arithmetic ones (countdown, GSM8K
files, the mixture, search with tools, the real model families' presets), end to end through
the command line, and what the mixture and search runs add (see test_configs_smoke.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from cli_runs import (MIXED, REPO, SMOKE_CONFIGS, check_smoke_artifacts, load_config, phase,
                      read_metrics, run_cli, smoke_runs)

SEARCH = os.path.join(REPO, "configs", "search_grpo.py")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return smoke_runs(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config_path", [c for c in SMOKE_CONFIGS if not os.path.basename(c).startswith("arith_")],
    ids=os.path.basename)
def test_smoke_train_writes_every_artifact(smoke_run, config_path):
    check_smoke_artifacts(smoke_run(config_path), config_path)


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
