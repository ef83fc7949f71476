"""Item executors: where a processor's cache misses are HF-processed.

The processor hands its executor an :class:`ItemJob` (the items and the HF kwargs) and gets their
kwargs items back, byte-identical whichever executor runs it: :class:`InPlaceExecutor` (the calling
process), :class:`LocalProcessExecutor` (local processes forked from one that built the processor,
the lanes) or :class:`RayExecutor` (Ray actors). ``InputPreprocessor`` picks one from ``MultiModalConfig.mm_processing_lanes`` and
``mm_lane_executor`` (:func:`executor_from_config`); see docs/processing.md, "Lanes".
"""

from mmfront.processing.executors.base import ItemExecutor, ItemJob, ItemProcessor, ProcessorOrigin
from mmfront.processing.executors.factory import executor_from_config
from mmfront.processing.executors.inplace import InPlaceExecutor
from mmfront.processing.executors.jobs import LaneSpec
from mmfront.processing.executors.lanes import BaseLaneExecutor
from mmfront.processing.executors.local import LocalProcessExecutor
from mmfront.processing.executors.ray import RayExecutor

__all__ = [
    "BaseLaneExecutor",
    "InPlaceExecutor",
    "ItemExecutor",
    "ItemJob",
    "ItemProcessor",
    "LaneSpec",
    "LocalProcessExecutor",
    "ProcessorOrigin",
    "RayExecutor",
    "executor_from_config",
]
