"""LLaVA-OneVision: served by the transformers backend (its ``replace_image_token`` hook). This
module declares the rest of what mmfront needs of it: the offline ``llava_onevision`` fixture
(Qwen2 tokens, the family's chat template, a random-weight config) and the encoder the reference
engine runs.

An image the processor gets in a flat list is tiled "anyres" (its base tile plus the tiles of the
best grid point, newline-separated); transformers tiles only the base tile of an image that
shares a nested list with others, which no mmfront call does. The processor takes a video
processor (none without torchvision: docs/models.md, "torchvision"), which the reference encoder
serves too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmfront.errors import ConfigError
from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import TEXT_TOWER, VISION_TOWER, ModelKind, special_token_ids
from mmfront.fixtures.processors import image_processor_class
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel

if TYPE_CHECKING:
    from transformers import LlavaOnevisionConfig, LlavaOnevisionProcessor, PreTrainedTokenizerFast

LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The chat template the LLaVA-OneVision checkpoints ship (images, then videos, then the text of
each turn)."""


def make_llava_onevision_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<image>", "<video>"],
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        add_bos=False,
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
    )


def make_llava_onevision_processor(tile_size: int = 28, patch_size: int = 7, max_grid: int = 3) -> LlavaOnevisionProcessor:
    """LlavaOnevisionProcessor: real LLaVA-OneVision uses 384 px tiles of 14 px patches (729
    tokens a tile) and grid points up to 6 x 6 tiles.

    ``pixel_values`` is 5-D ``[num_images, max_tiles, 3, tile_size, tile_size]`` (zero-padded
    across images), ``image_sizes`` ``[num_images, 2]``; the grid points are every ``i`` x ``j``
    tiles up to ``max_grid`` on a side.
    """
    from transformers import LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    if tile_size % patch_size:
        raise ConfigError(f"LLaVA-OneVision tiles ({tile_size} px) must be a whole number of patches ({patch_size} px).")
    tile = {"height": tile_size, "width": tile_size}
    pinpoints = [[tile_size * i, tile_size * j] for i in range(1, max_grid + 1) for j in range(1, max_grid + 1)]
    image_processor = image_processor_class("llava_onevision", "LlavaOnevisionImageProcessor")(
        size=tile, crop_size=tile, image_grid_pinpoints=pinpoints)
    return LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=make_llava_onevision_tokenizer(),
        video_processor=LlavaOnevisionVideoProcessor(size=tile),
        num_image_tokens=(tile_size // patch_size) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
    )


def _weights_config(processor: Any) -> LlavaOnevisionConfig:
    from transformers import LlavaOnevisionConfig

    tok = processor.tokenizer
    images = processor.image_processor
    tile = images.size["height"]
    return LlavaOnevisionConfig(
        vision_config={**VISION_TOWER, "model_type": "siglip_vision_model", "image_size": tile,
                       "patch_size": tile // round(processor.num_image_tokens ** 0.5)},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "model_type": "qwen2", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy=processor.vision_feature_select_strategy,
        vision_feature_layer=-1,
        vision_aspect_ratio=processor.vision_aspect_ratio,
        image_grid_pinpoints=images.image_grid_pinpoints,
        tie_word_embeddings=False,
    )


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
    fixtures={"llava_onevision": ModelKind("llava_onevision", "LlavaOnevisionForConditionalGeneration", "float32",
                                           make_llava_onevision_processor, ("tile_size", "patch_size", "max_grid"),
                                           weights_config=_weights_config)},
    reference=ReferenceModel(encode_llava_onevision),
))
