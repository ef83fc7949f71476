"""The processing layer, under vLLM's names: ``BaseMultiModalProcessor`` with its
``BaseProcessingInfo``, the prompt updates a processor
declares, the dummy inputs builder, and the commit step of the P0 cache."""

from mmfront.processing._matching import iter_token_matches
from mmfront.processing.commit import commit_mm_inputs
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
    "PromptIndexTargets",
    "PromptInsertion",
    "PromptReplacement",
    "PromptUpdate",
    "PromptUpdateDetails",
    "commit_mm_inputs",
    "iter_token_matches",
]
