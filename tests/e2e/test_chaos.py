"""Chaos: a real training run (smoke config, SFT then RL, a checkpoint every step) is killed
with SIGKILL at seeded random moments, resumed with --resume each time, and must end with
exactly the metrics (bit-identical losses and rewards at every step), evaluation and
parameters of the same run never interrupted."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(REPO, "configs", "arith_grpo.py")
ARGS = ["--config", f"{ARITH}:smoke", "--config.log.progress_bar=False",
        "--config.sft.steps=6", "--config.rl.steps=6", "--config.checkpoint.every_steps=1",
        "--config.log.tensorboard=False"]
ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _lines(workdir) -> int:
    path = os.path.join(workdir, "metrics.jsonl")
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def _train(workdir, *extra, kill_at=None):
    """Runs `train`; with kill_at = (n, delay) it is SIGKILLed `delay` seconds after
    metrics.jsonl holds n lines (at once when it already does: during start-up and
    compilation). Kill points follow progress, not wall time, and are absolute, so a resumed
    run that is already past one is still killed (in start-up) instead of finishing: the
    kills land on a fast or a slow machine. Returns (exit code or None if killed, output)."""
    cmd = [sys.executable, "-m", "jaxrl_reason.cli", "train", "--workdir", str(workdir),
           *ARGS, *extra]
    log = open(os.path.join(os.path.dirname(workdir), "log.txt"), "a+")
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    if kill_at is not None:
        target, delay = kill_at
        deadline = time.time() + 600
        while proc.poll() is None and _lines(workdir) < target and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return None, ""
    proc.wait(timeout=600)
    log.seek(0)
    return proc.returncode, log.read()


def _metrics(workdir):
    """{(phase, step): metrics without wall-time fields}, one record per step."""
    out = {}
    for line in open(os.path.join(workdir, "metrics.jsonl")):
        record = json.loads(line)
        key = (record.pop("phase"), record.pop("step"))
        assert key not in out, f"{key} logged twice"
        out[key] = {k: v for k, v in record.items()
                    if k != "time" and not k.startswith("time/") and k != "step_time_s"}
    return out


def _params(workdir):
    from jaxrl_reason.runtime import sharding as shd
    from jaxrl_reason.checkpoints.phases import load_params
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:1])
    params, _, _, _ = load_params(str(workdir), mesh, shd.DEFAULT_RULES)
    return jax.device_get(params)


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

    want, got = _metrics(clean), _metrics(chaos)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], (key, got[key], want[key])
    reports = [json.load(open(d / "eval.json"))["reports"] for d in (clean, chaos)]
    assert reports[0] == reports[1]
    for a, b in zip(jax.tree.leaves(_params(clean)), jax.tree.leaves(_params(chaos))):
        np.testing.assert_array_equal(a, b)
