"""Per-client request rates, host-wide: a token bucket for each client (an API key's name or
an address), shared by every server process of the host.

Each client's bucket holds at most `burst` tokens and refills at `rate` tokens a second; a
request takes one, or is refused with the seconds until the next one comes.

The buckets live in a file every process maps into memory (in the directory where `pencil-
gpu serve`'s processes count /live sessions): SLOTS slots of (client digest, tokens, time),
so that a client gets the rate once on the host, whichever process its connections land on
(SO_REUSEPORT spreads them by a hash, not by client). A client's bucket is one of PROBE
neighbouring slots from the position of its digest: its own, else an empty one or one that
has refilled (the same as never seen); only when PROBE other clients are all still limited
there does it share the first slot (never more than a burst of extra refusals for them). The
PROBE slots are locked (fcntl, a byte range of the file: the kernel drops it if the process
dies) while a request reads and updates them; times are CLOCK_MONOTONIC, the same in every
process of the host. Memory: SLOTS x 24 bytes, whatever the number of clients.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

SLOTS = 1 << 16  # buckets on the host (1.5 MiB)
PROBE = 8  # neighbouring slots a client's bucket may take
SLOT = struct.Struct("<Qdd")  # client digest (0: empty), tokens, when they were counted
FILE_NAME = "rate-buckets"


class RateLimiter:
    """At most `burst` requests at once and `rate` a second on average, per client, among
    the processes sharing `directory`."""

    def __init__(
        self,
        rate: float,
        burst: int,
        directory: Path,
        clock: Callable[[], float] = time.monotonic,
        slots: int = SLOTS,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")
        self.rate, self.burst, self.clock, self.slots = rate, float(burst), clock, slots
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(directory / FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        size = slots * SLOT.size
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)  # zeros: every slot empty; another process's truncate is the same
        self._table = mmap.mmap(self._fd, size)

    def take(self, client: str) -> float:
        """0.0 when `client` may go on (a token taken), else the seconds until it may."""
        digest = int.from_bytes(hashlib.blake2b(client.encode("utf-8", "surrogateescape"), digest_size=8).digest())
        digest = digest or 1  # 0 marks an empty slot
        first = digest % (self.slots - PROBE + 1)
        offset, length = first * SLOT.size, PROBE * SLOT.size
        fcntl.lockf(self._fd, fcntl.LOCK_EX, length, offset)
        try:
            now = self.clock()
            at = self._slot_of(digest, first, now)
            owner, tokens, then = SLOT.unpack_from(self._table, at)  # a shared slot keeps its owner
            # a time from before a reboot (the clock restarted): as good as refilled
            tokens = self.burst if then > now else min(self.burst, tokens + (now - then) * self.rate)
            taken = tokens >= 1.0
            SLOT.pack_into(self._table, at, owner, tokens - 1.0 if taken else tokens, now)
            return 0.0 if taken else (1.0 - tokens) / self.rate
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, length, offset)

    def _slot_of(self, digest: int, first: int, now: float) -> int:
        """The byte offset of the client's slot among the PROBE from `first`: its own, else
        a free one (empty, or refilled) made its own and full, else (every one another
        client's and still limited) the first, shared."""
        free = -1
        for index in range(first, first + PROBE):
            at = index * SLOT.size
            owner, tokens, then = SLOT.unpack_from(self._table, at)
            if owner == digest:
                return at
            if free < 0 and (owner == 0 or then > now or tokens + (now - then) * self.rate >= self.burst):
                free = at
        if free < 0:
            return first * SLOT.size
        SLOT.pack_into(self._table, free, digest, self.burst, now)
        return free

    def close(self) -> None:
        self._table.close()
        os.close(self._fd)
