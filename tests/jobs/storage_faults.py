"""Storage faults for the tests of jobs/storage.py and its users (tests/app): a directory
that cannot be written, a file-size limit, a corrupted database. Imported as
`tests.jobs.storage_faults`.

- `unwritable(directory)`: nothing can be created, renamed or removed under `directory`.
  Not as root: the directories are made read-only (chmod), the real thing. As root, where
  chmod stops nothing, os.open/os.mkdir/os.rename/os.replace/os.unlink/os.rmdir and
  open() refuse the same operations with EACCES, as the kernel would for the chmod
  (existing files stay writable, as they do then). SQLite does not go through them: its
  faults are injected with PRAGMA query_only (`read_only_database`).
- `run_limited(code, limit_bytes, workdir)`: `code` run in a Python subprocess whose
  file-size limit (RLIMIT_FSIZE) is set to `limit_bytes` when it calls `limit()`: writes
  past it fail with EFBIG as they do on a full disk with ENOSPC (SIGXFSZ is ignored by
  Python). The code prints one JSON line last; its value is returned.
- `run_on_small_disk(code, size_bytes, workdir)`: `code` run in a Python subprocess whose
  `DISK` is a file system of `size_bytes` of its own (a tmpfs mounted in a private mount
  namespace: `unshare`, as root or in a user namespace), and whose `fill()` fills it: a
  full disk for real, ENOSPC for every file on it. The test is skipped where the machine
  allows no such namespace (a container without the privilege).
- `corrupt(path, offset, size, rng)`: random bytes written over part of a file.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
from pencil_testkit import server_env

IS_ROOT = os.geteuid() == 0
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path: object, root: str) -> bool:
    if isinstance(path, int):
        return False
    name = os.path.abspath(os.fsdecode(os.fspath(path)))
    return name == root or name.startswith(root + os.sep)


def _refused(path: object) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))


@contextmanager
def _refusing_writes(root: str) -> Iterator[None]:
    """As root: the calls that create, rename or remove entries under `root` fail with EACCES."""
    real_open, real_builtin_open = os.open, builtins.open

    def guarded_open(path, flags, *args, **kwargs):
        creating = flags & os.O_CREAT and not os.path.lexists(path)
        if _inside(path, root) and creating:
            raise _refused(path)
        return real_open(path, flags, *args, **kwargs)

    def guarded_builtin_open(file, mode="r", *args, **kwargs):
        if _inside(file, root) and any(c in mode for c in "wax") and not os.path.lexists(file):
            raise _refused(file)
        return real_builtin_open(file, mode, *args, **kwargs)

    def refuse_inside(real, *positions):
        def guarded(*args, **kwargs):
            if any(_inside(args[i], root) for i in positions if i < len(args)):
                raise _refused(args[positions[0]])
            return real(*args, **kwargs)

        return guarded

    with (
        mock.patch.object(os, "open", guarded_open),
        mock.patch.object(builtins, "open", guarded_builtin_open),
        mock.patch.object(io, "open", guarded_builtin_open),
        mock.patch.object(os, "mkdir", refuse_inside(os.mkdir, 0)),
        mock.patch.object(os, "rename", refuse_inside(os.rename, 0, 1)),
        mock.patch.object(os, "replace", refuse_inside(os.replace, 0, 1)),
        mock.patch.object(os, "unlink", refuse_inside(os.unlink, 0)),
        mock.patch.object(os, "rmdir", refuse_inside(os.rmdir, 0)),
    ):
        yield


@contextmanager
def _read_only_directories(root: Path) -> Iterator[None]:
    """Not as root: every directory under `root` (itself included) made r-x for the block."""
    directories = [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]
    modes = {d: stat.S_IMODE(d.stat().st_mode) for d in directories}
    for directory in directories:
        directory.chmod(0o555)
    try:
        yield
    finally:
        for directory, mode in modes.items():
            directory.chmod(mode)


@contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """Nothing can be created, renamed or removed under `directory` inside the block."""
    if IS_ROOT:
        with _refusing_writes(os.path.abspath(directory)):
            yield
    else:
        with _read_only_directories(Path(directory)):
            yield


@contextmanager
def read_only_database(store) -> Iterator[None]:
    """The store's (SQLite) database refuses every write inside the block (SQLITE_READONLY)."""
    with store._db.session() as db:
        db.run("PRAGMA query_only = ON")
    try:
        yield
    finally:
        with store._db.session() as db:
            db.run("PRAGMA query_only = OFF")


_PRELUDE = """
import json, os, resource, sys
sys.path.insert(0, {tests!r})

def limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


def run_limited(code: str, limit_bytes: int, workdir: Path, timeout_s: float = 120) -> object:
    """Run `code` (dedented) in a subprocess in `workdir` whose `limit()` sets the file-size
    limit; returns the JSON value of its last output line."""
    prelude = _PRELUDE.format(tests=str(Path(__file__).resolve().parent), limit=limit_bytes)
    env = {**server_env(workdir), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


_DISK_PRELUDE = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
DISK = Path({disk!r})

def fill():
    fd = os.open(DISK / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    finally:
        os.close(fd)
"""


def _unshare() -> list[str] | None:
    """The unshare command that gives a process a mount namespace of its own, or None."""
    for command in (["unshare", "--user", "--map-root-user", "--mount"], ["unshare", "--mount"]):
        try:
            done = subprocess.run([*command, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0:
            return command
    return None


def run_on_small_disk(code: str, size_bytes: int, workdir: Path, timeout_s: float = 120) -> object:
    """Run `code` (dedented) in a subprocess in `workdir` with DISK, a file system of
    `size_bytes`, and fill(); returns the JSON value of its last output line. Skips the test
    where no private mount namespace can be had."""
    import pytest

    unshare = _unshare()
    if unshare is None:
        pytest.skip("no private mount namespace here (unshare) for a small file system")
    disk = workdir / "disk"
    disk.mkdir()
    prelude = _DISK_PRELUDE.format(tests=str(Path(__file__).resolve().parent), disk=str(disk))
    env = {**server_env(workdir), "PYTHONDONTWRITEBYTECODE": "1"}
    script = workdir / "on_small_disk.py"
    script.write_text(prelude + textwrap.dedent(code))
    mount = f"mount -t tmpfs -o size={size_bytes} tmpfs {disk} && exec {sys.executable} {script}"
    done = subprocess.run(
        [*unshare, "sh", "-c", mount], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0 and "mount" in done.stderr and "permission denied" in done.stderr.lower():
        pytest.skip(f"no tmpfs in a private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def corrupt(path: Path, offset: int, size: int, rng: np.random.Generator) -> bytes:
    """Write `size` random bytes over `path` at `offset`; returns the file's bytes before."""
    before = path.read_bytes()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return before
