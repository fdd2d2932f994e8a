"""OS-level isolation for every process that handles untrusted text (code answers, math).

`sandbox_command(argv, ...)` wraps a command line so that it runs under bubblewrap
(`bwrap`, Debian package `bubblewrap`) in:

- new pid, network, ipc, uts and mount namespaces (`--new-session`, `--die-with-parent`):
  the process sees no other process (it cannot signal or `pidfd_open` its parent), has only
  a down loopback, and everything it starts dies with it;
- a mount namespace holding only read-only binds of `/usr` (and the `/lib*`, `/bin`
  symlinks), the Python installation (`sys.base_prefix`, `sys.prefix`, the site-packages
  directories) and the extra files the caller names, a private `/tmp` tmpfs of at most
  `tmp_bytes` (bwrap's `--size`: its files are host memory, so the caller ties it to the
  run's memory limit), `/proc` of its own pid namespace and a minimal `/dev`: no workdir,
  no `/root`, no `/etc`, no home. The root and `/dev` are remounted read-only at the end,
  so `/tmp` is the only writable place (`/dev/shm` included: POSIX shared memory cannot be
  created);
- an empty environment (`PATH` only);
- rlimits applied by `prlimit` before the program starts (address space, CPU, file size,
  open files, no core dumps, and processes when a dedicated uid is used);
- as root: a fresh uid/gid drawn from `UID_BASE + [0, UID_COUNT)` per sandbox (no passwd
  entry, owns no file), no supplementary groups, an empty capability bounding
  set, no inheritable/ambient capabilities and `no_new_privs` (`setpriv`), so it owns no file
  and may signal no other process; not as root: an unprivileged user namespace with every
  capability dropped (`--cap-drop ALL`), `no_new_privs` (bwrap sets it) and no nested user
  namespaces (`--disable-userns`).

A seccomp filter, compiled by libseccomp (through its Python binding `pyseccomp`, for the
machine's own architecture: x86-64 or aarch64) and handed to bwrap's `--seccomp`, makes these
fail with EPERM: SysV IPC (shmget, semget, msgget: the fresh IPC namespace would otherwise
let a run pin host memory in segments no rlimit counts) and POSIX message queues (mq_open),
ptrace, process_vm_readv/writev, process_madvise, pidfd_getfd, bpf,
perf_event_open, userfaultfd, keyctl/add_key/request_key, unshare, setns, mount/umount2,
pivot_root, chroot, the new mount API (fsopen, fsconfig, fsmount, fspick, move_mount,
open_tree, mount_setattr), module and kexec loading, open_by_handle_at/name_to_handle_at,
io_uring, swapon/swapoff, reboot, acct, quotactl, lookup_dcookie, vhangup, socket and
socketpair of any family but AF_UNIX, and clone with any CLONE_NEW* flag (clone3 answers
ENOSYS so libc falls back to clone); a syscall of another ABI (i386 or x32 on x86-64, arm32
on aarch64) kills the process. Without libseccomp.so.2 or pyseccomp, or on another
architecture, there is no sandbox. `available()` says whether all this works on the host
(checked once, by running Python inside) and `unavailable_reason()` what is missing.

`bwrap` is run by the absolute path `shutil.which` finds (the path the check used), and
`prlimit` / `setpriv` by theirs, which must lie in the sandbox's view (`/usr`, `/bin`,
`/sbin`, `/lib*`). Without a sandbox, `unconfined_preamble` gives a Python child the same
rlimits from inside (`resource.setrlimit` before it runs anything else) and
`unconfined_env` an environment as empty; `log_status_once` says, once per process, which
of the two a run has.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Sequence

# As root, each sandbox runs as its own uid from this range (no passwd entry, owns no file):
# RLIMIT_NPROC then bounds that sandbox alone, and no two sandboxes can signal each other.
UID_BASE = 1 << 20
UID_COUNT = 1 << 20
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# The size of a sandbox's private /tmp unless the caller gives one (`sandbox_command`).
DEFAULT_TMP_BYTES = 64 * 2**20
# Top-level directories the sandbox shows (read-only): tools run inside must live there.
_VISIBLE_ROOTS = ("usr", "bin", "sbin", "lib", "lib32", "lib64")
_PACKAGES = {"bwrap": "bubblewrap", "prlimit": "util-linux", "setpriv": "util-linux"}
_log = logging.getLogger(__name__)


def _tool(name: str) -> str | None:
    """The absolute path of `name` as `shutil.which` finds it on this process's PATH, or
    None. The sandbox is started with exactly this path (never looked up again)."""
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def _tool_problem(name: str) -> str | None:
    """Why tool `name` cannot be used (not found; for the tools run inside the sandbox, a
    path outside its view), or None."""
    path = _tool(name)
    if path is None:
        return f"`{name}` not found: install it (`apt-get install -y {_PACKAGES[name]}`)"
    if name != "bwrap" and path.strip("/").split("/")[0] not in _VISIBLE_ROOTS:
        return (f"`{name}` was found at {path}, outside the sandbox's view (/usr, /bin, "
                "/sbin, /lib*): install it under /usr (`apt-get install -y "
                f"{_PACKAGES[name]}`)")
    return None


@functools.lru_cache(maxsize=1)
def _unavailable() -> str | None:
    """Why `sandbox_command` cannot work here (a sentence naming what is missing), or None
    when it does: bwrap, prlimit, setpriv as root, the libseccomp filter and namespaces
    (checked by running Python inside, once, with the options every sandbox uses)."""
    for tool in ("bwrap", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()):
        problem = _tool_problem(tool)
        if problem is not None:
            return problem
    try:
        fd = seccomp_fd()
    except SeccompUnavailable as e:
        return str(e)
    try:
        done = subprocess.run(
            sandbox_command([sys.executable, "-I", "-S", "-c", "pass"], seccomp=fd),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=sandbox_env(), timeout=30, pass_fds=(fd,))
    except (OSError, subprocess.SubprocessError) as e:
        return f"a test sandbox could not run: {e}"
    finally:
        os.close(fd)
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip()[-300:]
        hint = (" (this bwrap is too old for `--size`: bubblewrap 0.5 or newer is needed)"
                if "--size" in tail else " (user namespaces must be enabled)")
        return f"a test sandbox exited with status {done.returncode}{hint}: {tail}"
    return None


def available() -> bool:
    """Whether `sandbox_command` works here (bwrap, prlimit, setpriv as root, libseccomp,
    namespaces); `unavailable_reason()` says what is missing."""
    return _unavailable() is None


def unavailable_reason() -> str:
    """What `available()` found missing, as a sentence for an error message (a generic
    hint when nothing is: a caller may have been told otherwise)."""
    return _unavailable() or ("install bubblewrap (`apt-get install -y bubblewrap`); user "
                              "namespaces must be enabled")


def sandbox_env() -> dict[str, str]:
    """The environment to start the wrapped command with (bwrap clears it again inside)."""
    return {"PATH": _SANDBOX_PATH, "LANG": "C.UTF-8"}


def unconfined_env() -> dict[str, str]:
    """The environment of a helper process started *without* the sandbox: the same near-empty
    one a sandboxed process gets (`PATH`, `LANG`), none of the trainer's variables."""
    return sandbox_env()


