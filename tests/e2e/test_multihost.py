"""Multi-host for real, on one machine: 2 processes x 4 CPU devices joined by
`jax.distributed` on localhost, against 1 process x 8 devices.

- `test_helpers_across_two_processes` (~15 s): the host <-> mesh helpers, a DCN mesh over
  processes, stop agreement and env-var initialization in two real processes.
- `test_two_processes_train_like_one` (slow, ~4 min): `jaxrl-reason train` of the smoke
  config (cold-start SFT, evaluation, 2 RL steps with checkpoints), then `--resume` to 4 RL
  steps, then `jaxrl-reason eval --multihost` of the result on a JSONL file, on 2 processes
  and on 1; the metrics, the evaluation reports and every array of the final checkpoints
  must match.

Every child runs in its own session and is killed (the whole group) when a sibling fails or
the time limit passes, so a hung collective cannot hang CI; each launch asks the OS for a
free coordinator port (the launchers are in tests/cli_runs.py).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import numpy as np
import pytest

from cli_runs import (ARITH, assert_trained_alike, child_env, free_port, load_state, run_all,
                      train_both_ways)


def eval_cmd(workdir, data, out) -> list[str]:
    return [sys.executable, "-m", "jaxrl_reason.cli", "eval", "--checkpoint", str(workdir),
            "--data", str(data), "--out", str(out)]


def eval_on_two_processes(workdir, data, out, logdir, timeout: float = 600) -> None:
    """`eval --multihost`, the job's layout in the environment (as a cluster launcher sets)."""
    port = free_port()
    jobs = [(eval_cmd(workdir, data, out) + ["--multihost"],
             child_env(4, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                       JAX_PROCESS_ID=str(i)))
            for i in range(2)]
    run_all(jobs, [str(logdir / f"eval{i}.log") for i in range(2)], timeout)


# --------------------------------------------------------------------------- helpers

HELPERS = textwrap.dedent('''
    import sys
    import numpy as np
    from jaxrl_reason.runtime import distributed
    # Settings from the environment, as a GPU cluster's launcher would export them.
    assert distributed.initialize(None) is not None
    import jax
    from jaxrl_reason.runtime import sharding as shd
    from jaxrl_reason.runtime.reliability import GracefulStop, stop_requested

    me = jax.process_index()
    assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 8, 4)

    # A data axis over the two processes (the DCN), each process's 4 devices inside.
    mesh = shd.make_mesh({"data": -1}, dcn={"data": 2})
    assert [d.process_index for d in mesh.devices.reshape(-1)] == [0] * 4 + [1] * 4

    # Host copy -> global batch -> every row back on every process.
    host = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    batch = shd.put_batch(mesh, shd.DEFAULT_RULES, host)
    assert not batch.is_fully_addressable
    assert len(batch.addressable_shards) == 4
    np.testing.assert_array_equal(distributed.to_host({"x": batch})["x"], host)
    doubled = jax.jit(lambda x: 2 * x)(batch)
    np.testing.assert_array_equal(distributed.to_host(doubled), 2 * host)
    rep = shd.put_replicated(mesh, host)
    np.testing.assert_array_equal(jax.device_get(rep), host)  # replicated: readable anywhere

    # Process 0's view wins; identical data passes the check, different data is named.
    assert distributed.broadcast_from_primary({"from": me, "pad": "x" * (1000 * me)}) == \\
        {"from": 0, "pad": ""}
    distributed.check_same("prompts", host)
    try:
        distributed.check_same("prompts", host + me)
    except RuntimeError as e:
        assert "processes [1]" in str(e), e
    else:
        raise AssertionError("check_same did not notice different data")

    # A stop signal on one process stops both at the same step.
    GracefulStop.reset()
    assert stop_requested() is False
    if me == 1:
        GracefulStop.request()
    assert stop_requested() is True
    GracefulStop.reset()
    distributed.sync("done")
    print(f"process {me}: ok", flush=True)
''')


def test_helpers_across_two_processes(tmp_path):
    script = tmp_path / "helpers.py"
    script.write_text(HELPERS)
    port = free_port()
    jobs = [([sys.executable, str(script)],
             child_env(4, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                       JAX_PROCESS_ID=str(i)))
            for i in range(2)]
    logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
    run_all(jobs, logs, timeout=300)
    for i, log in enumerate(logs):
        with open(log) as f:
            assert f"process {i}: ok" in f.read()


def test_a_failing_process_does_not_hang_the_others(tmp_path):
    """One child dies at once, its sibling would wait for it forever: run_all kills it."""
    jobs = [([sys.executable, "-c", "import sys; sys.exit(3)"], child_env(1)),
            ([sys.executable, "-c", "import time; time.sleep(600)"], child_env(1))]
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"process 0 \(exit 3\)"):
        run_all(jobs, [str(tmp_path / "a.log"), str(tmp_path / "b.log")], timeout=120)
    assert time.monotonic() - t0 < 60


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"multi": workdir, "single": workdir}: 2 RL steps, then resumed to 4, each way."""
    root = tmp_path_factory.mktemp("multihost")
    out = train_both_ways(ARITH, root)
    for i in range(2):
        with open(root / f"logs{i}" / "p1.log") as f:  # process 1 prints nothing of its own
            assert not [line for line in f if line.startswith(("[train]", "| ", "report:"))]
    data = root / "probe.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)})
                            + "\n" for a, b in ((2, 3), (17, 25), (9, 9), (40, 2))))
    logdir = root / "logs_eval"
    logdir.mkdir()
    eval_on_two_processes(out["multi"], data, root / "eval_multi.json", logdir)
    run_all([(eval_cmd(out["single"], data, root / "eval_single.json"), child_env(8))],
            [str(logdir / "single.log")], 600)
    return out


@pytest.mark.slow
def test_two_processes_train_like_one(runs):
    assert_trained_alike(runs)  # process 0 alone logged, one line per step

    with open(runs["multi"] / "eval.json") as f, open(runs["single"] / "eval.json") as g:
        assert json.load(f)["reports"] == json.load(g)["reports"]
    root = runs["multi"].parent
    with open(root / "eval_multi.json") as f, open(root / "eval_single.json") as g:
        assert json.load(f)["report"] == json.load(g)["report"]  # `eval` of the checkpoints

    for phase, steps in (("sft", (2, 4)), ("rl", (2, 4))):
        assert sorted(os.listdir(runs["multi"] / "checkpoints" / phase)) == [str(s) for s in steps]
        a = load_state(runs["multi"] / "checkpoints" / phase / str(steps[-1]))
        b = load_state(runs["single"] / "checkpoints" / phase / str(steps[-1]))
        assert a.keys() == b.keys() and any("params" in k for k in a)
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            if np.issubdtype(a[k].dtype, np.integer):
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # step counts, RNG
            else:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)
        with open(runs["multi"] / "checkpoints" / phase / str(steps[-1])
                  / "jaxrl_manifest.json") as f:
            assert json.load(f)["files"]  # process 0 wrote the manifest after orbax finished
    assert not list(runs["multi"].glob(".write_probe*"))
