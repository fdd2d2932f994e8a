"""Shared by the command-line tests (tests/cli/test_cli.py, tests/e2e/test_configs_smoke.py): the
shipped configs, `jaxrl-reason` in this process, metrics readers and a cache of smoke runs."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

from jaxrl_reason import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))
ARITH = os.path.join(REPO, "configs", "arith_grpo.py")
MIXED = os.path.join(REPO, "configs", "mixed_grpo.py")
RL_KEYS = ("reward/mean", "accuracy", "format_rate", "kl", "entropy", "clip_frac_low",
           "clip_frac_high", "completion/length_mean", "completion/length_max",
           "frac_zero_variance_groups", "time/sample_s", "time/score_s", "time/train_s")
QUIET = ("--config.log.progress_bar=False",)


def run_cli(*args: str) -> int:
    """`jaxrl-reason ARGS` in this process; the exit code (parse errors raise SystemExit)."""
    try:
        return cli.main(["jaxrl-reason", *args])
    except SystemExit as e:
        return e.code


def read_metrics(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def phase(lines: list[dict], name: str) -> list[dict]:
    return [m for m in lines if m["phase"] == name]


def load_config(path: str, arg: str | None = "smoke"):
    spec = importlib.util.spec_from_file_location("config_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def smoke_runs(tmp_path_factory):
    """config path -> workdir of a finished `train --config PATH:smoke` run, cached: a module
    fixture returns this, so each config runs once per test module."""
    cache = {}

    def get(path: str):
        if path not in cache:
            workdir = tmp_path_factory.mktemp("smoke") / "run"
            rc = cli.main(["jaxrl-reason", "train", "--config", f"{path}:smoke",
                           "--workdir", str(workdir)])
            assert rc == 0
            cache[path] = workdir
        return cache[path]

    return get
