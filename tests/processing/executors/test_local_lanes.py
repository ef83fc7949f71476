"""Local process lanes: misses HF-processed in worker processes give the same inputs, byte for
byte, as processing in place; a dead lane fails its item with a typed error and restarts; closing
leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from lane_inputs import items, png, prompt, wire

from lane_processes import parent_of, wait_ended, wait_started
from mmfront import MultiModalConfig
from mmfront.errors import LaneError, MediaDecodeError, ValidationError
from mmfront.media import DecodeBudget
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import InPlaceExecutor, ItemJob, LaneSpec, LocalProcessExecutor
from mmfront.processing.executors.jobs import LaneReply
from mmfront.testing.media import natural_image

pytestmark = pytest.mark.usefixtures("preloaded_lane_parents")  # not a test of the parent's start


@pytest.mark.parametrize("kind", ["pil", "png"])
@pytest.mark.parametrize("tags", [[1], [1, 2], [1, 2, 3], [4, 5, 4]], ids=["1", "2", "3", "repeated"])
def test_lanes_give_the_same_inputs_as_in_place(
    in_place: InputPreprocessor, on_lanes: InputPreprocessor, kind: str, tags: list[int],
) -> None:
    ids = prompt(in_place, len(tags))
    want = in_place.preprocess(ids, {"image": items(kind, tags, in_place.connector)})
    got = on_lanes.preprocess(ids, {"image": items(kind, tags, on_lanes.connector)})
    assert wire(got) == wire(want)
    assert got["mm_hashes"]["image"][0] == want["mm_hashes"]["image"][0]


def test_each_unique_item_of_a_request_is_its_own_job(on_lanes: InputPreprocessor, monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = on_lanes.item_executor
    assert isinstance(lanes, LocalProcessExecutor)
    jobs: list[int] = []
    submit = lanes.submit_job
    monkeypatch.setattr(lanes, "submit_job", lambda frames: jobs.append(1) or submit(frames))
    on_lanes.preprocess(prompt(on_lanes, 3), {"image": [natural_image(48, 40, tag=t) for t in (7, 8, 7)]})
    assert len(jobs) == 2  # the repeated image is processed once
    monkeypatch.setattr(on_lanes.processor, "items_are_independent", False)
    on_lanes.preprocess(prompt(on_lanes, 3), {"image": [natural_image(48, 40, tag=t) for t in (9, 10, 11)]})
    assert len(jobs) == 3  # one job for the whole call


def test_an_item_failing_on_a_lane_raises_what_in_place_raises(
    in_place: InputPreprocessor, on_lanes: InputPreprocessor,
) -> None:
    truncated = png(natural_image(48, 40, tag=12))[:-200]  # the header reads, the decode fails
    errors = []
    for pre in (in_place, on_lanes):
        with pytest.raises(MediaDecodeError) as info:
            pre.preprocess(prompt(pre, 1), {"image": [pre.connector.load_image(truncated, budget=DecodeBudget(1 << 30))]})
        errors.append((type(info.value), info.value.parameter, str(info.value)))
    assert errors[0] == errors[1]
    assert errors[1][1] == "multi_modal_data"


def test_a_warm_up_runs_on_a_lane_and_comes_back_empty(on_lanes: InputPreprocessor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane processes the dummy and keeps its outputs: the server gets an empty reply."""
    lanes = on_lanes.item_executor
    assert isinstance(lanes, LocalProcessExecutor)
    sent: list[list[Any]] = []
    replies: list[LaneReply] = []
    submit = lanes._submit

    def spy(frames: list[Any]) -> Any:
        sent.append(frames)
        future = submit(frames)
        future.add_done_callback(lambda done: replies.append(msgspec.msgpack.decode(done.result()[0], type=LaneReply)))
        return future

    monkeypatch.setattr(lanes, "_submit", spy)
    on_lanes.warmup()
    assert [msgspec.msgpack.decode(frames[0]) for frames in sent] == [{"items": {}, "hf_kwargs": {}, "warm_up": {"image": 1}}]
    assert replies == [LaneReply()]
    assert [len(frames) for frames in sent] == [1]


