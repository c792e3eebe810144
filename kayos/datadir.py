"""One owner per directory: an exclusive ``flock`` on ``<dir>/LOCK`` held for the owner's life.

docs/node-api.md "Owners, locks and ports" is the rule. The lock belongs to the open file
description: the kernel drops it when the owner exits however it exits, so a lock file left by a
killed process never blocks the next owner (the file is never deleted, and the pid written into
it is for people to read, never checked). Two opens in one process are two owners, so the second
is refused as well.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from types import TracebackType

from kayos import limits
from kayos.errors import DirectoryInUseError, KayosError

LOCK_FILE_NAME = "LOCK"
# The file in a node's data directory naming the running (or last) process's incarnation, one
# line of 16 hex digits written at its start (docs/node-api.md, "Incarnation and the manager's
# watch"): the supervisor that runs the node names the process that exited with it.
INCARNATION_FILE_NAME = "incarnation"


def write_incarnation(directory: str, incarnation: str) -> None:
    """Replaces ``directory``'s incarnation file whole (no fsync: it names a process, which a
    power loss ends anyway)."""
    path = os.path.join(directory, INCARNATION_FILE_NAME)
    with open(path + ".tmp", "w") as handle:
        handle.write(incarnation + "\n")
    os.replace(path + ".tmp", path)


def read_incarnation(directory: str) -> str | None:
    """The incarnation ``directory``'s file names, or None (no file, or not 16 hex digits)."""
    try:
        with open(os.path.join(directory, INCARNATION_FILE_NAME), "rb") as handle:
            text = handle.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if len(text) == 16 and not text.strip("0123456789abcdef") else None


def read_holder_pid(lock_path: str) -> int | None:
    """The pid an owner wrote into ``lock_path``; None if the file is empty, unreadable or holds
    anything but a positive decimal number."""
    try:
        with open(lock_path, "rb") as handle:
            text = handle.read(limits.lock_file_pid_bytes_max)
    except OSError:
        return None
    try:
        pid = int(text.strip() or b"0")
    except ValueError:
        return None
    return pid if pid > 0 else None


class DirectoryLock:
    """The held lock of one directory; ``release`` (or the process's exit) gives it up."""

    def __init__(self, directory: str, fd: int, what: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE_NAME)
        self.what = what
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], *, what: str = "data dir") -> DirectoryLock:
        """Creates ``directory`` if needed and takes its lock without waiting, before anything
        else in it is touched. ``DirectoryInUseError`` names the holder's pid if another open
        file holds it; ``KayosError`` if the directory or file cannot be made."""
        path = os.fspath(directory)
        lock_path = os.path.join(path, LOCK_FILE_NAME)
        try:
            os.makedirs(path, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise KayosError(f"cannot lock {what} {path}: {exc.strerror} ({lock_path})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise KayosError(
                    f"cannot lock {what} {path}: {exc.strerror} ({lock_path})"
                ) from exc
            holder = read_holder_pid(lock_path)
            by = f"pid {holder}" if holder is not None else "another process"
            raise DirectoryInUseError(
                f"{what} {path} is in use by {by} (lock file {lock_path})",
                path=path,
                holder_pid=holder,
            ) from None
        # Ours now: the pid of the last owner, if any, is replaced by ours.
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)  # drops the lock too
            raise KayosError(f"cannot write the lock file {lock_path}: {exc.strerror}") from exc
        return cls(path, fd, what)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Gives the lock up (idempotent). The file stays; the next owner overwrites the pid."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
