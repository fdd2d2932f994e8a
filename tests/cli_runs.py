"""Shared by the command-line tests (tests/cli/test_cli.py, tests/e2e/test_configs_smoke.py): the
shipped configs, `jaxrl-reason` in this process, metrics readers and a cache of smoke runs.

Also `jaxrl-reason train` in child processes: several at once joined by `jax.distributed`
(`run_all`, `train_both_ways`: tests/e2e/test_multihost*.py) and one SIGKILLed when a
condition holds (`train_until_killed`: tests/e2e/test_chaos.py,
tests/rl/test_partial_rollouts.py), with readers of their metrics and checkpoints."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import numpy as np

from jaxrl_reason import cli
from jaxrl_reason.checkpoints.checkpointer import Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))
# Configs with a smoke run of their own (r1_pipeline.py's `train` is arith_grpo.py's run; its
# stages run in tests/e2e/test_r1_pipeline.py).
SMOKE_CONFIGS = [c for c in CONFIGS if not c.endswith("r1_pipeline.py")]
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


def check_smoke_artifacts(workdir, config_path: str) -> None:
    """A finished `train --config PATH:smoke` run wrote every artifact: SFT and RL metrics for
    each step (finite, RL keys present), eval.json with one report per phase and a set per
    task, TensorBoard events and the last checkpoint of each phase."""
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


# ----------------------------------------------------------------------------- child processes

RUN_FLAGS = ("--config.log.progress_bar=False", "--config.log.tensorboard=False",
             "--config.eval.seeds=(0,)", "--config.eval.num_problems=8",
             "--config.eval.batch_prompts=8")
NOT_COMPARED = ("time", "step_time_s")  # wall times
_DIST_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
             "JAX_LOCAL_DEVICE_IDS", "JAXRL_REASON_MULTIHOST", "TPU_WORKER_HOSTNAMES",
             "MEGASCALE_COORDINATOR_ADDRESS")


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS's choice: no two launches share one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def child_env(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a child with `devices` CPU devices, without any
    multi-host settings of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), **extra)
    return env


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its children
        except ProcessLookupError:
            pass
        proc.wait()


def run_all(jobs: list[tuple[list[str], dict]], logs: list[str], timeout: float) -> None:
    """Runs the commands together; all must exit 0 within `timeout` seconds. The first
    failure (or the deadline) kills the rest; the error shows each log's tail."""
    procs = []
    try:
        for (cmd, env), log in zip(jobs, logs):
            with open(log, "w") as out:
                procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if time.monotonic() > deadline:
                failed = "timeout"
            time.sleep(0.2)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    finally:
        for p in procs:
            _kill(p)
    if failed is not None:
        tails = []
        for i, log in enumerate(logs):
            with open(log) as f:
                lines = [line for line in f if not line.startswith("[Gloo]")]
            tails.append(f"--- process {i} (exit {procs[i].returncode}):\n" + "".join(lines[-40:]))
        raise AssertionError(f"multi-process run failed ({failed}):\n" + "\n".join(tails))


def train_cmd(config: str, workdir, *args: str) -> list[str]:
    """`jaxrl-reason train` of `config`:smoke in `workdir` with RUN_FLAGS and `args`."""
    return [sys.executable, "-m", "jaxrl_reason.cli", "train", "--config", f"{config}:smoke",
            "--workdir", str(workdir), *RUN_FLAGS, *args]


def train_on_two_processes(config: str, workdir, logdir, *args: str,
                           timeout: float = 900) -> None:
    """`train_cmd` as 2 processes x 4 CPU devices joined on a free localhost port; their
    output in <logdir>/p0.log and p1.log."""
    port = free_port()
    jobs = [(train_cmd(config, workdir, *args,
                       f"--config.distributed.coordinator_address=localhost:{port}",
                       "--config.distributed.num_processes=2",
                       f"--config.distributed.process_id={i}"), child_env(4))
            for i in range(2)]
    run_all(jobs, [str(logdir / f"p{i}.log") for i in range(2)], timeout)


def train_on_one_process(config: str, workdir, logdir, *args: str,
                         timeout: float = 900) -> None:
    """`train_cmd` as 1 process x 8 CPU devices; its output in <logdir>/single.log."""
    run_all([(train_cmd(config, workdir, *args), child_env(8))], [str(logdir / "single.log")],
            timeout)


