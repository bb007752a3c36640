"""How many /live sessions may be open on this host: slot files in a directory shared by the
server processes, each session holding an exclusive lock on one."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LiveSlots:
    """At most `count` live sessions at once among the server processes that share
    `directory`: a session holds an exclusive lock on one of `count` slot files, which the
    kernel releases when the session ends or its process dies (so a killed process never
    leaks a slot)."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory, self.count = directory, count
        directory.mkdir(parents=True, exist_ok=True)

    def acquire(self) -> int | None:
        """A held slot (a file descriptor to give to `release`), or None when all are taken."""
        for index in range(self.count):
            fd = os.open(self.directory / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # closing the only descriptor of the open file releases its lock

    def held(self) -> int:
        """Slots held now by any process (a free one is taken and given back at once to know)."""
        taken = 0
        for index in range(self.count):
            path = self.directory / f"slot-{index}"
            if not path.exists():
                continue
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                taken += 1
            finally:
                os.close(fd)
        return taken
