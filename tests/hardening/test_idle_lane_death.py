"""Issue 22, class 9: a lane that dies while idle (killed, OOM) is replaced before it is given
work, so the next request is served; only a lane that dies holding an item fails that item; and
whatever lanes die, the caller is left with no descriptor or mapping of theirs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from lane_processes import wait_ended, wait_started
from mmfront import MultiModalConfig
from mmfront.errors import LaneError
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import ItemJob, LocalProcessExecutor
from mmfront.testing.media import natural_image

pytestmark = pytest.mark.usefixtures("preloaded_lane_parents")  # not a test of the parent's start


def test_a_lane_killed_while_idle_is_replaced_before_the_next_item(gemma3_dir: Path) -> None:
    config = MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0)
    with InputPreprocessor(gemma3_dir, config) as pre:
        lanes = pre.item_executor
        assert isinstance(lanes, LocalProcessExecutor)
        pids = wait_started(lanes)
        for pid in pids:  # the lane dies idle: the next item would go to a dead lane
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            wait_ended(pid)
        ids = pre.tokenizer.encode("Look: " + pre.processor.get_placeholder_str("image", 0) + " now.")
        for tag in (1, 2, 3):  # no LaneError: each item goes to a live lane
            got = pre.preprocess(ids, {"image": [natural_image(48, 40, tag=tag)]})
            assert len(got["mm_hashes"]["image"]) == 1
        assert not set(lanes.pids()) & set(pids)


def _descriptors_and_mappings() -> tuple[int, int]:
    with open("/proc/self/maps") as maps:
        return len(os.listdir("/proc/self/fd")), sum("mmfront-frames" in line for line in maps)


def test_many_requests_and_killed_lanes_leave_no_descriptor_or_mapping_behind(gemma3_dir: Path) -> None:
    """A lane's jobs and replies travel in one shared buffer each way, reused request after request
    (mmfront.wire.shared_buffer): the caller holds a fixed set of descriptors and mappings per lane,
    whatever the number of requests, and a killed lane's are released with it."""
    before = _descriptors_and_mappings()
    with InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0)) as pre:
        lanes = pre.item_executor
        assert isinstance(lanes, LocalProcessExecutor)
        (pid,) = wait_started(lanes)
        ids = pre.tokenizer.encode("Look: " + pre.processor.get_placeholder_str("image", 0) + " now.")

        def serve(tag: int) -> None:
            got = pre.preprocess(ids, {"image": [natural_image(48, 40, tag=tag)]})
            assert len(got["mm_kwargs"]["image"]) == 1

        serve(100)
        steady = _descriptors_and_mappings()
        assert steady[1] == before[1] + 2  # the caller's mappings of its job buffer and of the lane's reply buffer
        for tag in range(101, 131):
            serve(tag)
        assert _descriptors_and_mappings() == steady
        os.kill(pid, signal.SIGKILL)  # while idle: replaced before its next item
        wait_ended(pid)
        for tag in range(131, 141):
            serve(tag)
        assert _descriptors_and_mappings() == steady
        (restarted,) = lanes.pids()
        assert restarted is not None
        pid = restarted
        os.kill(pid, signal.SIGSTOP)  # takes the next item and dies holding it
        try:
            job = lanes.encode_job(ItemJob(pre.processor.info.parse_mm_data({"image": natural_image(48, 40, tag=141)}), {}))
            assert job is not None
            held = lanes.submit_job(job)
            deadline = time.monotonic() + 60
            while not lanes._jobs.empty():  # the lane's thread took it and sends it to the stopped lane
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.3)
        finally:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(LaneError, match="while it held an item"):
            held.result(60)
        assert _descriptors_and_mappings()[1] == before[1]  # the dead lane's buffers went with it
        for tag in range(142, 152):
            serve(tag)
        assert _descriptors_and_mappings() == steady
    assert _descriptors_and_mappings() == before
