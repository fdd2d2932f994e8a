"""One run per workdir: a lock every command that writes a workdir takes before writing.

    acquire(workdir)      # raises WorkdirLocked naming the holder (host, pid) when taken
    release_all()         # at the end of a command (the CLI's GracefulStop calls it)

- Local workdirs: `fcntl.flock` on ``<workdir>/.lock``, which holds the holder's host, pid
  and start time (JSON). The kernel drops the lock when its process dies, so the file a
  killed run leaves behind is simply taken over. The file itself is never deleted (deleting
  a flock file races with a process that opened it). A workdir may come from elsewhere (a
  downloaded run), so the file is opened with `O_NOFOLLOW` (a symlink is refused, never
  followed) and must be a regular file owned by this user, not hard-linked elsewhere:
  anything else is `UnsafeLockFile` naming the path, before a byte is written.
- Object stores (`paths.is_remote`: gs://, s3://, ...): a lease object ``<workdir>/.lock``
  with host, pid, a random token and a heartbeat time that a daemon thread refreshes every
  `HEARTBEAT_S` seconds. A lease whose heartbeat is older than `STALE_S` seconds, or whose
  holder is a dead process of this host, is stale and taken over. An object store has no
  compare-and-swap through epath, so after writing the lease the taker reads it back once
  after a short pause and gives up if another run's token is there.
- Multi-host: process 0 takes the lock once for the whole job and broadcasts the outcome,
  so every process fails together when the workdir is in use.
- Re-entrant within one process: a command that takes the lock of a workdir its process
  already holds (a pipeline stage, `train` called twice in a notebook) shares it.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from typing import Any

from jaxrl_reason.runtime import paths

LOCK_NAME = ".lock"
HEARTBEAT_S = 60.0
STALE_S = 600.0  # 10 minutes without a heartbeat: the lease's holder is gone
CONFIRM_S = 2.0  # pause before reading a freshly written lease back

_log = logging.getLogger(__name__)
_held: dict[str, Any] = {}  # workdir key -> lock held by this process
_guard = threading.Lock()


class UnsafeLockFile(OSError):
    """`<workdir>/.lock` is not a file this run may write: a symlink, not a regular file,
    owned by another user or hard-linked elsewhere (the message names the path and why)."""

    def __init__(self, path: str, why: str):
        self.path, self.why = path, why
        super().__init__(f"workdir lock {path!r} {why}: refusing to use it (a run directory "
                         f"from elsewhere?); remove it if this workdir is yours")


class WorkdirLocked(OSError):
    """The workdir is in use by another run; `holder` is its lock record (host, pid, ...)."""

    def __init__(self, workdir: str, holder: dict[str, Any]):
        self.workdir, self.holder = workdir, holder
        super().__init__(f"workdir {workdir!r} is in use by another run ({describe(holder)}): "
                         f"wait for it to finish, stop it, or pass another --workdir")


def describe(holder: dict[str, Any]) -> str:
    """'host H, pid P, since <UTC time>' of a lock record (missing fields say 'unknown')."""
    since = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
            if isinstance(since, (int, float)) else "unknown time")
    return f"host {holder.get('host', 'unknown')}, pid {holder.get('pid', 'unknown')}, " \
           f"since {when}"


def _record() -> dict[str, Any]:
    """This process's lock record: host, pid, start time (unix seconds)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}


