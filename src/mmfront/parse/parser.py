"""The parser of ``multi_modal_data`` (vLLM's ``MultiModalDataParser``): what a user may pass for
each modality, normalised into the containers of :mod:`mmfront.parse.items`.

PIL images get vLLM's EXIF transpose and mode conversion, audio is resampled to the model's rate
(its peak memory charged before it is allocated), videos are paired with the metadata their
processor samples frames by, and embeddings are checked against the model. Everything else is
refused with a typed error that says what the modality accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import numpy as np
import torch
from PIL import Image

from mmfront.errors import InputTypeError, UnsupportedModalityError, ValidationError
from mmfront.media.base import MediaWithBytes
from mmfront.media.budget import DecodeBudget
from mmfront.media.image import normalize_pil_image
from mmfront.media.resample import (
    PROCESSOR_COPY_ITEMSIZE,
    charge_scratch,
    check_rates,
    resample_audio,
    resampled_bytes,
    resampled_length,
)
from mmfront.parse.items import (
    AudioEmbeddingItems,
    AudioProcessorItems,
    ImageEmbeddingItems,
    ImageProcessorItems,
    ModalityData,
    ModalityDataItems,
    MultiModalDataDict,
    MultiModalDataItems,
    VideoEmbeddingItems,
    VideoProcessorItems,
)


class MultiModalDataParser:
    """Parses ``multi_modal_data`` into :class:`MultiModalDataItems`.

    * images: PIL images, 3-D arrays/tensors (HWC or CHW), 4-D arrays or lists of those,
      ``MediaWithBytes`` (kept lazy, never converted again) and ``None`` (an item named by its
      UUID). Plain PIL images get vLLM's EXIF transpose and ``image_mode`` conversion, skipped
      when they would be no-ops.
    * audio: 1-D arrays, lists of floats, ``(waveform, sampling_rate)`` tuples, 2-D batches and
      ``MediaWithBytes`` wrapping ``(waveform, sampling_rate)``; resampled to ``target_sr``
      when both rates are known (lazily for ``MediaWithBytes``). The waveform's peak (the
      resampled output, and the float32 copy the feature extractor makes of it) is charged before
      it is allocated: to the budget a loaded item carries (its request's), else to one budget of
      ``max_resample_bytes`` per :meth:`parse_mm_data` call.
    * videos: a ``MediaWithBytes`` from :func:`~mmfront.media.load_video_bytes` (its metadata
      read from ``info``), a 4-D frames array/tensor, a list of 3-D frames or of PIL images, a
      ``(frames, metadata)`` tuple, lists of those, and ``None``. With ``video_needs_metadata``
      (the model's processor samples frames itself) a video without metadata is refused.
    * embeddings: a 3-D tensor or a list of 2-D tensors/arrays, only with ``enable_mm_embeds``.
    """

    def __init__(
        self,
        *,
        target_sr: float | None = None,
        enable_mm_embeds: bool = False,
        image_mode: str | None = "RGB",
        rgba_background_color: tuple[int, int, int] = (255, 255, 255),
        expected_hidden_size: int | None = None,
        max_resample_bytes: int | None = None,
        video_needs_metadata: bool = False,
    ) -> None:
        self.target_sr = target_sr
        self.video_needs_metadata = video_needs_metadata
        self.max_resample_bytes = max_resample_bytes
        self.enable_mm_embeds = enable_mm_embeds
        self.image_mode = image_mode
        red, green, blue = rgba_background_color
        self.rgba_background_color = (red, green, blue)
        self.expected_hidden_size = expected_hidden_size

    def _get_subparsers(self) -> Mapping[str, Callable[[ModalityData], ModalityDataItems[Any, Any] | None]]:
        return {"image": self._parse_image_data, "audio": self._parse_audio_data, "video": self._parse_video_data}

    def parse_mm_data(self, mm_data: MultiModalDataDict) -> MultiModalDataItems:
        """A modality given as an empty list is left out; a bare ``None`` is one ``None`` item."""
        if not isinstance(mm_data, Mapping):
            raise InputTypeError(f"multi_modal_data must be a mapping like {{'image': [...]}}, got "
                                 f"{type(mm_data).__name__}", parameter="multi_modal_data")
        subparsers = self._get_subparsers()
        items = MultiModalDataItems()
        for modality, data in mm_data.items():
            parse = subparsers.get(modality)
            if parse is None:
                raise UnsupportedModalityError(
                    f"Unsupported modality: {modality!r}. Supported: {', '.join(subparsers)}",
                    parameter="multi_modal_data", value=modality)
            parsed = parse(data)
            if parsed is not None:
                items[modality] = parsed
        return items

    # --- images ---

    def _parse_image_data(self, data: ModalityData) -> ModalityDataItems[Any, Any] | None:
        if isinstance(data, (list, tuple)) and not data:
            return None
        if _is_embeddings(data):
            return ImageEmbeddingItems(self._check_embeddings("image", data))
        if _is_array(data) and data.ndim not in (3, 4):
            raise ValidationError(_ndim_message("image", data, "3-D (one image, HWC or CHW) or 4-D (several)"),
                                  parameter="multi_modal_data")
        if data is None or isinstance(data, (Image.Image, MediaWithBytes)) or (_is_array(data) and data.ndim == 3):
            raw = [data]
        elif (_is_array(data) and data.ndim == 4) or isinstance(data, (list, tuple)):
            raw = list(data)
        else:
            raise InputTypeError(_type_message("image", None, data), parameter="multi_modal_data")
        return ImageProcessorItems([self._parse_image_item(index, item) for index, item in enumerate(raw)])

    def _parse_image_item(self, index: int, item: object) -> object:
        if item is None or isinstance(item, MediaWithBytes):
            return item
        if isinstance(item, Image.Image):
            return normalize_pil_image(item, self.image_mode, self.rgba_background_color)
        if _is_array(item):
            if item.ndim == 3:
                return item
            raise ValidationError(
                f"image {index} is a {item.ndim}-D array of shape {tuple(item.shape)}; an image array is 3-D "
                "(HWC or CHW). Embeddings go as a 3-D tensor or a list of 2-D tensors, never mixed with images.",
                parameter="multi_modal_data")
        raise InputTypeError(_type_message("image", index, item), parameter="multi_modal_data")

    # --- videos ---

    def _parse_video_data(self, data: ModalityData) -> ModalityDataItems[Any, Any] | None:
        if isinstance(data, list) and not data:
            return None
        if _is_embeddings(data):
            return VideoEmbeddingItems(self._check_embeddings("video", data))
        if _is_array(data) and data.ndim not in (4, 5):
            raise ValidationError(_ndim_message("video", data, "4-D (one video: frames, height, width, channels) or "
                                                "5-D (several)"), parameter="multi_modal_data")
        one_video = (
            data is None or isinstance(data, (MediaWithBytes, tuple)) or (_is_array(data) and data.ndim == 4)
            or (isinstance(data, list) and all(isinstance(f, Image.Image) or (_is_array(f) and f.ndim == 3)
                                               for f in data))
        )
        if one_video:
            raw = [data]
        elif isinstance(data, list) or (_is_array(data) and data.ndim == 5):
            raw = list(data)
        else:
            raise InputTypeError(_type_message("video", None, data), parameter="multi_modal_data")
        videos: list[object] = []
        metadata: list[Mapping[str, Any] | None] = []
        for index, item in enumerate(raw):
            video, item_metadata = _video_with_metadata(index, item)
            if video is not None and self.video_needs_metadata:
                if item_metadata is None:
                    raise ValidationError(
                        f"video {index} has no metadata, which this model's processor needs (it samples frames by "
                        "time). Load the video from its file (MediaConnector.load_video), or pass (frames, metadata) "
                        "with vLLM's metadata keys.", parameter="multi_modal_data")
                video = (video, item_metadata)
            videos.append(video)
            metadata.append(item_metadata)
        return VideoProcessorItems(videos, metadata)

    # --- audio ---

    def _parse_audio_data(self, data: ModalityData) -> ModalityDataItems[Any, Any] | None:
        if isinstance(data, list) and not data:
            return None
        if _is_embeddings(data):
            return AudioEmbeddingItems(self._check_embeddings("audio", data))
        if _is_array(data) and data.ndim not in (1, 2):
            raise ValidationError(_ndim_message("audio", data, "1-D (one waveform) or 2-D (a batch)"),
                                  parameter="multi_modal_data")
        if (data is None or isinstance(data, (MediaWithBytes, tuple)) or (_is_array(data) and data.ndim == 1)
                or (isinstance(data, list) and _is_number(data[0]))):
            raw = [data]
        elif _is_array(data) and data.ndim == 2:
            raw = list(data)
        elif isinstance(data, list):
            raw = data
        else:
            raise InputTypeError(_type_message("audio", None, data), parameter="multi_modal_data")
        budget = None if self.max_resample_bytes is None else DecodeBudget(self.max_resample_bytes)
        return AudioProcessorItems([self._parse_audio_item(index, item, budget) for index, item in enumerate(raw)])

    def _parse_audio_item(self, index: int, item: object, budget: DecodeBudget | None) -> object:
        if item is None:
            return None
        if isinstance(item, MediaWithBytes):
            return self._resample_lazily(item, item.budget if item.budget is not None else budget)
        rate: float | None = None
        waveform: np.ndarray
        if isinstance(item, tuple):
            if len(item) != 2 or not _is_number(item[1]):
                raise InputTypeError(f"audio {index} is a tuple of {len(item)} values; an audio tuple must be "
                                     "(waveform, sampling_rate)", parameter="multi_modal_data")
            waveform = _as_waveform(index, item[0])
            rate = float(item[1])
        else:
            waveform = _as_waveform(index, item)
        if rate is not None and self.target_sr is not None:
            waveform = resample_audio(waveform, orig_sr=rate, target_sr=self.target_sr, budget=budget)
        return waveform

    def _resample_lazily(self, item: MediaWithBytes[Any], budget: DecodeBudget | None) -> MediaWithBytes[np.ndarray]:
        """A new wrapper over the same bytes whose decode is "decode ``item``, then resample",
        so a lazy item stays undecoded; ``info`` already tells the resampled length, and the
        resampled float32 samples are charged to ``budget`` now, from that length. The wrapper
        hashes like ``item`` (same bytes and ``io_config``), so it keeps ``item``'s prehashed states."""
        info = dict(item.info)
        rate = info.get("sample_rate")
        decode_budget = budget
        if self.target_sr is not None and rate is not None and rate != self.target_sr:
            check_rates(rate, self.target_sr)
            info["original_sample_rate"] = rate
            info["sample_rate"] = self.target_sr
            if "num_frames" in info:
                frames = info["num_frames"]
                info["num_frames"] = resampled_length(frames, orig_sr=rate, target_sr=self.target_sr)
                if budget is not None:
                    budget.charge(resampled_bytes(info["num_frames"]), what=f"Audio resampled from {rate:g} to "
                                  f"{self.target_sr:g} Hz ({info['num_frames']} samples)")
                    charge_scratch(budget, frames, orig_sr=rate, target_sr=self.target_sr)
                decode_budget = None
        elif budget is not None and "num_frames" in info:
            budget.charge(info["num_frames"] * PROCESSOR_COPY_ITEMSIZE,
                          what=f"The feature extractor's copy of an audio ({info['num_frames']} samples)")
        wrapper = MediaWithBytes(original_bytes=item.original_bytes, io_config=item.io_config, info=info,
                                 decode=functools.partial(_decode_waveform, item, self.target_sr, decode_budget))
        wrapper.prehashed = item.prehashed
        return wrapper

    # --- embeddings ---

    def _check_embeddings(self, modality: str, data: Any) -> Any:
        if not self.enable_mm_embeds:
            raise ValidationError(f"You must set `enable_mm_embeds` to input `{modality}_embeds`",
                                  parameter=modality)
        items = list(data) if isinstance(data, (list, tuple)) else None
        for index, item in enumerate(items if items is not None else data):
            if item is None:
                raise ValidationError(f"{modality} embedding {index} is None; embeddings must be sent in full",
                                      parameter="multi_modal_data")
            hidden = int(item.shape[-1])
            if self.expected_hidden_size is not None and hidden != self.expected_hidden_size:
                raise ValidationError(
                    f"{modality} embedding {index} has hidden size {hidden}, but the model expects "
                    f"{self.expected_hidden_size}", parameter="multi_modal_data")
        if items is None:
            return data
        return [torch.from_numpy(item) if isinstance(item, np.ndarray) else item for item in items]


def _is_array(value: object) -> TypeGuard[np.ndarray | torch.Tensor]:
    return isinstance(value, (np.ndarray, torch.Tensor))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _is_embeddings(data: object) -> bool:
    """vLLM's rule: a 3-D tensor, or a list whose items are all 2-D tensors/arrays."""
    if isinstance(data, torch.Tensor) and data.ndim == 3:
        return True
    if isinstance(data, (list, tuple)) and data:
        present = [item for item in data if item is not None]
        return bool(present) and all(_is_array(item) and item.ndim == 2 for item in present)
    return False


def _ndim_message(modality: str, data: np.ndarray | torch.Tensor, expected: str) -> str:
    return (f"{modality} data is a {data.ndim}-D array of shape {tuple(data.shape)}; expected {expected}. "
            "Embeddings go as a 3-D tensor or a list of 2-D tensors.")


def _type_message(modality: str, index: int | None, value: object) -> str:
    where = f"{modality} data" if index is None else f"{modality} {index}"
    if modality == "image":
        expected = "a PIL image, a 3-D array/tensor, a MediaWithBytes or None (a list or 4-D array for several)"
    elif modality == "video":
        expected = ("a 4-D frames array/tensor, a list of frames (3-D arrays or PIL images), a (frames, metadata) "
                    "tuple, a MediaWithBytes from MediaConnector.load_video or None (a list for several)")
    else:
        expected = ("a 1-D float array, a list of floats, a (waveform, sampling_rate) tuple, a MediaWithBytes or None "
                    "(a list or 2-D array for several)")
    hint = "; load URLs, paths and base64 with MediaConnector first" if isinstance(value, (str, bytes)) else ""
    return f"{where} has type {type(value).__name__}; expected {expected}{hint}"


def _video_with_metadata(index: int, item: object) -> tuple[object, Mapping[str, Any] | None]:
    """A video item as its frames (a loaded item stays wrapped, so its bytes are hashed) and its
    metadata, if any."""
    if item is None:
        return None, None
    if isinstance(item, MediaWithBytes):
        return item, item.info.get("metadata")
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], Mapping):
            raise InputTypeError(f"video {index} is a tuple of {len(item)} values; a video tuple is (frames, metadata) "
                                 "with metadata a dict", parameter="multi_modal_data")
        frames, _ = _video_with_metadata(index, item[0])
        return frames, item[1]
    if _is_array(item) and item.ndim == 4:
        return item, None
    if isinstance(item, list) and item and all(isinstance(f, Image.Image) or (_is_array(f) and f.ndim == 3)
                                               for f in item):
        return np.stack([np.asarray(f) for f in item]), None
    raise InputTypeError(_type_message("video", index, item), parameter="multi_modal_data")


