"""Emu3: served by the transformers backend. This module declares its offline ``emu3`` fixture.
No reference encoder: its image "encoder" is a VQ-VAE tokenizer whose codes become ordinary prompt
tokens, not embeddings scattered into placeholder positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import ModelKind
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import Emu3Processor, PreTrainedTokenizerFast

EMU3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def make_emu3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<image>", "<|image start|>", "<|image end|>", "<|image token|>", "<|extra_201|>"],
        bos_token="<|extra_203|>",
        eos_token="<|extra_204|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<image>",
            "boi_token": "<|image start|>",
            "eoi_token": "<|image end|>",
            "image_wrapper_token": "<|image token|>",
            "eof_token": "<|extra_201|>",
        },
        add_bos=False,  # Emu3's GPT-style tokenizer adds no BOS; the processor does (5.23: once per sample)
        chat_template=EMU3_CHAT_TEMPLATE,
    )


def make_emu3_processor(min_pixels: int = 16 * 16, max_pixels: int = 64 * 64, spatial_factor: int = 8) -> Emu3Processor:
    """Emu3Processor: real values are min_pixels=512*512, max_pixels=1024*1024.

    The processor hard-codes ``downsample_ratio = 8``; an image resized (smart_resize, multiple
    of ``spatial_factor``) to HxW becomes ``<|image start|>{h}*{w}<|image token|>`` +
    ``<image> * h*(w+1)`` + ``<|extra_201|><|image end|>`` with h=H//8, w=W//8.
    ``pixel_values`` of several images are zero-padded (bottom/right) to the largest H and W;
    ``image_sizes`` holds each image's own resized (H, W).
    """
    from transformers import Emu3ImageProcessor, Emu3Processor

    image_processor = Emu3ImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, spatial_factor=spatial_factor)
    return Emu3Processor(image_processor=image_processor, tokenizer=make_emu3_tokenizer(), chat_template=EMU3_CHAT_TEMPLATE)


EMU3 = register_model(ModelSpec(
    model_type="emu3",
    hf_processor_class="Emu3Processor",
    fixtures={"emu3": ModelKind("emu3", "Emu3ForConditionalGeneration", "float32", make_emu3_processor,
                                ("min_pixels", "max_pixels", "spatial_factor"))},
))