def unconfined_preamble(memory_bytes: int, cpu_s: int, file_bytes: int,
                        open_files: int) -> str:
    """Python statements (one line) that set, soft = hard, the rlimits `rlimit_args` gives a
    sandbox (address space, CPU, file size, open files, no core dumps): the first thing a
    Python child started without the sandbox runs, so it holds them before it reads any
    untrusted text. A limit the process already has lower stays (a limit is only ever
    lowered). (No process limit: without a uid of its own it would count the trainer's
    threads.)"""
    limits = [("RLIMIT_AS", memory_bytes), ("RLIMIT_CPU", cpu_s), ("RLIMIT_FSIZE", file_bytes),
              ("RLIMIT_NOFILE", open_files), ("RLIMIT_CORE", 0)]
    lower = ("_lim = lambda k, v: resource.setrlimit(k, (min(v, h), min(v, h)) if (h := "
             "resource.getrlimit(k)[1]) != resource.RLIM_INFINITY else (v, v))")
    sets = "; ".join(f"_lim(resource.{name}, {int(v)})" for name, v in limits)
    return f"import resource; {lower}; {sets}; del _lim"


_LOGGED: list[str] = []


def log_status_once(logger: logging.Logger | None = None) -> str:
    """Logs, once per process, what isolation the reward processes of this run get (INFO
    with the sandbox, WARNING without it, naming what is missing); returns that line."""
    if available():
        line = ("reward isolation: bubblewrap sandbox (own pid/net/ipc/mount namespaces, "
                "rlimits, seccomp filter, private size-limited /tmp)")
    else:
        line = (f"reward isolation: NO sandbox ({unavailable_reason()}); math workers run "
                "as this user with rlimits, an empty environment and no inherited file "
                "descriptors only; code rewards refuse to run unless "
                "allow_unsandboxed_unsafe=True")
    if not _LOGGED:
        _LOGGED.append(line)
        (logger or _log).log(logging.INFO if available() else logging.WARNING, "%s", line)
    return line


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


