"""Multi-stage pipelines: stage planning and overrides, the state file and table (fast), and
the smoke pipeline end to end on the tiny model: stopped after stage 2 (`--until`), then
interrupted by a stop signal inside stage 3, then finished, each rerun skipping the
finished stages and resuming the interrupted one from its checkpoint (slow)."""

from __future__ import annotations

import json
import os

import ml_collections
import pytest

from jaxrl_reason import cli
from jaxrl_reason.recipes import r1_pipeline as pl
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.runtime.metrics import MetricsWriter
from jaxrl_reason.runtime.reliability import GracefulStop
from jaxrl_reason.config.validation import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPELINE = os.path.join(REPO, "configs", "r1_pipeline.py")
SMOKE = PIPELINE + ":smoke"
QUIET = ("--config.log.progress_bar=False", "--config.log.tensorboard=False")
STAGES = ["sft", "rl", "distill", "rl_final"]


def run_cli(*args: str) -> int:
    try:
        return cli.main(["jaxrl-reason", *args])
    except SystemExit as e:
        return e.code


def smoke_config(*overrides: str) -> ml_collections.ConfigDict:
    _, fv = cli.parse(["jaxrl-reason", "pipeline", "--config", SMOKE, *overrides])
    return fv.config


def read(path) -> str:
    with open(path) as f:
        return f.read()


# ----------------------------------------------------------------------------- planning


def test_plan_applies_each_stage_overrides():
    config = smoke_config()
    stages = pl.plan_stages(config, "/w", 8)
    assert [(s.index, s.name, s.kind) for s in stages] == \
        [(0, "sft", "sft"), (1, "rl", "rl"), (2, "distill", "distill"), (3, "rl_final", "rl")]
    assert stages[0].workdir == os.path.join("/w", "stages", "sft")
    assert stages[3].config.seed == 1 and stages[1].config.seed == config.seed
    assert stages[1].config.rl.steps == 2 and stages[2].steps() == 2
    assert config.seed == 0  # the base config is untouched
    with pytest.raises(AttributeError):  # stage configs are locked
        stages[1].config.new_key = 1


def test_merge_overrides_names_unknown_and_fixed_keys():
    config = smoke_config()
    merged, problems = pl.merge_overrides(
        config, {"rl": {"steps": 7, "stepz": 1}, "model": {"d_model": 8}, "bogus": 1}, "x")
    assert merged.rl.steps == 7 and config.rl.steps == 2
    assert problems == ["x.rl.stepz: no such config key",
                        "x.model: a stage cannot override 'model' (the model comes from the "
                        "previous stage's checkpoint; a distill stage's "
                        "distill.student_preset changes it)",
                        "x.bogus: no such config key"]


def test_bad_pipelines_list_every_problem():
    config = smoke_config()
    with config.unlocked():
        config.pipeline.stages = ("rl", "nope", "distill")
        config.pipeline.stage.rl.overrides.rl.steps = 0
        config.pipeline.stage.distill.overrides = {"distill": {"keep": "longest"}}
    with pytest.raises(ConfigError) as e:
        pl.plan_stages(config, "/w", 8)
    text = "\n".join(e.value.problems)
    assert "pipeline.stages: 'nope' has no pipeline.stage.nope block" in text
    assert "pipeline.stage.rl: rl.steps: must be a positive integer, got 0" in text
    assert "distill.keep: must be one of ['all', 'shortest'], got 'longest'" in text
    assert "the first stage 'rl' is 'rl', which needs a checkpoint" in text
    with config.unlocked():
        config.pipeline.stages = ("sft",)
        config.pipeline.stage.sft.kind = "dpo"
    with pytest.raises(ConfigError, match=r"pipeline.stage.sft.kind: must be one of"):
        pl.plan_stages(config, "/w", 8)
    with config.unlocked():
        del config["pipeline"]
    with pytest.raises(ConfigError, match="no pipeline block"):
        pl.plan_stages(config, "/w", 8)


def test_cli_rejects_bad_input_before_any_work(tmp_path, capsys):
    workdir = tmp_path / "w"
    assert run_cli("pipeline", "--config", SMOKE, "--workdir", str(workdir),
                   "--until", "rl2", *QUIET) == 1
    assert "--until 'rl2' is not a stage of this pipeline" in capsys.readouterr().err
    assert run_cli("pipeline", "--config", SMOKE, "--workdir", str(workdir),
                   "--config.pipeline.stage.rl.overrides.rl.steps=-1", *QUIET) == 1
    assert "pipeline.stage.rl: rl.steps: must be a positive integer" in capsys.readouterr().err
    assert not workdir.exists()
    assert run_cli("pipeline", "--workdir", str(workdir)) == 2  # --config is required


# ----------------------------------------------------------------------------- state, table


def _report(accuracy: float, length: float) -> dict:
    return {"sets": {"levels 1-3": {
        "pass@1": {"mean": accuracy, "ci95": 0.01, "values": [accuracy]},
        "mean_length": {"mean": length, "ci95": float("nan"), "values": [length]}}}}


