"""Command line: `jaxrl-reason COMMAND --config FILE[:ARG] [--config.a.b=v ...] [--flags]`.

`jaxrl-reason --help` lists the commands (the table in `cli/table.py`); `jaxrl-reason CMD
--help` lists a command's flags. Configs are `get_config()` files (ml_collections), locked
after parsing: an override of a key that does not exist is an error. Flags may be spelled
with dashes or underscores. Local paths, in flags and in the path fields of a config, are made
absolute here, before any command sees them; `gs://` and other URIs are kept as they are. Bad
input ends with a one-line message; set JAXRL_REASON_DEBUG=1 to see the traceback instead.

Multi-host: run the same command on every host. Before anything else touches JAX, the CLI
calls `jax.distributed.initialize` as `config.distributed` says (default "auto": on Cloud
TPU VMs and pods, or when a coordinator address / process count is configured; see
`jaxrl_reason.runtime.distributed`); `--multihost` forces it (for eval/sample without a config,
the `distributed` settings come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import Sequence

from absl import flags

from jaxrl_reason.runtime import paths
from jaxrl_reason.cli import help as cli_help
from jaxrl_reason.cli.table import COMMANDS, PATH_FLAGS, flag_values


def _normalize(argv: Sequence[str]) -> list[str]:
    """`--max-new-tokens=3` -> `--max_new_tokens=3` (config overrides are left alone)."""
    out = []
    for arg in argv:
        if arg.startswith("--") and not arg.startswith("--config"):
            name, eq, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + eq + value
        out.append(arg)
    return out


def _error_text(e: Exception, argv: Sequence[str], config=None) -> str:
    """A one-line reason for a flag error (no embedded tracebacks, unknown keys named, with
    the nearest existing key)."""
    missing = e if isinstance(e, KeyError) else e.__context__  # AttributeError wraps it
    if isinstance(missing, KeyError):
        raw = str(missing.args[0]) if missing.args else ""
        key = raw.partition("\n")[0].strip("'\"")  # ml_collections appends its own hint
        named = [a.split("=", 1)[0] for a in argv
                 if a.startswith("--config.") and key in a.split("=", 1)[0].split(".")]
        hint = cli_help.config_key_hint(config, named[0][len("--config."):]) if named else ""
        return (f"unknown config key {key!r} in {', '.join(named) or 'a --config override'} "
                f"(overrides must name existing keys){hint}")
    text = str(e)
    if isinstance(e, OSError):
        text = "cannot load the config file: " + " ".join(text.split())
    elif "Traceback (most recent call last)" in text:
        head = text.split("Error whilst parsing", 1)[0].strip()
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        text = f"{head} cannot load the config: {last}"
    return text


def _loaded_config(argv: Sequence[str]):
    """The config named by `--config` in `argv`, without its overrides (only to suggest key
    names after a bad override), or None."""
    for i, arg in enumerate(argv):
        value = (arg.split("=", 1)[1] if arg.startswith("--config=") else
                 argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
        if value:
            path, _, config_arg = value.partition(":")
            try:
                spec = importlib.util.spec_from_file_location("jaxrl_reason_cli_hint", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module.get_config(config_arg) if config_arg else module.get_config()
            except Exception:  # noqa: BLE001 (only a hint; the real error is reported)
                return None
    return None


def _check_finite(fv: flags.FlagValues) -> None:
    """Raises flags.Error for a float flag given as nan or inf (absl accepts both, and no
    float flag means them: a NaN rate would train to NaN parameters)."""
    for name in fv:
        if name.startswith("config."):
            continue  # config fields: validation.validate_config names them by key
        value = fv[name].value
        if fv[name].flag_type() == "float" and value is not None and not math.isfinite(value):
            raise flags.Error(f"--{name}={value}: must be a finite number")


def absolutize(fv: flags.FlagValues) -> None:
    """Makes the local paths among `fv`'s path flags and its config's path fields absolute
    (`paths.absolute`), relative to the current directory."""
    for name in PATH_FLAGS:
        if name in fv and fv[name].value:
            fv[name].value = paths.absolute(fv[name].value)
    config = fv["config"].value if "config" in fv else None
    if config is not None:
        paths.absolutize_config(config)


def parse(argv: Sequence[str]):
    """(command, parsed FlagValues) from a full argv. `--help`/`--version` print and raise
    SystemExit(0); bad input prints a one-line message and raises SystemExit(2)."""
    args = list(argv[1:])
    if not args:
        sys.stderr.write(cli_help.main_help())
        raise SystemExit(2)
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(cli_help.main_help())
        raise SystemExit(0)
    if args[0] in ("--version", "-V", "version"):
        sys.stdout.write(f"jaxrl-reason {cli_help.version()}\n")
        raise SystemExit(0)
    if args[0] not in COMMANDS:
        sys.stderr.write(f"jaxrl-reason: unknown command {args[0]!r}"
                         f"{cli_help.suggest(args[0], COMMANDS)}\n\n{cli_help.main_help()}")
        raise SystemExit(2)
    command = COMMANDS[args[0]]
    full = [f"jaxrl-reason {command.name}"] + _normalize(args[1:])
    fv = flag_values(command, full)
    if any(a in ("-h", "--help", "--helpfull") for a in full[1:]):
        sys.stdout.write(cli_help.command_help(command, fv))
        raise SystemExit(0)
    try:
        cli_help.check_flag_names(fv, full[1:])
        fv(full)
        missing = [f"--{name}" for name in command.required if fv[name].value is None]
        if missing:
            raise flags.Error(f"missing required flag {', '.join(missing)} (see --help)")
        _check_finite(fv)
        if "config" in fv and fv.config is not None:
            fv.config.get("name")  # a config file that failed to load raises only on access
    except (flags.Error, KeyError, ValueError, AttributeError, TypeError, OSError) as e:
        config = _loaded_config(full) if isinstance(e, (KeyError, AttributeError)) else None
        sys.stderr.write(f"jaxrl-reason {command.name}: {_error_text(e, full, config)}\n")
        raise SystemExit(2) from None
    absolutize(fv)
    return command.name, fv


def _distributed_block(fv: flags.FlagValues) -> dict:
    """The config's `distributed` block as a dict (empty without a config), `--multihost`
    turning it on."""
    config = fv.config
    block = config.get("distributed") if config is not None else None
    block = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
    if fv.multihost:
        block["enabled"] = True
    return block


def init_distributed(command: str, fv: flags.FlagValues) -> None:
    """`jax.distributed.initialize` per the config's `distributed` block, the environment and
    `--multihost` (never for `plan`, which only compiles). Must run before any JAX call."""
    if command == "plan":
        return
    from jaxrl_reason.runtime import distributed
    distributed.initialize(_distributed_block(fv))


def init_cpu_devices(command: str, fv: flags.FlagValues) -> int | None:
    """Splits a CPU host into `config.cpu_devices` XLA devices (see
    `jaxrl_reason.runtime.cpu_devices`) before JAX starts; returns the count set, or None (no config, `plan`, or the environment
    chose). Must run before any JAX call, and before `init_distributed` decides the process
    count (auto gives 1 in a multi-process job)."""
    config = fv.config
    if command == "plan" or config is None or "cpu_devices" not in config:
        return None
    from jaxrl_reason.runtime import cpu_devices
    from jaxrl_reason.runtime import distributed
    from jaxrl_reason.config import validation
    multi = distributed.decide(distributed.settings(_distributed_block(fv)))[0]
    count = cpu_devices.resolve(config.cpu_devices, cores=cpu_devices.usable_cores(),
                                fits=lambda n: validation.fits_devices(config, n),
                                multi_process=multi)  # a bad value is an error either way
    if config.cpu_devices == 0 and cpu_devices.started():
        return None  # auto in a process where JAX already runs: keep its devices
    return count if cpu_devices.apply(count) else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    command, fv = parse(argv)
    # Imported after parsing so that `--help` and flag errors are instant.
    from jaxrl_reason.runtime.reliability import GracefulStop, NumericError, Preempted
    try:
        init_cpu_devices(command, fv)  # before any other JAX call
        init_distributed(command, fv)
    except ValueError as e:
        sys.stderr.write(f"jaxrl-reason {command}: error: {e}\n")
        return 1
    from jaxrl_reason.cli import commands
    try:
        with GracefulStop():  # SIGTERM/SIGINT: checkpoint at the next step, then exit 0
            return getattr(commands, COMMANDS[command].function_name)(fv)
    except Preempted as e:
        print(f"jaxrl-reason {command}: {e}", flush=True)
        return 0
    except (ValueError, FileNotFoundError, OSError, NumericError) as e:
        if os.environ.get("JAXRL_REASON_DEBUG"):
            raise  # the full traceback, for bugs rather than bad input
        sys.stderr.write(f"jaxrl-reason {command}: error: {e}\n")
        return 1
