"""Hostile and broken input outside the reward sandbox: non-finite config values, two runs on
one workdir, malformed data lines, checkpoint symlinks and read-only directories, and which
checkpoint step an evaluation used."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli_runs import ARITH, QUIET, REPO, load_config, run_cli  # noqa: E402

from jaxrl_reason.checkpoints import workdir_lock  # noqa: E402
from jaxrl_reason.checkpoints.checkpointer import Checkpointer  # noqa: E402
from jaxrl_reason.checkpoints.manifest import abstract_like  # noqa: E402
from jaxrl_reason.data.files import read_examples  # noqa: E402
from jaxrl_reason.runtime.reliability import check_workdir  # noqa: E402
from jaxrl_reason.config.validation import non_finite_problems, validate_config  # noqa: E402

SMOKE = f"{ARITH}:smoke"


def _cli(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of `jaxrl-reason ARGS` in this process."""
    capsys.readouterr()
    rc = run_cli(*args)
    return rc, capsys.readouterr().err


# ------------------------------------------------------------------ NaN / inf in the config


@pytest.mark.parametrize("key, value", [("rl.learning_rate", math.nan),
                                        ("rewards.timeout_s", math.nan),
                                        ("rl.beta", math.inf),
                                        ("sft.learning_rate", -math.inf),
                                        ("rl.epsilon_high", math.nan)])
def test_validator_rejects_a_non_finite_value_naming_its_key(key, value):
    config = load_config(ARITH)
    block, name = key.split(".")
    config[block][name] = value
    problems = validate_config(config, 8)
    assert f"config.{key} = {value!r}: must be a finite number" in problems, problems
    clean = load_config(ARITH)
    assert validate_config(clean, 8) == []


def test_non_finite_walk_reaches_nested_blocks_and_lists():
    tree = {"a": {"b": [1.0, (2, math.inf)], "c": np.float32("nan")}, "ok": 3, "flag": True}
    problems = non_finite_problems(tree)
    assert problems[0] == "config.a.b[1][1] = inf: must be a finite number"
    assert len(problems) == 2 and problems[1].startswith("config.a.c = ")
    assert non_finite_problems({"x": 1e308, "y": -0.0, "z": [0.5]}) == []


@pytest.mark.parametrize("override, key", [("--config.rl.learning_rate=nan", "rl.learning_rate"),
                                           ("--config.rewards.timeout_s=nan",
                                            "rewards.timeout_s"),
                                           ("--config.rl.kl_target=inf", "rl.kl_target")])
def test_cli_refuses_nan_and_inf_before_any_work(capsys, tmp_path, override, key):
    workdir = tmp_path / "w"
    rc, err = _cli(capsys, "train", "--config", SMOKE, "--workdir", str(workdir), override)
    assert rc == 1, err
    assert f"config.{key} = " in err and "must be a finite number" in err
    assert "Traceback" not in err
    assert not workdir.exists()  # nothing compiled, trained or written


# ------------------------------------------------------------------ one run per workdir

_HOLDER = """
import sys, time
from jaxrl_reason.checkpoints import workdir_lock
workdir_lock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def _holder(workdir):
    """A separate process holding `workdir`'s lock until the block ends (then killed -9)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(workdir)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_second_process_on_a_workdir_fails_at_once_naming_the_holder(tmp_path, capsys):
    workdir = tmp_path / "run"
    with _holder(workdir) as proc:
        t0 = time.time()
        with pytest.raises(workdir_lock.WorkdirLocked, match=f"pid {proc.pid}") as info:
            workdir_lock.acquire(str(workdir))
        assert time.time() - t0 < 1.0
        assert info.value.holder["pid"] == proc.pid
        assert info.value.holder["host"] == os.uname().nodename
        # Every command that writes a workdir refuses it, before any work.
        rc, err = _cli(capsys, "train", "--config", SMOKE, "--workdir", str(workdir), *QUIET)
        assert rc == 1 and f"pid {proc.pid}" in err and "in use by another run" in err
        assert sorted(os.listdir(workdir)) == [".lock"]


def test_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    workdir = tmp_path / "run"
    with _holder(workdir) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = json.loads((workdir / ".lock").read_text())
    assert left["pid"] == proc.pid  # the dead run's record is still there
    workdir_lock.acquire(str(workdir))
    try:
        assert json.loads((workdir / ".lock").read_text())["pid"] == os.getpid()
        workdir_lock.acquire(str(workdir))  # re-entrant within one process
    finally:
        workdir_lock.release_all()
    assert (workdir / ".lock").read_text() == ""
    assert workdir_lock.held() == []


def test_lock_is_released_when_the_command_ends(tmp_path, capsys):
    """The CLI releases the lock when a command ends, even a failing one: a later process
    can take the workdir."""
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)  # without --resume: refused after the lock
    rc, err = _cli(capsys, "train", "--config", SMOKE, "--workdir", str(workdir), *QUIET)
    assert rc == 1 and "already holds checkpoints" in err
    assert workdir_lock.held() == []
    with _holder(workdir):
        pass


