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

On x86-64 a seccomp filter (classic BPF built by `seccomp_program`, handed to bwrap's
`--seccomp`) makes these fail with EPERM: ptrace, process_vm_readv/writev, bpf,
perf_event_open, userfaultfd, keyctl/add_key/request_key, unshare, setns, mount/umount2,
pivot_root, chroot, module and kexec loading, open_by_handle_at/name_to_handle_at, io_uring,
socket families other than AF_UNIX, clone with any CLONE_NEW* flag (clone3 answers ENOSYS so
libc falls back to clone), and every x32-ABI syscall; another architecture kills the process.
No libseccomp binding is a dependency: the filter is a deny list of a few dozen instructions
checked by the tests in `tests/security/`. `available()` says whether all this works on the
host (checked once, by running Python inside).
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
    fd = seccomp_fd()
    try:
        done = subprocess.run(
            sandbox_command([sys.executable, "-I", "-S", "-c", "pass"], seccomp=fd),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=sandbox_env(), timeout=30, pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if fd is not None:
            os.close(fd)
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


# x86-64 syscall numbers denied with EPERM (see the module docstring)
_DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
    "request_key": 249, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "fsopen": 430, "fsmount": 432,
    "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "swapon": 167, "swapoff": 168,
    "reboot": 169, "acct": 163, "quotactl": 179, "lookup_dcookie": 212, "vhangup": 153,
}
_SOCKET, _CLONE, _CLONE3 = 41, 56, 435
_CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_AUDIT_ARCH_X86_64 = 0xC000003E


def seccomp_program() -> bytes | None:
    """The filter (an array of `struct sock_filter`, native byte order) for bwrap's
    `--seccomp`, or None on a machine other than x86-64."""
    import platform
    import struct

    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    ld, jeq, jge, and_, ret = 0x20, 0x15, 0x35, 0x54, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, kill),
            (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # x32 ABI
    for nr in sorted(_DENIED_X86_64.values()):
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, enosys)]
    prog += [(jeq, 0, 5, _CLONE), (ld, 0, 0, 16), (and_, 0, 0, _CLONE_NEW_FLAGS),
             (jeq, 0, 1, 0), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 3, _SOCKET), (ld, 0, 0, 16), (jeq, 1, 0, 1), (ret, 0, 0, eperm),
             (ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def seccomp_fd() -> int | None:
    """A readable descriptor holding `seccomp_program()` for one sandbox start (pass it in
    `pass_fds` and to `sandbox_command`, close it after the start), or None."""
    program = seccomp_program()
    if program is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, program)  # a few hundred bytes: fits the pipe buffer
    finally:
        os.close(w)
    return r


def sandbox_command(argv: Sequence[str], *, files: Sequence[str] = (),
                    rlimits: Sequence[str] = (), chdir: str = "/tmp",
                    info_fd: int | None = None, die_with_parent: bool = True,
                    seccomp: int | None = None) -> list[str]:
    """`argv` wrapped in bwrap + prlimit (+ setpriv as root), as described in the module
    docstring. `files`: absolute paths (files or directories) bound read-only at their own
    path; `rlimits`: `prlimit` options (see `rlimit_args`); `info_fd`: a descriptor (passed
    to the child) on which bwrap writes `{"child-pid": N}`, for `kill_sandbox`; `seccomp`: a
    descriptor from `seccomp_fd()` (passed to the child). Start it with
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
    if seccomp is not None:
        cmd += ["--seccomp", str(seccomp)]
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
