r"""Python code answers: extraction, a sandboxed runner, and the `code` reward.

`run_sandboxed` runs untrusted code in a child `python -I -S -B -X utf8` (sys.executable)
whose cwd, HOME and TMPDIR is a fresh temporary directory (removed afterwards), with only
those three environment variables, in its own session; its whole process group is SIGKILLed
when the run ends for any reason. Before the user code, a bootstrap (`_BOOTSTRAP`):

1. unshares a network namespace (CLONE_NEWNET; os.unshare on 3.12+, else libc via ctypes,
   which is then unloaded): only a down loopback, so no network even for C extensions.
   Skipped silently when not permitted (it needs root/CAP_SYS_ADMIN; it works here).
2. when the parent runs as root (as here): drops to uid/gid `nobody` keeping only
   CAP_DAC_READ_SEARCH (to read the interpreter under /root, mode 0700), empties the
   capability bounding set and sets no_new_privs. The kernel then forbids writing outside
   the temp dir (chowned to nobody) and world-writable dirs, signalling root processes,
   mknod, raising hard rlimits, and enforces RLIMIT_NPROC.
3. sets rlimits: RLIMIT_AS `memory_bytes`, RLIMIT_CPU `cpu_s` (SIGXCPU, hard 1 s later),
   RLIMIT_FSIZE `file_bytes`, RLIMIT_NOFILE `open_files`, RLIMIT_CORE 0, and RLIMIT_NPROC
   `max_processes` only with step 2 (root is exempt from it, and for the trainer's own uid
   it would count the trainer's threads).
4. replaces functions that have no audit event with stubs that count as blocked:
   `_posixsubprocess.fork_exec`, `os.mknod`, `os.chroot`, `os.unshare`, `os.setns`.
5. installs a `sys.addaudithook` hook that raises PermissionError, and makes the run
   "blocked" even if the code catches it, on:
   - every `socket.*` event (creation, connect, bind, getaddrinfo, ...) and `ctypes.*`;
   - `os.fork`, `os.forkpty`, `os.posix_spawn`, `os.spawn`, `os.exec`, `os.system`,
     `subprocess.Popen`, `os.kill`, `os.killpg`, `signal.pthread_kill`,
     `resource.setrlimit`, `resource.prlimit`, `fcntl.ioctl`, `os.link`, `os.symlink`,
     `webbrowser.open`, sqlite extension loading, and `import` (including
     `_imp.create_dynamic`) of ctypes, _ctypes, _posixsubprocess, _testcapi and
     _testinternalcapi;
   - `open` (builtin/io/os.open/open_code) for writing (mode w/a/x/+ or write, create,
     truncate or append flags) unless the realpath is inside the temp dir or /dev/null,
     relative-path writes through os.open (its dir_fd is not audited), more than
     `_MAX_WRITE_OPENS` write opens; for reading unless inside the temp dir, the
     interpreter's sys.path (the stdlib: site-packages is not on it under -S) or
     /dev/{null,zero,urandom,random}. Integer fds are allowed;
   - `os.listdir`, `os.scandir`, `os.chdir` outside those read roots; `os.mkdir`,
     `os.remove`, `os.rmdir`, `os.rename`, `os.truncate`, `os.chmod`, `os.chown`,
     `os.utime`, `os.setxattr`, `os.removexattr` outside the temp dir or with a dir_fd;
     `sqlite3.connect` to a database outside the temp dir.

The user code then runs as `__main__` (with `exit`/`quit`, which -S leaves undefined).

Caveats: PEP 578 hooks are not a security boundary; code that corrupts memory (a CPython
crash bug turned exploit) gets past them and then holds nobody's rights plus
CAP_DAC_READ_SEARCH (reads any file), or full root where step 2 is unavailable. There is
no PID or mount namespace. For adversarial use at scale, also run the verifier under
gVisor/nsjail or in a throwaway container.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pwd
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from typing import Any

from jaxrl_reason.rewards.base import RewardResult, register_reward

MAX_CODE_CHARS = 100_000  # longer code scores 0 ("too_long") without running
_MAX_WRITE_OPENS = 64  # file creations/write opens per run (bounds disk use with FSIZE)
_STDERR_TAIL = 4096

# ----------------------------------------------------------------------------- extraction

# Fenced blocks pair up in order, so a closing fence is never taken for an opening one.
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n`]*\n(.*?)```", re.S)
_PY_LANGS = {"", "python", "python3", "py"}


def _last_fenced(text: str) -> str | None:
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
    Never raises (non-str input gives None).
    """
    if not isinstance(completion, str):
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
      wall_s: wall-clock seconds, process start included, before the group is killed.
      cpu_s: CPU seconds (RLIMIT_CPU, rounded up to whole seconds).
      memory_bytes: address space (RLIMIT_AS).
      output_bytes: stdout cap; more kills the run ("output_limit").
      file_bytes: largest file the code may write (RLIMIT_FSIZE).
      open_files: RLIMIT_NOFILE.
      max_processes: RLIMIT_NPROC of the `nobody` uid (all its tasks, threads included, in
        every concurrent sandbox); None for no limit. Only set when running as nobody.
      run_as_nobody: drop to `nobody` when running as root.
      network_namespace: unshare a fresh network namespace when permitted.
    """

    wall_s: float = 4.0
    cpu_s: float = 2.0
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 64 * 2**10
    file_bytes: int = 16 * 2**20
    open_files: int = 64
    max_processes: int | None = 512
    run_as_nobody: bool = True
    network_namespace: bool = True


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    Attributes:
      status: "ok" (exit 0), "error" (nonzero exit or killed by a signal), "timeout",
        "memory", "output_limit", "syntax_error", or "blocked": the audit hook or a stub
        fired, which wins over everything else (the code may have caught the error).
      stdout: decoded stdout (UTF-8, invalid bytes replaced), at most output_bytes.
      stderr_tail: the last few KiB of stderr.
      wall_s: wall time of the run, process start included.
    """

    status: str
    stdout: str
    stderr_tail: str
    wall_s: float