def test_filesystem_without_flock_warns_and_runs_unlocked(tmp_path, monkeypatch, caplog):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="jaxrl_reason.checkpoints.workdir_lock"):
        workdir_lock.acquire(str(tmp_path / "run"))
    workdir_lock.release_all()
    assert "running without a workdir lock" in caplog.text and "No locks" in caplog.text


def test_only_process_zero_takes_the_lock(tmp_path, monkeypatch):
    from jaxrl_reason.runtime import distributed
    monkeypatch.setattr(distributed, "is_primary", lambda: False)
    workdir_lock.acquire(str(tmp_path / "run"))
    assert not (tmp_path / "run" / ".lock").exists() and workdir_lock.held() == []


_JOB = """
import os, sys
from jaxrl_reason.checkpoints import workdir_lock
from jaxrl_reason.runtime import distributed
assert distributed.initialize(None) is not None
import jax
me = jax.process_index()
workdir_lock.acquire(sys.argv[1])  # the job's lock: taken by process 0 only
assert workdir_lock.held() == ([os.path.realpath(sys.argv[1])] if me == 0 else [])
distributed.sync("locked")
try:
    workdir_lock.acquire(sys.argv[2])  # held by another run: every process fails
except workdir_lock.WorkdirLocked as e:
    print(f"process {me}: refused: {e}", flush=True)
distributed.sync("done")
"""


def test_multi_host_job_takes_the_lock_once_and_fails_together(tmp_path):
    from cli_runs import child_env, free_port, run_all

    script = tmp_path / "job.py"
    script.write_text(_JOB)
    port = free_port()
    with _holder(tmp_path / "taken") as holder:
        jobs = [([sys.executable, str(script), str(tmp_path / "ours"), str(tmp_path / "taken")],
                 child_env(1, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                           JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)))
                for i in range(2)]
        logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
        run_all(jobs, logs, timeout=180)
    for i, log in enumerate(logs):
        with open(log) as f:
            text = f.read()
        assert f"process {i}: refused: workdir" in text and f"pid {holder.pid}" in text
    assert os.listdir(tmp_path / "ours") == [".lock"]


def test_lease_blocks_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    workdir = str(tmp_path / "bucket_run")
    first = workdir_lock.Lease(workdir, confirm_s=0.0, heartbeat_s=0.05)
    first.acquire()
    lease = json.loads((tmp_path / "bucket_run" / ".lock").read_text())
    assert {"host", "pid", "token", "heartbeat"} <= set(lease)
    time.sleep(0.2)  # the heartbeat thread refreshes it
    assert json.loads((tmp_path / "bucket_run" / ".lock").read_text())["heartbeat"] > \
        lease["heartbeat"]
    other = workdir_lock.Lease(workdir, confirm_s=0.0)
    other.record.update(host="other-host", pid=4242)
    with pytest.raises(workdir_lock.WorkdirLocked, match=f"host {lease['host']}, pid "
                                                         f"{os.getpid()}"):
        other.acquire()
    first.release()
    assert not (tmp_path / "bucket_run" / ".lock").exists()

    # A lease whose heartbeat is older than stale_s is taken over.
    stale = {"host": "gone-host", "pid": 1, "token": "t", "heartbeat": time.time() - 3600,
             "started": 0}
    (tmp_path / "bucket_run" / ".lock").write_text(json.dumps(stale))
    taker = workdir_lock.Lease(workdir, confirm_s=0.0, stale_s=600)
    assert taker.is_stale(stale) and not taker.is_stale(dict(stale, heartbeat=time.time()))
    taker.acquire()
    assert json.loads((tmp_path / "bucket_run" / ".lock").read_text())["token"] == \
        taker.record["token"]
    taker.release()
    # A fresh lease of a dead process of this host is stale too.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert taker.is_stale({"host": taker.record["host"], "pid": dead.pid,
                           "heartbeat": time.time()})


# ------------------------------------------------------------------ malformed data lines

GOOD = '{"prompt": "What is 1+1?", "answer": "2"}\n'
BAD_LINES = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "digits": '{"prompt": "p", "answer": ' + "9" * 5000 + "}",
    "surrogate": '{"prompt": "p\\ud800", "answer": "1"}',
    "surrogate_key": '{"prompt": "p", "answer": "1", "\\udfff": 1}',
    "nan": '{"prompt": "p", "answer": NaN}',
    "nested": '{"prompt": "p", "answer": "1", "x": ' + "[" * 200 + "]" * 200 + "}",
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_data_line_names_file_and_line_and_is_skipped(tmp_path, kind):
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD + BAD_LINES[kind] + "\n" + GOOD)
    with pytest.raises(ValueError, match=f"^{path}:2: ") as info:
        read_examples(str(path))
    assert len(str(info.value)) < 600  # a message, not the line echoed back
    source = read_examples(str(path), on_error="skip")
    assert len(source) == 2 and [w for w, _ in source.skipped] == [f"{path}:2"]
    for example in source:  # what is kept encodes (the tokenizer and the report need it)
        json.dumps(example, ensure_ascii=False).encode("utf-8")


