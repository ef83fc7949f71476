"""The parsed containers of ``multi_modal_data`` (vLLM: ``vllm.multimodal.parse``): one typed
container per modality, holding the user's items in the user's order.

A container answers what the processor needs to know without decoding: an image's size, an
audio's length and a video's frame count come from a lazy item's header ``info`` when it has one,
and :meth:`ModalityDataItems.get_item_for_hash` gives the hasher the stored item (its original
bytes), so a cache hit never decodes anything.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections import UserDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import torch
from PIL import Image

from mmfront.errors import InputTypeError, ModalityNotFoundError, ValidationError
from mmfront.media.base import MediaWithBytes

_T = TypeVar("_T")
_I = TypeVar("_I")
_M = TypeVar("_M", bound="ModalityDataItems[Any, Any]")

ModalityData = Any
"""One modality's user data: an item, a list of items (``None`` allowed), or ``None``."""
MultiModalDataDict = Mapping[str, ModalityData]


class ImageSize(NamedTuple):
    width: int
    height: int


class ModalityDataItems(ABC, Generic[_T, _I]):
    """The items of one modality, in the order the user gave them."""

    def __init__(self, data: _T, modality: str) -> None:
        self.data = data
        self.modality = modality

    def __len__(self) -> int:
        return self.get_count()

    def __getitem__(self, index: int) -> _I:
        return self.get(index)

    def __iter__(self) -> Iterator[_I]:
        return (self.get(index) for index in range(self.get_count()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(modality={self.modality!r}, count={self.get_count()})"

    @abstractmethod
    def get_count(self) -> int:
        """How many items the user gave (``None`` items included)."""

    @abstractmethod
    def get(self, index: int) -> _I:
        """The item as the HF processor takes it (decoded)."""

    def get_all(self) -> list[_I]:
        return [self.get(index) for index in range(self.get_count())]

    def subset(self: _M, indices: Sequence[int]) -> _M:
        """The same kind of container holding only items ``indices``, in that order."""
        picked = copy.copy(self)
        picked.data = self._pick(indices)
        return picked

    def _pick(self, indices: Sequence[int]) -> Any:
        return [self.data[index] for index in indices]  # type: ignore[index]

    def get_item_for_hash(self, index: int) -> object:
        """The item as the hasher takes it; by default the same as :meth:`get`."""
        return self.get(index)

    def get_all_items_for_hash(self) -> list[object]:
        return [self.get_item_for_hash(index) for index in range(self.get_count())]

    @abstractmethod
    def get_processor_data(self) -> Mapping[str, object]:
        """Keyword arguments for the HF processor."""

    @abstractmethod
    def get_passthrough_data(self) -> Mapping[str, object]:
        """Keyword arguments that skip the HF processor and go straight to the model."""


class ProcessorBatchItems(ModalityDataItems[Sequence[Any], _T]):
    """Items the HF processor consumes, stored as given (``MediaWithBytes`` wrappers kept).

    :meth:`get` unwraps a ``MediaWithBytes`` (decoding a lazy one); :meth:`get_item_for_hash`
    returns the stored item, so hashing sees the original bytes and never forces a decode.
    """

    def __init__(self, data: Sequence[Any], modality: str) -> None:
        super().__init__(list(data), modality)

    def get_count(self) -> int:
        return len(self.data)

    def get(self, index: int) -> _T:
        item = self.data[index]
        return item.media if isinstance(item, MediaWithBytes) else item

    def get_item_for_hash(self, index: int) -> object:
        return self.data[index]

    def get_processor_data(self) -> Mapping[str, object]:
        return {f"{self.modality}s": self.get_all()}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {}


class ImageProcessorItems(ProcessorBatchItems[Any]):
    def __init__(self, data: Sequence[Any]) -> None:
        super().__init__(data, "image")

    def get_pixels(self, index: int) -> np.ndarray | None:
        """Item ``index`` as a uint8 (height, width, 3) RGB array where it was decoded straight
        into one (a plain JPEG: :attr:`MediaWithBytes.pixels`), so a native processor reads it
        without a PIL image being made; None for any other item (read it with :meth:`get`)."""
        item = self.data[index]
        return item.pixels if isinstance(item, MediaWithBytes) else None

    def get_image_size(self, index: int) -> ImageSize:
        """Width and height of item ``index``; a lazy item answers from its header ``info``
        without decoding. Arrays are HWC when 3-D with 1, 3 or 4 trailing channels, else CHW."""
        item = self.data[index]
        if item is None:
            raise ValidationError(f"image {index} is None (an item named only by its UUID), so its size is unknown; "
                                  "send the image itself, or process it where the cache holds it",
                                  parameter="multi_modal_data")
        if isinstance(item, MediaWithBytes):
            if "width" in item.info and "height" in item.info:
                return ImageSize(int(item.info["width"]), int(item.info["height"]))
            item = item.media
        if isinstance(item, Image.Image):
            return ImageSize(*item.size)
        if isinstance(item, (np.ndarray, torch.Tensor)) and item.ndim == 3:
            shape = tuple(item.shape)
            height, width = (shape[0], shape[1]) if shape[-1] in (1, 3, 4) else (shape[1], shape[2])
            return ImageSize(int(width), int(height))
        raise InputTypeError(f"image {index} of type {type(item).__name__} has no image size", parameter="multi_modal_data")


class AudioProcessorItems(ProcessorBatchItems[Any]):
    def __init__(self, data: Sequence[Any]) -> None:
        super().__init__(data, "audio")

    def get_audio_length(self, index: int) -> int:
        """Samples in item ``index`` (at the parser's target rate); a lazy item answers from its
        header ``info`` without decoding."""
        item = self.data[index]
        if item is None:
            raise ValidationError(f"audio {index} is None (an item named only by its UUID), so its length is unknown",
                                  parameter="multi_modal_data")
        if isinstance(item, MediaWithBytes) and "num_frames" in item.info:
            return int(item.info["num_frames"])
        return len(self.get(index))


class VideoProcessorItems(ProcessorBatchItems[Any]):
    """Videos (a frames array each) and their vLLM metadata, ``None`` where there is none.

    A loaded video (``MediaWithBytes``) is hashed together with its metadata, as vLLM does, so the
    same file sampled another way is another item. A stored ``(frames, metadata)`` pair (kept
    when the model's processor needs metadata) is hashed as the pair.
    """

    def __init__(self, data: Sequence[Any], metadata: Sequence[Mapping[str, Any] | None]) -> None:
        super().__init__(data, "video")
        self.metadata = list(metadata)

    def subset(self, indices: Sequence[int]) -> VideoProcessorItems:
        return VideoProcessorItems([self.data[i] for i in indices], [self.metadata[i] for i in indices])

    def get(self, index: int) -> Any:
        item = self.data[index]
        if isinstance(item, tuple):
            frames, metadata = item
            return (frames.media if isinstance(frames, MediaWithBytes) else frames), metadata
        return item.media if isinstance(item, MediaWithBytes) else item

    def get_item_for_hash(self, index: int) -> object:
        item = self.data[index]
        metadata = self.metadata[index]
        if isinstance(item, MediaWithBytes) and metadata is not None:
            return item, metadata
        return item

    def get_num_frames(self, index: int) -> int:
        """Frames kept in video ``index``; a loaded video answers from its metadata without decoding."""
        item = self.data[index]
        if item is None:
            raise ValidationError(f"video {index} is None (an item named only by its UUID), so its length is unknown",
                                  parameter="multi_modal_data")
        metadata = self.metadata[index]
        if isinstance(item, MediaWithBytes) and metadata is not None:
            return len(metadata["frames_indices"])
        video = self.get(index)
        return len(video[0] if isinstance(video, tuple) else video)


class EmbeddingItems(ModalityDataItems[Any, torch.Tensor]):
    """Precomputed embeddings: a 3-D tensor or a list of 2-D tensors, one per item. They skip
    the HF processor and reach the model as ``{modality}_embeds``."""

    def get_count(self) -> int:
        return len(self.data)

    def get(self, index: int) -> torch.Tensor:
        return self.data[index]

    def _pick(self, indices: Sequence[int]) -> Any:
        if isinstance(self.data, torch.Tensor):
            return self.data[list(indices)]
        return [self.data[index] for index in indices]

    def get_feature_size(self, index: int) -> int:
        return len(self.get(index))

    def get_processor_data(self) -> Mapping[str, object]:
        return {}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {f"{self.modality}_embeds": self.data}


class ImageEmbeddingItems(EmbeddingItems):
    def __init__(self, data: Any) -> None:
        super().__init__(data, "image")


class AudioEmbeddingItems(EmbeddingItems):
    def __init__(self, data: Any) -> None:
        super().__init__(data, "audio")


class VideoEmbeddingItems(EmbeddingItems):
    def __init__(self, data: Any) -> None:
        super().__init__(data, "video")


_D = TypeVar("_D", bound=ModalityDataItems[Any, Any])


class MultiModalDataItems(UserDict[str, ModalityDataItems[Any, Any]]):
    """Parsed ``multi_modal_data``: modality -> its items, in the user's modality order."""

    def select(self, modalities: Iterable[str]) -> MultiModalDataItems:
        wanted = set(modalities)
        return MultiModalDataItems({m: items for m, items in self.items() if m in wanted})

    def get_count(self, modality: str, *, strict: bool = True) -> int:
        """Items of ``modality``; a missing modality raises ``KeyError``, or counts 0 when not
        ``strict``."""
        if modality not in self:
            if strict:
                raise ModalityNotFoundError(f"Modality {modality!r} not found. Available modalities: {sorted(self)}")
            return 0
        return self[modality].get_count()

    def subset(self, selection: Mapping[str, Sequence[int]]) -> MultiModalDataItems:
        """Only the items ``selection`` names (modality -> item indices), e.g. the cache misses
        of a request, each modality keeping its container type."""
        return MultiModalDataItems({m: self[m].subset(indices) for m, indices in selection.items()})

    def get_all_counts(self) -> dict[str, int]:
        return {m: items.get_count() for m, items in self.items()}

    def get_items(self, modality: str, typ: type[_D] | tuple[type[_D], ...]) -> _D:
        if modality not in self:
            raise ModalityNotFoundError(f"Modality {modality!r} not found. Available modalities: {sorted(self)}")
        items = self[modality]
        if not isinstance(items, typ):
            raise InputTypeError(f"Invalid type of data items for modality={modality!r}: expected {typ}, found "
                                 f"{type(items).__name__}", parameter="multi_modal_data")
        return items


__all__ = [
    "AudioEmbeddingItems", "AudioProcessorItems", "EmbeddingItems", "ImageEmbeddingItems", "ImageProcessorItems",
    "ImageSize", "ModalityData", "ModalityDataItems", "MultiModalDataDict", "MultiModalDataItems",
    "ProcessorBatchItems", "VideoEmbeddingItems", "VideoProcessorItems"]
