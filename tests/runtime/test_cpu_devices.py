"""config.cpu_devices: how many XLA devices a CPU host runs as
(jaxrl_reason.runtime.cpu_devices)."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from configs import arith_grpo
from jaxrl_reason.runtime import cpu_devices
from jaxrl_reason.config import validation

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, cores, fits, multi, expected", [
    (0, 2, None, False, 2),                       # auto: one per core
    (0, 8, lambda n: 18 % n == 0, False, 6),      # ... lowered to the largest count that fits
    (0, 5, lambda n: n == 1, False, 1),           # nothing but one fits
    (0, 8, None, True, 1),                        # multi-process: JAX's default
    (3, 2, lambda n: False, False, 3),            # explicit: as given (validation says more)
    (1, 16, None, False, 1),
])
def test_resolve(value, cores, fits, multi, expected):
    assert cpu_devices.resolve(value, cores=cores, fits=fits, multi_process=multi) == expected


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_resolve_refuses_bad_values(value):
    with pytest.raises(ValueError, match="cpu_devices: must be 0"):
        cpu_devices.resolve(value, cores=2)


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}, None),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 8),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                   "--xla_force_host_platform_device_count=2"}, 2),   # the last one counts
    ({"JAX_NUM_CPU_DEVICES": "4", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 4),
    ({"JAX_NUM_CPU_DEVICES": "-1"}, None),                             # JAX's "unset"
])
def test_environment_count(env, expected):
    assert cpu_devices.environment_count(env) == expected


def test_apply_defers_to_the_environment_and_checks_a_started_backend(monkeypatch):
    jax.devices()  # the test process runs (conftest) with 8 forced devices
    assert cpu_devices.apply(3) is False  # XLA_FLAGS chose
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    assert cpu_devices.started()
    assert cpu_devices.apply(jax.device_count("cpu")) is False  # already so
    with pytest.raises(ValueError, match="already running with 8 CPU device"):
        cpu_devices.apply(2)


def test_fits_devices_follows_the_batches_and_the_mesh():
    c = arith_grpo.get_config()
    rows = c.rl.batch_prompts * c.rl.num_generations
    for n in range(1, 17):
        expected = rows % n == 0 and c.sft.batch_size % n == 0 \
            and (c.eval.batch_prompts * c.eval.num_samples) % n == 0
        assert validation.fits_devices(c, n) == expected, n
    c.mesh.data, c.mesh.fsdp = 2, 1                     # a fixed mesh fits only its size
    assert validation.fits_devices(c, 2) and not validation.fits_devices(c, 4)


def _fresh_process(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`args` run in a new python with no device count in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", **(env_extra or {}))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


_PROBE = """
import sys
import jax
from jaxrl_reason import cli
command, fv = cli.parse(["jaxrl-reason", "train", "--config", "configs/arith_grpo.py:smoke",
                         *sys.argv[1:]])
print("set", cli.init_cpu_devices(command, fv), "devices", jax.device_count())
"""


def test_cli_splits_the_host_before_jax_starts():
    auto = cpu_devices.resolve(0, cores=cpu_devices.usable_cores(),
                               fits=lambda n: validation.fits_devices(
                                   arith_grpo.get_config("smoke"), n))
    out = _fresh_process("-c", _PROBE)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"set {auto} devices {auto}" in out.stdout
    out = _fresh_process("-c", _PROBE, "--config.cpu_devices=3")
    assert "set 3 devices 3" in out.stdout, out.stderr[-2000:]
    out = _fresh_process("-c", _PROBE, "--config.cpu_devices=3",   # the environment wins
                         env_extra={"XLA_FLAGS": "--xla_force_host_platform_device_count=5"})
    assert "set None devices 5" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("env_extra", [
    {}, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}])
def test_cli_refuses_a_bad_count(tmp_path, env_extra):
    """Refused whether or not the environment sets the count (it would win, but the config is
    still wrong)."""
    out = _fresh_process("-m", "jaxrl_reason.cli", "train", "--config",
                         "configs/arith_grpo.py:smoke", "--workdir", str(tmp_path / "w"),
                         "--config.cpu_devices=-2", env_extra=env_extra)
    assert out.returncode == 1
    assert "cpu_devices: must be 0 (auto: one device per core) or a positive device count, " \
           "got -2" in out.stderr
    assert not (tmp_path / "w").exists()
