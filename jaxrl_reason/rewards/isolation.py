"""OS-level isolation for every process that handles untrusted text (code answers, math).

`sandbox_command(argv, ...)` wraps a command line so that it runs under bubblewrap
(`bwrap`, Debian package `bubblewrap`) in:

- new pid, network, ipc, uts and mount namespaces (`--new-session`, `--die-with-parent`):
  the process sees no other process (it cannot signal or `pidfd_open` its parent), has only
  a down loopback, and everything it starts dies with it;
- a mount namespace holding only read-only binds of `/usr` (and the `/lib*`, `/bin`
  symlinks), the Python installation (`sys.base_prefix`, `sys.prefix`, the site-packages
  directories) and the extra files the caller names, a private `/tmp` tmpfs, `/proc` of its
  own pid namespace and a minimal `/dev`: no workdir, no `/root`, no `/etc`, no home;
- an empty environment (`PATH` only);
- rlimits applied by `prlimit` before the program starts (address space, CPU, file size,
  open files, no core dumps, and processes when a dedicated uid is used);
- as root: a fresh uid/gid drawn from `UID_BASE + [0, UID_COUNT)` per sandbox (no passwd
  entry, owns no file), no supplementary groups, an empty capability bounding
  set, no inheritable/ambient capabilities and `no_new_privs` (`setpriv`), so it owns no file
  and may signal no other process; not as root: an unprivileged user namespace with every
  capability dropped (`--cap-drop ALL`), `no_new_privs` (bwrap sets it) and no nested user
  namespaces (`--disable-userns`).

`available()` says whether this works on the host (checked once, by running `true` inside).
There is no seccomp filter: no maintained libseccomp binding is a dependency of the package;
the namespaces, the uid and the missing capabilities are the boundary.
"""
from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import site
import subprocess
import sys
from collections.abc import Sequence

# As root, each sandbox runs as its own uid from this range (no passwd entry, owns no file):
# RLIMIT_NPROC then bounds that sandbox alone, and no two sandboxes can signal each other.
UID_BASE = 1 << 20
UID_COUNT = 1 << 20
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether `sandbox_command` works here (bwrap, prlimit, setpriv as root, namespaces)."""
    if not all(shutil.which(t) for t in ("bwrap", "prlimit")):
        return False
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return False
    try:
        done = subprocess.run(sandbox_command([sys.executable, "-I", "-S", "-c", "pass"]),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=sandbox_env(), timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def sandbox_env() -> dict[str, str]:
    """The environment to start the wrapped command with (bwrap clears it again inside)."""
    return {"PATH": _SANDBOX_PATH, "LANG": "C.UTF-8"}


def _python_roots() -> list[str]:
    """Directories of the running Python installation the sandbox must read."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    for p in site.getsitepackages():
        if os.path.isdir(p):
            roots.add(os.path.realpath(p))
    roots.add(os.path.dirname(os.path.realpath(sys.executable)))
    # keep only outermost directories, and nothing that would expose the whole system
    roots = {r for r in roots if r not in ("/", "/root", "/home", "/etc")}
    return sorted(r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots))


def _parents(path: str) -> list[str]:
    """The ancestors of an absolute `path`, outermost first (`/a/b/c` -> `/a`, `/a/b`)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bind_args(sources: Sequence[str]) -> list[str]:
    """Read-only binds of `sources` at their own paths, parents created world-traversable."""
    args, made = [], {"/usr", "/tmp", "/proc", "/dev"}
    for src in sources:
        for parent in _parents(src):
            if parent not in made and not parent.startswith("/usr/"):
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", src, src]
        made.add(src)
    return args


def rlimit_args(memory_bytes: int, cpu_s: int, file_bytes: int, open_files: int,
                processes: int | None) -> list[str]:
    """`prlimit` options (soft = hard) for the wrapped program; `processes` only applies
    with a dedicated uid (as root): it counts every task (threads too) of the sandbox."""
    out = [f"--as={memory_bytes}", f"--cpu={cpu_s}:{cpu_s + 1}", f"--fsize={file_bytes}",
           f"--nofile={open_files}", "--core=0"]
    if processes is not None and os.geteuid() == 0:
        out.append(f"--nproc={processes}")
    return out


def sandbox_command(argv: Sequence[str], *, files: Sequence[str] = (),
                    rlimits: Sequence[str] = (), chdir: str = "/tmp",
                    info_fd: int | None = None, die_with_parent: bool = True) -> list[str]:
    """`argv` wrapped in bwrap + prlimit (+ setpriv as root), as described in the module
    docstring. `files`: absolute paths (files or directories) bound read-only at their own
    path; `rlimits`: `prlimit` options (see `rlimit_args`); `info_fd`: a descriptor (passed
    to the child) on which bwrap writes `{"child-pid": N}`, for `kill_sandbox`. Start it with
    `sandbox_env()`. `die_with_parent=False` for a long-lived sandbox started from a thread
    that may exit first (the kernel's parent-death signal follows the creating thread): it
    must then end itself when its stdin closes."""
    for f in files:
        if not os.path.isabs(f):
            raise ValueError(f"isolation: bind path must be absolute, got {f!r}")
    root = os.geteuid() == 0
    cmd = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--new-session"]
    if die_with_parent:
        cmd.append("--die-with-parent")
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if not root:
        cmd += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib32", "lib64", "sbin"):
        if os.path.islink("/" + link):
            cmd += ["--symlink", os.readlink("/" + link), "/" + link]
        elif os.path.isdir("/" + link):
            cmd += ["--ro-bind", "/" + link, "/" + link]
    # /tmp first: binds of host paths under /tmp then land on top of the private tmpfs
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    cmd += _bind_args([*_python_roots(), *files])
    cmd += ["--chdir", chdir, "--clearenv", "--setenv", "PATH", _SANDBOX_PATH, "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--"]
    cmd += ["prlimit", *rlimits, "--"]
    if root:
        uid = UID_BASE + secrets.randbelow(UID_COUNT)
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return cmd + list(argv)


def sandbox_pid(info: bytes) -> int | None:
    """The sandbox's init pid (as seen from here) from what bwrap wrote on its info fd."""
    try:
        pid = json.loads(info.decode("utf-8", "replace")).get("child-pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 1 else None


def kill_sandbox(proc: subprocess.Popen, init_pid: int | None, timeout_s: float = 10.0) -> None:
    """End a sandbox and everything in it, returning once all of it is gone.

    SIGKILL to the sandbox's pid-namespace init makes the kernel kill every process in the
    namespace, and that init exits only after they all have; bwrap (`proc`, not reaped yet
    here, so `init_pid` cannot have been reused while it lives) then exits and is reaped.
    """
    try:
        alive = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        alive = False
    if alive and init_pid is not None:
        try:
            os.kill(init_pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
