"""The README's commands, as written, from the root of a fresh copy of the repository.

Every ```bash block of README.md is read; each command in it that starts with `jaxrl-reason`
or `python` runs in order, in one copy of the tracked files (a newcomer's fresh clone), with
relative paths exactly as the README writes them. Two changes keep it to CI's budget: a
`--config configs/NAME.py` with no argument gets `:smoke` (the same command at test size), and
`pip install` steps and the test command itself are skipped (the package is installed; the
tests are running). Then `--resume` on the main run, and eval / sample / export with relative
paths from a subdirectory. ```sh blocks (GPU/TPU launches that cannot run here) are syntax-checked.
Editing a command in the README edits the command tested.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from cli_runs import REPO

README = os.path.join(REPO, "README.md")
MAIN_COMMAND = "jaxrl-reason train --config configs/arith_grpo.py"


def blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced ```language blocks of a markdown text, in order."""
    return re.findall(rf"^```{language}[ \t]*\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped, `&&`
    chains split."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # shell comments (not inside words)
        if line and not line.startswith("#"):
            out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


def runnable(command: str) -> str | None:
    """`command` as the test runs it (smoke-sized), or None if the test skips it."""
    if command.startswith("pip ") or "-m pytest" in command:
        return None
    if not command.startswith(("jaxrl-reason", "python")):
        return None
    return re.sub(r"(--config[ =]configs/[\w./-]+\.py)(?=\s|$)", r"\1:smoke", command)


def readme_commands() -> list[str]:
    text = open(README, encoding="utf-8").read()
    found = [runnable(c) for block in blocks(text, "bash") for c in commands(block)]
    return [c for c in found if c]


def test_readme_shows_the_two_commands():
    text = open(README, encoding="utf-8").read()
    bash = [c for block in blocks(text, "bash") for c in commands(block)]
    assert bash[:2] == ["pip install -e .", MAIN_COMMAND], bash[:3]
    assert "pip install -e '.[dev]'" in bash and "python -m pytest -q -n 2" in bash


def test_sh_blocks_parse():
    text = open(README, encoding="utf-8").read()
    for block in blocks(text, "sh"):
        result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert result.returncode == 0, (block, result.stderr)
        for script in re.findall(r"(?:^|\s)(tpu_scripts/[\w./-]+)", block):
            assert os.path.isfile(os.path.join(REPO, script)), script


def _fresh_copy(dest: str) -> None:
    """The tracked files of the repository (a clone's content), or the tree without run
    outputs when git is not available."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        files = None
    if files is None:
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", "runs", "*.pyc"))
        return
    for name in filter(None, files):
        source = os.path.join(REPO, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    todo = readme_commands()
    assert todo and todo[0] == MAIN_COMMAND + ":smoke", todo
    root = tmp_path / "clone"
    _fresh_copy(str(root))
    bin_dir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    for command in todo:
        result = subprocess.run(command, shell=True, cwd=root, env=env, capture_output=True,
                                text=True, timeout=1800)
        assert result.returncode == 0, (
            f"README command failed: {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        if command == todo[0]:
            run = root / "runs" / "arith_grpo"
            for name in ("metrics.jsonl", "eval.json"):
                assert (run / name).is_file(), f"{name} missing after {command}"
    resume = f"{todo[0]} --resume --config.rl.steps=3"
    result = subprocess.run(shlex.split(resume), cwd=root, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    # Relative paths from another directory than the one the run was made in.
    sub = root / "elsewhere"
    sub.mkdir()
    for command in ("jaxrl-reason eval --checkpoint ../runs/arith_grpo --num_problems 4 "
                    "--seeds 1 --num_samples 1 --out e.json",
                    "jaxrl-reason sample --checkpoint ../runs/arith_grpo --prompt 1+1 "
                    "--max_new_tokens 4",
                    "jaxrl-reason export --checkpoint ../runs/arith_grpo --out hf"):
        result = subprocess.run(shlex.split(command), cwd=sub, env=env, capture_output=True,
                                text=True, timeout=1800)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    assert (sub / "e.json").is_file() and (sub / "hf" / "config.json").is_file()
