"""LFM2-VL (``LiquidAI/LFM2-VL`` checkpoints): served by the transformers backend's HF call, which
learns a tiled image's tile count here (HF's processor counts its grid's rows and columns, then drops
them); what vLLM 0.33's native ``Lfm2VlForConditionalGeneration`` reads is declared here too.

vLLM's ``Lfm2VLMultiModalProcessor``: an image's tiles (a large image's grid, then its thumbnail),
each the patch rows ``[max_num_patches, 3 * patch**2]`` of HF's ``pixel_values``, and their
``spatial_shapes`` (kept on the CPU), both flat along dim 0 by the image's ``num_patches`` (batched,
on the CPU), which vLLM computes from the image's size and the grid layout; no
``pixel_attention_mask`` (the model packs patches by ``spatial_shapes``). Each range is masked to
the image tokens (``select_token_id``). vLLM's count ignores ``do_image_splitting`` and
``use_thumbnail`` (any grid of more than one tile is split, a thumbnail added); where either makes
HF tile an image otherwise, vLLM's fields would not match its data, and mmfront refuses the request.
On the Legacy transformers backend (transformers < 5.15) the native class is refused: it cannot place
a tiled image's tokens (``LFM2_VL_NATIVE.legacy_mismatch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["LFM2_VL", "LFM2_VL_NATIVE", "lfm2_vl_fields", "lfm2_vl_num_patches", "lfm2_vl_tiles"]

_VLLM_TILING = {"do_image_splitting": True, "use_thumbnail": True}
"""What vLLM's count assumes: a grid of more than one tile is split and gets a thumbnail."""


def lfm2_vl_tiles(hf_processor: Any, height: int, width: int, images_kwargs: Mapping[str, Any]) -> int:
    """The tiles HF's image processor makes of an image: one, or a large image's grid (the ratio of
    ``min_tiles..max_tiles`` tiles nearest its aspect ratio) and its thumbnail. HF's own rounding and
    ratio choice, imported here: the module needs torchvision, which mmfront's import does not."""
    from transformers.models.lfm2_vl.image_processing_lfm2_vl import find_closest_aspect_ratio, round_by_factor

    image_processor = hf_processor.image_processor

    def setting(name: str) -> Any:
        return images_kwargs.get(name, getattr(image_processor, name))

    patch, factor = int(setting("encoder_patch_size")), int(setting("downsample_factor"))
    min_tiles, max_tiles = (int(setting("min_tiles")), int(setting("max_tiles"))) if setting("do_image_splitting") else (1, 1)
    total = patch * factor
    area = max(patch, round_by_factor(height, total)) * max(patch, round_by_factor(width, total))
    if min_tiles == max_tiles == 1 or area <= setting("max_image_tokens") * total**2 * setting("max_pixels_tolerance"):
        return 1
    ratios = sorted({(w, h) for n in range(min_tiles, max_tiles + 1) for w in range(1, n + 1) for h in range(1, n + 1)
                     if min_tiles <= w * h <= max_tiles}, key=lambda r: r[0] * r[1])
    grid_width, grid_height = find_closest_aspect_ratio(width / height, ratios, width, height, int(setting("tile_size")))
    grid = grid_width * grid_height
    return grid + 1 if grid != 1 and setting("use_thumbnail") else grid


def lfm2_vl_num_patches(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                        hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data``: each image's ``num_patches`` as vLLM counts them, which
    must be the tiles HF made (the backend's ``num_image_patches``)."""
    made = hf_out.get("num_image_patches")
    if "image" not in mm_items or not isinstance(made, torch.Tensor):
        return hf_out
    images = mm_items.get_items("image", ImageProcessorItems)
    images_kwargs = {**(hf_kwargs.get("images_kwargs") or {}), **_VLLM_TILING}
    sizes = [images.get_image_size(i) for i in range(images.get_count())]
    counts = [lfm2_vl_tiles(hf_processor, s.height, s.width, images_kwargs) for s in sizes]
    if counts != made.tolist():
        raise ValidationError(
            f"LFM2-VL made {made.tolist()} tiles of the images, where vLLM 0.33's native class counts {counts}: vLLM "
            "counts a large image's grid and thumbnail whatever do_image_splitting and use_thumbnail say, so its "
            "fields would not match the data. Send the request without those settings, or serve the model with "
            "--model-impl transformers.", parameter="mm_processor_kwargs")
    return dict(hf_out, num_patches=torch.tensor(counts))


def lfm2_vl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's LFM2-VL fields: tiles and their patch grids flat by ``num_patches``."""
    num_patches = hf_out.get("num_patches", torch.empty(0, dtype=torch.long))
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", num_patches),
            "spatial_shapes": MultiModalFieldConfig.flat_from_sizes("image", num_patches, keep_on_cpu=True),
            "num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}


LFM2_VL_NATIVE = NativeInputs(
    ("Lfm2VlForConditionalGeneration",), lfm2_vl_fields, outputs=lfm2_vl_num_patches,
    legacy_mismatch="it cannot locate a tiled image's expansion, whose tiles' image tokens are runs between "
                    "<|img_row_R_col_C|> markers, since HF < 5.15 reports no per-image token count; vLLM serves tiled images")

LFM2_VL = register_model(ModelSpec(model_type="lfm2_vl", hf_processor_class="Lfm2VlProcessor",
                                   image_patches=lfm2_vl_tiles, native=LFM2_VL_NATIVE))