def test_state_round_trip_and_table(tmp_path):
    workdir = str(tmp_path)
    assert pl.read_state(workdir) == {"stages": {}}
    stages = pl.plan_stages(smoke_config(), workdir, 8)
    state = {"stages": {
        "sft": {"kind": "sft", "steps": 4, "seconds": 3.0, "info": {}, "eval": _report(0.5, 40)},
        "distill": {"kind": "distill", "steps": 2, "seconds": 1.0, "eval": _report(0.6, 30),
                    "info": {"kept": 3, "samples": 4, "kept_fraction": 0.75,
                             "mean_length_kept": 29.5}}}}
    pl.write_state(workdir, state)
    assert json.dumps(pl.read_state(workdir)) == json.dumps(state)  # (NaN != NaN)
    table, markdown = pl.stage_table(stages, state, num_samples=2)
    assert [(r["index"], r["name"]) for r in table["stages"]] == [(1, "sft"), (3, "distill")]
    assert table["stages"][0]["sets"]["levels 1-3"] == {
        "accuracy": {"mean": 0.5, "ci95": 0.01}, "mean_length": {"mean": 40.0, "ci95": None}}
    assert "| 1. sft (sft): levels 1-3" in markdown and "50.0 ± 1.0" in markdown
    assert "| 3. distill | distill | 2 | 1 | kept 3 of 4 samples (75.0%)" in markdown
    (tmp_path / pl.STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        pl.read_state(workdir)


# ----------------------------------------------------------------------------- end to end


class _StopAfterFirstStudentStep(MetricsWriter):
    """A MetricsWriter that asks for a graceful stop (as SIGTERM does) once the distill
    stage's student wrote its first SFT step."""

    def write(self, step, scalars, *, phase="train"):
        line = super().write(step, scalars, phase=phase)
        if phase == "sft" and step == 1 and self.workdir.endswith("distill"):
            GracefulStop.request()
        return line


@pytest.mark.slow
def test_stop_after_stage_two_then_interrupt_then_finish(tmp_path, capsys, monkeypatch):
    """One workdir: (1) --until rl, (2) a rerun stopped by a signal after the student's first
    step in stage 3, (3) a rerun to the end, (4) a rerun with nothing left to do."""
    workdir = str(tmp_path / "run")
    args = ("pipeline", "--config", SMOKE, "--workdir", workdir, *QUIET)
    stage_dir = lambda name: os.path.join(workdir, "stages", name)  # noqa: E731

    # 1. Stages 1-2 only.
    assert run_cli(*args, "--until", "rl") == 0
    printed = capsys.readouterr().out
    state = pl.read_state(workdir)
    assert list(state["stages"]) == ["sft", "rl"]
    assert not os.path.exists(stage_dir("distill"))
    assert "1. sft (sft)" in printed and "2. rl (rl)" in printed and "distill" not in printed
    done_files = {name: (read(os.path.join(stage_dir(name), "metrics.jsonl")),
                         Checkpointer(os.path.join(stage_dir(name), "checkpoints",
                                                   name)).latest_step())
                  for name in ("sft", "rl")}
    assert done_files["sft"][1] == 4 and done_files["rl"][1] == 2

    # 2. A stop signal inside stage 3 (the student's SFT, after its first step).
    monkeypatch.setattr(pl, "MetricsWriter", _StopAfterFirstStudentStep)
    try:
        assert run_cli(*args) == 0
    finally:
        GracefulStop.reset()
        monkeypatch.undo()
    printed = capsys.readouterr().out
    assert "1/4 sft (sft): finished earlier, skipped" in printed
    assert "2/4 rl (rl): finished earlier, skipped" in printed
    assert "stopped by a signal" in printed and "rerun the same command" in printed
    assert list(pl.read_state(workdir)["stages"]) == ["sft", "rl"]
    student = os.path.join(stage_dir("distill"), "checkpoints", "sft")
    assert Checkpointer(student).latest_step() == 1
    data_mtime = os.path.getmtime(os.path.join(stage_dir("distill"), "distill.jsonl"))

    # 3. The rest: stages 1-2 skipped, stage 3 resumed from its step-1 checkpoint.
    assert run_cli(*args) == 0
    printed = capsys.readouterr().out
    assert "1/4 sft (sft): finished earlier, skipped" in printed
    assert "2/4 rl (rl): finished earlier, skipped" in printed
    for name, (metrics, step) in done_files.items():  # untouched
        assert read(os.path.join(stage_dir(name), "metrics.jsonl")) == metrics
        assert Checkpointer(os.path.join(stage_dir(name), "checkpoints",
                                         name)).latest_step() == step
    assert os.path.getmtime(os.path.join(stage_dir("distill"), "distill.jsonl")) == data_mtime
    lines = [json.loads(x) for x in read(os.path.join(stage_dir("distill"), "metrics.jsonl"))
             .splitlines()]
    assert [m["step"] for m in lines if m["phase"] == "sft"] == [1, 2]  # resumed, not redone
    assert Checkpointer(student).latest_step() == 2
    assert Checkpointer(os.path.join(stage_dir("rl_final"), "checkpoints",
                                     "rl")).latest_step() == 2

    state = pl.read_state(workdir)
    assert list(state["stages"]) == STAGES
    assert state["stages"]["distill"]["info"]["kept"] == 32  # 16 prompts x 2, unverified
    with open(os.path.join(workdir, pl.TABLE_FILE + ".json")) as f:
        table = json.load(f)
    assert [r["name"] for r in table["stages"]] == STAGES
    for row in table["stages"]:
        for summary in row["sets"].values():
            assert 0.0 <= summary["accuracy"]["mean"] <= 1.0
            assert 0 < summary["mean_length"]["mean"] <= 32
    markdown = read(os.path.join(workdir, pl.TABLE_FILE + ".md"))
    assert all(f"{i + 1}. {name} (" in markdown for i, name in enumerate(STAGES))
    assert "4. rl_final (rl): levels 1-3 (held-out)" in printed  # the final table is printed

    # 4. Once more: nothing left to do.
    assert run_cli(*args) == 0
    assert capsys.readouterr().out.count("finished earlier, skipped") == 4
