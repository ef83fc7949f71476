"""The processing layer, under vLLM's names: ``BaseMultiModalProcessor`` with its
``BaseProcessingInfo``, the prompt updates a processor
declares, the dummy inputs builder, and the inputs a processor prepares (``PreparedInputs``,
which ``mmfront.processing.commit.commit`` turns into committed inputs)."""

from mmfront.processing._matching import iter_token_matches
from mmfront.processing.commit import PreparedInputs
from mmfront.processing.dummy import BaseDummyInputsBuilder
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo
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
    "PromptIndexTargets",
    "PromptInsertion",
    "PromptReplacement",
    "PromptUpdate",
    "PromptUpdateDetails",
    "iter_token_matches",
]
