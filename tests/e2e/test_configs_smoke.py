"""Every shipped config's smoke run end to end through the command line: the arithmetic
configs here, the other tasks' and model families' in test_configs_smoke_tasks.py (two
modules, so the two test workers share these minutes-long runs)."""

from __future__ import annotations

import os

import pytest

from cli_runs import SMOKE_CONFIGS, check_smoke_artifacts, smoke_runs


def _tasks(config_path: str) -> bool:
    """Whether the config's smoke run belongs to test_configs_smoke_tasks.py."""
    return not os.path.basename(config_path).startswith("arith_")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return smoke_runs(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("config_path", [c for c in SMOKE_CONFIGS if not _tasks(c)],
                         ids=os.path.basename)
def test_smoke_train_writes_every_artifact(smoke_run, config_path):
    check_smoke_artifacts(smoke_run(config_path), config_path)