def test_a_warm_up_failing_on_a_lane_raises_what_in_place_raises(
    in_place: InputPreprocessor, on_lanes: InputPreprocessor,
) -> None:
    errors = []
    for pre in (in_place, on_lanes):
        with pytest.raises(ValidationError) as info:
            pre.item_executor.warm_up({"audio": 1}, pre.processor)  # Gemma 3 takes no audio
        errors.append((type(info.value), info.value.parameter, str(info.value)))
    assert errors[0] == errors[1]


def test_a_killed_lane_fails_its_item_with_lane_error_and_restarts(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    with InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0)) as pre:
        lanes = pre.item_executor
        assert isinstance(lanes, LocalProcessExecutor)
        (pid,) = wait_started(lanes)
        parent = lanes.parent_pid()
        ids = prompt(pre, 1)
        os.kill(pid, signal.SIGSTOP)  # the lane takes the item but cannot answer it: it holds it
        handed = threading.Event()
        submit_job = lanes.submit_job

        def submitted(frames: Any) -> Any:
            future = submit_job(frames)
            handed.set()
            return future

        lanes.submit_job = submitted  # type: ignore[method-assign]
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(pre.preprocess, ids, {"image": [natural_image(48, 40, tag=13)]})
            assert handed.wait(60)
            deadline = time.monotonic() + 60
            while not lanes._jobs.empty():  # the lane's thread took it and sends it to the stopped lane
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(LaneError, match=r"exited with code -9 while it held an item") as info:
                pending.result(60)
        del lanes.submit_job
        assert info.value.retryable is True
        got = pre.preprocess(ids, {"image": [natural_image(48, 40, tag=13)]})
        assert wire(got) == wire(in_place.preprocess(ids, {"image": [natural_image(48, 40, tag=13)]}))
        (new_pid,) = lanes.pids()
        assert new_pid not in (None, pid)
        assert new_pid is not None and parent_of(new_pid) == parent == lanes.parent_pid()  # forked again


def test_closing_leaves_no_process_and_later_misses_run_in_place(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0))
    lanes = pre.item_executor
    assert isinstance(lanes, LocalProcessExecutor)
    pids = wait_started(lanes)
    parent = lanes.parent_pid()
    assert parent is not None
    pre.close()
    pre.close()  # idempotent
    for pid in [*pids, parent]:
        wait_ended(pid)
    assert (lanes.pids(), lanes.parent_pid()) == ([None], None)
    with pytest.raises(LaneError, match="closed"):
        lanes.submit_job([b""])
    assert isinstance(pre.item_executor, InPlaceExecutor)
    ids = prompt(pre, 1)
    got = pre.preprocess(ids, {"image": [natural_image(48, 40, tag=14)]})
    assert wire(got) == wire(in_place.preprocess(ids, {"image": [natural_image(48, 40, tag=14)]}))


def test_a_lane_that_cannot_build_the_processor_fails_its_items(gemma3_dir: Path) -> None:
    spec = LaneSpec.of(create_processor(gemma3_dir))
    assert spec is not None
    broken = msgspec.structs.replace(spec, model_dir=str(gemma3_dir / "missing"))
    with LocalProcessExecutor(broken, 1) as lanes:
        job = ItemJob(create_processor(gemma3_dir).info.parse_mm_data({"image": natural_image(8, 8)}), {})
        frames = lanes.encode_job(job)
        assert frames is not None
        with pytest.raises(LaneError, match="could not build the processor"):
            lanes.submit_job(frames).result(timeout=240)


def test_a_script_without_a_main_guard_runs_once(gemma3_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from mmfront import MultiModalConfig\n"
        "from mmfront.preprocess import InputPreprocessor\n"
        "from mmfront.testing.media import natural_image\n"
        f"pre = InputPreprocessor({str(gemma3_dir)!r}, MultiModalConfig(mm_processing_lanes=1))\n"
        "ids = pre.tokenizer.encode(pre.processor.get_placeholder_str('image', 0))\n"
        "print('items', len(pre.preprocess(ids, {'image': [natural_image(48, 40)]})['mm_kwargs']['image']))\n"
        "pre.close()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280, check=False)
    assert (done.returncode, done.stdout) == (0, "items 1\n"), done.stderr[-2000:]
