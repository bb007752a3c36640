"""How many /live sessions may be open on this host: slot files in a directory shared by the
server processes, each session holding an exclusive lock on one; and, the same way, how many
one client may hold (its share), so that one client cannot take every slot."""

from __future__ import annotations

import fcntl
import hashlib
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
        return self._lock_one("slot", self.count)

    def acquire_share(self, client: str, share: int) -> int | None:
        """One of the `share` places of `client` (any string naming it), held like a slot;
        None when the client holds them all. Its files are named by a digest of the name
        and, like the slots', stay until the directory goes (at exit): a few empty files for
        each client that ever used /live."""
        digest = hashlib.sha256(client.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return self._lock_one(f"client-{digest}", share)

    def _lock_one(self, prefix: str, count: int) -> int | None:
        for index in range(count):
            fd = os.open(self.directory / f"{prefix}-{index}", os.O_RDWR | os.O_CREAT, 0o600)
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
