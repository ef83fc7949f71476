"""Dummy inputs: the largest items a model takes, for warm-up and memory profiling.

vLLM builds them per model (``BaseDummyInputsBuilder``); mmfront asks the processor for its
largest image size and audio length, and lets ``limit_mm_per_prompt`` shrink them (a larger
override is ignored with a warning, as in vLLM: profiling must not under-count).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from PIL import Image

from mmfront.config import ModalityLimit

logger = logging.getLogger(__name__)


class _Encodes(Protocol):
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...


class DummySource(Protocol):
    """What the builder asks of a processor (``BaseMultiModalProcessor`` is one). Structural, so
    the processor, which warms itself up with the builder's items, is not imported here."""

    @property
    def info(self) -> _Encodes: ...

    def get_placeholder_str(self, modality: str, index: int) -> str: ...

    def get_dummy_image_size(self) -> tuple[int, int]: ...

    def get_dummy_audio_length(self) -> int: ...


class BaseDummyInputsBuilder:
    """Dummy text and items for a processor; override the size hooks on the processor."""

    def __init__(self, processor: DummySource) -> None:
        self.processor = processor

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        """One placeholder per item, in modality order."""
        return "".join(
            self.processor.get_placeholder_str(modality, i) for modality, count in mm_counts.items()
            for i in range(count)
        )

    def get_dummy_mm_data(
        self, mm_counts: Mapping[str, int], mm_options: Mapping[str, ModalityLimit | None] | None = None,
    ) -> dict[str, list[Any]]:
        options = mm_options or {}
        out: dict[str, list[Any]] = {}
        for modality, count in mm_counts.items():
            if count <= 0:
                continue
            option = options.get(modality)
            if modality == "image":
                width, height = self.processor.get_dummy_image_size()
                width = _clamped("width", width, option.width if option else None)
                height = _clamped("height", height, option.height if option else None)
                out[modality] = [Image.new("RGB", (width, height), color=(255, 255, 255)) for _ in range(count)]
            elif modality == "audio":
                length = _clamped("length", self.processor.get_dummy_audio_length(), option.length if option else None)
                out[modality] = [np.zeros(length, dtype=np.float32) for _ in range(count)]
        return out

    def get_dummy_processor_inputs(
        self, mm_counts: Mapping[str, int], mm_options: Mapping[str, ModalityLimit | None] | None = None,
    ) -> tuple[list[int], dict[str, list[Any]]]:
        """Prompt ids and items that :meth:`BaseMultiModalProcessor.apply` accepts."""
        text = self.get_dummy_text(mm_counts)
        ids = self.processor.info.encode(text, add_special_tokens=False) if text else []
        return ids, self.get_dummy_mm_data(mm_counts, mm_options)


def _clamped(name: str, largest: int, requested: int | None) -> int:
    if requested is None or requested == largest:
        return largest
    if requested > largest:
        logger.warning("limit_mm_per_prompt asks for dummy %s %d, more than the model's largest (%d); "
                       "keeping %d.", name, requested, largest, largest)
        return largest
    return requested
