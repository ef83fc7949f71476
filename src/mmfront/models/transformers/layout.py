"""How one HF call's outputs split into items: which outputs are about the text, which key
holds an item's rows and along which dimension, and the padding a batch adds that an item
processed alone does not have. Plain functions on HF output mappings, shared by both paths of
the transformers backend."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmfront.errors import FieldConfigError, UnsupportedModelError
from mmfront.inputs import MultiModalFieldConfig

LAYOUT_KEY = "__mmfront_layout__"
"""Key under which a processed HF output carries its :class:`OutputLayout` (never a model input:
keys without a field config are dropped when the outputs are split into items)."""

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "text_replacement_offsets",
             "labels")
"""Outputs about the text HF processed, not about the items; the model must not receive them
(``labels``: PaliGemma's training targets, its ``input_ids`` with the prefix masked)."""

PROMPT_LAID_OUT_KEYS = ("cross_attention_mask",)
"""Outputs with one row per prompt token that are about the items (``[batch, prompt tokens,
images, tiles]``: which images each token attends to). They belong to the prompt as a whole: no
item can carry them, and an item processed apart from its prompt has none. Served only where the
model's module says how its engine rebuilds them (``ModelSpec.prompt_outputs``)."""

MAIN_KEYS = {"image": ("pixel_values", "image_patches"), "audio": ("input_features", "input_values"),
              "video": ("pixel_values_videos",)}
PER_VIDEO_KEYS = ("video_grid_thw", "second_per_grid_ts")
"""One row per video whatever the video holds (vLLM registers them so)."""


@dataclass
class ModalityLayout:
    """How one modality's outputs split into items.

    ``rows[i]`` is how many rows item ``i`` owns along a key's slice dimension (image tiles or crops,
    audio windows). ``size_keys`` are per-item counts sent along with the data (kept on CPU);
    ``replacement_sizes`` splits ``{modality}_replacement_ids``; ``expansions`` holds each item's
    expansion where the model's module computes it from the data (``ModelSpec.image_expansions``),
    rather than the backend reading it off HF's text.
    """

    count: int
    keys: list[str]
    rows: list[int]
    size_keys: list[str] = field(default_factory=list)
    replacement_sizes: list[int] | None = None
    expansions: list[list[int]] | None = None


OutputLayout = dict[str, ModalityLayout]


def split_text_outputs(hf_out: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(text outputs, data outputs)`` of one HF call."""
    text = {k: v for k, v in hf_out.items() if k in TEXT_KEYS}
    data = {k: v for k, v in hf_out.items() if k not in TEXT_KEYS}
    return text, data


def drop_prompt_outputs(processor: str, hf_out: dict[str, Any], rebuilt: Collection[str]) -> None:
    """Drop from one HF call's outputs those laid out along the prompt that the engine rebuilds
    (``rebuilt``); any other is refused, since splitting it into items would be wrong."""
    for key in PROMPT_LAID_OUT_KEYS:
        if key in hf_out and key not in rebuilt:
            raise UnsupportedModelError(
                f"{processor} returns {key!r}, one row per prompt token: it belongs to the prompt as a whole, so the "
                "transformers backend cannot split it into items or process items apart from the prompt. Its model's "
                "module in mmfront.models can declare how the engine rebuilds it from the items' placeholder ranges "
                "and data (ModelSpec.prompt_outputs; see docs/transformers-backend.md)."
            )
        hf_out.pop(key, None)


def slice_dim(data: torch.Tensor, total_rows: int) -> int:
    """1 for outputs with a leading batch dimension (Idefics3's ``[1, tiles, C, H, W]``), else 0."""
    if data.ndim >= 2 and data.shape[0] != total_rows and data.shape[1] == total_rows:
        return 1
    return 0


def found_rows(value: Any, total_rows: int) -> int:
    """Rows of an output along its slice dimension for ``total_rows`` expected rows (a list's length)."""
    return len(value) if isinstance(value, list) else int(value.shape[slice_dim(value, total_rows)])


def field_config(modality: str, key: str, data: Any, layout: ModalityLayout) -> MultiModalFieldConfig:
    """Lists hold one element per item (batched); tensors are split by rows (flat along their slice
    dimension), or one row per item when only the item count fits."""
    if isinstance(data, (list, tuple)):
        if len(data) != layout.count:
            raise FieldConfigError(
                f"{modality} output {key!r} is a list of {len(data)} entries for {layout.count} item(s); the "
                "transformers backend cannot attribute it to items."
            )
        return MultiModalFieldConfig.batched(modality)
    if not isinstance(data, torch.Tensor) or data.ndim == 0:
        raise FieldConfigError(f"{modality} output {key!r} ({type(data).__name__}) has no item dimension.")
    if modality == "video" and (key in PER_VIDEO_KEYS or data.shape[0] == layout.count):
        return MultiModalFieldConfig.batched(modality, keep_on_cpu=key in PER_VIDEO_KEYS)
    total = sum(layout.rows)
    dim = slice_dim(data, total)
    if data.shape[dim] == total:
        return MultiModalFieldConfig.flat_from_sizes(modality, torch.tensor(layout.rows), dim=dim)
    if data.shape[0] == layout.count:
        return MultiModalFieldConfig.batched(modality)
    raise FieldConfigError(
        f"{modality} output {key!r} of shape {tuple(data.shape)} matches neither {layout.count} item(s) nor their "
        f"{total} row(s) ({layout.rows}); the transformers backend cannot attribute it to items."
    )


def unpad_images(data: dict[str, Any]) -> None:
    """Crop batch-padded ``pixel_values`` back to each image's ``image_sizes`` (Emu3 pads every
    image of a call to the largest one), leaving one tensor per image."""
    pixels, sizes = data.get("pixel_values"), data.get("image_sizes")
    if not (isinstance(pixels, torch.Tensor) and isinstance(sizes, torch.Tensor)):
        return
    if pixels.ndim != 4 or sizes.ndim != 2 or sizes.shape != (pixels.shape[0], 2):
        return
    if tuple(sizes.max(dim=0).values.tolist()) != tuple(pixels.shape[-2:]):
        return
    data["pixel_values"] = [pixels[i, :, :h, :w] for i, (h, w) in enumerate(sizes.tolist())]


def drop_tile_padding(data: dict[str, Any], count: int) -> None:
    """Give each image its own tiles where a call pads them: LLaVA-NeXT and LLaVA-OneVision return
    ``pixel_values`` ``[images, most tiles of any image, C, H, W]``, each image's tiles followed by
    zero tiles up to the call's most, so an image's data would depend on what it was processed
    beside. Each image keeps ``[1, its tiles, C, H, W]``, what it gets processed alone: its
    trailing all-zero tiles are dropped (a real tile is never all zeros once normalized)."""
    pixels = data.get("pixel_values")
    if not (isinstance(pixels, torch.Tensor) and pixels.ndim == 5 and pixels.shape[0] == count > 1):
        return
    own = []
    for image in pixels:
        filled = image.flatten(1).any(dim=1).nonzero()
        tiles = int(filled.max()) + 1 if filled.numel() else image.shape[0]
        own.append(image[None, :tiles])
    data["pixel_values"] = own


def merge_item_outputs(outputs: Sequence[Mapping[str, Any]], *, unbatch: bool = False) -> dict[str, Any]:
    """Outputs of one HF call per item, as one output: concatenated along rows where the shapes
    allow it, else one tensor per item. ``unbatch``: such a tensor (or list) loses its batch
    dimension of one (a video's ``[1, frames, C, H, W]``, its list of timestamps), so the item is
    what it is in a call of several."""
    merged: dict[str, Any] = {}
    for key in outputs[0]:
        parts = [out[key] for out in outputs]
        tensors = all(isinstance(p, torch.Tensor) and p.ndim > 0 for p in parts)
        if tensors and all(p.shape[1:] == parts[0].shape[1:] for p in parts):
            merged[key] = torch.cat(parts)
        elif unbatch and all(((isinstance(p, torch.Tensor) and p.ndim > 0) or isinstance(p, list)) and len(p) == 1
                             for p in parts):
            merged[key] = [p[0] for p in parts]
        else:
            merged[key] = parts
    return merged


def main_key(modality: str, data: Mapping[str, Any]) -> str | None:
    """The key whose rows define an item's rows (``pixel_values``, ``input_features``...)."""
    for key in (*MAIN_KEYS[modality], *data):
        value = data.get(key)
        if isinstance(value, list) or (isinstance(value, torch.Tensor) and value.ndim > 0):
            return key
    return None


def row_count(value: Any) -> int:
    """Rows along dim 0 (audio features: one row per audio or per window)."""
    return len(value) if isinstance(value, list) else int(value.shape[0])


def most_frequent_token(ids: Sequence[int]) -> int:
    """The token an expansion repeats most: the one that receives embeddings (vLLM's rule). Ties
    go to the token seen first."""
    counts = Counter(ids)  # counted in C (a real image's expansion is thousands of ids), in first-seen order
    return max(counts, key=counts.__getitem__)
