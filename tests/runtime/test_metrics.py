"""Tests for jaxrl_reason.runtime.metrics: jsonl round trip, tensorboard events, wandb (offline),
console, errors."""
import json
import math
import os
import re
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.runtime.metrics import (MetricsWriter, WandbOptions, format_line, read_metrics,
                                  wandb_options)


def test_round_trip_through_jsonl(tmp_path):
    workdir = tmp_path / "run"
    with MetricsWriter(str(workdir), console=False) as writer:
        writer.write(0, {"loss": 1.5, "reward/mean": np.float32(0.25), "n": 3})
        writer.write(1, {"loss": jnp.asarray(0.5), "kl": np.array([2.0])})
        writer.write(1, {"pass@1": 0.4}, phase="eval")
    records = read_metrics(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 1]
    assert [r["phase"] for r in records] == ["train", "train", "eval"]
    assert records[0]["loss"] == 1.5 and records[0]["reward/mean"] == 0.25
    assert records[0]["n"] == 3.0 and isinstance(records[0]["n"], float)
    assert records[1]["loss"] == 0.5 and records[1]["kl"] == 2.0
    assert all(isinstance(r["time"], float) for r in records)
    assert read_metrics(str(workdir), phase="eval") == [records[2]]


def test_appends_to_existing_file(tmp_path):
    for step in range(2):
        with MetricsWriter(str(tmp_path), console=False, tensorboard=False) as writer:
            writer.write(step, {"x": float(step)})
    assert [r["x"] for r in read_metrics(str(tmp_path))] == [0.0, 1.0]


def test_non_finite_values_are_json_null(tmp_path):
    with MetricsWriter(str(tmp_path), console=False, tensorboard=False) as writer:
        writer.write(0, {"a": float("nan"), "b": float("inf"), "c": 1.0})
    raw = (tmp_path / "metrics.jsonl").read_text()
    record = json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert record["a"] is None and record["b"] is None and record["c"] == 1.0
    back = read_metrics(str(tmp_path))[0]
    assert math.isnan(back["a"]) and math.isnan(back["b"])


def test_tensorboard_event_file_exists(tmp_path):
    with MetricsWriter(str(tmp_path), console=False) as writer:
        writer.write(5, {"loss": 0.1})
    tb = tmp_path / "tb"
    events = [f for f in os.listdir(tb) if f.startswith("events.out.tfevents")]
    assert len(events) == 1
    assert os.path.getsize(tb / events[0]) > 0
    assert b"train/loss" in (tb / events[0]).read_bytes()


def test_disabled_writer_writes_nothing(tmp_path):
    workdir = tmp_path / "never"
    writer = MetricsWriter(str(workdir), enabled=False)
    assert writer.write(0, {"loss": 1.0}) is None
    writer.flush()
    writer.close()
    with writer:
        pass
    assert not workdir.exists()