# The child program (`python -c`; argv[1] is a JSON config). It reports on the status pipe:
# "blocked <event>", "memory", "syntax_error" and, after assert tests ran, "done <nonce>".
_BOOTSTRAP = r"""
import json, os, sys
def _main():
    cfg = json.loads(sys.argv.pop(1))
    def report(msg):
        try:
            os.write(cfg["status_fd"], (msg + "\n").encode())
        except OSError:
            pass
    libc_netns = cfg["netns"] and not hasattr(os, "unshare")
    if libc_netns or cfg["uid"]:
        try:
            import ctypes
            libc, u32 = ctypes.CDLL(None, use_errno=True), ctypes.c_uint32
            if libc_netns:
                libc.unshare(0x40000000)  # CLONE_NEWNET
            if cfg["uid"]:
                for cap in set(range(64)) - {2}:  # keep CAP_DAC_READ_SEARCH (2) only
                    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
                libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
                os.setgroups([]); os.setgid(cfg["uid"][1]); os.setuid(cfg["uid"][0])
                libc.capset((u32 * 2)(0x20080522, 0), (u32 * 6)(4, 4, 0, 0, 0, 0))
                libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        except Exception:
            pass
        for m in [m for m in sys.modules if m.startswith(("ctypes", "_ctypes"))]:
            del sys.modules[m]
    elif cfg["netns"]:
        try:
            os.unshare(os.CLONE_NEWNET)
        except OSError:
            pass
    import _posixsubprocess, builtins, resource, types
    for name, soft, hard in cfg["rlimits"]:
        res, cur = getattr(resource, name), resource.getrlimit(getattr(resource, name))[1]
        hard = hard if cur == resource.RLIM_INFINITY else min(hard, cur)
        resource.setrlimit(res, (min(soft, hard), hard))
    state = {"fired": False, "writes": 0}
    def blocked(what, *_):
        if not state["fired"]:
            state["fired"] = True
            report("blocked " + what)
        raise PermissionError("sandbox: " + what + " is not allowed")
    _posixsubprocess.fork_exec = lambda *a: blocked("_posixsubprocess.fork_exec")
    for mod in (os, sys.modules["posix"]):
        for name in ("mknod", "chroot", "unshare", "setns"):
            if hasattr(mod, name):
                setattr(mod, name, lambda *a, _n="os." + name, **k: blocked(_n))
    real, max_writes, tmp = os.path.realpath, cfg["max_writes"], os.path.realpath(cfg["tmp"])
    reads = [tmp] + [real(p) for p in sys.path if p]
    read_files = {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}
    def inside(p, roots):
        p = real(os.fsdecode(os.fspath(p)))
        return p in roots or any(p.startswith(r + os.sep) for r in roots)
    def may_read(p):
        return isinstance(p, int) or inside(p, read_files) or inside(p, reads)
    def may_modify(p, allow_fd=False):
        return allow_fd if isinstance(p, int) else inside(p, [tmp])
    WFLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def check_open(path, mode, flags):
        if isinstance(path, int):
            return True
        if not (any(c in mode for c in "wax+") if isinstance(mode, str) else flags & WFLAGS):
            return may_read(path)
        if inside(path, ["/dev/null"]):
            return True
        if mode is None and not os.path.isabs(os.fsdecode(os.fspath(path))):
            return False  # os.open's dir_fd is not audited
        state["writes"] += 1
        return state["writes"] <= max_writes and may_modify(path)
    # event -> (indices of path arguments, indices of dir_fd arguments)
    MODIFY = {"os.mkdir": ((0,), (2,)), "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
              "os.rename": ((0, 1), (2, 3)), "os.truncate": ((0,), ()),
              "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
              "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ())}
    DENY = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
            "os.startfile", "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
            "resource.setrlimit", "resource.prlimit", "os.link", "os.symlink", "fcntl.ioctl",
            "webbrowser.open", "sqlite3.enable_load_extension", "sqlite3.load_extension"}
    DENY_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi"}
    def allowed(event, args):
        if event in DENY or event.startswith(("socket.", "ctypes.")):
            return False
        if event == "open":
            return check_open(*args[:3])
        if event == "import":
            return args[0] not in DENY_IMPORTS
        if event in ("os.listdir", "os.scandir", "os.chdir"):
            return may_read("." if args[0] is None else args[0])
        if event in MODIFY:
            paths, dir_fds = MODIFY[event]
            return all(args[i] in (None, -1) for i in dir_fds) and all(
                may_modify(args[i], event == "os.truncate") for i in paths)
        if event == "sqlite3.connect":
            db = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else "file:"
            return db in ("", ":memory:") or (not db.startswith("file:") and may_modify(db))
        return True
    def hook(event, args):  # no reentrancy flag: one would be racy across threads
        try:
            ok = allowed(event, args)
        except Exception:
            ok = False
        if not ok:
            blocked(event + repr(tuple(args)[:2])[:160])
    def read(name):
        with open(os.path.join(tmp, name), encoding="utf-8") as f:
            return f.read()
    try:
        code = compile(read("solution.py"), "solution.py", "exec")
        tests = compile(read("tests.py"), "tests.py", "exec") if cfg["tests"] else None
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        report("syntax_error")
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        os._exit(1)
    done = "done " + cfg.pop("nonce")
    builtins.exit = builtins.quit = sys.exit  # -S leaves them undefined
    sys.argv[:] = ["solution.py"]
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    sys.addaudithook(hook)
    try:
        try:
            exec(code, main.__dict__)
        except SystemExit:
            if tests is None:
                raise
        if tests is not None:
            exec(tests, main.__dict__)
            sys.stdout.flush()
            report(done)
    except MemoryError:
        report("memory")
        raise
_main()
"""


