"""Help, version and "did you mean" for the command line (`jaxrl_reason.cli`)."""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Sequence

from absl import flags

from jaxrl_reason.cli.table import COMMANDS, Command

_CONFIG_HELP = ("--config.KEY=VALUE", "override a field of the config (e.g. "
                "--config.rl.learning_rate=3e-5); unknown keys are an error")


def version() -> str:
    """The installed package's version (`jaxrl_reason.__version__` when not installed)."""
    from importlib import metadata
    try:
        return metadata.version("jaxrl-reason")
    except metadata.PackageNotFoundError:
        import jaxrl_reason
        return jaxrl_reason.__version__


def suggest(word: str, choices: Iterable[str]) -> str:
    """`"; did you mean 'x'?"` for the nearest of `choices` to `word`, or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def main_help() -> str:
    """`jaxrl-reason --help`: the commands with one line each."""
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: jaxrl-reason COMMAND [flags]   (jaxrl-reason COMMAND --help for its flags)",
             "", "commands:"]
    lines += [f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS.values()]
    lines += ["", "other:", "  --help, -h     this message", "  --version      the version",
              "", "example: jaxrl-reason train --config configs/arith_grpo.py", ""]
    return "\n".join(lines)


_METAVARS = {"string": "VALUE", "int": "INT", "integer": "INT", "float": "FLOAT"}


def _flag_line(flag) -> tuple[str, str]:
    """("--name=VALUE", "help (default: x)") for one absl flag."""
    kind = flag.flag_type()
    if flag.name == "config":
        left = "--config=FILE[:ARG]"
    elif kind == "bool":
        left = f"--[no]{flag.name}"
    elif getattr(flag.parser, "enum_values", None):
        left = f"--{flag.name}={{{','.join(flag.parser.enum_values)}}}"
    else:
        left = f"--{flag.name}={_METAVARS.get(kind, kind.upper())}"
    right = re.sub(r"^<[^>]*>: ", "", " ".join(str(flag.help).split()))  # absl's enum prefix
    if flag.default not in (None, "") and flag.name != "config":
        right += f" (default: {flag.default})"
    return left, right


def command_help(command: Command, fv: flags.FlagValues) -> str:
    """`jaxrl-reason CMD --help`: the synopsis and every flag with its one-line help."""
    rows = [_flag_line(fv[name]) for name in _names(fv)]
    if "config" in fv:
        rows.append(_CONFIG_HELP)
    width = max(len(left) for left, _ in rows)
    lines = [f"usage: jaxrl-reason {command.name} {command.usage}", "", command.summary, "",
             "flags:"]
    lines += [f"  {left:<{width}}  {right}" for left, right in rows]
    if command.required:
        lines += ["", "required: " + ", ".join(f"--{n}" for n in command.required)]
    lines += ["", "Flags may be spelled with dashes or underscores (--max-new-tokens).", ""]
    return "\n".join(lines)


def _names(fv: flags.FlagValues) -> list[str]:
    """The flags defined on `fv`, in definition order."""
    names = []
    for module_flags in fv.flags_by_module_dict().values():
        names += [f.name for f in module_flags if f.name not in names]
    return names


def check_flag_names(fv: flags.FlagValues, args: Sequence[str]) -> None:
    """Raises flags.Error naming the nearest valid flag for an unknown `--name` in `args`
    (`--config.a.b` overrides are checked against the config later)."""
    known = _names(fv)
    for arg in args:
        if not arg.startswith("-") or arg.startswith("--config.") or arg == "--":
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        bare = name[2:] if name.startswith("no") and name[2:] in known else name
        if bare not in known:
            raise flags.Error(f"unknown flag --{name}{suggest(name, ['--' + k for k in known])}"
                              " (see --help)")


def config_key_hint(config, dotted: str) -> str:
    """`"; did you mean --config.rl.learning_rate?"` for a mistyped override key path, from
    the keys of `config` (a ConfigDict, or None: no hint)."""
    if config is None:
        return ""
    parts, node, prefix = dotted.split("."), config, []
    for part in parts:
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if part not in keys:
            close = difflib.get_close_matches(part, keys, n=1, cutoff=0.6)
            return f"; did you mean --config.{'.'.join(prefix + close)}?" if close else ""
        prefix.append(part)
        node = node[part]
    return ""
