"""LLaVA-OneVision: served by the transformers backend (its ``replace_image_token`` hook). This
module declares the rest of what mmfront needs of it: what vLLM 0.33's native
``LlavaOnevisionForConditionalGeneration`` reads (LLaVA-NeXT's image fields,
:mod:`mmfront.models.llava_next`, with the same intended difference: each image without the tile
padding of the images beside it; and a video's frames ``[frames, C, H, W]`` per item, batched), and
the encoder the reference engine runs on those fields (its offline ``llava_onevision`` fixture is
:mod:`mmfront.fixtures.models.llava_onevision`'s).

An image the processor gets in a flat list is tiled "anyres" (its base tile plus the tiles of the
best grid point, newline-separated); transformers tiles only the base tile of an image that
shares a nested list with others, which no mmfront call does. The processor takes a video
processor (none without torchvision: docs/models.md, "torchvision"), which the reference encoder
serves too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.llava_next import anyres_tiles, llava_next_fields
from mmfront.models.spec import ModelSpec, ReferenceModel
from mmfront.processing.native import NativeInputs


def llava_onevision_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``LlavaOnevisionMultiModalProcessor._get_mm_fields_config``: LLaVA-NeXT's image fields
    and one video's frames per item."""
    return {**llava_next_fields(hf_out, hf_processor), "pixel_values_videos": MultiModalFieldConfig.batched("video")}


LLAVA_ONEVISION_NATIVE = NativeInputs(("LlavaOnevisionForConditionalGeneration",), llava_onevision_fields,
                                      outputs=anyres_tiles, whole_range_embeds=True)


def encode_llava_onevision(model: Any, modality: str, kwargs: BatchedTensorInputs,
                           features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """Images: the vision tower, projector and anyres packing (tiles unpadded to the image's
    aspect, newline rows) of every image, each tiled on its own as the processor counted it. The
    images' tiles go in as one ``[tiles, C, H, W]`` run, which the model splits by
    ``image_sizes``. Videos: :func:`encode_llava_onevision_videos`."""
    config = model.config
    if modality == "video":
        return encode_llava_onevision_videos(model, kwargs)
    sizes: torch.Tensor = kwargs["image_sizes"]  # type: ignore[assignment]
    pixels = kwargs["pixel_values"]
    # [images, tiles, C, H, W] where the batch's images have equal tile counts, else one per image
    parts: list[torch.Tensor] = list(pixels) if isinstance(pixels, (list, tuple)) else [pixels]  # type: ignore[arg-type, list-item]
    tiles = torch.cat([p.reshape(-1, *p.shape[-3:]) for p in parts])
    output = model.get_image_features(
        tiles, sizes.reshape(-1, 2), vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        vision_aspect_ratio=config.vision_aspect_ratio, batch_num_images=torch.ones(len(features), dtype=torch.long),
        return_dict=True)
    return [rows.reshape(-1, rows.shape[-1]) for rows in output.pooler_output]


def encode_llava_onevision_videos(model: Any, kwargs: BatchedTensorInputs) -> list[torch.Tensor]:
    """Each video's frames through the tower and projector, pooled, with the newline row after
    them; one video at a time, since videos of different lengths do not stack."""
    config = model.config
    pixels = kwargs["pixel_values_videos"]
    videos: list[torch.Tensor] = list(pixels)  # type: ignore[arg-type]
    out = []
    for frames in videos:
        output = model.get_video_features(frames[None], vision_feature_layer=config.vision_feature_layer,
                                          vision_feature_select_strategy=config.vision_feature_select_strategy,
                                          return_dict=True)
        out.append(output.pooler_output.reshape(-1, output.pooler_output.shape[-1]))
    return out


LLAVA_ONEVISION = register_model(ModelSpec(
    model_type="llava_onevision",
    hf_processor_class="LlavaOnevisionProcessor",
    reference=ReferenceModel(encode_llava_onevision),
    native=LLAVA_ONEVISION_NATIVE,
))
