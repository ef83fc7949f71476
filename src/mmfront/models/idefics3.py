"""Idefics3 (SmolVLM): served by the transformers backend's HF call; what vLLM 0.33's native
``Idefics3ForConditionalGeneration`` / ``SmolVLMForConditionalGeneration`` read is declared here,
with the encoder the reference engine runs (its offline ``idefics3`` fixture is
:mod:`mmfront.fixtures.models.idefics3`'s).

vLLM's ``Idefics3MultiModalProcessor``: the call's tiles ``[tiles, C, H, W]`` (HF's batch of one
prompt squeezed), ``pixel_values`` and ``pixel_attention_mask`` flat along them by each image's
``num_patches`` (batched, kept on the CPU; the model pops it without a default), and each range
masked to the image tokens (``select_token_id``). Refused for that class on the Legacy backend
(``IDEFICS3_NATIVE.legacy_mismatch``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["IDEFICS3", "IDEFICS3_NATIVE", "SMOLVLM", "encode_idefics3_images", "idefics3_fields", "idefics3_outputs"]

def idefics3_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                     hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data``: each image's tile count as ``num_patches`` (the image
    processor's ``get_number_of_image_patches``, at least one), the tiles without HF's batch of one."""
    if "image" not in mm_items or not isinstance(hf_out.get("pixel_values"), torch.Tensor):
        return hf_out
    images = mm_items.get_items("image", ImageProcessorItems)
    images_kwargs = dict(hf_kwargs.get("images_kwargs") or {})
    counts = []
    for i in range(images.get_count()):
        size = images.get_image_size(i)
        patches = hf_processor.image_processor.get_number_of_image_patches(size.height, size.width, images_kwargs)
        counts.append(max(int(patches[0]), 1))
    out = dict(hf_out, num_patches=torch.tensor(counts))
    for key, ndim in (("pixel_values", 5), ("pixel_attention_mask", 4)):
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.ndim == ndim and value.shape[0] == 1:
            out[key] = value[0]
    return out


def idefics3_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Idefics3 fields: tiles flat by ``num_patches``, embeddings one per image."""
    num_patches = hf_out.get("num_patches", torch.empty(0, dtype=torch.long))
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", num_patches),
            "pixel_attention_mask": MultiModalFieldConfig.flat_from_sizes("image", num_patches),
            "image_embeds": MultiModalFieldConfig.batched("image"),
            "num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}


def encode_idefics3_images(model: Any, modality: str, kwargs: BatchedTensorInputs,
                           features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """The vision tower and connector on every tile; an image owns its tiles' rows. vLLM's native
    layout sends the tiles ``[tiles, C, H, W]`` with each image's ``num_patches``; the transformers
    backend's ``[1, tiles, C, H, W]`` per image."""
    pixel_values: torch.Tensor = kwargs["pixel_values"]  # type: ignore[assignment]
    mask = kwargs.get("pixel_attention_mask")
    if pixel_values.ndim == 4:
        pixel_values = pixel_values[None]
        mask = mask[None] if isinstance(mask, torch.Tensor) else mask
    pooled = pooled_rows(model.get_image_features(pixel_values, mask, return_dict=True))
    tiles = [_tiles(f) for f in features]
    per_tile = pooled.shape[0] // max(sum(tiles), 1)
    return split_rows(pooled, [t * per_tile for t in tiles])


def _tiles(feature: MultiModalFeatureSpec) -> int:
    data = feature.data
    assert data is not None
    if "num_patches" in data:
        return int(data["num_patches"].data)  # type: ignore[arg-type]
    return int(data["pixel_values"].data.shape[1])  # type: ignore[union-attr]


IDEFICS3_NATIVE = NativeInputs(
    ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"), idefics3_fields, outputs=idefics3_outputs,
    legacy_mismatch=("it locates a tiled image's tokens by counts HF < 5.15 takes with each <row_R_col_C> and <global-img> "
                     "marker as one token (SmolVLM reports none), so it cannot place an image where the tokenizer "
                     "splits those markers, and its placement of tiled images is not proven equal to vLLM's"))

IDEFICS3 = register_model(ModelSpec(
    model_type="idefics3",
    hf_processor_class="Idefics3Processor",
    reference=ReferenceModel(encode_idefics3_images),
    native=IDEFICS3_NATIVE,
))

SMOLVLM = register_model(ModelSpec(model_type="smolvlm", hf_processor_class="SmolVLMProcessor", native=IDEFICS3_NATIVE))
"""SmolVLM: vLLM runs Idefics3's processor and model for it."""
