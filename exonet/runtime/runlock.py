"""RunLock: one fit at a time writes a run directory.

Two resumes of one run directory at once (or a resume of a run still going) would interleave
their checkpoints, metrics and status. The fit that writes a run directory holds ``run.lock``
in it, an ``flock`` on that file, for as long as it writes; the file says who holds it (pid,
host, since when), so a refusal names the holder. The kernel releases an ``flock`` when its
holder exits, however it ends (SIGKILL included), so a lock file left by a dead process is
stale by construction and the next fit takes it over. The fit removes the file when it ends. On a
file system that cannot lock (some FUSE mounts) the fit warns and goes on without the lock. The
file is opened with ``O_NOFOLLOW`` and must be a regular file: a ``run.lock`` planted as a link
is refused (TraceError naming it), so the holder's line is never written where the link points.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from exonet.errors import TraceError
from exonet.files import open_regular

LOCK = "run.lock"
# flock's errors where a file system cannot lock at all (some FUSE mounts): the run goes on unlocked, with a warning
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class RunLocked(RuntimeError):
    """Another fit holds the run directory.

    Attributes:
        holder: what its lock file says: ``pid``, ``host``, ``since`` (UTC), or {} when unreadable.
    """

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


class RunLock:
    """The lock of the run directory ``run``, taken at once or refused (``RunLocked``); ``release()`` frees it."""

    def __init__(self, run: Path) -> None:
        self.file = run / LOCK
        while True:
            fd = open_regular(self.file, os.O_RDWR | os.O_CREAT, TraceError)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunLocked(f"{run} is in use by {_describe(holder)} (its lock file {self.file}); a run "
                                "directory is written by one fit at a time: wait for that one to end, or stop it",
                                holder) from None
            except OSError as exc:
                if exc.errno not in UNSUPPORTED:
                    os.close(fd)
                    raise
                warnings.warn(f"{run}: this file system cannot lock {self.file} ({exc}); nothing stops a second fit "
                              "from writing the run directory at the same time", stacklevel=2)
                break
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.file):
                break
            os.close(fd)  # its holder removed the file as we opened it: take the one there now
        self.fd: int | None = fd
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode())

    def release(self) -> None:
        """Remove the lock file and free the lock (the file first: a waiting fit then finds no stale one)."""
        if self.fd is None:
            return
        self.file.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> dict[str, Any]:
    """What a lock file says about its holder ({} while it is being written, or when it is not ours)."""
    try:
        value = json.loads(os.pread(fd, 4096, 0).decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another fit"
    return f"another fit (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since {holder.get('since', '?')})"
