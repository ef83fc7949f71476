"""The processes of the processing lanes, as the tests that kill and count them see them through
``/proc``: when the lanes are up, whose child a process is, whether it has ended."""

from __future__ import annotations

import os
import time
from pathlib import Path

from mmfront.processing.executors import LocalProcessExecutor


def wait_started(lanes: LocalProcessExecutor) -> list[int]:
    """The lanes' pids, once every lane is up."""
    deadline = time.monotonic() + 240
    while None in lanes.pids():
        assert time.monotonic() < deadline, "the lanes did not start"
        time.sleep(0.1)
    return [pid for pid in lanes.pids() if pid is not None]


def ended(pid: int) -> bool:
    """Whether process ``pid`` has finished dying: gone, or a zombie (its parent has not reaped it
    yet) whose threads are all gone, so its descriptors are closed."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
    except (FileNotFoundError, ProcessLookupError):  # gone, before the open or between it and the read
        return True
    return status["State"].split()[0] in ("Z", "X") and int(status["Threads"]) <= 1


def wait_ended(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not ended(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))
