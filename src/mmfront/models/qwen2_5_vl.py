"""Qwen2.5-VL: served by the transformers backend (its ``replace_image_token`` hook). This module
declares the rest of what mmfront needs of it: the encoder and M-RoPE positions the reference
engine runs (its offline ``qwen2_5_vl`` fixture is :mod:`mmfront.fixtures.models.qwen2_5_vl`'s).

The processor takes a video processor (transformers builds none without torchvision: see
docs/models.md, "torchvision"); the fixture carries one at the image processor's patch sizes.
Videos go to HF with their metadata (``video_needs_metadata``: the processor derives
``second_per_grid_ts`` from the frame rate, and vLLM's own Qwen2.5-VL processor passes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.errors import FieldConfigError
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields, qwen2_vl_image_expansions, qwen2_vl_pixel_limits, qwen2_vl_speedups
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows
from mmfront.processing.native import NativeInputs


def encode_qwen2_5_vl(model: Any, modality: str, kwargs: BatchedTensorInputs,
                      features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """The vision tower and patch merger on every image's or video's patches; an item owns
    ``t*h*w / merge_size**2`` rows."""
    if modality == "video":
        grid: torch.Tensor = kwargs["video_grid_thw"]  # type: ignore[assignment]
        output = model.get_video_features(kwargs["pixel_values_videos"], grid, return_dict=True)
    else:
        grid = kwargs["image_grid_thw"]  # type: ignore[assignment]
        output = model.get_image_features(kwargs["pixel_values"], grid, return_dict=True)
    pooled = pooled_rows(output)
    merge = model.config.vision_config.spatial_merge_size
    return split_rows(pooled, [int(n) // (merge * merge) for n in grid.prod(-1).tolist()])


def qwen2_5_vl_positions(model: Any, prompt: Sequence[int],
                         features: Sequence[MultiModalFeatureSpec]) -> tuple[torch.Tensor, int]:
    """M-RoPE: the model's own ``get_rope_index`` on the prompt, every item's embedding positions
    marked with its modality and its grid from the item's data (a video's temporal positions
    also from its ``second_per_grid_ts``)."""
    device = model.device
    ids = torch.tensor([list(prompt)], device=device)
    types = torch.zeros_like(ids)
    grids: dict[str, list[torch.Tensor]] = {"image": [], "video": []}
    seconds: list[torch.Tensor] = []
    for feature in sorted(features, key=lambda f: f.mm_position.offset):
        pos = feature.mm_position
        span = torch.arange(pos.offset, pos.offset + pos.length, device=device)
        if pos.is_embed is not None:
            span = span[pos.is_embed.to(device=device, dtype=torch.bool)]
        types[0, span] = 1 if feature.modality == "image" else 2
        if feature.data is None:
            raise FieldConfigError(f"Qwen2.5-VL positions need the grid of item {feature.identifier!r}, which "
                                   "carries no data: fill it from the receiver cache first.")
        grid = feature.data[f"{feature.modality}_grid_thw"].data
        grids[feature.modality].append(torch.as_tensor(grid, device=device).reshape(3))
        if feature.modality == "video" and "second_per_grid_ts" in feature.data:
            seconds.append(torch.as_tensor(feature.data["second_per_grid_ts"].data, device=device).reshape(()))
    position_ids, deltas = model.model.get_rope_index(
        ids, mm_token_type_ids=types,
        image_grid_thw=torch.stack(grids["image"]) if grids["image"] else None,
        video_grid_thw=torch.stack(grids["video"]) if grids["video"] else None,
        second_per_grid_ts=torch.stack(seconds) if seconds else None)
    return position_ids, int(deltas.reshape(-1)[0])


def qwen2_5_vl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``Qwen2_5_VLMultiModalProcessor._get_mm_fields_config``: Qwen2-VL's and each video's
    ``second_per_grid_ts``."""
    return {**qwen2_vl_fields(hf_out, hf_processor),
            "second_per_grid_ts": MultiModalFieldConfig.batched("video", keep_on_cpu=True)}


QWEN2_5_VL_NATIVE = NativeInputs(("Qwen2_5_VLForConditionalGeneration",), qwen2_5_vl_fields, device_normalize=True,
                                 whole_range_embeds=True, hf_samples_frames=False)


QWEN2_5_VL = register_model(ModelSpec(
    model_type="qwen2_5_vl",
    hf_processor_class="Qwen2_5_VLProcessor",
    reference=ReferenceModel(encode_qwen2_5_vl, positions=qwen2_5_vl_positions,
                             device_normalized=("pixel_values", "pixel_values_videos")),
    video_needs_metadata=True,
    native=QWEN2_5_VL_NATIVE,
    hf_speedups=qwen2_vl_speedups,
    image_expansions=qwen2_vl_image_expansions,
    call_kwargs=qwen2_vl_pixel_limits,
))
