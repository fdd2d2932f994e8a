"""Command-line conventions: --help / -h / --version exit 0, every flag has a one-line help,
unknown commands, flags and config keys name the nearest valid one, and relative paths (in
flags and in config fields) reach the commands as absolute paths, from any directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_runs import ARITH, REPO
from jaxrl_reason.runtime import paths
from jaxrl_reason.cli import parse
from jaxrl_reason.cli.table import COMMANDS, PATH_FLAGS, flag_values

SMOKE = f"{ARITH}:smoke"


def _exit(capsys, *args):
    """(exit code, stdout, stderr) of `jaxrl-reason ARGS` parsed in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        parse(["jaxrl-reason", *args])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"]])
def test_program_help(capsys, args):
    code, out, _ = _exit(capsys, *args)
    assert code == 0
    for name, command in COMMANDS.items():
        assert f"  {name} " in out and command.summary in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("spelling", ["--help", "-h"])
def test_command_help_lists_every_flag(capsys, command, spelling):
    code, out, err = _exit(capsys, command, spelling)
    assert code == 0, err
    assert out.startswith(f"usage: jaxrl-reason {command} ")
    fv = flag_values(COMMANDS[command], ["x"])
    for name in fv:
        lines = [line for line in out.splitlines() if f"--{name}=" in line
                 or f"--[no]{name} " in line]
        assert len(lines) == 1, (name, out)
        text = lines[0].split("  ")[-1].strip()
        assert len(text) > 10, (name, lines[0])  # a real one-line description


def test_help_needs_no_other_flags(capsys):
    """`train --help` works although --config is required, and before it is loaded."""
    code, out, _ = _exit(capsys, "train", "--config", "/nonexistent.py", "--help")
    assert code == 0 and "--config=FILE" in out


def test_version(capsys):
    code, out, _ = _exit(capsys, "--version")
    assert code == 0
    import jaxrl_reason
    assert out.strip() == f"jaxrl-reason {jaxrl_reason.__version__}"


def test_installed_entry_point_help_and_version():
    """The installed `jaxrl-reason` script itself (what a user types first)."""
    exe = os.path.join(os.path.dirname(sys.executable), "jaxrl-reason")
    for args in (["--help"], ["train", "--help"], ["--version"]):
        result = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (args, result.stderr)
        assert "jaxrl-reason" in result.stdout


@pytest.mark.parametrize("args, needle", [
    (["trian"], "did you mean train?"),
    (["eval", "--checkpiont", "x"], "did you mean --checkpoint?"),
    (["train", "--config", SMOKE, "--worddir", "x"], "did you mean --workdir?"),
    (["sample", "--checkpoint", "x", "--prompt", "p", "--max-new-tokns", "3"],
     "did you mean --max_new_tokens?"),
    (["train", "--config", SMOKE, "--config.rl.learnin_rate=1e-3"],
     "did you mean --config.rl.learning_rate?"),
    (["train", "--config", SMOKE, "--config.rll.steps=1"], "did you mean --config.rl?"),
])
def test_did_you_mean(capsys, args, needle):
    code, _, err = _exit(capsys, *args)
    assert code == 2
    assert needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_float_flags_are_refused(capsys, value):
    code, _, err = _exit(capsys, "sample", "--checkpoint", "x", "--prompt", "p",
                         f"--temperature={value}")
    assert code == 2 and f"--temperature={float(value)}: must be a finite number" in err
    code, _, err = _exit(capsys, "reward-model", "--config", SMOKE, "--data", "d.jsonl",
                         f"--learning_rate={value}")
    assert code == 2 and "--learning_rate" in err and "finite" in err


def test_missing_required_flag_is_named(capsys):
    code, _, err = _exit(capsys, "export", "--checkpoint", "x")
    assert code == 2 and "missing required flag --out" in err


def test_every_path_flag_becomes_absolute(tmp_path, monkeypatch):
    """For every command of the table, each path flag it takes, given relative, is absolute
    after parsing (relative to the current directory); gs:// stays as it is."""
    monkeypatch.chdir(tmp_path)
    for name, command in COMMANDS.items():
        defined = [f for f in PATH_FLAGS if f in flag_values(command, ["x"])]
        args = [name]
        if "config" in command.required:
            args += ["--config", SMOKE]
        if name == "plan":
            args += ["--topology", "v5e:2x2"]
        if name == "sample":
            args += ["--prompt", "p"]
        for flag in defined:
            args += [f"--{flag}", f"rel/{flag}"]
        _, fv = parse(["jaxrl-reason", *args])
        for flag in defined:
            assert fv[flag].value == str(tmp_path / "rel" / flag), (name, flag)
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE, "--workdir", "gs://b/run"])
    assert fv.workdir == "gs://b/run"


def test_config_path_fields_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE,
                   "--config.tokenizer.path=tok/t.model", "--config.hf_model=models/q",
                   "--config.rewards.reward_model_dir=gs://bucket/rm",
                   "--config.rewards.modules=('my_rewards', 'extra/r.py')"])
    c = fv.config
    assert c.tokenizer.path == str(tmp_path / "tok" / "t.model")
    assert c.hf_model == str(tmp_path / "models" / "q")
    assert c.rewards.reward_model_dir == "gs://bucket/rm"
    assert tuple(c.rewards.modules) == ("my_rewards", str(tmp_path / "extra" / "r.py"))
    assert c.rl.steps == 2  # other fields untouched
    files = os.path.join(REPO, "configs", "gsm8k_file_grpo.py")
    _, fv = parse(["jaxrl-reason", "train", "--config", f"{files}:smoke",
                   "--config.task.train_file=data/*.jsonl",
                   "--config.task.eval_files.test=data/test.jsonl"])
    assert fv.config.task.train_file == str(tmp_path / "data" / "*.jsonl")
    assert fv.config.task.eval_files.test == str(tmp_path / "data" / "test.jsonl")


def test_absolute_keeps_uris_and_empty():
    assert paths.absolute("") == ""
    assert paths.absolute("gs://b/x") == "gs://b/x"
    assert paths.absolute("s3://b/x") == "s3://b/x"
    assert paths.absolute("file:///tmp/x") == "/tmp/x"
    assert paths.absolute("~/x") == os.path.expanduser("~/x")


def test_checkpointer_accepts_relative_directory(tmp_path, monkeypatch):
    """Library callers too: orbax refuses relative paths, the Checkpointer resolves them."""
    import jax.numpy as jnp

    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    monkeypatch.chdir(tmp_path)
    ckpt = Checkpointer("ck", max_to_keep=1)
    assert ckpt.save(1, {"w": jnp.ones(3)}, {"step": 1}, force=True)
    ckpt.close()
    assert (tmp_path / "ck").is_dir() and os.path.isabs(os.fspath(ckpt.directory))


def test_readme_and_ci_share_the_test_command():
    """CI (.ci/run) runs the README's test command, with the same extras."""
    readme = open(os.path.join(REPO, "README.md")).read()
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    command = "pip install -e '.[dev]' && python -m pytest -q -n 2"
    assert command in readme
    assert command.split(" && ")[0] in ci and command.split(" && ")[1] in ci
