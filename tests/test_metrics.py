"""Tests for jaxrl_reason.metrics: jsonl round trip, tensorboard events, console, errors."""
import json
import math
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.metrics import MetricsWriter, format_line, read_metrics


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
