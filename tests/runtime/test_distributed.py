"""Multi-host plumbing in one process: when `jax.distributed.initialize` is called and with
what, hybrid (multi-slice) meshes, the host <-> mesh helpers on one process, and run files
on a remote (epath) workdir. The real multi-process runs are in tests/e2e/test_multihost.py."""

from __future__ import annotations

import json
import os
import shutil
import types

import jax
import numpy as np
import pytest

from jaxrl_reason import cli
from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import paths
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.runtime.metrics import MetricsWriter, read_metrics
from jaxrl_reason.runtime.progress import ProgressBar
from jaxrl_reason.runtime.reliability import check_workdir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"
NO_TPU = lambda: False  # noqa: E731


# --------------------------------------------------------------------------- settings


def test_config_fields_win_over_the_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "env:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3",
           "JAX_LOCAL_DEVICE_IDS": "0,1"}
    s = distributed.settings({"enabled": "auto", "coordinator_address": "10.0.0.1:1234",
                              "num_processes": 2, "process_id": 1, "local_device_ids": ()}, env)
    assert (s.coordinator_address, s.num_processes, s.process_id) == ("10.0.0.1:1234", 2, 1)
    assert s.local_device_ids == (0, 1)  # not set in the config: the environment's
    s = distributed.settings({"num_processes": 0, "process_id": -1}, env)  # 0 / -1 = unset
    assert (s.coordinator_address, s.num_processes, s.process_id) == ("env:1", 4, 3)
    assert s.kwargs() == {"coordinator_address": "env:1", "num_processes": 4, "process_id": 3,
                          "local_device_ids": [0, 1], "initialization_timeout": 300}
    assert distributed.settings(None, {}).kwargs() == {"initialization_timeout": 300}


@pytest.mark.parametrize("value, expected", [
    ("auto", "auto"), ("AUTO", "auto"), (True, "true"), ("True", "true"), ("1", "true"),
    (False, "false"), ("false", "false"), ("no", "false")])
def test_enabled_accepts_bools_and_their_spellings(value, expected):
    assert distributed.settings({"enabled": value}, {}).enabled == expected


