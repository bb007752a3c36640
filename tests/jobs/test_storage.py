"""jobs/storage.py: what a storage error says and which status it gets, durable writes that
leave nothing half-written, and the checks of start-up and readiness, with real faults
(tests/app/storage_faults.py)."""

from __future__ import annotations

import errno

import pytest

from jobs.storage import (
    StartupError,
    StorageError,
    prepare_directory,
    probe_directory,
    storage_errors,
    write_atomically,
)
from tests.jobs.storage_faults import run_limited, unwritable


@pytest.mark.parametrize(
    ("code", "out_of_space"),
    [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EFBIG, True), (errno.EACCES, False), (errno.EIO, False)],
)
def test_a_storage_error_says_what_failed_and_whether_space_is_missing(code, out_of_space):
    error = StorageError("store the corpus", OSError(code, "reason"))
    assert isinstance(error, OSError) and error.errno == code
    assert str(error) == "could not store the corpus: reason"
    assert error.out_of_space is out_of_space


def test_storage_errors_wraps_os_errors_only():
    with pytest.raises(StorageError) as caught, storage_errors("read it"):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/x")
    assert str(caught.value) == "could not read it: Permission denied" and caught.value.errno == errno.EACCES
    inner = StorageError("store the result", OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(StorageError) as caught, storage_errors("read it"):
        raise inner
    assert caught.value is inner
    with pytest.raises(ValueError), storage_errors("read it"):
        raise ValueError("not storage")


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "job.json"
    write_atomically(target, b"first")
    write_atomically(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]


def test_a_write_past_the_file_size_limit_leaves_the_old_file_and_no_temporary(tmp_path):
    result = run_limited(
        """
        from pathlib import Path
        from jobs.storage import write_atomically
        target = Path("record.json")
        write_atomically(target, b"old")
        limit()
        try:
            write_atomically(target, b"x" * 2_000_000)
            error = None
        except OSError as exc:
            error = exc.errno
        print(json.dumps({"error": error, "content": target.read_text(), "files": sorted(os.listdir("."))}))
        """,
        1_000_000,
        tmp_path,
    )
    assert result == {"error": errno.EFBIG, "content": "old", "files": ["record.json"]}


def test_probe_directory_creates_nothing_and_names_the_fault(tmp_path):
    assert probe_directory(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    with unwritable(tmp_path):
        assert probe_directory(tmp_path) == "Permission denied"
    assert list(tmp_path.iterdir()) == []
    assert probe_directory(tmp_path / "missing") == "No such file or directory"


def test_prepare_directory_makes_it_or_says_what_to_do(tmp_path):
    prepare_directory(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("a file where the data directory should be")
    with pytest.raises(StartupError) as caught:
        prepare_directory(tmp_path / "file" / "data")
    assert "cannot be written (Not a directory)" in str(caught.value) and "PENCIL_DATA_DIR" in str(caught.value)
    with unwritable(tmp_path / "a"), pytest.raises(StartupError) as caught:
        prepare_directory(tmp_path / "a" / "b")
    assert "Permission denied" in str(caught.value)
