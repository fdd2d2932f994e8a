r"""Python code answers: extraction, a sandboxed runner, and the `code` reward.

`run_sandboxed` runs untrusted code in `python -I -S -B -X utf8 _code_harness.py` inside the
OS sandbox of `isolation.py` (bubblewrap: a fresh unprivileged uid with no capabilities and
`no_new_privs` when the trainer is root, else an unprivileged user namespace; new pid,
network, ipc and mount namespaces; a read-only view of /usr and the Python installation; a
private writable /tmp as cwd, HOME and TMPDIR, a tmpfs of `memory_bytes` (the only writable
place: its files are host memory); rlimits on address space, CPU, file size,
open files and, with a dedicated uid, processes; a libseccomp filter denying ptrace,
namespaces, mounts, SysV IPC, non-AF_UNIX sockets and other kernel attack surface). The code can do anything Python allows inside
that view: nothing it does reaches the trainer's files, processes or network, and every
process it starts dies when the run ends (its pid namespace is torn down). The solution file
is the only file of the run the sandbox can read; expected outputs and test files never
enter it.

Verdicts are the parent's: for stdin/stdout tests the parent compares the captured stdout
with the expected output; assert tests (`assert f(x) == 3`) are converted by the parent
(`_judge.parse_assert_tests`) into the call `f(x)` and the expected value `3` (a literal,
read with `ast.literal_eval`); the sandbox returns the call's value as tagged plain data and
the parent compares it with `==` on fresh builtin objects (never an object of the code's).

Where the sandbox cannot run (no bubblewrap, no user namespaces), code rewards refuse to run
(RuntimeError) unless `allow_unsandboxed_unsafe=True` (config:
`rewards.options.code.allow_unsandboxed_unsafe`), which runs the code as the trainer's own
user with only rlimits, with a warning.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import warnings
import time
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards import _judge, isolation
from jaxrl_reason.rewards.base import RewardResult, register_reward

MAX_CODE_CHARS = 100_000  # longer code scores 0 ("too_long") without running
_STDERR_TAIL = 4096

# ----------------------------------------------------------------------------- extraction

# Fenced blocks pair up in order, so a closing fence is never taken for an opening one.
# Linear: the opening line's quantifiers are possessive (its tag and the rest of the line
# cannot trade characters), and a failed opening has no ``` after it to scan again.
_FENCE = re.compile(r"```[ \t]*+([\w+#.-]*+)[^\n`]*+\n(.*?)```", re.S)
_PY_LANGS = {"", "python", "python3", "py"}
# Longer completions are not searched for code (the code itself is capped at
# MAX_CODE_CHARS; this bounds the parent's scan of a hostile completion).
MAX_COMPLETION_CHARS = 1_000_000


def _last_fenced(text: str) -> str | None:
    if len(text) > MAX_COMPLETION_CHARS:
        return None
    code = None
    for m in _FENCE.finditer(text):
        body = textwrap.dedent(m.group(2)).strip("\n")
        if m.group(1).lower() in _PY_LANGS and body.strip():
            code = body
    return code


def extract_code(completion: str) -> str | None:
    """The Python code of a completion, or None.

    The last non-empty closed fenced block tagged python/python3/py or untagged (blocks in
    other languages are skipped), dedented; else the content of the last
    `<answer>...</answer>`, itself possibly fenced. An unclosed fence does not count.
    Never raises (non-str input gives None); a completion longer than
    `MAX_COMPLETION_CHARS` gives None without being searched.
    """
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    code = _last_fenced(completion)
    if code is not None:
        return code
    close = completion.rfind("</answer>")
    open_ = completion.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ < 0:
        return None
    inner = completion[open_ + len("<answer>"):close]
    code = _last_fenced(inner)
    if code is None:
        code = textwrap.dedent(inner.strip("\n")).strip("\n")
    return code if code.strip() else None


# ---------------------------------------------------------------------------------- sandbox


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (see the module docstring for how each is enforced).

    Attributes:
      wall_s: wall-clock seconds, process start included, before the sandbox is killed.
      cpu_s: CPU seconds (RLIMIT_CPU, rounded up to whole seconds).
      memory_bytes: address space (RLIMIT_AS) of each process, and the size of the run's
        private /tmp (a tmpfs: files there are host memory; writes beyond it fail).
      output_bytes: stdout cap; more kills the run ("output_limit").
      file_bytes: largest file the code may write (RLIMIT_FSIZE).
      open_files: RLIMIT_NOFILE.
      max_processes: RLIMIT_NPROC of the sandbox's own uid (its tasks, threads included);
        None for no limit. Only set when the trainer is root (a dedicated uid per run).
    """

    wall_s: float = 4.0
    cpu_s: float = 2.0
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 64 * 2**10
    file_bytes: int = 16 * 2**20
    open_files: int = 64
    max_processes: int | None = 128


