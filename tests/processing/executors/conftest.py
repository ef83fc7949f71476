from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mmfront import MultiModalConfig
from mmfront.preprocess import InputPreprocessor


@pytest.fixture(scope="module")
def in_place(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=0, mm_processor_cache_gb=0))


@pytest.fixture(scope="module")
def on_lanes(gemma3_dir: Path, preloaded_lane_parents: None) -> Iterator[InputPreprocessor]:
    with InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processing_lanes=2, mm_processor_cache_gb=0)) as pre:
        yield pre