def _as_waveform(index: int, item: object) -> np.ndarray:
    if isinstance(item, torch.Tensor):
        waveform = item.detach().cpu().numpy()
    elif isinstance(item, np.ndarray):
        waveform = item
    elif isinstance(item, list):
        try:
            waveform = np.asarray(item, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputTypeError(f"audio {index} is a list that is not all numbers; send a list of floats", parameter="multi_modal_data") from None
    else:
        raise InputTypeError(_type_message("audio", index, item), parameter="multi_modal_data")
    if waveform.ndim != 1:
        raise ValidationError(f"audio {index} has shape {waveform.shape}; audio must be 1-D (mono). Average the "
                              "channels, or send several items as a list.", parameter="multi_modal_data")
    if waveform.dtype.kind != "f":
        raise InputTypeError(f"audio {index} has dtype {waveform.dtype}; send float samples in [-1, 1] (divide 16-bit "
                             "PCM by 32768)", parameter="multi_modal_data")
    return waveform


def _decode_waveform(item: MediaWithBytes[Any], target_sr: float | None, budget: DecodeBudget | None) -> np.ndarray:
    """``budget``: what the resampled samples are charged to, unless they were charged already."""
    media = item.media
    rate: float | None = None
    if isinstance(media, tuple) and len(media) == 2:
        media, rate = media
    waveform = _as_waveform(0, media)
    if rate is not None and target_sr is not None:
        waveform = resample_audio(waveform, orig_sr=rate, target_sr=target_sr, budget=budget)
    return waveform


__all__ = ["MultiModalDataParser"]