_NUMERIC_LIMITS = ("wall_s", "cpu_s", "memory_bytes", "output_bytes", "file_bytes",
                   "open_files", "max_processes")


def tighten(base: SandboxLimits, overrides: Mapping[str, Any] | None,
            where: str = "example['limits']") -> SandboxLimits:
    """`base` with the `overrides` that make it stricter (a smaller number; a process limit
    where `base` has none); looser or unknown values are ignored, so data cannot weaken the
    sandbox. ValueError (naming `where`) for a field that does not exist or a non-number."""
    if not overrides:
        return base
    if not isinstance(overrides, Mapping):
        raise ValueError(f"code: {where} must be a mapping, got {type(overrides).__name__}")
    changes = {}
    for name, value in overrides.items():
        if name not in _NUMERIC_LIMITS:
            raise ValueError(f"code: {where} has unknown or non-tightenable field {name!r} "
                             f"(allowed: {', '.join(_NUMERIC_LIMITS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise ValueError(f"code: {where}[{name!r}] must be a positive finite number, "
                             f"got {value!r}")
        current = getattr(base, name)
        if current is None or value < current:
            changes[name] = type(current)(value) if current is not None else int(value)
    return dataclasses.replace(base, **changes)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    Attributes:
      status: "ok" (exit 0), "error" (nonzero exit or killed by a signal), "timeout",
        "memory", "output_limit" or "syntax_error".
      stdout: decoded stdout (UTF-8, invalid bytes replaced), at most output_bytes.
      stderr_tail: the last few KiB of stderr.
      wall_s: wall time of the run, process start included.
      results: with `calls`: the sandbox's list of `["ok", data] | ["raise", name]` (to
        decode with `_judge`), or None when it sent none (or garbage).
    """

    status: str
    stdout: str
    stderr_tail: str
    wall_s: float
    results: list | None = None


_HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_code_harness.py")
_WARNED: set[str] = set()


def sandbox_ready(allow_unsandboxed_unsafe: bool = False) -> bool:
    """Whether runs are isolated; RuntimeError when they cannot be and the caller has not
    opted in to running code unsandboxed (then a warning, once)."""
    if isolation.available():
        return True
    if not allow_unsandboxed_unsafe:
        raise RuntimeError(
            f"code reward: the OS sandbox is unavailable ({isolation.unavailable_reason()}). "
            "Refusing to run model code. To run it anyway as your own user with only "
            "rlimits, set rewards.options.code.allow_unsandboxed_unsafe=True")
    if "unsafe" not in _WARNED:
        _WARNED.add("unsafe")
        warnings.warn("code reward: running model code WITHOUT a sandboxed process "
                      "(allow_unsandboxed_unsafe=True)", RuntimeWarning)
    return False


def _command(solution_dir: str, cfg: dict, limits: SandboxLimits, isolated: bool,
             info_fd: int, seccomp: int | None) -> list[str]:
    """The command line of one run: the harness in the sandbox, its private /tmp as large
    as the run's memory limit (files there are host memory); unsandboxed, under `prlimit`
    (by the absolute path `shutil.which` finds) when there is one."""
    cpu = max(1, math.ceil(limits.cpu_s))
    rlimits = isolation.rlimit_args(limits.memory_bytes, cpu, limits.file_bytes,
                                    limits.open_files, limits.max_processes)
    argv = [sys.executable, "-I", "-S", "-B", "-X", "utf8", _HARNESS, json.dumps(cfg)]
    if isolated:
        return isolation.sandbox_command(argv, files=[solution_dir, _HARNESS], rlimits=rlimits,
                                         info_fd=info_fd, seccomp=seccomp,
                                         tmp_bytes=max(4096, int(limits.memory_bytes)))
    prlimit = shutil.which("prlimit")
    return ([os.path.abspath(prlimit), *rlimits, "--"] if prlimit else []) + argv


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until `pid` exits without reaping it (so its pgid stays reserved for killpg);
    False at the deadline."""
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def run_sandboxed(code: str, stdin: str = "", limits: SandboxLimits | None = None, *,
                  calls: list[str] | None = None,
                  allow_unsandboxed_unsafe: bool = False) -> SandboxResult:
    """Run Python `code` in the sandbox described in the module docstring.

    `stdin` is the program's standard input (fed from an unlinked file, so it never blocks).
    With `calls` (Python expression sources), they are evaluated after `code` in its
    `__main__` namespace (a SystemExit of `code` does not skip them) and their values come
    back in `results`. The sandbox is killed at `limits.wall_s` (counted from the call) or
    once stdout exceeds `limits.output_bytes`. The status pipe (which the code can write
    too) is read with limits (`_parse_status`): a `result` line that is too large, too
    deeply nested or not a JSON list makes the run "error". Nothing the code does makes
    this raise; host failures (no temp dir, cannot spawn) raise OSError; RuntimeError when
    the sandbox is unavailable and `allow_unsandboxed_unsafe` is False.
    """
    limits = limits or SandboxLimits()
    isolated = sandbox_ready(allow_unsandboxed_unsafe)
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="jaxrl_code_")
    status_r, status_w = os.pipe()
    info_r, info_w = os.pipe()
    seccomp = isolation.seccomp_fd() if isolated else None
    try:
        os.chmod(tmp, 0o755)
        solution = os.path.join(tmp, "solution.py")
        with open(solution, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(solution, 0o644)
        cfg = {"status_fd": status_w, "solution": solution, "calls": calls}
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8", "replace"))
            stdin_file.seek(0)
            proc = subprocess.Popen(
                _command(tmp, cfg, limits, isolated, info_w, seccomp), stdin=stdin_file,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd="/" if isolated else tmp,
                env=isolation.sandbox_env() if isolated else {
                    "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
                pass_fds=tuple(fd for fd in (status_w, info_w, seccomp) if fd is not None),
                start_new_session=True)
        for fd in (status_w, info_w):
            os.close(fd)
        status_w = info_w = -1
        try:
            deadline = start + limits.wall_s
            status_cap = limits.output_bytes + 2**16
            killed, out, err, status = _collect(proc, status_r, deadline, limits.output_bytes,
                                                status_cap)
            if killed is None and not _wait_unreaped(proc.pid, deadline):
                killed = "timeout"
        finally:  # the leader is not reaped yet, so its pgid cannot have been reused
            os.set_blocking(info_r, False)
            try:
                info = os.read(info_r, 4096)
            except OSError:
                info = b""
            if isolated:
                isolation.kill_sandbox(proc, isolation.sandbox_pid(info))
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    finally:
        for fd in (status_r, status_w, info_r, info_w, -1 if seccomp is None else seccomp):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
    stderr = err[-_STDERR_TAIL:].decode("utf-8", "replace")
    lines, results, problem = _parse_status(status, status_cap, calls is not None)
    verdict = _status(killed, proc.returncode, lines, stderr)
    if problem is not None and killed is None:
        # a status pipe the parent will not read is a failed run, whatever the exit code
        verdict = "error"
        stderr = (f"[sandbox] status pipe rejected: {problem}\n" + stderr)[:_STDERR_TAIL]
    return SandboxResult(verdict, out.decode("utf-8", "replace"), stderr,
                         time.monotonic() - start, results)


# Deepest JSON nesting accepted on the status pipe. The harness's deepest honest line is
# about 3 * its `_MAX_DEPTH` (50) + 3 levels; `_judge.decode` stops at 60 values anyway.
_STATUS_MAX_DEPTH = 256
_JSON_SPECIAL = re.compile(r'[\[\]{}"\\]')  # one character at a time: linear


def _json_depth_ok(text: str, limit: int) -> bool:
    """Whether the brackets of JSON `text` (outside strings) nest at most `limit` deep;
    one pass over its brackets, quotes and backslashes, no recursion (malformed text is
    left to the JSON parser)."""
    depth, in_string, skip = 0, False, -1
    for m in _JSON_SPECIAL.finditer(text):
        i = m.start()
        if i == skip:  # the character after a backslash in a string
            continue
        c = text[i]
        if in_string:
            if c == "\\":
                skip = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return False
        elif c in "]}":
            depth -= 1
    return True


def _parse_status(status: bytes, cap: int, calls: bool
                  ) -> tuple[list[str], list | None, str | None]:
    """(status lines, the last `result <json>` line's list or None, why the pipe is
    rejected or None). Only with `calls` is a result read: rejected when the pipe carried
    more than `cap` bytes, or its result line nests deeper than `_STATUS_MAX_DEPTH`, is not
    JSON, or is not a list. Never raises (the pipe is the sandbox's)."""
    lines = status[:cap].decode("utf-8", "replace").splitlines()
    if not calls:
        return lines, None, None
    if len(status) > cap:
        return lines, None, f"more than {cap} bytes"
    line = next((x for x in reversed(lines) if x.startswith("result ")), None)
    if line is None:
        return lines, None, None
    text = line[len("result "):]
    if not _json_depth_ok(text, _STATUS_MAX_DEPTH):
        return lines, None, f"result nested deeper than {_STATUS_MAX_DEPTH}"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError, MemoryError) as e:
        return lines, None, f"result is not JSON ({type(e).__name__})"
    if not isinstance(data, list):
        return lines, None, f"result is a JSON {type(data).__name__}, not a list"
    return lines, data, None


def _collect(proc: subprocess.Popen, status_fd: int, deadline: float, cap: int,
             status_cap: int) -> tuple[str | None, bytes, bytes, bytes]:
    """Read stdout (capped), stderr (tail) and the status pipe until EOF on all or a limit:
    (kill reason or None, stdout, stderr, status)."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(),
            status_fd: bytearray()}
    poller = select.poll()
    for fd in bufs:
        poller.register(fd, select.POLLIN)
    open_fds = set(bufs)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    killed = None
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed = "timeout"
            break
        for fd, _ in poller.poll(remaining * 1000):
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            buf = bufs[fd]
            buf += chunk
            if fd == err_fd and len(buf) > 2 * _STDERR_TAIL:
                del buf[:-_STDERR_TAIL]
            elif fd == status_fd and len(buf) > status_cap:
                del buf[status_cap + 1:]  # one byte over: the parent sees it overflowed
        if len(bufs[out_fd]) > cap:
            killed = "output_limit"
            del bufs[out_fd][cap:]
            break
    proc.stdout.close()
    proc.stderr.close()
    return killed, bytes(bufs[out_fd]), bytes(bufs[err_fd]), bytes(bufs[status_fd])


def _status(killed: str | None, returncode: int, lines: list[str], stderr: str) -> str:
    if killed is not None:
        return killed
    # bwrap reports a child killed by signal N as exit status 128 + N
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if signum == signal.SIGXCPU:
        return "timeout"
    if "memory" in lines or "MemoryError" in stderr:
        return "memory"
    if "syntax_error" in lines:
        return "syntax_error"
    return "ok" if returncode == 0 else "error"


# ----------------------------------------------------------------------------------- reward

DEFAULT_LIMITS = SandboxLimits()


def _parse_tests(raw: Any) -> list[tuple[Any, str | None]]:
    """[(stdin, expected stdout)] or [(list of `_judge.Check`, None)] for assert programs;
    ValueError if malformed, empty, or an assert form that cannot be judged by the parent."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"code: example['tests'] is not valid JSON: {e}") from None
    if isinstance(raw, Mapping) and "inputs" in raw and "outputs" in raw:
        raw = [{"input": i, "output": o} for i, o in zip(raw["inputs"], raw["outputs"])]
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"code: example['tests'] must be a non-empty list, got {raw!r:.200}")

    def text(v: Any) -> str:
        return "\n".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    out = []
    for n, item in enumerate(raw):
        if isinstance(item, str):
            out.append((_judge.parse_assert_tests(item, f"example['tests'][{n}]"), None))
        elif isinstance(item, Mapping) and "input" in item and "output" in item:
            out.append((text(item["input"]), text(item["output"])))
        else:
            raise ValueError(f"code: bad test case {item!r:.200}")
    return out


