"""Run guards: non-finite updates are skipped (state untouched) and stop the run after K in a
row; SIGTERM saves a checkpoint and exits 0; start-up checks of the workdir and prompts."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.runtime.reliability import (GracefulStop, NumericError, SkipGuard,
                                      check_prompt_lengths, check_workdir)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(REPO, "configs", "arith_grpo.py")


def test_apply_gradients_if_finite_updates_only_on_a_finite_loss_and_gradient():
    """The optimizer step runs inside lax.cond: finite -> one AdamW step (step + 1, moments
    moved, as `apply_gradients` computes it); NaN/inf loss or gradient -> the same state."""
    import optax

    from jaxrl_reason.runtime.train_state import (apply_gradients, apply_gradients_if_finite,
                                          create_train_state, make_optimizer)

    opt = make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=1.0)
    state = create_train_state({"w": jnp.arange(3.0), "b": jnp.ones(2)}, opt)
    fn = jax.jit(lambda s, g, loss: apply_gradients_if_finite(s, g, loss, opt))
    grads = {"w": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array([0.1, 0.2])}
    new, norm, ok = fn(state, grads, jnp.float32(1.0))
    expected, expected_norm = jax.jit(lambda s, g: apply_gradients(s, g, opt))(state, grads)
    assert bool(ok) and int(new.step) == 1
    assert float(norm) == pytest.approx(float(optax.tree.norm(grads)))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)
    for loss, bad in ((jnp.nan, None), (1.0, jnp.inf), (-jnp.inf, jnp.nan)):
        g = grads if bad is None else {**grads, "b": jnp.array([bad, 0.0])}
        kept, _, ok = fn(state, g, jnp.float32(loss))
        assert not bool(ok) and int(kept.step) == 0
        for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(state)):
            np.testing.assert_array_equal(a, b)


def test_skip_guard_counts_consecutive_skips_and_names_the_batch(capsys):
    guard = SkipGuard("rl", max_consecutive=3)
    guard.update(1, True, "non-finite loss", ["a-1", "a-2"])
    guard.update(2, False, "", [])
    guard.update(3, True, "non-finite loss", ["b-1"])
    guard.update(4, True, "non-finite loss", ["c-1"])
    assert "step 1: update skipped" in capsys.readouterr().out
    with pytest.raises(NumericError, match="3 consecutive steps skipped.*step 5"):
        guard.update(5, True, "non-finite loss", ["d-1"])
    assert guard.total == 4


def test_rl_update_with_nan_advantages_leaves_params_and_optimizer_untouched():
    from jaxrl_reason.cli import parse
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.rl.update import make_update_fn
    from jaxrl_reason.runtime.build import build_runtime
    from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer
    import tempfile

    _, fv = parse(["jaxrl-reason", "train", "--config", f"{ARITH}:smoke"])
    rt = build_runtime(fv.config, tempfile.mkdtemp())
    params = init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    opt = make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=1.0)
    state = create_train_state(params, opt)
    before = jax.device_get((state.params, state.opt_state))
    n, tp, length = 16, 8, 8
    batch = {"prompt_tokens": rt.put(np.ones((n, tp), np.int32)),
             "prompt_valid": rt.put(np.ones((n, tp), bool)),
             "completion_tokens": rt.put(np.full((n, length), 5, np.int32)),
             "mask": rt.put(np.ones((n, length), np.float32)),
             "advantages": rt.put(np.full((n,), np.nan, np.float32)),
             "beta": np.float32(0.0)}
    update = make_update_fn(rt.model, opt, fv.config.rl)
    state, metrics = update(state, batch)
    assert float(metrics["update_skipped"]) == 1.0
    after = jax.device_get((state.params, state.opt_state))
    assert all(np.array_equal(a, b, equal_nan=True)
               for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def test_check_workdir_reports_an_unwritable_path_and_a_full_disk(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        check_workdir(str(blocker / "run"), 1000, 2)
    import shutil
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 9, 2**20))
    with pytest.raises(OSError, match="MiB free.*checkpoints need about"):
        check_workdir(str(tmp_path / "run"), 2**20, 2)
    check_workdir(str(tmp_path / "run"), 1000, 2)  # room for 1.1 * 2 * 3 * 1000 bytes


def test_check_prompt_lengths_names_the_set_and_example():
    sets = {"eval L4": [{"id": "x-1", "prompt": "ab"}, {"id": "x-2", "prompt": "abcdefgh"}]}
    with pytest.raises(ValueError, match="eval L4: prompt of example 'x-2' has 8 tokens"):
        check_prompt_lengths(list, sets, (4, 6))
    check_prompt_lengths(list, sets, (8,))


def test_graceful_stop_flag_and_handlers_restored():
    GracefulStop.reset()
    previous = signal.getsignal(signal.SIGTERM)
    with GracefulStop():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert GracefulStop.requested()
    assert signal.getsignal(signal.SIGTERM) is previous
    GracefulStop.reset()


@pytest.mark.slow  # a real smoke run in a subprocess, stopped by SIGTERM, then resumed (~60 s)
def test_sigterm_saves_a_checkpoint_exits_0_and_resume_finishes(tmp_path):
    workdir = tmp_path / "run"
    args = [sys.executable, "-m", "jaxrl_reason.cli", "train", "--config", f"{ARITH}:smoke",
            "--workdir", str(workdir), "--config.log.progress_bar=False",
            "--config.rl.steps=40", "--config.checkpoint.every_steps=1000"]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # wait for the RL phase
        if metrics.exists() and '"phase": "rl"' in metrics.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "stopped by signal in phase 'rl'" in out
    rl_steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
                if json.loads(line)["phase"] == "rl"]
    stopped_at = max(rl_steps)
    assert 0 < stopped_at < 40
    assert sorted(os.listdir(workdir / "checkpoints" / "rl"))[-1] == str(stopped_at)
    done = subprocess.run(args + ["--resume"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rl_steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
                if json.loads(line)["phase"] == "rl"]
    assert rl_steps == list(range(1, 41))  # every step once: the resumed run continued
