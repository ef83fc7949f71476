"""``OffsetsMultiModalProcessor``: the transformers backend for transformers >= 5.15.

From 5.15 an HF processor can say what each placeholder expanded to
(``text_replacement_offsets``), so the backend never lets HF see the user's prompt: it processes
the items on a dummy text (one placeholder per item), encodes each reported replacement, and
splices it into the prompt with a :class:`PromptReplacement` on the modality's placeholder. That is
the shape every native processor has, so this path goes through the cached ``apply()``: a repeated
image is a cache hit and never reaches HF again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import torch
from packaging.version import Version
from PIL import Image
from transformers import ProcessorMixin

from mmfront.errors import MissingOffsetsError, MMFrontError, ProcessorError
from mmfront.inputs import MultiModalKwargsItems
from mmfront.models.transformers.base import (
    PROBE_IMAGE_SIZE,
    TRANSFORMERS_VERSION,
    _MultiModalProcessorBase,
)
from mmfront.models.transformers.layout import (
    ModalityLayout,
    found_rows,
    main_key,
    most_frequent_token,
)
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing.hf import resolve_hf_kwargs
from mmfront.processing.processor import BaseProcessingInfo
from mmfront.processing.updates import PromptUpdate, PromptUpdateDetails

OFFSETS_MIN_VERSION = Version("5.15.0")
"""From this version HF processors report ``text_replacement_offsets`` (Gemma3, Emu3 and most
others; Idefics3 and GLM-ASR already did in 5.14.1, Qwen2-Audio only from 5.16)."""


def offsets_request_kwargs(version: Version = TRANSFORMERS_VERSION) -> dict[str, Any]:
    """How to ask for the offsets: a processor kwarg from 5.15 (``text_kwargs`` still works there
    but warns from 5.23), only through ``text_kwargs`` before (a flat kwarg is dropped)."""
    if version < OFFSETS_MIN_VERSION:
        return {"text_kwargs": {"return_text_replacement_offsets": True}}
    return {"return_text_replacement_offsets": True}


def has_replacement_hook(processor_cls: type, modality: str) -> bool:
    """Whether a class below ``ProcessorMixin`` defines ``replace_<modality>_token`` (the base's
    raises NotImplementedError)."""
    name = f"replace_{modality}_token"
    return any(name in vars(cls) for cls in processor_cls.__mro__
               if cls is not ProcessorMixin and issubclass(cls, ProcessorMixin))


def _advice() -> str:
    return (
        "Please report it to transformers (https://github.com/huggingface/transformers/issues) so the processor "
        "gets the hook. Until then, pin `transformers<5.15`, which selects the Legacy backend, or keep this "
        "transformers and set MultiModalConfig(transformers_backend=\"legacy\") (which locates each item's expansion "
        "in the HF processor's own token ids)."
    )


def missing_hook_error(processor: Any, modality: str) -> MissingOffsetsError:
    name = type(processor).__name__
    return MissingOffsetsError(
        f"{name} does not implement `replace_{modality}_token`, so under transformers {TRANSFORMERS_VERSION} it "
        f"reports no text_replacement_offsets for {modality} items and the transformers backend cannot tell where "
        f"each item's placeholder expands. {_advice()}"
    )


def no_offsets_error(processor: Any, modality: str) -> MissingOffsetsError:
    name = type(processor).__name__
    return MissingOffsetsError(
        f"{name} returned no text_replacement_offsets for its {modality} items, so the transformers backend cannot "
        f"tell where each item's placeholder expands. Its `__call__` has to reach "
        f"`ProcessorMixin.get_text_with_replacements` with one replacement per item through "
        f"`replace_{modality}_token`. {_advice()}"
    )


class OffsetsMultiModalProcessor(_MultiModalProcessorBase):
    """Places each item with the replacement its HF processor reports (transformers >= 5.15)."""

    def __init__(self, info: BaseProcessingInfo) -> None:
        super().__init__(info)
        proc = self.info.hf_processor
        for modality in self.modalities:
            if not has_replacement_hook(type(proc), modality):
                raise missing_hook_error(proc, modality)

    def _dummy_call_kwargs(self) -> dict[str, Any]:
        return offsets_request_kwargs()

    def offsets_missing(self) -> MissingOffsetsError | None:
        """Why this processor cannot be served here, probed once on one small dummy item per image
        or audio modality: the refusal of the first modality HF reports no offsets for (Mllama has
        the hook, but its ``__call__`` never reaches it), else None. A probe HF itself refuses
        decides nothing: the real request reports that error."""
        hf_kwargs = resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs)
        probes: dict[str, Any] = {"image": Image.new("RGB", (PROBE_IMAGE_SIZE, PROBE_IMAGE_SIZE), (255, 255, 255)),
                                  "audio": np.zeros(int(self.info.get_target_sample_rate() or 16000), np.float32)}
        for modality in (m for m in self.modalities if m in probes):
            try:
                out = self._call_on_dummy_text(modality, [probes[modality]], hf_kwargs)
            except MMFrontError:
                continue
            if not any(entry.get("type") == modality for sample in (out.get("text_replacement_offsets") or ())
                       for entry in sample):
                return no_offsets_error(self.info.hf_processor, modality)
        return None

    def replacements(self, modality: str, outputs: Sequence[Mapping[str, Any]], count: int) -> list[str]:
        """The replacement text of each item, in item order, across the calls' text samples."""
        entries = [
            entry for out in outputs for sample in (out.get("text_replacement_offsets") or ())
            for entry in sample if entry.get("type") == modality
        ]
        if not entries:
            raise no_offsets_error(self.info.hf_processor, modality)
        if len(entries) != count:
            raise ProcessorError(
                f"{type(self.info.hf_processor).__name__} reported {len(entries)} {modality} replacement(s) for "
                f"{count} {modality} item(s); the transformers backend needs exactly one per item."
            )
        return [str(entry["replacement"]) for entry in entries]

    def same_expansions(self, joint: Mapping[str, Any], singles: Sequence[Mapping[str, Any]], count: int) -> bool:
        return self.replacements("image", [joint], count) == self.replacements("image", singles, count)

    def image_rows(self, images: ImageProcessorItems, data: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
                   hf_out: Mapping[str, Any]) -> list[int]:
        """Where the placeholder is a structure token rather than the embedding token (Gemma3's
        ``<start_of_image>``), a replacement repeats it once per sub-image it holds: pan-and-scan
        gives the original plus one per crop. That count is the only per-image one, since Gemma3
        drops ``num_crops`` and its ``_get_num_multimodal_tokens`` ignores pan-and-scan."""
        if "image_grid_thw" not in data:
            placeholder = self.info.placeholder("image")
            texts = self.replacements("image", [hf_out], images.get_count())
            placeholder_ids = self.info.placeholder_ids("image")
            embeds = [most_frequent_token(self.info.encode(text) or placeholder_ids) for text in texts]
            subs = [text.count(placeholder) for text in texts]
            key = main_key("image", data)
            if (all(placeholder_ids != [e] for e in embeds) and all(subs)
                    and (key is None or found_rows(data[key], sum(subs)) == sum(subs))):
                return subs
        return super().image_rows(images, data, hf_kwargs, hf_out)

    def _add_item_sizes(self, modality: str, outputs: Sequence[Mapping[str, Any]], data: dict[str, Any],
                        layout: ModalityLayout) -> None:
        super()._add_item_sizes(modality, outputs, data, layout)
        if layout.expansions is not None:
            encoded = layout.expansions
        else:
            encoded = [self.info.encode(text) for text in self.replacements(modality, outputs, layout.count)]
        if not all(encoded):
            raise self._empty_replacement_error(modality, encoded.index([]))
        data[f"{modality}_replacement_ids"] = torch.tensor([t for ids in encoded for t in ids], dtype=torch.int64)
        layout.replacement_sizes = [len(ids) for ids in encoded]
        if modality == "audio":
            data["num_audio_tokens"] = torch.tensor([ids.count(most_frequent_token(ids)) for ids in encoded])
            layout.size_keys.append("num_audio_tokens")

    def _empty_replacement_error(self, modality: str, index: int) -> ProcessorError:
        name = type(self.info.hf_processor).__name__
        message = f"{name} expands {modality} item {index} to no tokens, so the model could not see it."
        shortest = self.min_audio_samples if modality == "audio" else None
        rate = self.info.get_target_sample_rate()
        if shortest is not None and rate:
            message += (f" The clip is too short: send at least {shortest} samples at {rate:g} Hz "
                        f"({1000 * shortest / rate:.0f} ms), or pad it with silence.")
        return ProcessorError(message, parameter=modality)

    @cached_property
    def min_audio_samples(self) -> int | None:
        """The shortest audio (samples at the target rate) the HF processor expands to at least one
        token under the deployment's kwargs: doubled, then bisected, on silent clips, once per
        processor and only after a clip was too short. ``None``: not even one window is enough."""
        hf_kwargs = resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs)

        def enough(samples: int) -> bool:
            try:
                out = self._call_on_dummy_text("audio", [np.zeros(samples, dtype=np.float32)], hf_kwargs)
                return bool(self.info.encode(self.replacements("audio", [out], 1)[0]))
            except ProcessorError:
                return False

        high, limit = 1, max(1, self.get_dummy_audio_length())
        while not enough(high):
            if high >= limit:
                return None
            high = min(2 * high, limit)
        low = high // 2  # too short (or 0)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if enough(middle) else (middle, high)
        return high

    def _get_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        """Item ``i`` takes its own reported expansion, whose most frequent token receives embeddings."""
        return self._replacement_updates(
            mm_items, out_mm_kwargs, lambda _, ids: PromptUpdateDetails.select_token_id(ids, most_frequent_token(ids)))
