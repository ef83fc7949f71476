"""Idefics3 (SmolVLM): served by the transformers backend. This module declares the rest of what
mmfront needs of it: the offline ``idefics3`` fixture (SmolVLM-style tokens and template, a
random-weight config) and the encoder the reference engine runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmfront.errors import ConfigError
from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import TEXT_TOWER, VISION_TOWER, ModelKind, special_token_ids
from mmfront.fixtures.processors import ImageBackend, image_processor_class
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows

if TYPE_CHECKING:
    from transformers import Idefics3Config, Idefics3Processor, PreTrainedTokenizerFast

IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}"
    "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

IDEFICS3_ROW_COL_TOKENS = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]


def make_idefics3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *IDEFICS3_ROW_COL_TOKENS],
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        add_bos=False,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def make_idefics3_processor(
    patch_size: int = 32, max_splits_per_side: int = 2, image_seq_len: int = 4, backend: ImageBackend = "auto"
) -> Idefics3Processor:
    """Idefics3Processor: real Idefics3 uses 364px patches, size longest_edge 4*364 and
    image_seq_len=169 (SmolVLM: 512 / 2048 / 64).

    Images are split into up to ``max_splits_per_side`` x ``max_splits_per_side`` tiles of
    ``patch_size`` plus one global tile. ``pixel_values`` is 5-D
    ``[num_prompts, max_tiles_in_any_prompt, 3, patch_size, patch_size]`` (zero-padded across
    prompts), ``pixel_attention_mask`` is ``[num_prompts, max_tiles, patch_size, patch_size]``.
    """
    from transformers import Idefics3Processor

    cls = image_processor_class("idefics3", "Idefics3ImageProcessor", backend)
    image_processor = cls(
        size={"longest_edge": patch_size * max_splits_per_side},
        max_image_size={"longest_edge": patch_size},
        do_image_splitting=True,
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=make_idefics3_tokenizer(),
        image_seq_len=image_seq_len,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def _weights_config(processor: Any) -> Idefics3Config:
    from transformers import Idefics3Config

    tok = processor.tokenizer
    tile = processor.image_processor.max_image_size["longest_edge"]
    scale = 2
    side = math.isqrt(processor.image_seq_len)
    if side * side != processor.image_seq_len or tile % (scale * side):
        raise ConfigError(
            f"Idefics3 weights need image_seq_len a square number (got {processor.image_seq_len}) and a tile size "
            f"divisible by {scale} times its root (got {tile}).")
    return Idefics3Config(
        vision_config={**VISION_TOWER, "image_size": tile, "patch_size": tile // (scale * side)},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "model_type": "llama", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        # a keyword the config takes through **kwargs: its default 128002 lies outside the vocabulary
        **{"pad_token_id": tok.pad_token_id},
        tie_word_embeddings=False,
    )


def encode_idefics3_images(model: Any, modality: str, kwargs: BatchedTensorInputs,
                           features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """The vision tower and connector on every tile; an image owns its tiles' rows."""
    pixel_values = kwargs["pixel_values"]
    pooled = pooled_rows(model.get_image_features(pixel_values, kwargs.get("pixel_attention_mask"), return_dict=True))
    tiles = [f.data["pixel_values"].data.shape[1] for f in features]  # type: ignore[index, union-attr]
    per_tile = pooled.shape[0] // max(sum(tiles), 1)
    return split_rows(pooled, [t * per_tile for t in tiles])


IDEFICS3 = register_model(ModelSpec(
    model_type="idefics3",
    hf_processor_class="Idefics3Processor",
    # float32, so its outputs compare bit-exact with the HF processor's
    fixtures={"idefics3": ModelKind("idefics3", "Idefics3ForConditionalGeneration", "float32", make_idefics3_processor,
                                    ("patch_size", "max_splits_per_side", "image_seq_len"),
                                    weights_config=_weights_config)},
    reference=ReferenceModel(encode_idefics3_images),
))
