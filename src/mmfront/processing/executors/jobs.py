"""A lane's messages and its body: the spec it builds its processor from, the job it is sent, the
reply it answers, and :class:`LaneRunner`, which turns job frames into reply frames.

Nothing is pickled: a job and its reply are the codec's frames (:mod:`mmfront.wire.codec`).
Lazily loaded images travel as their encoded bytes and are decoded on the lane; decoded images
travel as raw pixels, arrays and tensors zero-copy. The prompt updates are not sent back (they
hold callables): the caller resolves them from the returned kwargs, which is cheap. An error
raised on the lane reaches the caller as the same mmfront type with the same ``parameter``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.errors import EncodeError, LaneError, MMFrontError, PromptUpdateError, ValidationError
from mmfront.inputs import MultiModalKwargsItems
from mmfront.media.budget import DecodeBudget
from mmfront.media.image import load_image_bytes
from mmfront.parse import (
    AudioProcessorItems,
    ImageProcessorItems,
    MediaWithBytes,
    ModalityDataItems,
    MultiModalDataItems,
)
from mmfront.processing.executors.base import ItemJob, ItemProcessor
from mmfront.processing.hf import folder_kwargs, load_hf_processor
from mmfront.wire import Frame, MsgpackDecoder, MsgpackEncoder


class LaneSpec(msgspec.Struct, frozen=True):
    """What a lane needs to build the caller's processor: its classes by import path, the model
    folder and the config, and the function that built it where one did (``create_processor``
    also gives the processor its engine layout and the image processor's speedups, which a
    processor built from its classes alone lacks)."""

    processor_cls: str
    info_cls: str
    model_dir: str
    model_id: str
    config: dict[str, Any]
    sys_path: list[str]
    built_by: str | None = None

    @classmethod
    def of(cls, processor: ItemProcessor) -> LaneSpec | None:
        """The spec of ``processor``; ``None`` when a lane cannot rebuild it: it was given a
        ready HF processor rather than a folder, or a class of it is not importable by name."""
        info = processor.info
        paths = [_import_path(type(processor)), _import_path(type(info))]
        if info.model_dir is None or None in paths:
            return None
        config = {f.name: getattr(info.config, f.name) for f in fields(info.config)}
        return cls(paths[0] or "", paths[1] or "", str(info.model_dir), info.model_id, config, list(sys.path),
                   info.built_by)

    def build(self) -> ItemProcessor:
        config = MultiModalConfig(**self.config)
        if self.built_by is not None:
            built: ItemProcessor = _resolve(self.built_by)(self.model_dir, config, model_id=self.model_id)
            return built
        info = _resolve(self.info_cls)(load_hf_processor(Path(self.model_dir), **folder_kwargs(config)),
                                       model_id=self.model_id,
                                       config=config, model_dir=self.model_dir)
        processor: ItemProcessor = _resolve(self.processor_cls)(info)
        return processor


class _EncodedImage(msgspec.Struct, tag="encoded"):
    """A lazily loaded image: its bytes (an array, so they travel as an aux frame rather than a
    copy into the message body) and the conversion its loader recorded."""

    payload: np.ndarray
    io_config: dict[str, Any] | None


class _RawImage(msgspec.Struct, tag="pil"):
    mode: str
    width: int
    height: int
    pixels: np.ndarray


class _Array(msgspec.Struct, tag="array"):
    value: np.ndarray


class _Tensor(msgspec.Struct, tag="tensor"):
    value: torch.Tensor


_Media = _EncodedImage | _RawImage | _Array | _Tensor


class _Job(msgspec.Struct):
    items: dict[str, list[_Media]]
    hf_kwargs: dict[str, Any]
    warm_up: dict[str, int] | None = None
    """Counts of dummy items to warm the lane's processor with (``items`` empty): answered with an
    empty reply, the outputs dropped in the lane."""


class LaneFailure(msgspec.Struct):
    """An error raised on a lane: its mmfront type's name (empty for any other), message and
    ``parameter``."""

    kind: str
    message: str
    parameter: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> LaneFailure:
        if isinstance(exc, MMFrontError):
            return cls(type(exc).__name__, str(exc), exc.parameter if isinstance(exc, ValidationError) else None)
        return cls("", f"{type(exc).__name__}: {exc}")

    def reraise(self) -> None:
        """Raise the error the lane raised, as the same mmfront type where it is one."""
        cls = _ERROR_TYPES.get(self.kind)
        if cls is None or cls is MMFrontError:
            raise LaneError(f"A processing lane failed: {self.message}")
        if issubclass(cls, PromptUpdateError):
            raise cls(self.message, modality=self.parameter)
        if issubclass(cls, ValidationError):
            raise cls(self.message, parameter=self.parameter)
        raise cls(self.message)


def _error_types(root: type[MMFrontError]) -> dict[str, type[MMFrontError]]:
    found = {root.__name__: root}
    for sub in root.__subclasses__():
        found.update(_error_types(sub))
    return found


_ERROR_TYPES = _error_types(MMFrontError)
"""mmfront's errors by name (they all live in :mod:`mmfront.errors`, imported above)."""


