"""The service's persistent data under PENCIL_DATA_DIR (job store, job folders, corpora):
the one error a failed read or write of it becomes, durable writes, and the checks that
start-up and readiness make.

A file-system error while storing or reading that data is raised as a StorageError (an
OSError with the errno of its cause) naming what could not be done, and the API answers it
(app/errors.py) by its cause:

- 507 insufficient_storage: the disk or the quota is full, or a file hit its size limit
  (ENOSPC, EDQUOT, EFBIG). Retrying does not help until space is freed, so no Retry-After.
- 503 storage_unavailable, with Retry-After: any other cause (EACCES, EROFS, EIO, ...). The
  storage cannot be used now; once an operator fixes it the same request succeeds.

Start-up problems the server cannot fix itself (an unwritable data directory) are a
StartupError whose message tells the operator what to do.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("pencil.storage")

OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StorageError(OSError):
    """Persistent data could not be stored or read: `action` says what ("store the corpus"),
    the errno and the reason are those of the cause."""

    def __init__(self, action: str, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.action = action

    def __str__(self) -> str:
        return f"could not {self.action}: {self.strerror}"

    @property
    def out_of_space(self) -> bool:
        """Whether more space (disk, quota or file-size limit) is what it takes."""
        return self.errno in OUT_OF_SPACE


class StartupError(Exception):
    """A start-up problem the server cannot fix; the message says what to do about it."""


@contextmanager
def storage_errors(action: str) -> Iterator[None]:
    """Raise an OSError of the block as StorageError(action, it) (one already so, as it is)."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(action, exc) from exc


def write_file(path: Path, data: bytes, durable: bool = True) -> None:
    """Create `path`, which must not exist, holding `data`; flushed to disk when `durable`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, content: bytes | Callable[[BinaryIO], None], sync_directory: bool = True) -> None:
    """Replace `path` by a file holding `content` (bytes, or a function that writes them to
    the open file): written and flushed under a hidden temporary name beside it, renamed over
    it, then, with `sync_directory`, the directory synced. A failure leaves `path` as it was
    and no temporary file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")  # unique: writers may race
    try:
        if isinstance(content, bytes):
            write_file(partial, content)
        else:
            with open(partial, "xb") as handle:
                content(handle)
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        remove_quietly(partial)
        raise
    if sync_directory:
        fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    """Make the renames and creations inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    """Remove the file `path` if it is there. A failure is logged, not raised: clean-up must
    not hide the error that called for it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc.strerror or exc)


def remove_tree_quietly(path: Path) -> None:
    """Remove the directory `path` and everything in it, as far as possible (see remove_quietly)."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        log.warning("could not remove all of %s", path)


def probe_directory(directory: Path) -> str | None:
    """Why a file cannot be created in `directory` now, or None when it can: a small file is
    created, written and removed (not flushed: cheap enough for every readiness probe)."""
    probe = directory / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        write_file(probe, b"probe\n", durable=False)
        os.unlink(probe)
    except OSError as exc:
        remove_quietly(probe)
        return exc.strerror or str(exc)
    return None


def free_bytes(directory: Path) -> int:
    """The bytes the server's user may still write on the file system of `directory`."""
    status = os.statvfs(directory)
    return status.f_bavail * status.f_frsize


RESERVE_BYTES = 1024 * 1024  # room kept for recording what happened when the disk fills


class SpaceReserve:
    """A file of RESERVE_BYTES kept in the data directory and given up when the disk is full,
    so that what must still be written then (a job's end in its SQLite row and its job.json)
    finds room; made again once there is room (4 times its size free)."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES):
        self.path, self.size = path, size

    def keep(self) -> None:
        """Make the reserve if it is missing and there is room; quiet on failure (it is a
        precaution: the next call tries again)."""
        try:
            if self.path.exists() or free_bytes(self.path.parent) < 4 * self.size:
                return
            write_atomically(self.path, os.urandom(self.size))  # random: no file system compresses it away
        except OSError as exc:
            log.debug("could not make the space reserve %s: %s", self.path, exc)

    def release(self) -> bool:
        """Give the reserve's space back to the file system; whether there was one."""
        try:
            os.unlink(self.path)
        except OSError:
            return False
        return True


def out_of_space(exc: BaseException) -> bool:
    """Whether `exc` says the disk, a quota or a file-size limit is full: an OSError of
    OUT_OF_SPACE, or SQLite's SQLITE_FULL ("database or disk is full")."""
    if isinstance(exc, OSError):
        return exc.errno in OUT_OF_SPACE
    return getattr(exc, "sqlite_errorcode", None) == 13  # SQLITE_FULL


def prepare_directory(directory: Path, setting: str = "PENCIL_DATA_DIR") -> None:
    """Create `directory` if it is missing and check that files can be created in it;
    StartupError saying what to do otherwise."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        problem = probe_directory(directory)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem is not None:
        raise StartupError(
            f"the data directory {directory} cannot be written ({problem}): make it a writable directory for the "
            f"server's user (uid {os.geteuid()}) with free space, or point {setting} elsewhere"
        )


@contextmanager
def exclusive_lock(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    """Hold an exclusive lock (flock) on the file `path`, created if missing, inside the
    block: it serialises the server processes (and threads) that share the data directory.
    `mode=fcntl.LOCK_SH`: a shared lock instead."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # drops the lock


# Files being written (an upload's partial file, a submission's staging folder) have an owner:
# the writer holds an flock on the file (for a folder, on a file in it) until it has renamed or
# removed it, and the kernel drops that lock when the writer dies, however it dies. A sweep can
# then tell a dead writer's leftovers from another process's upload in progress, at once rather
# than after an hour. Owned files are created under a shared lock on a lock file of their
# directory (beside it: `<directory>.lock`) and swept under an exclusive one, so a sweep never
# meets a file created but not yet locked. flock works between processes and hosts on local
# file systems and NFS (Linux emulates it with POSIX locks there); the files are opened for
# writing, as those need.


def writers_lock(directory: Path) -> Path:
    """The lock file of the owned files of `directory`: beside it, so not among them."""
    return directory.with_name(f"{directory.name}.lock")


def creating_owned(directory: Path) -> AbstractContextManager[None]:
    """The block in which owned files of `directory` are created (create_owned)."""
    return exclusive_lock(writers_lock(directory), fcntl.LOCK_SH)


def sweeping_owned(directory: Path) -> AbstractContextManager[None]:
    """The block in which the owned files of `directory` are checked (has_owner) and removed."""
    return exclusive_lock(writers_lock(directory))


def create_owned(path: Path) -> int:
    """Create the file `path` (it must not exist) and hold its owner's lock: the open
    descriptor returned, until it is closed. Call inside creating_owned(path's directory)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def has_owner(path: Path) -> bool:
    """Whether a live writer holds the lock of the owned file `path` (False for a missing file).
    Call inside sweeping_owned(its directory)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