def train_both_ways(config: str, root, *args: str, timeout: float = 900) -> dict:
    """{"multi": workdir, "single": workdir} under `root`: `config` trained for its smoke RL
    steps (2), then resumed to 4 RL steps, on 2 processes and on 1, each launch's logs in
    <root>/logs0 and logs1."""
    out = {"multi": root / "multi", "single": root / "single"}
    for i, extra in enumerate(([], ["--resume", "--config.rl.steps=4"])):
        logdir = root / f"logs{i}"
        logdir.mkdir()
        train_on_two_processes(config, out["multi"], logdir, *args, *extra, timeout=timeout)
        train_on_one_process(config, out["single"], logdir, *args, *extra, timeout=timeout)
    return out


def assert_metrics_match(a: dict, b: dict, where: str) -> None:
    """Two metrics.jsonl records of one step from two device layouts agree: the same keys
    (wall times aside), the same step, sampled tokens and rewards exactly, and float32
    results to rtol 1e-4, atol 1e-6."""
    keys = [k for k in a if k not in NOT_COMPARED and not k.startswith("time/")]
    assert set(keys) == {k for k in b if k not in NOT_COMPARED and not k.startswith("time/")}
    for k in keys:
        if k in ("phase", "step") or k.startswith(("reward/", "completion/")) or k in (
                "accuracy", "format_rate", "frac_zero_variance_groups", "train_rows_frac"):
            assert a[k] == b[k], f"{where}: {k}"  # same sampled tokens, same rewards
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=f"{where}: {k}")


def assert_trained_alike(runs: dict) -> tuple[list[dict], list[dict]]:
    """The metrics of `train_both_ways` runs agree: process 0 alone logged one line per
    step, SFT once (4 steps; the resume did not redo it) then RL steps 1-4, the same steps
    on 1 process, and every line matches (`assert_metrics_match`).
    Returns (multi, single): the two runs' metrics lines."""
    multi, single = read_metrics(runs["multi"]), read_metrics(runs["single"])
    assert [(m["phase"], m["step"]) for m in multi] == \
        [("sft", s) for s in range(1, 5)] + [("rl", s) for s in range(1, 5)]
    assert [(m["phase"], m["step"]) for m in single] == [(m["phase"], m["step"]) for m in multi]
    for a, b in zip(multi, single):
        assert_metrics_match(a, b, f"{a['phase']} step {a['step']}")
    return multi, single


def load_state(step_dir) -> dict[str, np.ndarray]:
    """Every array of a checkpoint step, as numpy, by tree path."""
    import jax
    import orbax.checkpoint as ocp
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(os.path.join(step_dir, "state"))
    meta = getattr(meta, "item_metadata", meta)
    meta = getattr(meta, "tree", meta)
    args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    tree = ckptr.restore(os.path.join(step_dir, "state"),
                         args=ocp.args.PyTreeRestore(restore_args=args))
    return {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def metrics_lines(workdir) -> int:
    """Lines in <workdir>/metrics.jsonl (0 before it exists)."""
    path = os.path.join(workdir, "metrics.jsonl")
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def train_until_killed(workdir, args, kill_when: Callable[[], bool] | None = None,
                       delay: float = 0.0, timeout: float = 600) -> tuple[int | None, str]:
    """`jaxrl-reason train --workdir WORKDIR ARGS` in a child process on one CPU device, its
    output appended to log.txt beside `workdir`. With `kill_when`, the child is SIGKILLed
    `delay` seconds after `kill_when()` first holds (at once when it already does), unless
    it exits first; the wait for it ends after `timeout` seconds.
    Returns (exit code, or None when killed; the log so far, "" when killed)."""
    cmd = [sys.executable, "-m", "jaxrl_reason.cli", "train", "--workdir", str(workdir), *args]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    log = open(os.path.join(os.path.dirname(workdir), "log.txt"), "a+")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    if kill_when is not None:
        deadline = time.time() + timeout
        while proc.poll() is None and not kill_when() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return None, ""
    proc.wait(timeout=timeout)
    log.seek(0)
    return proc.returncode, log.read()


def metrics_by_step(workdir) -> dict[tuple[str, int], dict]:
    """{(phase, step): metrics without wall times} of <workdir>/metrics.jsonl; a step logged
    twice is an AssertionError."""
    out = {}
    for line in open(os.path.join(str(workdir), "metrics.jsonl")):
        record = json.loads(line)
        key = (record.pop("phase"), record.pop("step"))
        assert key not in out, f"{key} logged twice"
        out[key] = {k: v for k, v in record.items()
                    if k not in NOT_COMPARED and not k.startswith("time/")}
    return out


def final_params(workdir):
    """The newest checkpoint's params of a run, on the host (one-device mesh)."""
    import jax
    from jaxrl_reason.checkpoints.phases import load_params
    from jaxrl_reason.runtime import sharding as shd
    mesh = shd.make_mesh({"data": -1}, jax.devices()[:1])
    return jax.device_get(load_params(str(workdir), mesh, shd.DEFAULT_RULES)[0])
