"""The thread budget's division, and where misses are processed when ``mm_processing_lanes`` is
left to the default: in place for a processor whose misses run in mmfront's kernels, on lanes
otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig, bicubic, pixels
from mmfront.models.registry import create_processor
from mmfront.models.transformers.base import TRANSFORMERS_VERSION
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import InPlaceExecutor, LocalProcessExecutor
from mmfront.processing.threads import ThreadPlan
from mmfront.testing.models import build_model_folder


@pytest.mark.parametrize(("lanes", "budget", "want"), [
    (None, 4, ThreadPlan(budget=4, lanes=3, torch_threads=1, decode_threads=1)),
    (None, 1, ThreadPlan(budget=1, lanes=1, torch_threads=1, decode_threads=1)),
    (0, 4, ThreadPlan(budget=4, lanes=0, torch_threads=1, decode_threads=4)),
    (2, 8, ThreadPlan(budget=8, lanes=2, torch_threads=1, decode_threads=6)),
])
def test_the_thread_plan_divides_the_budget(lanes: int | None, budget: int, want: ThreadPlan) -> None:
    assert ThreadPlan.from_config(MultiModalConfig(mm_processing_lanes=lanes, mm_thread_budget=budget)) == want


@pytest.mark.parametrize(("lanes", "budget", "want"), [
    (None, 4, ThreadPlan(budget=4, lanes=0, torch_threads=1, decode_threads=4)),
    (None, 1, ThreadPlan(budget=1, lanes=0, torch_threads=1, decode_threads=1)),
    (2, 4, ThreadPlan(budget=4, lanes=2, torch_threads=1, decode_threads=2)),  # asked for: lanes
])
def test_a_processor_whose_misses_run_in_mmfronts_kernels_gets_no_lane_by_default(
        lanes: int | None, budget: int, want: ThreadPlan) -> None:
    config = MultiModalConfig(mm_processing_lanes=lanes, mm_thread_budget=budget)
    assert ThreadPlan.from_config(config, in_place_misses=True) == want


KERNELS_HERE = bicubic.resizes_in_c() and pixels.patch_rows_in_c()
QWEN_KERNELS = Version("5.15") <= TRANSFORMERS_VERSION and KERNELS_HERE
"""transformers 5.14 inlines Qwen2-VL's ``patchify``: its misses stay HF's steps, lanes pay."""


@pytest.mark.parametrize(("kind", "sizes", "in_place"), [
    pytest.param("gemma3", {}, True, id="Gemma 3 (native)"),
    pytest.param("qwen2_5_vl", {"patch_size": 14, "merge_size": 2}, QWEN_KERNELS, marks=NEEDS_TORCHVISION,
                 id="Qwen2.5-VL (its image processor's steps swapped)"),
    pytest.param("llava_onevision", {}, False, id="LLaVA-OneVision (HF's steps)"),
])
def test_which_processors_process_their_misses_in_place(kind: str, sizes: dict[str, int], in_place: bool,
                                                        tmp_path: Path) -> None:
    folder = build_model_folder(kind, tmp_path / kind, **sizes)
    assert create_processor(folder).in_place_misses is in_place
    with InputPreprocessor(folder, MultiModalConfig(mm_processing_lanes=None, mm_thread_budget=2)) as pre:
        executor = pre.item_executor
        assert pre.pipeline.threads.lanes == (0 if in_place else 1)
        assert isinstance(executor, InPlaceExecutor if in_place else LocalProcessExecutor)
