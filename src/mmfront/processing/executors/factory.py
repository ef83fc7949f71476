"""The item executor a config asks for."""

from __future__ import annotations

from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.processing.executors.base import ItemExecutor, ItemProcessor
from mmfront.processing.executors.inplace import InPlaceExecutor
from mmfront.processing.executors.jobs import LaneSpec
from mmfront.processing.executors.local import LocalProcessExecutor
from mmfront.processing.executors.ray import RayExecutor


def executor_from_config(processor: ItemProcessor, config: MultiModalConfig, lanes: int) -> ItemExecutor:
    """The executor ``config`` asks for (``mm_lane_executor``), with ``lanes`` lanes for
    ``processor``; in place for ``lanes`` 0, or for lanes left to the default
    (``mm_processing_lanes=None``) with a processor no lane can rebuild."""
    if lanes == 0:
        return InPlaceExecutor()
    spec = LaneSpec.of(processor)
    if spec is None:
        if config.mm_processing_lanes is None:
            return InPlaceExecutor()
        raise ConfigError(
            f"mm_processing_lanes={config.mm_processing_lanes} needs a processor a lane can rebuild: one created "
            f"from a model folder (create_processor(folder)), with classes importable by name; "
            f"{type(processor).__name__} is not. Set mm_processing_lanes=0 to process in place.")
    if config.mm_lane_executor == "ray":
        return RayExecutor(spec, lanes)
    return LocalProcessExecutor(spec, lanes)


__all__ = ["executor_from_config"]