def _nobody(limits: SandboxLimits) -> list[int] | None:
    """[uid, gid] of `nobody` to drop to (only as root), or None."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return [entry.pw_uid, entry.pw_gid] if limits.run_as_nobody and os.geteuid() == 0 else None


def _rlimits(limits: SandboxLimits, nobody: bool) -> list[tuple[str, int, int]]:
    cpu = max(1, math.ceil(limits.cpu_s))
    out = [("RLIMIT_AS", limits.memory_bytes, limits.memory_bytes),
           ("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_CORE", 0, 0),
           ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes),
           ("RLIMIT_NOFILE", limits.open_files, limits.open_files)]
    if nobody and limits.max_processes is not None:
        out.append(("RLIMIT_NPROC", limits.max_processes, limits.max_processes))
    return out


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
                  tests: str | None = None) -> SandboxResult:
    """Run Python `code` in the sandbox described in the module docstring.

    `stdin` is the program's standard input (read from a file, so feeding it never blocks).
    With `tests` (Python source such as asserts), they run after `code` in the same
    `__main__` namespace, and "ok" also requires that they ran to the end (a SystemExit
    raised by `code` does not skip them; os._exit does, which gives "error"). The process
    group is killed at `limits.wall_s` (counted from the call) or once stdout exceeds
    `limits.output_bytes`. Nothing the code does makes this raise; host failures (no temp
    dir, cannot spawn) raise OSError.
    """
    limits = limits or SandboxLimits()
    start = time.monotonic()
    nonce, nobody = secrets.token_hex(16), _nobody(limits)
    tmp = tempfile.mkdtemp(prefix="jaxrl_code_")
    status_r, status_w = os.pipe()
    try:
        for name, text in (("solution.py", code), ("input.txt", stdin), ("tests.py", tests)):
            if text is not None:
                with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                    f.write(text)
        if nobody is not None:
            os.chown(tmp, *nobody)
        cfg = {"status_fd": status_w, "tmp": tmp, "nonce": nonce, "tests": tests is not None,
               "rlimits": _rlimits(limits, nobody is not None), "uid": nobody,
               "netns": limits.network_namespace, "max_writes": _MAX_WRITE_OPENS}
        with open(os.path.join(tmp, "input.txt"), "rb") as stdin_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP,
                 json.dumps(cfg)],
                stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=tmp, env={"HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"},
                pass_fds=(status_w,), start_new_session=True)
        os.close(status_w)
        status_w = -1
        try:
            deadline = start + limits.wall_s
            killed, out, err, status = _collect(proc, status_r, deadline, limits.output_bytes)
            if killed is None and not _wait_unreaped(proc.pid, deadline):
                killed = "timeout"
        finally:  # the leader is not reaped yet, so its pgid cannot have been reused
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        os.set_blocking(status_r, False)
        try:  # what the status pipe still holds after a kill
            status += os.read(status_r, 65536)
        except OSError:
            pass
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
    stderr = err[-_STDERR_TAIL:].decode("utf-8", "replace")
    return SandboxResult(_status(killed, proc.returncode, status, nonce, tests, stderr),
                         out.decode("utf-8", "replace"), stderr, time.monotonic() - start)


def _collect(proc: subprocess.Popen, status_fd: int, deadline: float, cap: int
             ) -> tuple[str | None, bytes, bytes, bytes]:
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
            elif fd == status_fd and len(buf) > 4096:
                del buf[4096:]
        if len(bufs[out_fd]) > cap:
            killed = "output_limit"
            del bufs[out_fd][cap:]
            break
    proc.stdout.close()
    proc.stderr.close()
    return killed, bytes(bufs[out_fd]), bytes(bufs[err_fd]), bytes(bufs[status_fd])


def _status(killed: str | None, returncode: int, status: bytes, nonce: str,
            tests: str | None, stderr: str) -> str:
    lines = status.decode("utf-8", "replace").splitlines()
    if any(line.startswith("blocked ") for line in lines):
        return "blocked"  # even when the code caught the exception and went on
    if killed is not None:
        return killed
    if returncode == -signal.SIGXCPU:
        return "timeout"
    if "memory" in lines or (returncode < 0 and "MemoryError" in stderr):
        return "memory"
    if "syntax_error" in lines:
        return "syntax_error"
    if returncode != 0 or (tests is not None and f"done {nonce}" not in lines):
        return "error"
    return "ok"


# ----------------------------------------------------------------------------------- reward

DEFAULT_LIMITS = SandboxLimits()


def _parse_tests(raw: Any) -> list[tuple[str, str | None]]:
    """[(stdin, expected stdout)] or [(assert source, None)]; ValueError if malformed/empty."""
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
    for item in raw:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, Mapping) and "input" in item and "output" in item:
            out.append((text(item["input"]), text(item["output"])))
        else:
            raise ValueError(f"code: bad test case {item!r:.200}")
    return out


def _normalize(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.replace("\r\n", "\n").rstrip().split("\n"))


@register_reward("code")
def code_reward(completion: str, example: Mapping[str, Any], *,
                limits: SandboxLimits | Mapping[str, Any] | None = None) -> RewardResult:
    """Fraction of `example["tests"]` that the completion's code passes.

    `example["tests"]` is a list (or its JSON string, or APPS-style {"inputs", "outputs"})
    of {"input": str, "output": str} stdin/stdout cases (outputs compared after stripping
    trailing whitespace of each line and of the whole) and/or str Python sources (asserts)
    run after the solution in the same program (pass = they ran to the end, exit 0). Each
    test is one sandboxed run, sequentially. After the first timeout, syntax error or
    blocked run the remaining tests count as failed without running, so a call takes at
    most about (number of tests) x wall_s, and one wall_s when the code hangs.

    `limits` (keyword; a SandboxLimits or a mapping of field overrides, also taken from an
    optional `example["limits"]` mapping) defaults to DEFAULT_LIMITS; a stdin/stdout case's
    output cap is raised to twice its expected output plus 4 KiB. Reason: None when all
    pass, else that of the first failure: "no_code", "too_long", "wrong_output", "error",
    "timeout", "memory", "output_limit", "blocked", "syntax_error". Raises ValueError only
    when the example has no usable tests (missing, empty or malformed: a data bug).
    """
    if "tests" not in example:
        raise ValueError(f"code: example has no 'tests' key (keys: {sorted(example)})")
    tests = _parse_tests(example["tests"])
    base = limits if isinstance(limits, SandboxLimits) else DEFAULT_LIMITS
    for overrides in (limits, example.get("limits")):
        if isinstance(overrides, Mapping):
            base = dataclasses.replace(base, **overrides)
    code = extract_code(completion)
    if code is None:
        return RewardResult(0.0, "no_code")
    if len(code) > MAX_CODE_CHARS:
        return RewardResult(0.0, "too_long")
    passed, reason = 0, None
    for source, expected in tests:
        if expected is None:
            res = run_sandboxed(code, "", base, tests=source)
            kind = None if res.status == "ok" else res.status
        else:
            cap = max(base.output_bytes, 2 * len(expected.encode()) + 4096)
            res = run_sandboxed(code, source, dataclasses.replace(base, output_bytes=cap))
            kind = res.status if res.status != "ok" else (
                None if _normalize(res.stdout) == _normalize(expected) else "wrong_output")
        if kind is None:
            passed += 1
            continue
        reason = reason or kind
        if kind in ("timeout", "syntax_error", "blocked"):
            break
    return RewardResult(passed / len(tests), reason)
