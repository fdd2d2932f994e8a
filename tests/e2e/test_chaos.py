"""Chaos: a real training run (smoke config, SFT then RL, a checkpoint every step) is killed
with SIGKILL at seeded random moments, resumed with --resume each time, and must end with
exactly the metrics (bit-identical losses and rewards at every step), evaluation and
parameters of the same run never interrupted."""
import json

import jax
import numpy as np
import pytest

from cli_runs import (ARITH, final_params, metrics_by_step, metrics_lines,
                      train_until_killed)

ARGS = ["--config", f"{ARITH}:smoke", "--config.log.progress_bar=False",
        "--config.sft.steps=6", "--config.rl.steps=6", "--config.checkpoint.every_steps=1",
        "--config.log.tensorboard=False"]


def _train(workdir, *extra, kill_at=None):
    """Runs `train`; with kill_at = (n, delay) it is SIGKILLed `delay` seconds after
    metrics.jsonl holds n lines (at once when it already does: during start-up and
    compilation). Kill points follow progress, not wall time, and are absolute, so a resumed
    run that is already past one is still killed (in start-up) instead of finishing: the
    kills land on a fast or a slow machine. Returns (exit code or None if killed, output)."""
    if kill_at is None:
        return train_until_killed(workdir, [*ARGS, *extra])
    target, delay = kill_at
    return train_until_killed(workdir, [*ARGS, *extra],
                              kill_when=lambda: metrics_lines(workdir) >= target, delay=delay)


@pytest.mark.slow  # ~4 minutes: one clean run and a run killed 4 times
def test_sigkill_at_random_points_then_resume_is_bit_identical(tmp_path):
    clean = tmp_path / "clean"
    rc, out = _train(clean)
    assert rc == 0, out

    chaos = tmp_path / "chaos"
    rng = np.random.default_rng(1234)
    kills = 0
    # Kill points spread over the 12 steps (6 SFT, then evaluation, 6 RL): start-up, SFT,
    # around the evaluation and the first RL steps, late RL; each a seeded 0-0.5 s after
    # its line, so kills also land inside checkpoint saves.
    targets = [0, int(rng.integers(2, 5)), int(rng.integers(5, 8)), int(rng.integers(8, 10))]
    for attempt in range(12):
        extra = ("--resume",) if attempt else ()
        kill_at = (targets[kills], float(rng.uniform(0, 0.5))) if kills < 4 else None
        rc, out = _train(chaos, *extra, kill_at=kill_at)
        if rc is None:
            kills += 1
            continue
        assert rc == 0, out
        break
    assert kills >= 3, f"only {kills} kills landed before the run finished"

    want, got = metrics_by_step(clean), metrics_by_step(chaos)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], (key, got[key], want[key])
    reports = [json.load(open(d / "eval.json"))["reports"] for d in (clean, chaos)]
    assert reports[0] == reports[1]
    for a, b in zip(jax.tree.leaves(final_params(clean)), jax.tree.leaves(final_params(chaos))):
        np.testing.assert_array_equal(a, b)
