"""Issue 22, class 9: a lane that dies while idle (killed, OOM) is replaced before it is given
work, so the next request is served; only a lane that dies holding an item fails that item."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from mmfront import MultiModalConfig
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import LocalProcessExecutor
from mmfront.testing.media import natural_image


def _started(lanes: LocalProcessExecutor) -> list[int]:
    deadline = time.monotonic() + 240
    while None in lanes.pids():
        assert time.monotonic() < deadline, "the lanes did not start"
        time.sleep(0.1)
    return [pid for pid in lanes.pids() if pid is not None]


def _wait_exited(pid: int) -> None:
    """Until the killed process has finished dying: a zombie (its parent has not reaped it yet)
    whose threads are all gone, so its descriptors are closed; or gone."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":" in line)
        except FileNotFoundError:
            return
        if status["State"].split()[0] in ("Z", "X") and int(status["Threads"]) <= 1:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs")


def test_a_lane_killed_while_idle_is_replaced_before_the_next_item(gemma3_dir: Path) -> None:
    config = MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0)
    with InputPreprocessor(gemma3_dir, config) as pre:
        lanes = pre.item_executor
        assert isinstance(lanes, LocalProcessExecutor)
        pids = _started(lanes)
        for pid in pids:  # the lane dies idle: the next item would go to a dead lane
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            _wait_exited(pid)
        ids = pre.tokenizer.encode("Look: " + pre.processor.get_placeholder_str("image", 0) + " now.")
        for tag in (1, 2, 3):  # no LaneError: each item goes to a live lane
            got = pre.preprocess(ids, {"image": [natural_image(48, 40, tag=tag)]})
            assert len(got["mm_hashes"]["image"]) == 1
        assert not set(lanes.pids()) & set(pids)
