"""The lane parent: every lane is forked from one interpreter that built the processor once. A
forked lane answers a job with the bytes a freshly started interpreter answers; a dead lane or a
dead parent is replaced; the parent runs one thread whenever it forks; and nothing outlives the
executor, closed or killed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from lane_processes import parent_of, threads_of, wait_ended, wait_started
from mmfront.errors import LaneError
from mmfront.models.registry import create_processor
from mmfront.processing.executors import ItemJob, LaneSpec, LocalProcessExecutor
from mmfront.processing.executors.jobs import LaneReply, encode_job
from mmfront.testing.media import natural_image
from mmfront.wire import MsgpackDecoder, MsgpackEncoder
from preloaded import popen, run

_FRESH = """
import sys
import msgspec
from mmfront.processing.executors.jobs import LaneRunner, LaneSpec
spec, frames = msgspec.msgpack.decode(open(sys.argv[1], "rb").read())
reply = LaneRunner(msgspec.msgpack.decode(spec, type=LaneSpec)).run(frames)
open(sys.argv[2], "wb").write(msgspec.msgpack.encode([bytes(f) for f in reply]))
"""
"""A lane's body building its own processor where it runs, as a lane started fresh did before the
lanes were forked (run from the suite's preloaded interpreter, which has imported torch and
transformers but built nothing): the spec and one job's frames in, the reply's frames out."""


def _job(gemma3_dir: Path, tag: int) -> list[Any]:
    processor = create_processor(gemma3_dir)
    frames = encode_job(ItemJob(processor.info.parse_mm_data({"image": [natural_image(48, 40, tag=tag)]}), {}),
                        MsgpackEncoder())
    assert frames is not None
    return frames


def _items_bytes(reply_frames: list[Any]) -> list[bytes]:
    reply: LaneReply = MsgpackDecoder(LaneReply).decode(reply_frames)
    assert reply.failure is None and reply.items is not None
    return [bytes(f) for f in MsgpackEncoder().encode(reply.items)]


def _spec(gemma3_dir: Path) -> LaneSpec:
    spec = LaneSpec.of(create_processor(gemma3_dir))
    assert spec is not None
    return spec


def _bytes_of(lanes: LocalProcessExecutor, frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in MsgpackEncoder().encode(lanes.submit_job(frames).result(240))]


def test_forked_lanes_answer_the_fresh_bytes_and_a_dead_parent_is_replaced(
        gemma3_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A lane and its replacement, forked from one parent, answer a job with the bytes of a lane
    that built its own processor; a dead parent leaves its idle lane serving, and the next lane to
    start starts a new parent."""
    spec = _spec(gemma3_dir)
    frames = _job(gemma3_dir, 21)
    (tmp_path / "job").write_bytes(msgspec.msgpack.encode([msgspec.msgpack.encode(spec), [bytes(f) for f in frames]]))
    run([sys.executable, "-c", _FRESH, str(tmp_path / "job"), str(tmp_path / "reply")], check=True, timeout=280)
    fresh = _items_bytes([bytearray(f) for f in msgspec.msgpack.decode((tmp_path / "reply").read_bytes())])
    with LocalProcessExecutor(spec, 1) as lanes:
        (first,) = wait_started(lanes)
        parent = lanes.parent_pid()
        assert parent is not None and parent_of(first) == parent
        assert threads_of(parent) == 1  # it forks only so (below), and the fixture's build leaves it so
        assert _bytes_of(lanes, frames) == fresh
        os.kill(first, signal.SIGKILL)  # idle: its replacement is forked from the same parent
        wait_ended(first)
        assert _bytes_of(lanes, frames) == fresh
        (second,) = lanes.pids()
        assert second not in (None, first) and second is not None
        assert parent_of(second) == parent == lanes.parent_pid()

        os.kill(parent, signal.SIGKILL)
        wait_ended(parent)
        assert _bytes_of(lanes, frames) == fresh  # the idle lane did not need its parent
        assert lanes.pids() == [second]
        os.kill(second, signal.SIGKILL)  # its replacement needs a parent: a new one
        wait_ended(second)
        with caplog.at_level(logging.WARNING, logger="mmfront.processing.executors.local"):
            assert _bytes_of(lanes, frames) == fresh
        (third,) = lanes.pids()
        new_parent = lanes.parent_pid()
        assert third is not None and new_parent not in (None, parent) and parent_of(third) == new_parent
        assert f"The processing lanes' parent (pid {parent}) is gone" in caplog.text


def test_a_parent_that_runs_another_thread_refuses_to_fork(gemma3_dir: Path) -> None:
    """A fork inherits every lock but only the forking thread: the parent counts its threads before
    each fork."""
    threaded = msgspec.structs.replace(_spec(gemma3_dir), built_by="lane_inputs:build_with_a_thread")
    with LocalProcessExecutor(threaded, 1) as lanes, pytest.raises(
            LaneError, match=r"Could not start processing lane mmfront-lane-0: the lane parent runs 2 threads"):
        lanes.submit_job(_job(gemma3_dir, 23)).result(240)


_SERVER = """
import sys, time
from mmfront.models.registry import create_processor
from mmfront.processing.executors import LaneSpec, LocalProcessExecutor
lanes = LocalProcessExecutor(LaneSpec.of(create_processor(sys.argv[1])), 2)
while None in lanes.pids():
    time.sleep(0.05)
print(lanes.parent_pid(), *lanes.pids(), flush=True)
time.sleep(600)
"""


def test_a_killed_caller_leaves_no_lane_or_parent_behind(gemma3_dir: Path) -> None:
    caller = popen([sys.executable, "-c", _SERVER, str(gemma3_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        parent, *lanes = (int(pid) for pid in caller.stdout.readline().split())
        assert len(lanes) == 2 and all(parent_of(lane) == parent for lane in lanes)
        assert parent_of(parent) == caller.pid
    finally:
        caller.kill()
        caller.wait()
    for pid in (parent, *lanes):
        wait_ended(pid)
