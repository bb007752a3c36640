"""jobs/leader.py: one runner lock holder at a time, released by close or by death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from jobs.leader import RunnerLock


def test_one_holder_at_a_time(tmp_path):
    first, second = RunnerLock(tmp_path / "lock"), RunnerLock(tmp_path / "lock")
    assert first.try_acquire() and first.held
    assert not second.try_acquire() and not second.held
    assert first.try_acquire()  # taking it again is a no-op
    first.release()
    assert second.try_acquire()
    assert (tmp_path / "lock").read_text().strip() == str(os.getpid())
    second.release()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from jobs.leader import RunnerLock; import sys, time; assert "
            f"RunnerLock({str(path)!r}).try_acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = RunnerLock(path)
        assert not lock.try_acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not lock.try_acquire():
            assert time.monotonic() < deadline, "the dead holder's lock was never released"
            time.sleep(0.05)
        lock.release()
    finally:
        holder.kill()
        holder.wait(timeout=10)