def host_paths(files: Sequence[str] = ()) -> list[str]:
    """The host paths a sandbox sees, read-only at their own path: the running Python
    installation's outermost directories, then `files`."""
    return [*_python_roots(), *files]


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


# Syscalls answered with EPERM (see the module docstring), by name: libseccomp resolves each
# for the machine's architecture.
_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "unshare",
    "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
    "fspick", "move_mount", "open_tree", "mount_setattr", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
    "name_to_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register", "swapon",
    "swapoff", "reboot", "acct", "quotactl", "lookup_dcookie", "vhangup",
    "shmget", "semget", "msgget", "mq_open",
)
# CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
# CLONE_NEWNET: clone's flags (its first argument on x86-64 and aarch64) with any of them
_CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                    0x20000000, 0x40000000)
_AF_UNIX = 1
_SECCOMP_ARCHES = ("X86_64", "AARCH64")  # pyseccomp.Arch names the policy was written for
_LIBSECCOMP_HINT = ("the sandbox's seccomp filter is compiled by libseccomp through its Python "
                    "binding pyseccomp: it needs libseccomp.so.2 (Debian package libseccomp2: "
                    "`apt-get install -y libseccomp2`) and `pip install pyseccomp`")


class SeccompUnavailable(RuntimeError):
    """libseccomp, its binding or the architecture cannot give the sandbox its filter."""


def _libseccomp():
    """The `pyseccomp` module (a ctypes binding that loads libseccomp.so.2 on import), or
    SeccompUnavailable naming what is missing."""
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError, AttributeError) as e:
        # pyseccomp raises RuntimeError("Unable to find libseccomp") without the library
        raise SeccompUnavailable(f"{_LIBSECCOMP_HINT} ({type(e).__name__}: {e})") from e
    return pyseccomp


