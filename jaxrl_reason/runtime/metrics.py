"""Metric logging: a JSON-lines file, tensorboardX event files, Weights & Biases (optional),
and a one-line console summary.

    with MetricsWriter(workdir, enabled=jax.process_index() == 0) as writer:
        writer.write(step, {"loss": loss, "reward/mean": r}, phase="train")

Every `write` appends one JSON object to `<workdir>/metrics.jsonl`:

    {"step": 12, "phase": "train", "time": 1790000000.1, "loss": 0.25, "reward/mean": 0.5}

Values are converted with `float()`. JSON has no NaN/Infinity, so non-finite values are
written as `null` (the file stays valid JSON for any reader); `read_metrics` turns them back
into `float("nan")`. The same scalars go to tensorboard under the tag "<phase>/<name>", and
with `config.log.wandb=True` (`pip install 'jaxrl-reason[wandb]'`) to a wandb run as
"<phase>/<name>" against the x-axis "<phase>/step" (phases count their steps separately, and a
resumed run logs its steps again, which wandb's single global step would drop).

The workdir may be remote (gs://bucket/run or any `etils.epath` path): object stores have
no appends, so the writer keeps the file's lines in memory and rewrites the object at most
every `remote_flush_s` seconds and at `flush`, `truncate` and `close` (a killed process
loses at most those seconds of lines, which a resumed run logs again). Multi-host: only
process 0 writes (`enabled=jax.process_index() == 0`); the other processes never import wandb.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import string
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_reason.runtime import paths

__all__ = ["MetricsWriter", "WandbOptions", "format_line", "read_metrics", "wandb_options"]

METRICS_FILENAME = "metrics.jsonl"
TB_DIRNAME = "tb"
WANDB_ID_FILENAME = "wandb_run_id"  # the run's wandb id, so that --resume continues that run
WANDB_MODES = ("online", "offline", "disabled")
_RESERVED = ("step", "phase", "time")


class _LocalLines:
    """metrics.jsonl on a local disk: an open, line-buffered append-mode file."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "a", encoding="utf-8", buffering=1)

    def append(self, line: str) -> None:
        self._file.write(line)

    def read(self) -> list[str]:
        self._file.flush()
        with open(self.path, encoding="utf-8") as f:
            return f.readlines()

    def replace(self, lines: list[str]) -> None:
        """Rewrites the file atomically (temp file + rename) and reopens it for appends."""
        self._file.close()
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _RemoteLines:
    """metrics.jsonl on an object store: the lines in memory, the object rewritten whole at
    most every `every_s` seconds (and at flush/replace/close)."""

    def __init__(self, path: str, every_s: float):
        self.path, self.every_s = paths.as_path(path), every_s
        self._lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True) \
            if self.path.exists() else []
        self._lines = [line if line.endswith("\n") else line + "\n" for line in self._lines]
        self._written = time.monotonic()
        self.flush()  # fail now, naming the path, if the object cannot be written

    def append(self, line: str) -> None:
        self._lines.append(line)
        if time.monotonic() - self._written >= self.every_s:
            self.flush()

    def read(self) -> list[str]:
        return list(self._lines)

    def replace(self, lines: list[str]) -> None:
        self._lines = list(lines)
        self.flush()

    def flush(self) -> None:
        self.path.write_text("".join(self._lines), encoding="utf-8")
        self._written = time.monotonic()

    def close(self) -> None:
        self.flush()