def _normalize(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.replace("\r\n", "\n").rstrip().split("\n"))


@register_reward("code")
def code_reward(completion: str, example: Mapping[str, Any], *,
                limits: SandboxLimits | Mapping[str, Any] | None = None,
                allow_unsandboxed_unsafe: bool = False) -> RewardResult:
    """Fraction of `example["tests"]` that the completion's code passes.

    `example["tests"]` is a list (or its JSON string, or APPS-style {"inputs", "outputs"})
    of {"input": str, "output": str} stdin/stdout cases (outputs compared by the parent after
    stripping trailing whitespace of each line and of the whole) and/or str programs of
    asserts (`assert f(1) == 2`, `assert f(1)`, `assert not f(1)`; see `_judge`), whose calls
    are evaluated in the sandbox after the solution and compared by the parent with the
    expected literals (pass = every call returned plain data equal to its expected value).
    Each test is one sandboxed run, sequentially. After the first timeout or syntax error the
    remaining tests count as failed without running, so a call takes at most about (number
    of tests) x wall_s, and one wall_s when the code hangs.

    `limits` (keyword, from the trusted config; a SandboxLimits or a mapping of field
    overrides) defaults to DEFAULT_LIMITS; an optional `example["limits"]` mapping can only
    tighten them (`tighten`). A stdin/stdout case's output cap is raised to twice its
    expected output plus 4 KiB. `allow_unsandboxed_unsafe`: see `sandbox_ready`. Reason: None
    when all pass, else that of the first failure: "no_code", "too_long", "wrong_output",
    "error", "timeout", "memory", "output_limit", "syntax_error". Raises ValueError only
    when the example has no usable tests (missing, empty or malformed: a data bug) or
    its limits are malformed; RuntimeError when the sandbox is unavailable (see above).
    """
    if "tests" not in example:
        raise ValueError(f"code: example has no 'tests' key (keys: {sorted(example)})")
    tests = _parse_tests(example["tests"])
    base = limits if isinstance(limits, SandboxLimits) else DEFAULT_LIMITS
    if isinstance(limits, Mapping):
        base = dataclasses.replace(base, **limits)
    base = tighten(base, example.get("limits"))
    code = extract_code(completion)
    if code is None:
        return RewardResult(0.0, "no_code")
    if len(code) > MAX_CODE_CHARS:
        return RewardResult(0.0, "too_long")
    passed, reason = 0, None
    for source, expected in tests:
        if expected is None:
            res = run_sandboxed(code, "", base, calls=[c.call for c in source],
                                allow_unsandboxed_unsafe=allow_unsandboxed_unsafe)
            kind = res.status if res.status != "ok" else (
                None if _judge.passes(res.results, source) else "wrong_output")
        else:
            cap = max(base.output_bytes, 2 * len(expected.encode()) + 4096)
            res = run_sandboxed(code, source, dataclasses.replace(base, output_bytes=cap),
                                allow_unsandboxed_unsafe=allow_unsandboxed_unsafe)
            kind = res.status if res.status != "ok" else (
                None if _normalize(res.stdout) == _normalize(expected) else "wrong_output")
        if kind is None:
            passed += 1
            continue
        reason = reason or kind
        if kind in ("timeout", "syntax_error"):
            break
    return RewardResult(passed / len(tests), reason)
