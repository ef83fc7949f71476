"""Processing lanes: misses HF-processed in worker processes (or Ray actors) give the same inputs,
byte for byte, as processing in place; a dead lane fails its item with a typed error and restarts;
closing leaves no process behind."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from PIL import Image

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, LaneError, MediaDecodeError
from mmfront.inputs import MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.lanes import LaneSpec, LocalProcessLanes
from mmfront.processing.threads import ThreadPlan
from mmfront.testing.media import natural_image
from mmfront.wire import MsgpackEncoder

COMPARED = ("prompt_token_ids", "mm_kwargs", "mm_hashes", "mm_placeholders")


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _wire(inputs: MultiModalInputs) -> list[bytes]:
    """The inputs as the codec writes them: equal frames mean byte-identical tensors, dtypes,
    field layouts, hashes and placeholders."""
    return [bytes(f) for f in MsgpackEncoder().encode({key: inputs[key] for key in COMPARED})]  # type: ignore[literal-required]


def _prompt(pre: InputPreprocessor, n: int) -> list[int]:
    placeholder = pre.processor.get_placeholder_str("image", 0)
    return pre.tokenizer.encode("Look: " + " and ".join([placeholder] * n) + " now.")


@pytest.fixture(scope="module")
def in_place(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=0, mm_processor_cache_gb=0))


@pytest.fixture(scope="module")
def on_lanes(gemma3_dir: Path) -> Iterator[InputPreprocessor]:
    with InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=2, mm_processor_cache_gb=0)) as pre:
        yield pre


def _items(kind: str, tags: list[int], connector: MediaConnector) -> list[Any]:
    images = [natural_image(48, 40, tag=t) for t in tags]
    if kind == "pil":
        return images
    return [connector.load_image(_png(im), budget=DecodeBudget(1 << 30)) for im in images]


@pytest.mark.parametrize("kind", ["pil", "png"])
@pytest.mark.parametrize("tags", [[1], [1, 2], [1, 2, 3], [4, 5, 4]], ids=["1", "2", "3", "repeated"])
def test_lanes_give_the_same_inputs_as_in_place(
    in_place: InputPreprocessor, on_lanes: InputPreprocessor, kind: str, tags: list[int],
) -> None:
    prompt = _prompt(in_place, len(tags))
    want = in_place.preprocess(prompt, {"image": _items(kind, tags, in_place.connector)})
    got = on_lanes.preprocess(prompt, {"image": _items(kind, tags, on_lanes.connector)})
    assert _wire(got) == _wire(want)
    assert got["mm_hashes"]["image"][0] == want["mm_hashes"]["image"][0]


def test_each_unique_item_of_a_request_is_its_own_job(on_lanes: InputPreprocessor, monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = on_lanes.processor.lanes
    assert isinstance(lanes, LocalProcessLanes)
    jobs: list[int] = []
    submit = lanes.submit_job
    monkeypatch.setattr(lanes, "submit_job", lambda frames: jobs.append(1) or submit(frames))
    on_lanes.preprocess(_prompt(on_lanes, 3), {"image": [natural_image(48, 40, tag=t) for t in (7, 8, 7)]})
    assert len(jobs) == 2  # the repeated image is processed once
    monkeypatch.setattr(on_lanes.processor, "lanes_per_item", False)
    on_lanes.preprocess(_prompt(on_lanes, 3), {"image": [natural_image(48, 40, tag=t) for t in (9, 10, 11)]})
    assert len(jobs) == 3  # one job for the whole call


def test_an_item_failing_on_a_lane_raises_what_in_place_raises(
    in_place: InputPreprocessor, on_lanes: InputPreprocessor,
) -> None:
    truncated = _png(natural_image(48, 40, tag=12))[:-200]  # the header reads, the decode fails
    errors = []
    for pre in (in_place, on_lanes):
        with pytest.raises(MediaDecodeError) as info:
            pre.preprocess(_prompt(pre, 1), {"image": [pre.connector.load_image(truncated, budget=DecodeBudget(1 << 30))]})
        errors.append((type(info.value), info.value.parameter, str(info.value)))
    assert errors[0] == errors[1]
    assert errors[1][1] == "multi_modal_data"


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs")


def _wait_started(lanes: LocalProcessLanes) -> list[int]:
    deadline = time.monotonic() + 240
    while None in lanes.pids():
        assert time.monotonic() < deadline, "the lanes did not start"
        time.sleep(0.1)
    return [pid for pid in lanes.pids() if pid is not None]


def test_a_killed_lane_fails_its_item_with_lane_error_and_restarts(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    with InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=1, mm_processor_cache_gb=0)) as pre:
        lanes = pre.processor.lanes
        assert isinstance(lanes, LocalProcessLanes)
        (pid,) = _wait_started(lanes)
        os.kill(pid, signal.SIGKILL)
        prompt = _prompt(pre, 1)
        with pytest.raises(LaneError, match=r"exited with code -9 while it held an item") as info:
            pre.preprocess(prompt, {"image": [natural_image(48, 40, tag=13)]})
        assert info.value.retryable is True
        got = pre.preprocess(prompt, {"image": [natural_image(48, 40, tag=13)]})
        assert _wire(got) == _wire(in_place.preprocess(prompt, {"image": [natural_image(48, 40, tag=13)]}))
        (new_pid,) = lanes.pids()
        assert new_pid not in (None, pid)


def test_closing_leaves_no_process_and_later_misses_run_in_place(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=2, mm_processor_cache_gb=0))
    lanes = pre.processor.lanes
    assert isinstance(lanes, LocalProcessLanes)
    pids = _wait_started(lanes)
    pre.close()
    pre.close()  # idempotent
    for pid in pids:
        _wait_dead(pid)
    assert lanes.pids() == [None, None]
    with pytest.raises(LaneError, match="closed"):
        lanes.submit_job([b""])
    assert pre.processor.lanes is None
    prompt = _prompt(pre, 1)
    got = pre.preprocess(prompt, {"image": [natural_image(48, 40, tag=14)]})
    assert _wire(got) == _wire(in_place.preprocess(prompt, {"image": [natural_image(48, 40, tag=14)]}))


def test_a_lane_that_cannot_build_the_processor_fails_its_items(gemma3_dir: Path) -> None:
    spec = LaneSpec.of(create_processor(gemma3_dir))
    assert spec is not None
    broken = msgspec.structs.replace(spec, model_dir=str(gemma3_dir / "missing"))
    with LocalProcessLanes(broken, 1) as lanes:
        frames = lanes.encode_job(create_processor(gemma3_dir).info.parse_mm_data({"image": natural_image(8, 8)}), {})
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


# --- configuration ------------------------------------------------------------------------------


def test_lanes_need_a_processor_a_lane_can_rebuild(gemma3_processor: Any) -> None:
    with pytest.raises(ConfigError, match=r"mm_processing_lanes=2 needs a processor a lane can rebuild"):
        InputPreprocessor(gemma3_processor, MultiModalConfig(mm_processing_lanes=2))
    pre = InputPreprocessor(gemma3_processor, MultiModalConfig(mm_processing_lanes=None))
    assert pre.processor.lanes is None  # the default degrades to in place


def test_a_spec_names_the_classes_by_import_path(gemma3_dir: Path) -> None:
    spec = LaneSpec.of(create_processor(gemma3_dir))
    assert spec is not None
    assert spec.processor_cls == "mmfront.models.gemma3:Gemma3MultiModalProcessor"
    assert spec.info_cls == "mmfront.models.gemma3:Gemma3ProcessingInfo"
    assert MultiModalConfig(**spec.config) == MultiModalConfig()


@pytest.mark.parametrize(("field", "value"), [("mm_processing_lanes", -1), ("mm_processing_lanes", 1.5),
                                              ("mm_thread_budget", 0), ("mm_lane_executor", "threads")])
def test_bad_lane_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        MultiModalConfig(**{field: value})


@pytest.mark.parametrize(("lanes", "budget", "want"), [
    (None, 4, ThreadPlan(budget=4, lanes=3, torch_threads=1, decode_threads=1)),
    (None, 1, ThreadPlan(budget=1, lanes=1, torch_threads=1, decode_threads=1)),
    (0, 4, ThreadPlan(budget=4, lanes=0, torch_threads=1, decode_threads=4)),
    (2, 8, ThreadPlan(budget=8, lanes=2, torch_threads=1, decode_threads=6)),
])
def test_the_thread_plan_divides_the_budget(lanes: int | None, budget: int, want: ThreadPlan) -> None:
    assert ThreadPlan.from_config(MultiModalConfig(mm_processing_lanes=lanes, mm_thread_budget=budget)) == want


# --- Ray ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_lanes_give_the_same_inputs_as_in_place(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    ray = pytest.importorskip("ray", reason="Ray is the optional extra mmfront[ray]; `make test` installs it in "
                              ".venv only (nothing in the Ray path depends on the transformers version)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config = MultiModalConfig(mm_processing_lanes=2, mm_lane_executor="ray", mm_processor_cache_gb=0)
        with InputPreprocessor(gemma3_dir, config) as pre:
            for kind, tags in (("pil", [1, 2, 3]), ("png", [4, 5, 4])):
                prompt = _prompt(pre, len(tags))
                got = pre.preprocess(prompt, {"image": _items(kind, tags, pre.connector)})
                want = in_place.preprocess(prompt, {"image": _items(kind, tags, in_place.connector)})
                assert _wire(got) == _wire(want)
    finally:
        ray.shutdown()
