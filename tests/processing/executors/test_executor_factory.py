"""Which executor a config gets, and what a lane is told to build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import InPlaceExecutor, LaneSpec


def test_lanes_need_a_processor_a_lane_can_rebuild(gemma3_processor: Any) -> None:
    with pytest.raises(ConfigError, match=r"mm_processing_lanes=2 needs a processor a lane can rebuild"):
        InputPreprocessor(gemma3_processor, MultiModalConfig(mm_processing_lanes=2))
    pre = InputPreprocessor(gemma3_processor, MultiModalConfig(mm_processing_lanes=None))
    assert isinstance(pre.item_executor, InPlaceExecutor)  # the default degrades to in place


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