def _to_float(name: str, value: Any) -> float:
    """One scalar (python number, numpy or jax scalar / size-1 array) as a python float."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except Exception as e:  # e.g. an object numpy cannot convert
        raise TypeError(f"metric {name!r}: cannot convert {type(value).__name__} to a number"
                        ) from e
    if arr.size != 1:
        raise ValueError(f"metric {name!r}: expected a scalar, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise TypeError(f"metric {name!r}: expected a number, got dtype {arr.dtype}")
    return float(arr.reshape(()))


def _check_step(step: Any) -> int:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int, got {type(step).__name__} ({step!r})")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return int(step)


def _format_value(value: float) -> str:
    if not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


def format_line(step: int, scalars: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """A compact one-line summary, e.g. "step 12 | loss 0.2531 | reward/mean 0.5".

    Args:
      step: int, the training step.
      scalars: {name: number, numpy or jax scalar}.
      keys: which names to show, in this order (names absent from `scalars` are skipped, since
        some metrics are logged only every few steps); default all, in insertion order.
    Returns:
      str without newline; integers print as integers, other values with 4 significant digits.
      A caller with a tqdm bar passes this (without the step part, if it likes) as the postfix.
    """
    step = _check_step(step)
    names = list(scalars) if keys is None else [k for k in keys if k in scalars]
    parts = [f"step {step}"]
    parts += [f"{k} {_format_value(_to_float(k, scalars[k]))}" for k in names]
    return " | ".join(parts)


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    """Where the wandb backend logs (from `config.log.wandb_*`; see `wandb_options`).

    Fields:
      project: the W&B project. entity: team or user ("" = the account's default).
      name: the run's display name ("" = the workdir's basename).
      mode: "online", "offline" (a local run directory; `wandb sync` uploads it later) or
        "disabled".
      dir: the local directory wandb writes `wandb/<run>/` into ("" = the workdir when it is
        local, else wandb's default, ./wandb).
      config: the run's configuration as a JSON-able dict (shown in the W&B UI), or None.
    """
    project: str = "jaxrl-reason"
    entity: str = ""
    name: str = ""
    mode: str = "online"
    dir: str = ""
    config: Mapping[str, Any] | None = None

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ValueError(f"config.log.wandb_mode must be one of {', '.join(WANDB_MODES)}, "
                             f"got {self.mode!r}")
        if not isinstance(self.project, str) or not self.project:
            raise ValueError(f"config.log.wandb_project must be a non-empty str, "
                             f"got {self.project!r}")


def wandb_options(config) -> WandbOptions | None:
    """The wandb settings of a run config (an ml_collections ConfigDict with a `log` section),
    or None when `config.log.wandb` is off or absent (configs saved by older versions)."""
    log = config.log
    if not log.get("wandb", False):
        return None
    try:
        as_dict = json.loads(config.to_json_best_effort())
    except (TypeError, ValueError):
        as_dict = None
    return WandbOptions(project=log.get("wandb_project", "jaxrl-reason"),
                        entity=log.get("wandb_entity", ""), name=log.get("wandb_name", ""),
                        mode=log.get("wandb_mode", "online"), dir=log.get("wandb_dir", ""),
                        config=as_dict)


def _import_wandb():
    """The wandb module, or an ImportError that names the extra to install."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError("config.log.wandb=True needs the wandb package: "
                          "pip install 'jaxrl-reason[wandb]' (or set "
                          "--config.log.wandb=False)") from e
    return wandb


class _WandbRun:
    """One wandb run of a workdir: each phase's scalars against its own "<phase>/step"."""

    def __init__(self, workdir: str, options: WandbOptions):
        wandb = _import_wandb()
        id_path = paths.join(workdir, WANDB_ID_FILENAME)
        run_id = paths.as_path(id_path).read_text().strip() \
            if paths.as_path(id_path).exists() else ""
        if not run_id:
            alphabet = string.ascii_lowercase + string.digits  # wandb's own id alphabet
            run_id = "".join(secrets.choice(alphabet) for _ in range(8))
            paths.write_text_atomic(id_path, run_id + "\n")
        local_dir = paths.absolute(options.dir) or (None if paths.is_remote(workdir)
                                                    else workdir)
        if local_dir and paths.is_remote(local_dir):
            raise ValueError(f"config.log.wandb_dir must be a local directory, got {local_dir!r}")
        if local_dir:
            os.makedirs(local_dir, exist_ok=True)
        name = options.name or os.path.basename(os.path.normpath(workdir))
        self.run = wandb.init(project=options.project, entity=options.entity or None,
                              name=name, mode=options.mode, dir=local_dir, id=run_id,
                              resume="allow",
                              config=dict(options.config) if options.config else None)
        self._phases: set[str] = set()

    def log(self, phase: str, step: int, values: Mapping[str, float]) -> None:
        if phase not in self._phases:
            self.run.define_metric(f"{phase}/step")
            self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
            self._phases.add(phase)
        row = {f"{phase}/{name}": value for name, value in values.items()}
        row[f"{phase}/step"] = step
        self.run.log(row)

    def close(self) -> None:
        self.run.finish()


