"""The processes of the processing lanes, as the tests that kill and count them see them through
``/proc``: when the lanes are up, whose child a process is, whether it has ended; and lane
parents forked from the suite's preloaded interpreter, for the tests whose claim is not the
parent's start."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import preloaded
from mmfront.processing.executors import LocalProcessExecutor, local


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


_HIGH_FD = 900
"""Where the parent's socket is passed: a number the preloaded child has not opened itself."""


def _preloaded_parent(args: list[str], *, pass_fds: tuple[int, ...], stdin: Any, env: dict[str, str]) -> Any:
    (fd,) = pass_fds
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
    try:
        code = args[-1].replace(f"parent_main({fd})", f"parent_main({high})")
        assert code != args[-1], args
        return preloaded.popen([*args[:-1], code], env=env, pass_fds=(high,), stdin=stdin)
    finally:
        os.close(high)


@contextlib.contextmanager
def preloaded_lane_parents() -> Iterator[None]:
    """While open, ``LocalProcessExecutor`` starts its lane parent (``python -c ...parent_main(fd)``,
    its socket passed) from the preloaded interpreter (tests/preloaded.py), which has imported
    torch and transformers: ~4 s of CPU fewer per executor. The parent then builds its processor
    and forks its lanes as a fresh one does. Not for the tests of the parent's own start (what
    its interpreter imports, whose child it is: tests/processing/executors/test_lane_parent.py, a
    script's lanes)."""
    shim = types.SimpleNamespace(Popen=_preloaded_parent, DEVNULL=subprocess.DEVNULL,
                                 TimeoutExpired=subprocess.TimeoutExpired)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "subprocess", shim)
        yield