def test_unwritable_directory_raises_naming_path(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = blocker / "run"
    with pytest.raises(OSError, match=re.escape(str(bad))):
        MetricsWriter(str(bad), console=False)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores directory permissions")
def test_read_only_directory_raises_naming_path(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OSError, match=re.escape(str(ro))):
            MetricsWriter(str(ro), console=False)
    finally:
        ro.chmod(0o700)


def test_console_prints_line(tmp_path, capsys):
    with MetricsWriter(str(tmp_path), tensorboard=False) as writer:
        line = writer.write(3, {"loss": 0.123456, "n": 8}, phase="eval")
    assert line == "step 3 | loss 0.1235 | n 8"
    assert capsys.readouterr().out.strip() == "[eval] step 3 | loss 0.1235 | n 8"


def test_console_false_prints_nothing(tmp_path, capsys):
    with MetricsWriter(str(tmp_path), tensorboard=False, console=False) as writer:
        assert writer.write(0, {"loss": 1.0}) == "step 0 | loss 1"
    assert capsys.readouterr().out == ""


def test_format_line_keys_select_and_order():
    scalars = {"a": 1.0, "b": 0.5, "c": float("nan"), "d": -float("inf")}
    assert format_line(7, scalars, keys=["c", "a", "missing"]) == "step 7 | c nan | a 1"
    assert format_line(7, scalars) == "step 7 | a 1 | b 0.5 | c nan | d -inf"


def test_write_rejects_bad_input(tmp_path):
    with MetricsWriter(str(tmp_path), tensorboard=False, console=False) as writer:
        with pytest.raises(ValueError, match="'v'.*shape"):
            writer.write(0, {"v": np.zeros(3)})
        with pytest.raises(TypeError, match="'s'"):
            writer.write(0, {"s": "text"})
        with pytest.raises(ValueError, match="reserved"):
            writer.write(0, {"step": 1.0})
        with pytest.raises(TypeError, match="step"):
            writer.write(1.5, {"x": 1.0})
    with pytest.raises(ValueError, match="closed"):
        writer.write(0, {"x": 1.0})


def test_read_metrics_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n')
    with pytest.raises(ValueError, match=":2"):
        read_metrics(str(tmp_path))


# ----------------------------------------------------------------------------- wandb


def _wandb_records(path):
    """The protobuf records of a wandb run file (`run-<id>.wandb`): a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks (7-byte header: crc32, uint16 length, type
    FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) carry one serialized `Record` each."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _wandb_history(run_dir, timeout_s=60.0):
    """[{key: value}] of the history rows and the run record of one offline run directory.
    wandb's service process may still be writing the file when `finish()` returns: this
    waits for the run's exit record."""
    (run_file,) = [os.path.join(run_dir, f) for f in os.listdir(run_dir) if f.endswith(".wandb")]
    deadline = time.monotonic() + timeout_s
    while True:
        records = _wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{run_file}: no exit record after {timeout_s} s"
        time.sleep(0.1)
    rows, run = [], None
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind == "run":
            run = record.run
    return rows, run


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """wandb's settings, cache and data dirs inside tmp_path; offline, quiet."""
    pytest.importorskip("wandb", reason="the [wandb] extra (in [dev]) is not installed")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # belt and braces: nothing leaves the machine
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    return tmp_path


def test_wandb_offline_run_holds_the_scalars(wandb_home):
    workdir = wandb_home / "run"
    options = WandbOptions(project="jaxrl-test", mode="offline", config={"rl": {"beta": 0.04}})
    with MetricsWriter(str(workdir), console=False, tensorboard=False, wandb=options) as writer:
        writer.write(0, {"loss": 1.5, "reward/mean": np.float32(0.25)})
        writer.write(1, {"loss": jnp.asarray(0.5), "kl": float("nan")})
        writer.write(0, {"pass@1": 0.4}, phase="eval")
    run_id = (workdir / "wandb_run_id").read_text().strip()
    (run_dir,) = (workdir / "wandb").glob(f"offline-run-*-{run_id}")
    rows, run = _wandb_history(run_dir)
    scalars = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
    assert scalars[0] == {"train/step": 0, "train/loss": 1.5, "train/reward/mean": 0.25}
    assert scalars[1]["train/step"] == 1 and scalars[1]["train/loss"] == 0.5
    assert scalars[1]["train/kl"] in ("NaN", None) or math.isnan(scalars[1]["train/kl"])
    assert scalars[2] == {"eval/step": 0, "eval/pass@1": 0.4}
    assert run.run_id == run_id and run.project == "jaxrl-test" and run.display_name == "run"
    assert "beta" in run.config.SerializeToString().decode("utf-8", "replace")
    # metrics.jsonl is written as before.
    assert [r["phase"] for r in read_metrics(str(workdir))] == ["train", "train", "eval"]


def test_wandb_resumed_run_continues_the_same_run(wandb_home):
    workdir = wandb_home / "run"
    options = WandbOptions(project="jaxrl-test", mode="offline", name="first")
    for step in (0, 1):  # a run, then its resumption (which logs its own steps)
        with MetricsWriter(str(workdir), console=False, tensorboard=False,
                           wandb=options) as writer:
            writer.write(step, {"loss": float(step)})
    run_id = (workdir / "wandb_run_id").read_text().strip()
    # Each start writes an offline-run directory ("-1" appended within one second) of the
    # same run id; `wandb sync` uploads both into that run.
    run_dirs = sorted((workdir / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2 and all(_wandb_history(d)[1].run_id == run_id for d in run_dirs)
    steps = [row["train/step"] for d in run_dirs for row in _wandb_history(d)[0]]
    assert sorted(steps) == [0, 1]


def test_wandb_missing_package_fails_before_writing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    workdir = tmp_path / "run"
    with pytest.raises(ImportError, match=r"pip install 'jaxrl-reason\[wandb\]'"):
        MetricsWriter(str(workdir), console=False, wandb=WandbOptions(mode="offline"))
    assert not workdir.exists()
    # Only process 0 logs: the others never import wandb.
    MetricsWriter(str(workdir), enabled=False, wandb=WandbOptions(mode="offline")).close()
    assert not workdir.exists()


def test_wandb_options_from_config():
    from cli_runs import ARITH, load_config

    config = load_config(ARITH)
    assert wandb_options(config) is None  # off by default
    config.log.wandb, config.log.wandb_mode, config.log.wandb_project = True, "offline", "p"
    options = wandb_options(config)
    assert (options.mode, options.project, options.name, options.dir) == ("offline", "p", "", "")
    assert options.config["log"]["wandb_mode"] == "offline"  # the run's config goes along
    config.log.wandb_mode = "online-ish"
    with pytest.raises(ValueError, match="config.log.wandb_mode must be one of"):
        wandb_options(config)
    with pytest.raises(ValueError, match="config.log.wandb_project"):
        WandbOptions(project="")
