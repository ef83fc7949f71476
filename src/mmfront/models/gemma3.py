"""Gemma 3's native processor.

Each ``<start_of_image>`` in the prompt expands to ``processor.full_image_sequence``
(``"\\n\\n<start_of_image>" + <image_soft_token> * image_seq_length + "<end_of_image>\\n\\n"``), or with
pan-and-scan to "Here is the original image {seq} and here are some crops to help you see better
{seq} {seq} ..." with one sequence per crop. Only the soft tokens receive embeddings.

Pixels are computed natively, the way HF's torchvision backend (vLLM's default) computes them: a
uint8 antialiased bilinear resize in channels-last layout, then the fused rescale-and-normalize in
float32. That is faster than HF's PIL backend on CPU and differs from it by at most one
intensity level; configurations the native path does not cover fall back to the HF
image processor. The kernels are in :mod:`mmfront.pixels`; the crop grid and the settings are Gemma 3's.
A JPEG decoded straight into numpy (:attr:`mmfront.parse.MediaWithBytes.pixels`) is read as it lies:
no PIL image, and no copy of its pixels before the table pass.

Newlines: Gemma's vocabulary has ``"\\n\\n\\n"`` and ``"\\n\\n\\n\\n"`` tokens, and splicing puts
``"\\n\\n"`` next to ``"\\n"`` or ``"\\n\\n"``; those pairs are merged as HF's own tokenization would
(the same three passes as vLLM). Placeholder ranges are tracked through every merge, so each range
covers exactly the merged tokens holding its item. When two images are back to back, the merged
``"\\n\\n\\n\\n"`` between them belongs to the first image and the second range starts after it (vLLM 0.33
gives both ranges that token, so they overlap by one).

The module also declares the rest of what mmfront needs of Gemma 3 (:data:`GEMMA3`): the
``max_pan_and_scan_crops`` deployment option and the reference engine's image encoder. Its offline
``gemma3`` and ``gemma3-896`` fixtures are :mod:`mmfront.fixtures.models.gemma3`'s.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mmfront.config import ModelOption
from mmfront.errors import ValidationError
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig, MultiModalKwargsItems
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows
from mmfront.parse import EmbeddingItems, ImageProcessorItems, MultiModalDataItems
from mmfront.pixels import pixel_rows, to_hwc_uint8
from mmfront.processing.hf import ProcessorKwargSpec, call_hf, resolve_hf_kwargs
from mmfront.processing.native import NativeInputs
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo
from mmfront.processing.threads import map_items
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptReplacement,
    PromptUpdate,
    PromptUpdateDetails,
    ResolvedPromptUpdate,
    placeholder_spans,
)

if TYPE_CHECKING:
    pass

_BILINEAR = 2
_IMAGE_KWARGS_MEMO = 64
"""Distinct request kwargs whose merged image settings are kept (then the memo starts over)."""

MAX_PAN_AND_SCAN_CROPS = ModelOption(
    "max_pan_and_scan_crops", 16, minimum=1,
    doc="most pan-and-scan crops a request may ask for per image (Gemma 3; the checkpoints default to 4)")
"""Each crop is processed and costs the model ``image_seq_length`` tokens, so a request's
``pan_and_scan_max_num_crops`` is capped by the deployment."""


class Gemma3ProcessingInfo(BaseProcessingInfo):
    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None}

    @property
    def image_seq_length(self) -> int:
        return int(self.hf_processor.image_seq_length)

    def image_kwargs(self, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The image processor's settings for one request: its own config, the processor's
        defaults (pan-and-scan), then the deployment's and the request's kwargs.

        Merged once per distinct set of kwargs (HF's ``_merge_kwargs`` is a measurable part of a
        request); a fresh dict each call, so a caller may change it."""
        try:
            key = tuple(sorted(hf_kwargs.items()))
            hash(key)
        except TypeError:  # an unhashable value: merge it each time
            return self._merge_image_kwargs(hf_kwargs)
        memo = self._image_kwargs_memo
        settings = memo.get(key)
        if settings is None:
            settings = self._merge_image_kwargs(hf_kwargs)
            if len(memo) >= _IMAGE_KWARGS_MEMO:
                memo.clear()
            memo[key] = settings
        return {k: dict(v) if isinstance(v, dict) else v for k, v in settings.items()}

    @cached_property
    def _image_kwargs_memo(self) -> dict[tuple[tuple[str, Any], ...], dict[str, Any]]:
        return {}

    def _merge_image_kwargs(self, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        proc = self.hf_processor
        merged = proc._merge_kwargs(proc.valid_processor_kwargs, tokenizer_init_kwargs=self.tokenizer.init_kwargs,
                                    **hf_kwargs)["images_kwargs"]
        image_processor = proc.image_processor
        names = ("do_resize", "size", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                 "image_std", "do_convert_rgb", "do_pan_and_scan", "pan_and_scan_min_crop_size",
                 "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")
        out = {name: getattr(image_processor, name, None) for name in names}
        out.update({k: v for k, v in merged.items() if k in names and v is not None})
        if out["size"] is not None and not isinstance(out["size"], Mapping):
            # Newer transformers store a SizeDict, which its own strict kwargs check refuses when
            # handed back to the image processor (the HF fallback for non-RGB images).
            out["size"] = dict(out["size"])
        return out


def pan_and_scan_grid(width: int, height: int, settings: Mapping[str, Any]) -> tuple[int, int]:
    """Columns and rows of pan-and-scan crops (Gemma3ImageProcessor's rule); ``(1, 1)``: no crops."""
    min_crop = int(settings["pan_and_scan_min_crop_size"])
    max_crops = int(settings["pan_and_scan_max_num_crops"])
    min_ratio = float(settings["pan_and_scan_min_ratio_to_activate"])
    if width >= height:
        if width / height < min_ratio:
            return 1, 1
        crops_w = min(math.floor(width / min_crop), math.floor(width / height + 0.5))
        crops_w, crops_h = min(max_crops, max(2, crops_w)), 1
    else:
        if height / width < min_ratio:
            return 1, 1
        crops_h = min(math.floor(height / min_crop), math.floor(height / width + 0.5))
        crops_w, crops_h = 1, min(max_crops, max(2, crops_h))
    if min(math.ceil(width / crops_w), math.ceil(height / crops_h)) < min_crop:
        return 1, 1
    return crops_w, crops_h


def _native_supported(settings: Mapping[str, Any]) -> bool:
    size = settings.get("size") or {}
    height = size.get("height") if isinstance(size, Mapping) else getattr(size, "height", None)
    width = size.get("width") if isinstance(size, Mapping) else getattr(size, "width", None)
    resample = settings.get("resample")
    return bool(settings.get("do_resize")) and height is not None and width is not None and (
        resample is None or int(resample) == _BILINEAR
    )


def _target_size(settings: Mapping[str, Any]) -> tuple[int, int]:
    size = settings["size"]
    if isinstance(size, Mapping):
        return int(size["height"]), int(size["width"])
    return int(size.height), int(size.width)


class Gemma3MultiModalProcessor(BaseMultiModalProcessor):
    """Precomputed ``image_embeds`` (with ``enable_mm_embeds``) skip the image processor: an item
    of ``(k + 1) * image_seq_length`` rows stands for an image with ``k`` pan-and-scan crops."""

    info: Gemma3ProcessingInfo

    items_are_independent: ClassVar[bool] = True  # each image is resized and normalized on its own
    reads_pixels = True  # the native path reads a decoded JPEG's pixels as they lie
    in_place_misses = True  # decoded, resized and looked up in mmfront's kernels

    mm_kwarg_specs: ClassVar[Sequence[ProcessorKwargSpec]] = (
        ProcessorKwargSpec("do_pan_and_scan", bool),
        ProcessorKwargSpec("pan_and_scan_min_crop_size", int, minimum=1),
        ProcessorKwargSpec("pan_and_scan_max_num_crops", int, minimum=1, maximum=MAX_PAN_AND_SCAN_CROPS),
        ProcessorKwargSpec("pan_and_scan_min_ratio_to_activate", float, minimum=0),
    )

    def __init__(self, info: BaseProcessingInfo) -> None:
        super().__init__(info)
        tok = info.tokenizer
        self.boi_token: str = tok.boi_token
        self.boi_id: int = tok.convert_tokens_to_ids(tok.boi_token)
        self.soft_id: int = tok.convert_tokens_to_ids(tok.image_token)
        self.full_image_sequence: str = info.hf_processor.full_image_sequence
        self._merges = self._newline_merges()

    def get_placeholder_str(self, modality: str, index: int) -> str:
        if modality == "image":
            return self.boi_token
        return super().get_placeholder_str(modality, index)

    def get_mm_special_tokens(self) -> set[str]:
        tok = self.info.tokenizer
        return {tok.boi_token, tok.eoi_token, tok.image_token}

    def get_max_tokens_per_item(self) -> Mapping[str, int]:
        settings = self.info.image_kwargs(
            resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs))
        crops = int(settings["pan_and_scan_max_num_crops"] or 0) if settings.get("do_pan_and_scan") else 0
        return {"image": (crops + 1) * self.info.image_seq_length}

    def get_dummy_image_size(self) -> tuple[int, int]:
        """The tallest image pan-and-scan still cuts into the most crops (vLLM's profiling size)."""
        settings = self.info.image_kwargs(resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs))
        height, width = _target_size(settings)
        crops = int(settings["pan_and_scan_max_num_crops"] or 1) if settings.get("do_pan_and_scan") else 1
        return width, height * crops

    # --- HF step ---

    def _call_hf_processor(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        embeds = mm_items["image"]
        if isinstance(embeds, EmbeddingItems):
            return {"num_patches": torch.tensor([self._embeds_patches(embeds.get(i), i)
                                                 for i in range(embeds.get_count())])}
        settings = self.info.image_kwargs(hf_kwargs)
        items = mm_items.get_items("image", ImageProcessorItems)
        count = items.get_count()
        if _native_supported(settings):
            # a decoded JPEG's pixels as they lie; other items through their PIL image or array
            views = [to_hwc_uint8(pixels if (pixels := items.get_pixels(i)) is not None else items.get(i))
                     for i in range(count)]
            if all(v is not None for v in views):
                return call_hf(self._native, what="Gemma3 image processing", data_desc=f"{count} image(s)",
                               views=views, settings=settings, dtype=self.info.model_dtype)
        images = items.get_all()
        out = call_hf(self.info.hf_processor.image_processor, what="Gemma3ImageProcessor",
                      data_desc=f"{len(images)} image(s)", images=images, return_tensors="pt",
                      **{k: v for k, v in settings.items() if v is not None})
        num_crops = torch.as_tensor(out["num_crops"])
        return {"pixel_values": out["pixel_values"], "num_patches": num_crops + 1, "num_crops": num_crops}

    def _embeds_patches(self, embeds: torch.Tensor, index: int) -> int:
        """Sub-images (the original plus its crops) an ``image_embeds`` item holds."""
        seq = self.info.image_seq_length
        rows = int(embeds.shape[0])
        if rows == 0 or rows % seq:
            raise ValidationError(
                f"image_embeds item {index} has {rows} rows; Gemma 3 takes {seq} per image (one per soft token), "
                f"or a multiple of {seq} for an image with pan-and-scan crops.", parameter="image")
        return rows // seq

    @staticmethod
    def _native(views: Sequence[torch.Tensor], settings: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
        out_hw = _target_size(settings)
        crops_per_image: list[list[torch.Tensor]] = []
        for hwc in views:
            height, width = int(hwc.shape[0]), int(hwc.shape[1])
            crops_w, crops_h = pan_and_scan_grid(width, height, settings) if settings.get("do_pan_and_scan") \
                else (1, 1)
            regions = [hwc]
            if crops_w * crops_h > 1:
                crop_w, crop_h = math.ceil(width / crops_w), math.ceil(height / crops_h)
                regions += [hwc[r * crop_h:(r + 1) * crop_h, c * crop_w:(c + 1) * crop_w]
                            for r in range(crops_h) for c in range(crops_w)]
            crops_per_image.append(regions)
        pixel_values = pixel_rows([r for regions in crops_per_image for r in regions], out_hw, settings, dtype,
                                  map_rows=map_items)
        crops = torch.tensor([len(regions) - 1 for regions in crops_per_image], dtype=torch.int64)
        return {"pixel_values": pixel_values, "num_patches": crops + 1, "num_crops": crops}

    def _get_mm_fields_config(
        self, hf_inputs: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
    ) -> Mapping[str, MultiModalFieldConfig]:
        num_patches = torch.as_tensor(hf_inputs["num_patches"])
        return {
            "pixel_values": MultiModalFieldConfig.flat_from_sizes("image", num_patches),
            "image_embeds": MultiModalFieldConfig.batched("image"),
            "num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
        }

    def _get_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        items = out_mm_kwargs["image"]

        def replacement(idx: int) -> PromptUpdateDetails[list[int]]:
            item = items[idx]
            assert item is not None
            crops = int(torch.as_tensor(item["num_patches"].data)) - 1
            return PromptUpdateDetails.select_token_id(self._replacement_ids(crops), self.soft_id)

        return [PromptReplacement("image", target=[self.boi_id], replacement=replacement)]

    def _replacement_ids(self, num_crops: int) -> list[int]:
        seq = self.full_image_sequence
        if num_crops:
            text = (f"Here is the original image {seq} and here are some crops to help you see better "
                    + " ".join([seq] * num_crops))
        else:
            text = seq
        return self.info.encode(text)

    # --- prompt step ---

    def _newline_merges(self) -> list[tuple[int, int, int]]:
        """vLLM's three passes, for the newline runs this vocabulary has single tokens for."""
        single = {}
        for text in ("\n", "\n\n", "\n\n\n", "\n\n\n\n"):
            ids = self.info.encode(text)
            if len(ids) == 1:
                single[text] = ids[0]
        rules = [("\n", "\n\n", "\n\n\n"), ("\n\n", "\n", "\n\n\n"), ("\n\n", "\n\n", "\n\n\n\n")]
        return [(single[a], single[b], single[c]) for a, b, c in rules if {a, b, c} <= single.keys()]

    def _apply_prompt_updates(
        self, prompt_ids: list[int], mm_prompt_updates: Mapping[str, Sequence[Sequence[ResolvedPromptUpdate]]],
    ) -> tuple[list[int], Mapping[str, Sequence[PlaceholderFeaturesInfo]]]:
        ids, placeholders = super()._apply_prompt_updates(prompt_ids, mm_prompt_updates)
        contents = placeholder_spans(placeholders)
        merges = _plan_newline_merges(ids, contents, self._merges)
        if not merges:
            return ids, placeholders
        merged_at = dict(merges)
        out: list[int] = []
        prev = 0
        for pos, token in merges:
            out += ids[prev:pos]
            out.append(token)
            prev = pos + 2
        out += ids[prev:]
        positions = [pos for pos, _ in merges]

        def new_index(old: int) -> int:  # the position in ``out`` of the token at ``old``
            return old - bisect_right(positions, old - 1)

        spans = [(p.start_idx, p.start_idx + len(p.tokens)) for ps in placeholders.values() for p in ps]
        moved: dict[str, list[PlaceholderFeaturesInfo]] = {}
        for modality, ps in placeholders.items():
            found = moved[modality] = []
            for p in ps:
                start, end = p.start_idx, p.start_idx + len(p.tokens)
                dropped = 0
                if start - 1 in merged_at:  # this placeholder's first token was merged into the previous one
                    if any(s <= start - 1 < e for s, e in spans):
                        dropped = 1  # it ends another placeholder: it stays there
                    else:
                        start -= 1
                new_start = new_index(start) + dropped
                last = end - 1
                new_end = new_index(last - 1 if last - 1 in merged_at else last) + 1
                if (new_start, new_end - new_start) == (p.start_idx, len(p.tokens)):
                    found.append(p)
                    continue
                mask = p.is_embed[dropped:] if p.is_embed is not None and dropped else p.is_embed
                found.append(PlaceholderFeaturesInfo(modality, p.item_idx, new_start, out[new_start:new_end], mask))
        return out, moved


def _plan_newline_merges(
    ids: list[int], contents: Sequence[tuple[int, int]], rules: Sequence[tuple[int, int, int]],
) -> list[tuple[int, int]]:
    """vLLM's three whole-prompt passes (``[a, b] -> [c]`` each, non-overlapping, left to right),
    computed on the positions of the newline tokens only: ``(position, merged token)`` per merge,
    in the original coordinates, sorted.

    A merged token never takes part in a later pass, and the token a merge removes sits right
    after a merged one, so two remaining candidates are neighbours exactly when their original
    positions are consecutive. Candidates are the prompt's own tokens plus the first and last
    token of each spliced content (``contents``: sorted ``[start, end)`` spans): a content is
    tokenizer output, and the tokenizer already merged every newline run inside it. So only the
    prompt's few tokens are scanned, not the expansion."""
    candidates = {token for rule in rules for token in rule[:2]}
    token_at: dict[int, int] = {}
    prompt_start = 0
    for start, end in (*contents, (len(ids), len(ids))):
        for token in candidates:
            i = prompt_start - 1
            try:
                while True:
                    i = ids.index(token, i + 1, start)
                    token_at[i] = token
            except ValueError:
                pass
        if start < end:
            for edge in (start, end - 1):
                if ids[edge] in candidates:
                    token_at[edge] = ids[edge]
        prompt_start = end
    merges: list[tuple[int, int]] = []
    for first, second, merged in rules:
        for pos in sorted(token_at):
            if token_at.get(pos) == first and token_at.get(pos + 1) == second:
                merges.append((pos, merged))
                del token_at[pos], token_at[pos + 1]
    merges.sort()
    return merges


# --- the reference engine's encoder ------------------------------------------------------------


def encode_gemma3_images(model: Any, modality: str, kwargs: BatchedTensorInputs,
                         features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """SigLIP and the projector on every crop; an image owns ``num_patches`` crops' rows."""
    pooled = pooled_rows(model.get_image_features(pixel_values=kwargs["pixel_values"], return_dict=True))
    crops = kwargs.get("num_patches")
    per_crop = model.config.mm_tokens_per_image
    counts = [int(n) * per_crop for n in crops.tolist()] if isinstance(crops, torch.Tensor) else \
        [per_crop] * len(features)
    return split_rows(pooled, counts)


GEMMA3 = register_model(ModelSpec(
    model_type="gemma3",
    hf_processor_class="Gemma3Processor",
    processor=Gemma3MultiModalProcessor,
    info=Gemma3ProcessingInfo,
    options=(MAX_PAN_AND_SCAN_CROPS,),
    reference=ReferenceModel(encode_gemma3_images, marks_token_types=True),
    # transformers < 5.15 names the soft token ``processor.image_token``; the prompt's is boi
    backend_placeholders={"image": "boi_token"},
    # the native processor sends what vLLM's Gemma3MultiModalProcessor sends (tests/models/test_gemma3_pixels.py)
    native=NativeInputs(("Gemma3ForConditionalGeneration",)),
))