def _deny_policy(sc, filt) -> None:
    """Adds the sandbox's rules (see the module docstring) to `filt`, a
    `pyseccomp.SyscallFilter(ALLOW)` for the native architecture; `sc` is `pyseccomp`.
    SeccompUnavailable when libseccomp does not know one of the syscalls by name."""
    eperm = sc.ERRNO(1)
    for name in _DENIED:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) == -1:  # __NR_SCMP_ERROR: unknown name
            raise SeccompUnavailable(f"isolation: this libseccomp does not know syscall "
                                     f"{name!r}; a newer libseccomp2 is needed")
        filt.add_rule(eperm, name)
    for flag in _CLONE_NEW_FLAGS:
        filt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 takes its flags in memory, out of a filter's reach: ENOSYS makes libc fall
    # back to clone, whose flags the rules above see
    filt.add_rule(sc.ERRNO(38), "clone3")
    for name in ("socket", "socketpair"):
        filt.add_rule(eperm, name, sc.Arg(0, sc.NE, _AF_UNIX))


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The filter compiled by libseccomp for this machine's architecture (x86-64 or
    aarch64): an array of `struct sock_filter` (8 bytes each, native byte order) for bwrap's
    `--seccomp`. SeccompUnavailable (a RuntimeError naming the cause) without libseccomp,
    pyseccomp, or on another architecture."""
    sc = _libseccomp()
    native = sc.system_arch()
    if native not in [getattr(sc.Arch, a) for a in _SECCOMP_ARCHES]:
        raise SeccompUnavailable(f"isolation: no seccomp policy for this architecture "
                                 f"(libseccomp arch token {native:#x}); written for x86-64 "
                                 "and aarch64")
    filt = sc.SyscallFilter(sc.ALLOW)
    # another ABI on the same kernel (i386, x32 on x86-64; arm32 on aarch64) kills the process
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    _deny_policy(sc, filt)
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"isolation: libseccomp exported {len(program)} bytes, "
                                 "not a whole number of BPF instructions")
    return program


def seccomp_fd() -> int:
    """A readable descriptor holding `seccomp_program()` for one sandbox start (pass it in
    `pass_fds` and to `sandbox_command`, close it after the start). SeccompUnavailable as
    `seccomp_program`."""
    program = seccomp_program()
    r, w = os.pipe()
    try:
        os.write(w, program)  # a few hundred bytes: fits the pipe buffer
    finally:
        os.close(w)
    return r


def sandbox_command(argv: Sequence[str], *, files: Sequence[str] = (),
                    rlimits: Sequence[str] = (), chdir: str = "/tmp",
                    info_fd: int | None = None, die_with_parent: bool = True,
                    seccomp: int | None = None,
                    tmp_bytes: int = DEFAULT_TMP_BYTES) -> list[str]:
    """`argv` wrapped in bwrap + prlimit (+ setpriv as root), as described in the module
    docstring. `files`: absolute paths (files or directories) bound read-only at their own
    path; `rlimits`: `prlimit` options (see `rlimit_args`); `info_fd`: a descriptor (passed
    to the child) on which bwrap writes `{"child-pid": N}`, for `kill_sandbox`; `seccomp`: a
    descriptor from `seccomp_fd()` (passed to the child); `tmp_bytes`: the size of the
    private `/tmp` tmpfs (host memory: writes beyond it fail with ENOSPC). Start it with
    `sandbox_env()`. `die_with_parent=False` for a long-lived sandbox started from a thread
    that may exit first (the kernel's parent-death signal follows the creating thread): it
    must then end itself when its stdin closes. bwrap, prlimit and setpriv are named by the
    absolute paths `shutil.which` finds (as `available()` checked them)."""
    for f in files:
        if not os.path.isabs(f):
            raise ValueError(f"isolation: bind path must be absolute, got {f!r}")
    if isinstance(tmp_bytes, bool) or not isinstance(tmp_bytes, int) or tmp_bytes < 4096:
        raise ValueError(f"isolation: tmp_bytes must be an int >= 4096, got {tmp_bytes!r}")
    root = os.geteuid() == 0
    cmd = [_tool("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
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
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_bytes),
            "--tmpfs", "/tmp"]
    cmd += _bind_args(host_paths(files))
    # last: the root and /dev tmpfs (writable by the sandbox's user in a user namespace, and
    # of no size) become read-only, so /tmp is all a run can fill
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/"]
    cmd += ["--chdir", chdir, "--clearenv", "--setenv", "PATH", _SANDBOX_PATH, "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--"]
    cmd += [_tool("prlimit") or "prlimit", *rlimits, "--"]
    if root:
        uid = UID_BASE + secrets.randbelow(UID_COUNT)
        cmd += [_tool("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return cmd + list(argv)


def sandbox_pid(info: bytes) -> int | None:
    """The sandbox's init pid (as seen from here) from what bwrap wrote on its info fd."""
    try:
        pid = json.loads(info.decode("utf-8", "replace")).get("child-pid")
    except (ValueError, AttributeError, RecursionError):
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
