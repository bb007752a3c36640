"""Which server process runs the batch jobs: the one holding an exclusive lock on a file
in the data directory.

With PENCIL_PROCESSES > 1 every process serves the job API (the store is shared), but
only the lock holder claims and runs jobs, so each job runs once. The operating system
drops the lock when its process dies, however it dies; another process then takes it,
re-queues the jobs the dead one left running and carries on.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class RunnerLock:
    """A non-blocking exclusive lock (flock) on `path`, held until release() or exit."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no other holder has it; True when this object holds it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for an operator's eyes
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:  # no locks on this file system, a full disk: not held, and said so
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
