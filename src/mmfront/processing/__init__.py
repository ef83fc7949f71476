"""The processing layer, under vLLM's names: ``BaseMultiModalProcessor`` with its
``BaseProcessingInfo`` (``ProcessingInfo`` is the older alias), the prompt updates a processor
declares, the dummy inputs builder, and the inputs a processor prepares (``PreparedInputs``,
which ``mmfront.processing.commit.commit`` turns into committed inputs)."""

from mmfront.processing.commit import PreparedInputs
from mmfront.processing.dummy import BaseDummyInputsBuilder
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo, ProcessingInfo
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptIndexTargets,
    PromptInsertion,
    PromptReplacement,
    PromptUpdate,
    PromptUpdateDetails,
)

__all__ = [
    "BaseDummyInputsBuilder",
    "BaseMultiModalProcessor",
    "BaseProcessingInfo",
    "PlaceholderFeaturesInfo",
    "PreparedInputs",
    "ProcessingInfo",
    "PromptIndexTargets",
    "PromptInsertion",
    "PromptReplacement",
    "PromptUpdate",
    "PromptUpdateDetails",
]