@pytest.mark.parametrize("block, needle", [
    ({"enabled": "maybe"}, "distributed.enabled"),
    ({"num_processes": "two"}, "distributed.num_processes"),
    ({"num_processes": 2, "process_id": 2}, "process_id=2 is not in [0, 2)"),
])
def test_bad_settings_are_named(block, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        distributed.settings(block, {})


@pytest.mark.parametrize("block, env, tpu_vm, go", [
    ({}, {}, False, False),                                          # a laptop, CI
    ({"enabled": False}, {"JAX_COORDINATOR_ADDRESS": "h:1"}, True, False),
    ({"enabled": True}, {}, False, True),                            # srun / mpirun: JAX detects
    ({}, {}, True, True),                                            # a Cloud TPU VM
    ({}, {"TPU_SKIP_MDS_QUERY": "1"}, True, False),                  # TPU chips, no metadata
    ({"coordinator_address": "h:1"}, {}, False, True),
    ({"num_processes": 2}, {}, False, True),
    ({"num_processes": 1, "coordinator_address": "h:1"}, {}, True, False),
    ({}, {"JAX_NUM_PROCESSES": "8"}, False, True),
    ({}, {"MEGASCALE_COORDINATOR_ADDRESS": "h:8080"}, False, True),  # multi-slice
    ({}, {"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}, False, True),      # a TPU pod
    ({}, {"TPU_WORKER_HOSTNAMES": "w0"}, False, False),              # one worker
    ({}, {distributed.MULTIHOST_ENV: "1"}, False, True),             # --multihost
])
def test_when_auto_initializes(block, env, tpu_vm, go):
    s = distributed.settings(block, env)
    decided, why = distributed.decide(s, env, on_tpu_vm=lambda: tpu_vm)
    assert decided is go, why
    calls = []
    out = distributed.initialize(block, env=env, on_tpu_vm=lambda: tpu_vm,
                                 initialize_fn=lambda **kw: calls.append(kw))
    assert (out is not None) is go and len(calls) == int(go)
    if go:
        assert calls[0] == out == s.kwargs()


def test_this_machine_is_not_mistaken_for_a_pod():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TPU_", "MEGA"))}
    env.pop(distributed.MULTIHOST_ENV, None)
    assert distributed.decide(distributed.settings({}, env), env)[0] is False


def _parse(*args):
    _, fv = cli.parse(["jaxrl-reason", *args])
    return fv


def test_cli_initializes_from_the_config_and_multihost_flag(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 distributed.MULTIHOST_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distributed, "_cloud_tpu_vm", NO_TPU)

    cli.init_distributed("train", _parse("train", "--config", SMOKE))
    assert calls == []                                               # auto, one machine
    cli.init_distributed("train", _parse(
        "train", "--config", SMOKE, "--config.distributed.coordinator_address=localhost:9",
        "--config.distributed.num_processes=2", "--config.distributed.process_id=1"))
    assert calls[-1] == {"coordinator_address": "localhost:9", "num_processes": 2,
                         "process_id": 1, "initialization_timeout": 300}
    cli.init_distributed("eval", _parse("eval", "--checkpoint", "x", "--multihost"))
    assert calls[-1] == {"initialization_timeout": 300}              # JAX detects the rest
    cli.init_distributed("plan", _parse("plan", "--config", SMOKE, "--topology", "v5e:2x4",
                                        "--config.distributed.enabled=true"))
    assert len(calls) == 2                                           # plan never


def test_cli_reports_bad_distributed_settings_in_one_line(capsys, tmp_path):
    rc = cli.main(["jaxrl-reason", "train", "--config", SMOKE, "--workdir", str(tmp_path / "w"),
                   "--config.distributed.num_processes=2", "--config.distributed.process_id=7"])
    err = capsys.readouterr().err
    assert rc == 1 and "process_id=7 is not in [0, 2)" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- meshes


def _fake_devices(processes: int, per_process: int):
    return [types.SimpleNamespace(id=i, process_index=i // per_process, device_kind="cpu",
                                  platform="cpu", slice_index=None)
            for i in range(processes * per_process)]


def test_hybrid_mesh_puts_each_process_on_one_part_of_the_dcn_axis():
    devices = _fake_devices(2, 4)
    grid = shd._hybrid_device_array((8, 1, 1), (2, 1, 1), devices)
    assert grid.shape == (8, 1, 1)
    assert [d.process_index for d in grid.reshape(-1)] == [0] * 4 + [1] * 4
    grid = shd._hybrid_device_array((2, 4, 1), (2, 1, 1), devices)  # data over hosts, fsdp in
    assert [[d.process_index for d in row.reshape(-1)] for row in grid] == [[0] * 4, [1] * 4]
    with pytest.raises(ValueError, match="asks for 4 slices, but the devices belong to 2"):
        shd._hybrid_device_array((8, 1, 1), (4, 1, 1), devices)


def test_dcn_mesh_shape_is_checked_and_all_ones_is_the_plain_mesh():
    assert shd.resolve_dcn_shape({"data": 2}, (8, 1, 1, 1)) == (2, 1, 1, 1)
    with pytest.raises(ValueError, match="dcn_mesh: fsdp=3"):
        shd.resolve_dcn_shape({"fsdp": 3}, (4, 2, 1, 1))
    with pytest.raises(ValueError, match="unknown axes"):
        shd.resolve_dcn_shape({"pipeline": 2}, (8, 1, 1, 1))
    plain = shd.make_mesh({"data": -1})
    same = shd.make_mesh({"data": -1}, dcn={"data": 1, "fsdp": 1, "tensor": 1})
    assert plain.devices.tolist() == same.devices.tolist()
    with pytest.raises(ValueError, match="belong to 1 processes"):
        shd.make_mesh({"data": -1}, dcn={"data": 2})


# --------------------------------------------------------------------------- one process


def test_host_helpers_are_the_single_host_operations():
    mesh = shd.make_mesh({"data": -1})
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    arr = shd.put_batch(mesh, shd.DEFAULT_RULES, x)
    np.testing.assert_array_equal(distributed.to_host({"x": arr})["x"], x)
    rep = shd.put_replicated(mesh, x)
    assert rep.sharding.is_fully_replicated and np.array_equal(np.asarray(rep), x)
    obj = {"a": [1, 2]}
    assert distributed.broadcast_from_primary(obj) is obj
    distributed.check_same("anything", x)  # nothing to compare with
    distributed.sync("barrier")
    assert distributed.is_primary() and distributed.process_count() == 1
    assert distributed.digest(x, "a") == distributed.digest(x.copy(), "a") != distributed.digest(x)


def test_progress_bar_draws_on_process_zero_only(monkeypatch):
    class Stream(list):
        def write(self, s):
            self.append(s)

        def flush(self):
            pass

    out = Stream()
    with ProgressBar(2, "x", stream=out, print_every=1) as bar:
        bar.update(2)
    assert out
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    quiet = Stream()
    with ProgressBar(2, "x", stream=quiet, print_every=1) as bar:
        bar.update(2)
    assert quiet == [] and bar.count == 2


# --------------------------------------------------------------------------- remote workdirs


@pytest.fixture
def remote(monkeypatch):
    """Makes every path count as remote (gs://...), so the epath code runs on tmp_path."""
    monkeypatch.setattr(paths, "is_remote", lambda path: True)


def test_paths_tell_remote_from_local():
    assert paths.is_remote("gs://bucket/run") and paths.is_remote("s3://b/x")
    assert not paths.is_remote("/tmp/run") and not paths.is_remote("runs/x")
    assert not paths.is_remote("file:///tmp/run")
    assert paths.join("gs://bucket/run", "metrics.jsonl") == "gs://bucket/run/metrics.jsonl"
    assert paths.join("runs/a", "x") == os.path.join("runs/a", "x")


@pytest.mark.parametrize("is_remote", [False, True])
def test_atomic_writes(tmp_path, monkeypatch, is_remote):
    monkeypatch.setattr(paths, "is_remote", lambda path: is_remote)
    target = tmp_path / "deep" / "er" / "report.json"
    paths.write_text_atomic(str(target), "{}")
    paths.write_text_atomic(str(target), '{"a": 1}')
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(os.listdir(target.parent)) == ["report.json"]


def test_metrics_on_a_remote_workdir_rewrite_the_object(tmp_path, remote):
    workdir = tmp_path / "run"
    with MetricsWriter(str(workdir), tensorboard=False, console=False,
                       remote_flush_s=3600) as writer:
        assert (workdir / "metrics.jsonl").read_text() == ""  # created at once
        for step in (1, 2, 3):
            writer.write(step, {"loss": float(step)}, phase="rl")
        assert (workdir / "metrics.jsonl").read_text() == ""  # buffered until a flush
        writer.flush()
        assert [r["step"] for r in read_metrics(str(workdir))] == [1, 2, 3]
        assert writer.truncate("rl", after_step=1) == 2      # a resumed run
        assert [r["step"] for r in read_metrics(str(workdir))] == [1]
        writer.write(2, {"loss": float("nan")}, phase="rl")
    with MetricsWriter(str(workdir), tensorboard=False, console=False,
                       remote_flush_s=0) as writer:     # reopened: appends after the old lines
        writer.write(3, {"loss": 3.0}, phase="rl")
        assert len(read_metrics(str(workdir))) == 3          # flushed at every write
    records = read_metrics(str(workdir), phase="rl")
    assert [r["step"] for r in records] == [1, 2, 3] and np.isnan(records[1]["loss"])


def test_check_workdir_on_a_remote_path_skips_the_disk_check(tmp_path, remote, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 9, 1))
    check_workdir(str(tmp_path / "run"), 2**30, 2)  # no disk to measure: no error
    assert os.listdir(tmp_path / "run") == []          # the probe is gone


def test_tokenizer_of_a_remote_workdir_is_saved_and_reused(tmp_path, remote):
    from jaxrl_reason.runtime.build import build_tokenizer
    _, fv = cli.parse(["jaxrl-reason", "train", "--config", SMOKE])
    first = build_tokenizer(fv.config, str(tmp_path / "run"))
    assert (tmp_path / "run" / "tokenizer.model").is_file()
    again = build_tokenizer(fv.config, str(tmp_path / "run"))
    text = "What is 12+7?"
    assert again.encode(text) == first.encode(text) and again.vocab_size == first.vocab_size