def test_eval_data_with_a_lone_surrogate_names_the_line(tmp_path):
    from jaxrl_reason.evaluation.runner import file_sets
    path = tmp_path / "probe.jsonl"
    path.write_text(GOOD + BAD_LINES["surrogate"] + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: field 'prompt' is not valid Unicode"):
        file_sets(str(path))


# ------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def saved_steps(tmp_path_factory):
    """A checkpoint directory with steps 1 and 2 of a small replicated state."""
    directory = tmp_path_factory.mktemp("ckpt") / "ck"
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": np.int32(3)}
    with Checkpointer(str(directory)) as ckpt:
        for s in (1, 2):
            assert ckpt.save(s, state, {"s": s})
    return directory, state


@pytest.mark.parametrize("target_kind", ["dir", "file"])
def test_symlink_out_of_a_step_is_an_error_naming_it(tmp_path, saved_steps, target_kind):
    import shutil
    directory = tmp_path / "ck"
    shutil.copytree(saved_steps[0], directory, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"x" * 10)
    target = outside if target_kind == "dir" else outside / "secret"
    os.symlink(target, directory / "2" / "state" / "evil")
    with Checkpointer(str(directory)) as ckpt:
        problems = ckpt.verify(2)
        assert len(problems) == 1 and problems[0].startswith("state/evil: a symbolic link to "
                                                             f"{target}, outside")
        restored, meta = ckpt.restore(abstract_state=abstract_like(saved_steps[1]))
        assert meta == {"s": 1} and list(ckpt.last_skipped) == [2]
        assert "state/evil" in ckpt.last_skipped[2][0]


def test_symlink_inside_a_step_is_not_followed_twice(tmp_path, saved_steps):
    import shutil
    directory = tmp_path / "ck"
    shutil.copytree(saved_steps[0], directory, symlinks=True)
    os.symlink(directory / "2" / "state", directory / "2" / "loop")  # a cycle if followed
    with Checkpointer(str(directory)) as ckpt:
        assert ckpt.verify(2) == []


@contextlib.contextmanager
def _read_only(path):
    """`path` (a directory) made unwritable for this process, even as root (chattr +i)."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a directory read-only as root here (chattr +i failed)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_checkpoint_directory_is_found_at_start(tmp_path, capsys):
    workdir = tmp_path / "run"
    phase = workdir / "checkpoints" / "sft"
    phase.mkdir(parents=True)
    check_workdir(str(workdir), 1000, 2)
    with _read_only(phase):
        with pytest.raises(OSError, match=f"checkpoint directory '{phase}' is not writable"):
            check_workdir(str(workdir), 1000, 2)
        t0 = time.time()
        rc, err = _cli(capsys, "train", "--config", SMOKE, "--workdir", str(workdir),
                       "--resume", *QUIET)
        assert rc == 1 and f"'{phase}' is not writable" in err and "Traceback" not in err
        assert not (workdir / "metrics.jsonl").exists() or \
            (workdir / "metrics.jsonl").read_text() == ""  # no step ran
        assert time.time() - t0 < 120


# ------------------------------------------------------------------ eval names its step


def test_eval_report_names_the_step_after_a_fallback(tmp_path, capsys):
    from jaxrl_reason.checkpoints import phases as run_state
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.runtime.build import build_runtime
    from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer

    from checkpoint_damage import damage

    config = load_config(ARITH)
    workdir = tmp_path / "run"
    rt = build_runtime(config, str(workdir))
    optimizer = make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=1.0)
    params = init_params(rt.model_cfg, jax.random.key(0), rt.mesh, rt.rules)
    ckpt = run_state.PhaseCheckpointer(rt, "rl")
    for s in (1, 2):
        ckpt.save(s, create_train_state(params, optimizer), {"pos": s})
    ckpt.close()
    rl_dir = workdir / "checkpoints" / "rl"
    out = tmp_path / "eval.json"
    args = ("eval", "--checkpoint", str(workdir), "--num_problems", "8", "--seeds", "1",
            "--out", str(out))
    capsys.readouterr()
    assert run_cli(*args) == 0
    report = json.loads(out.read_text())
    assert report["step"] == 2 and report["skipped_steps"] == {}
    assert f"checkpoint: {rl_dir}, step 2" in capsys.readouterr().out

    rel = damage(rl_dir / "2", "flip")
    assert run_cli(*args) == 0
    report = json.loads(out.read_text())
    assert report["step"] == 1 and list(report["skipped_steps"]) == ["2"]
    assert rel in report["skipped_steps"]["2"][0]
    captured = capsys.readouterr()
    assert f"checkpoint: {rl_dir}, step 1" in captured.out
    assert "step 2 is damaged" in captured.err and "falling back to step 1" in captured.err