class LaneReply(msgspec.Struct):
    """A lane's answer: a job's items, or the failure processing them raised (neither: the lane
    is up and built its processor)."""

    items: MultiModalKwargsItems | None = None
    failure: LaneFailure | None = None


_CONTAINERS: dict[type[ModalityDataItems[Any, Any]], str] = {ImageProcessorItems: "image", AudioProcessorItems: "audio"}
_PALETTE_MODES = frozenset({"P", "PA"})


def _import_path(cls: type) -> str | None:
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for name in qualname.split("."):
        obj = getattr(obj, name)
    return obj


def _media_of(container: ModalityDataItems[Any, Any], index: int) -> _Media | None:
    """How one item travels; ``None`` when it cannot (it is then processed in place). An image
    still undecoded travels as its bytes, and is decoded on the lane."""
    raw = container.get_item_for_hash(index)
    if isinstance(raw, MediaWithBytes) and not raw.is_decoded and "source_mode" in raw.info:
        return _EncodedImage(np.frombuffer(raw.original_bytes, np.uint8), raw.io_config)
    decoded = container.get(index)
    if isinstance(decoded, Image.Image):
        if decoded.mode in _PALETTE_MODES:
            return None
        return _RawImage(decoded.mode, decoded.width, decoded.height, np.frombuffer(decoded.tobytes(), np.uint8))
    if isinstance(decoded, np.ndarray) and decoded.dtype != object:
        return _Array(decoded)
    if isinstance(decoded, torch.Tensor):
        return _Tensor(decoded)
    return None


def _item_of(media: _Media, config: MultiModalConfig, *, pixels: bool) -> object:
    """``pixels``: the lane's processor ``reads_pixels``, so a JPEG is decoded straight into them."""
    if isinstance(media, _EncodedImage):
        options = media.io_config or {"image_mode": None}
        item = load_image_bytes(media.payload.tobytes(), config=config, budget=DecodeBudget(config.max_media_request_decode_bytes),
                                media_io_kwargs={"image": options})
        item.ensure_decoded(pixels=pixels)
        return item
    if isinstance(media, _RawImage):
        return Image.frombytes(media.mode, (media.width, media.height), media.pixels.tobytes())
    return media.value


def encode_job(job: ItemJob, encoder: MsgpackEncoder) -> list[Frame] | None:
    """The frames of ``job``; ``None`` when an item or kwarg has no wire form (an exotic item
    type, a non-data kwarg), and the job is processed in place."""
    media: dict[str, list[_Media]] = {}
    for modality, container in job.items.items():
        if _CONTAINERS.get(type(container)) != modality:
            return None
        media[modality] = []
        for index in range(container.get_count()):
            one = _media_of(container, index)
            if one is None:
                return None
            media[modality].append(one)
    try:
        return encoder.encode(_Job(media, dict(job.hf_kwargs)))
    except EncodeError:
        return None


def encode_warm_up(counts: Mapping[str, int], encoder: MsgpackEncoder) -> list[Frame]:
    """The frames of a warm-up job: :meth:`LaneRunner.run` warms its processor with ``counts`` of
    the largest dummy items and answers an empty :class:`LaneReply`."""
    return encoder.encode(_Job({}, {}, warm_up=dict(counts)))


class LaneRunner:
    """One lane's processor and codec: job frames in, reply frames out."""

    def __init__(self, spec: LaneSpec) -> None:
        torch.set_num_threads(1)  # a lane is one runnable thread of the budget
        self.processor = spec.build()
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(_Job)

    def run(self, frames: list[Frame]) -> list[Frame]:
        try:
            job: _Job = self.decoder.decode(frames)
            if job.warm_up is not None:
                self.processor.warm_up(job.warm_up)
                return self.encoder.encode(LaneReply())
            items = MultiModalDataItems()
            for modality, media in job.items.items():
                container = ImageProcessorItems if modality == "image" else AudioProcessorItems
                items[modality] = container([_item_of(m, self.processor.info.config, pixels=self.processor.reads_pixels)
                                             for m in media])
            reply = LaneReply(items=self.processor.process_hf_items(items, job.hf_kwargs))
        except Exception as exc:  # every failure goes back to the caller, typed
            reply = LaneReply(failure=LaneFailure.of(exc))
        return self.encoder.encode(reply)


__all__ = ["LaneFailure", "LaneReply", "LaneRunner", "LaneSpec", "encode_job", "encode_warm_up"]
