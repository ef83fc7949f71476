"""Typed multimodal items: what the user passed, normalised per modality.

:class:`MediaWithBytes` (defined in :mod:`mmfront.media.base`, re-exported here as in vLLM)
keeps a media item's encoded bytes next to it, and can defer its decode.

:class:`MultiModalDataParser` turns a ``multi_modal_data`` mapping into
:class:`MultiModalDataItems`: one typed container per modality (vLLM's names), with PIL images
normalised like vLLM does, audio resampled to the model's rate and videos paired with their
metadata.
"""

from mmfront.media.base import MediaWithBytes
from mmfront.parse.items import (
    AudioEmbeddingItems,
    AudioProcessorItems,
    EmbeddingItems,
    ImageEmbeddingItems,
    ImageProcessorItems,
    ImageSize,
    ModalityDataItems,
    MultiModalDataItems,
    ProcessorBatchItems,
    VideoEmbeddingItems,
    VideoProcessorItems,
)
from mmfront.parse.parser import MultiModalDataParser

__all__ = [
    "AudioEmbeddingItems", "AudioProcessorItems", "EmbeddingItems", "ImageEmbeddingItems", "ImageProcessorItems",
    "ImageSize", "MediaWithBytes", "ModalityDataItems", "MultiModalDataItems",
    "MultiModalDataParser", "ProcessorBatchItems", "VideoEmbeddingItems", "VideoProcessorItems"]