class MetricsWriter:
    """Writes scalars to `<workdir>/metrics.jsonl`, tensorboard (`<workdir>/tb`) and the console.

    Args:
      workdir: directory for the outputs; created if missing.
      tensorboard: also write tensorboardX event files under `<workdir>/tb`.
      wandb: also log to a wandb run with these options (None: no wandb). The run's id is
        kept in `<workdir>/wandb_run_id`, so a resumed run continues the same wandb run.
      console: print `format_line(...)` (prefixed with "[phase]") to stdout on each write.
        A caller that drives a tqdm bar passes False and uses `format_line` for the postfix.
      enabled: False makes every method a no-op and touches no file; pass
        `jax.process_index() == 0` so that only one process of a multi-host run logs.
      remote_flush_s: for a remote workdir (gs://...), the longest time between rewrites of
        metrics.jsonl.
    Raises:
      OSError: naming the path, when the directory or file cannot be created or written.
      ImportError: `wandb` is given and the package is not installed (before any file is
        written), naming the extra to install.
    """

    def __init__(self, workdir: str, *, tensorboard: bool = True, console: bool = True,
                 enabled: bool = True, remote_flush_s: float = 30.0,
                 wandb: WandbOptions | None = None):
        self.workdir = os.fspath(workdir)
        self.path = paths.join(self.workdir, METRICS_FILENAME)
        self.console = console
        self.enabled = enabled
        self._file: _LocalLines | _RemoteLines | None = None
        self._tb = None
        self._wandb: _WandbRun | None = None
        self._closed = False
        if not enabled:
            return
        if wandb is not None:
            _import_wandb()  # a missing package fails here, before anything is written
        try:
            if paths.is_remote(self.workdir):
                paths.as_path(self.workdir).mkdir(parents=True, exist_ok=True)
                self._file = _RemoteLines(self.path, remote_flush_s)
            else:
                os.makedirs(self.workdir, exist_ok=True)
                self._file = _LocalLines(self.path)
        except OSError as e:
            raise OSError(f"MetricsWriter: cannot write metrics to {self.path!r}: {e}") from e
        if tensorboard:
            tb_dir = paths.join(self.workdir, TB_DIRNAME)
            try:
                from tensorboardX import SummaryWriter
                self._tb = SummaryWriter(logdir=tb_dir)
            except OSError as e:
                self._file.close()
                raise OSError(f"MetricsWriter: cannot write tensorboard events to {tb_dir!r}: "
                              f"{e}") from e
        if wandb is not None:
            try:
                self._wandb = _WandbRun(self.workdir, wandb)
            except BaseException:
                self._file.close()
                if self._tb is not None:
                    self._tb.close()
                raise

    @classmethod
    def from_config(cls, workdir: str, config, *, console: bool = False,
                    enabled: bool = True) -> "MetricsWriter":
        """The writer a run config asks for: tensorboard from `config.log.tensorboard`,
        wandb from `config.log.wandb*` (`wandb_options`)."""
        return cls(workdir, tensorboard=config.log.tensorboard, console=console,
                   enabled=enabled, wandb=wandb_options(config))

    # ------------------------------------------------------------------ writing

    def write(self, step: int, scalars: Mapping[str, Any], *, phase: str = "train") -> str | None:
        """Log one step's scalars.

        Args:
          step: int >= 0.
          scalars: {name: python number, numpy or jax scalar / size-1 array}; names may not be
            "step", "phase" or "time". Jax values are fetched to the host (a device sync).
          phase: e.g. "train" or "eval"; tensorboard tags are "<phase>/<name>".
        Returns:
          the `format_line` summary (None when disabled).
        """
        if not self.enabled:
            return None
        if self._closed:
            raise ValueError(f"MetricsWriter for {self.path!r} is closed")
        step = _check_step(step)
        if not isinstance(phase, str) or not phase:
            raise ValueError(f"phase must be a non-empty str, got {phase!r}")
        values: dict[str, float] = {}
        for name, value in scalars.items():
            if not isinstance(name, str):
                raise TypeError(f"metric names must be str, got {name!r}")
            if name in _RESERVED:
                raise ValueError(f"metric name {name!r} is reserved ({', '.join(_RESERVED)})")
            values[name] = _to_float(name, value)
        record = {"step": step, "phase": phase, "time": time.time()}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._file.append(json.dumps(record, allow_nan=False) + "\n")
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(f"{phase}/{name}", value, step)
        if self._wandb is not None:
            self._wandb.log(phase, step, values)
        line = format_line(step, values)
        if self.console:
            print(f"[{phase}] {line}", file=sys.stdout, flush=True)
        return line

    def truncate(self, phase: str, *, after_step: int) -> int:
        """Drops the records of `phase` with step > `after_step` from metrics.jsonl (a run
        resumed from a checkpoint at `after_step` logs those steps again). Returns how many
        were dropped. The file is rewritten atomically (temp file + rename). Tensorboard and
        wandb keep what they have; the steps logged again plot over it."""
        if not self.enabled or self._closed:
            return 0
        lines = self._file.read()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a kill mid-write
            if not (record.get("phase") == phase and record.get("step", 0) > after_step):
                kept.append(line if line.endswith("\n") else line + "\n")
        dropped = len(lines) - len(kept)
        if dropped:
            self._file.replace(kept)
        return dropped

    def flush(self) -> None:
        """Push buffered data to disk (the jsonl file is line-buffered already)."""
        if not self.enabled or self._closed:
            return
        self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Flush and close the files; further writes raise, further closes do nothing."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str, phase: str | None = None) -> list[dict]:
    """Load a metrics.jsonl written by `MetricsWriter`.

    Args:
      path: the jsonl file, or a workdir containing `metrics.jsonl` (local or gs://...).
      phase: keep only records of this phase (default all).
    Returns:
      list of dicts in file order; `null` metric values come back as float("nan").
    """
    path = os.fspath(path)
    if paths.as_path(path).is_dir():
        path = paths.join(path, METRICS_FILENAME)
    if not paths.as_path(path).exists():
        raise FileNotFoundError(f"read_metrics: no metrics file at {path!r}")
    records = []
    with paths.as_path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"read_metrics: {path}:{lineno} is not valid JSON: {e}") from e
            record = {k: (float("nan") if v is None and k not in _RESERVED else v)
                      for k, v in record.items()}
            if phase is None or record.get("phase") == phase:
                records.append(record)
    return records

