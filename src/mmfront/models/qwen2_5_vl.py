"""Qwen2.5-VL: served by the transformers backend (its ``replace_image_token`` hook). This module
declares the rest of what mmfront needs of it: the offline ``qwen2_5_vl`` fixture (Qwen's tokens
and chat template, a random-weight config) and the encoder and M-RoPE positions the reference
engine runs.

The processor takes a video processor (transformers builds none without torchvision: see
docs/models.md, "torchvision"); the fixture carries one at the image processor's patch sizes.
Videos go to HF with their metadata (``video_needs_metadata``: the processor derives
``second_per_grid_ts`` from the frame rate, and vLLM's own Qwen2.5-VL processor passes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmfront.errors import ConfigError, FieldConfigError
from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import TEXT_TOWER, VISION_TOWER, ModelKind, special_token_ids
from mmfront.fixtures.processors import image_processor_class
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows
from mmfront.processing.native import NativeInputs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLProcessor

QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat template Qwen2-VL and Qwen2.5-VL Instruct ship (a default system turn; ``add_vision_id``
numbers the items)."""

QWEN2_VL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                   "<|video_pad|>"]


def make_qwen2_5_vl_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        QWEN2_VL_TOKENS,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        add_bos=False,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )


def make_qwen2_5_vl_processor(patch_size: int = 8, merge_size: int = 2, max_pixels: int = 64 * 64) -> Qwen2_5_VLProcessor:
    """Qwen2_5_VLProcessor: real Qwen2.5-VL uses 14 px patches, merge size 2 and up to 12845056
    pixels (a 28 px unit, from 3136 pixels).

    An image is resized to multiples of ``patch_size * merge_size`` holding at most
    ``max_pixels``; each ``merge_size`` x ``merge_size`` block of patches is one ``<|image_pad|>``
    token. ``pixel_values`` is flat: ``[sum of t*h*w patches, 3 * 2 * patch_size**2]`` with
    ``image_grid_thw`` ``[num_images, 3]`` (``t`` is 1 for an image: two copies of it make one
    temporal patch).
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

    unit = patch_size * merge_size
    sizes = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": 2,
             "size": {"shortest_edge": unit * unit, "longest_edge": max_pixels}}
    image_processor = image_processor_class("qwen2_vl", "Qwen2VLImageProcessor")(**sizes)
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=make_qwen2_5_vl_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(**sizes),
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )


def _weights_config(processor: Any) -> Qwen2_5_VLConfig:
    from transformers import Qwen2_5_VLConfig

    tok = processor.tokenizer
    images = processor.image_processor
    head_dim = TEXT_TOWER["hidden_size"] // TEXT_TOWER["num_attention_heads"]
    if head_dim % 8:
        raise ConfigError(f"Qwen2.5-VL weights need a text head size divisible by 8, got {head_dim}.")
    rotary = head_dim // 2  # M-RoPE splits the rotary frequencies into temporal, height and width sections
    section = [rotary // 4, rotary * 3 // 8, rotary * 3 // 8]
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    return Qwen2_5_VLConfig(
        vision_config={"hidden_size": VISION_TOWER["hidden_size"], "intermediate_size": VISION_TOWER["intermediate_size"],
                       "depth": VISION_TOWER["num_hidden_layers"], "num_heads": VISION_TOWER["num_attention_heads"],
                       "out_hidden_size": TEXT_TOWER["hidden_size"],
                       "patch_size": images.patch_size, "spatial_merge_size": images.merge_size,
                       "temporal_patch_size": images.temporal_patch_size,
                       "window_size": 2 * images.patch_size * images.merge_size, "fullatt_block_indexes": [0]},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "vocab_size": len(tok), "tie_word_embeddings": False,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}},
        tie_word_embeddings=False,
        **ids,
    )


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
    fixtures={"qwen2_5_vl": ModelKind("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "float32",
                                      make_qwen2_5_vl_processor, ("patch_size", "merge_size", "max_pixels"),
                                      weights_config=_weights_config)},
    reference=ReferenceModel(encode_qwen2_5_vl, positions=qwen2_5_vl_positions),
    video_needs_metadata=True,
    native=QWEN2_5_VL_NATIVE,
))