def _parse(text: str) -> dict[str, Any]:
    """A lock record from the lock file's text ({} when empty or unreadable)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _pid_alive(pid: Any) -> bool:
    """Whether a process `pid` runs on this host (True when it cannot be told)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_lock_file(path: str) -> int:
    """A read-write descriptor of the lock file `path` (created 0644 if absent), opened
    without following a symlink (`O_NOFOLLOW`, `O_CLOEXEC`, `O_NONBLOCK` so a FIFO cannot
    block the open) and checked on the open descriptor: a regular file, owned by this
    process's effective uid, with no second hard link. UnsafeLockFile otherwise (nothing
    written)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafeLockFile(path, "is a symbolic link") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a socket or a directory
            raise UnsafeLockFile(path, "is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_uid != os.geteuid():
            why = f"is owned by uid {st.st_uid}, not this user (uid {os.geteuid()})"
        elif st.st_nlink > 1:
            why = f"has {st.st_nlink} hard links"
        else:
            os.set_blocking(fd, True)
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise UnsafeLockFile(path, why)


class LocalLock:
    """`fcntl.flock` on `<workdir>/.lock` (local filesystems)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock at once or raises WorkdirLocked naming the holder (a filesystem
        that cannot flock gets a warning and no lock)."""
        import fcntl
        os.makedirs(self.workdir, exist_ok=True)
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                # A filesystem without flock (some FUSE mounts): run unguarded, say so.
                _log.warning("workdir %s: cannot lock %s (%s); running without a workdir "
                             "lock", self.workdir, self.path, e)
                return
            try:  # the holder's record, through the descriptor checked above
                text = os.pread(fd, 1 << 16, 0).decode("utf-8", "replace")
            finally:
                os.close(fd)
            raise WorkdirLocked(self.workdir, _parse(text)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_record()).encode("utf-8"), 0)
        self._fd = fd

    def release(self) -> None:
        """Empties the lock file and drops the lock (the file stays, see the module doc)."""
        if self._fd is None:
            return
        import fcntl
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


class Lease:
    """A lease object `<workdir>/.lock` with a heartbeat (object stores; any epath path)."""

    def __init__(self, workdir: str, *, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S, confirm_s: float = CONFIRM_S):
        self.workdir = workdir
        self.path = paths.as_path(workdir, LOCK_NAME)
        self.stale_s, self.heartbeat_s, self.confirm_s = stale_s, heartbeat_s, confirm_s
        self.record = {**_record(), "token": uuid.uuid4().hex}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict[str, Any]:
        try:
            return _parse(self.path.read_text())
        except (OSError, UnicodeDecodeError):  # absent (FileNotFoundError) or unreadable
            return {}

    def _write(self) -> None:
        self.path.write_text(json.dumps({**self.record, "heartbeat": time.time()}))

    def is_stale(self, holder: dict[str, Any], now: float | None = None) -> bool:
        """Whether `holder`'s lease may be taken over: none, a heartbeat older than
        `stale_s`, or a dead process of this host."""
        if not holder:
            return True
        beat = holder.get("heartbeat")
        now = time.time() if now is None else now
        if not isinstance(beat, (int, float)) or now - beat > self.stale_s:
            return True
        return holder.get("host") == self.record["host"] and not _pid_alive(holder.get("pid"))

    def acquire(self) -> None:
        """Takes the lease at once (or takes over a stale one) or raises WorkdirLocked."""
        holder = self._read()
        if holder and not self.is_stale(holder):
            raise WorkdirLocked(self.workdir, holder)
        if holder:
            _log.warning("workdir %s: taking over a stale lease (%s)", self.workdir,
                         describe(holder))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        time.sleep(self.confirm_s)
        winner = self._read()
        if winner.get("token") != self.record["token"]:
            raise WorkdirLocked(self.workdir, winner)
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"lease-heartbeat {self.workdir}")
        self._thread.start()

    def _beat(self) -> None:
        """Refreshes the heartbeat until released; warns if another run took the lease."""
        while not self._stop.wait(self.heartbeat_s):
            try:
                current = self._read()
                if current.get("token") not in (None, self.record["token"]):
                    _log.error("workdir %s: the lease was taken over by %s (this run's "
                               "heartbeat came too late)", self.workdir, describe(current))
                    return
                self._write()
            except OSError as e:  # a transient store error: try again at the next beat
                _log.warning("workdir %s: lease heartbeat failed: %s", self.workdir, e)

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with contextlib.suppress(OSError):
            if self._read().get("token") == self.record["token"]:
                self.path.unlink()


def _key(workdir: str) -> str:
    return os.fspath(workdir) if paths.is_remote(workdir) else os.path.realpath(workdir)


def _take(workdir: str) -> dict[str, Any] | tuple[str, str] | None:
    """Takes (or re-enters) this process's lock of `workdir`; the holder's record when
    another run holds it, (path, why) when the lock file may not be used (UnsafeLockFile),
    else None."""
    with _guard:
        if _key(workdir) in _held:
            return None
        lock = Lease(workdir) if paths.is_remote(workdir) else LocalLock(workdir)
        try:
            lock.acquire()
        except WorkdirLocked as e:
            return e.holder
        except UnsafeLockFile as e:
            return (e.path, e.why)
        _held[_key(workdir)] = lock
        return None


def acquire(workdir: str) -> None:
    """Makes `workdir` (creating it) this run's, until `release_all` or process exit.

    Multi-host: a collective. Process 0 takes the lock and every process gets its outcome.

    Raises:
      WorkdirLocked: another live run holds it (the message names its host and pid).
      UnsafeLockFile: `<workdir>/.lock` is a symlink, not a regular file, or not this
        user's (on every process of a multi-host job).
    """
    from jaxrl_reason.runtime import distributed
    holder = _take(workdir) if distributed.is_primary() else None
    holder = distributed.broadcast_from_primary(holder)
    if isinstance(holder, tuple):
        raise UnsafeLockFile(*holder)
    if holder is not None:
        raise WorkdirLocked(os.fspath(workdir), holder)


def held() -> list[str]:
    """The workdirs whose lock this process holds."""
    return sorted(_held)


def release_all() -> None:
    """Releases every workdir lock this process holds (no-op when none)."""
    with _guard:
        for key in list(_held):
            lock = _held.pop(key)
            try:
                lock.release()
            except OSError as e:
                _log.warning("workdir %s: releasing its lock failed: %s", key, e)


atexit.register(release_all)
