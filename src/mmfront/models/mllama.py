"""Mllama (Llama 3.2 Vision): served by the transformers backend. This module declares where its
HF processor departs from the others, and how an engine rebuilds what HF lays out along the prompt.

Mllama's images reach the text through cross-attention layers, not as embeddings in the prompt, so
``MllamaProcessor`` leaves each ``<|image|>`` as one token (``unexpanded_placeholders``) and writes
the BOS after the image tokens that open a prompt (HF's ``build_string_from_input``:
``prompt_layout``). Each image is an item whose placeholder range is its ``<|image|>``; its data is
its slice of ``pixel_values`` (``[1, 1, max tiles, C, H, W]``: HF pads every image's tiles to the
image processor's ``max_image_tiles``, so an item is the same in any batch), ``aspect_ratio_ids``
and ``aspect_ratio_mask`` (ones over the image's tiles, which is how its tile count travels: HF
pops ``num_tiles``).

HF also returns ``cross_attention_mask``, ``[batch, prompt tokens, images, max tiles]``: which
images' tiles each text token attends to. It is the prompt's, not an item's, so mmfront does not
send it (``prompt_outputs``): the engine rebuilds it from the items' ranges and tile counts with
:func:`rebuild_cross_attention_mask`, as vLLM's Mllama model computed it from the image tokens'
positions (up to vLLM 0.10.1; 0.10.2 dropped the model). The coverage suite proves the rebuild
equal to HF's mask."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.inputs import PlaceholderRange
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec


def mllama_prompt_layout(text: str, hf_processor: Any) -> str:
    """``text`` with the tokenizer's BOS after the image placeholders that open it, unless it holds
    the BOS already (chat-templated prompts do)."""
    bos, image = hf_processor.bos_token, hf_processor.image_token
    if bos in text:
        return text
    body = text
    while body.startswith(image):
        body = body[len(image):]
    return f"{text[:len(text) - len(body)]}{bos}{body}"


def cross_attention_mask(prompt_len: int, image_offsets: Sequence[int], num_tiles: Sequence[int],
                         max_tiles: int) -> torch.Tensor:
    """``[prompt_len, images, max_tiles]``, 1 where a token attends to a tile, as HF builds it.

    Image ``i`` is attended from its ``<|image|>`` up to the next image's; images that follow one
    another at once form a group, each attended up to where the group's last one is (so the text
    after ``<|image|><|image|>`` sees both). Only an image's own tiles are attended, not its
    padding tiles."""
    ends = [*image_offsets[1:], prompt_len]
    for i in range(len(ends) - 2, -1, -1):
        if ends[i] == image_offsets[i] + 1:
            ends[i] = ends[i + 1]
    mask = torch.zeros(prompt_len, len(image_offsets), max_tiles, dtype=torch.int64)
    for i, (start, end, tiles) in enumerate(zip(image_offsets, ends, num_tiles)):
        mask[start:end, i, :tiles] = 1
    return mask


def tile_counts(images: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each image's tile count from its item data: the ones of its ``aspect_ratio_mask``."""
    return [int(image["aspect_ratio_mask"].sum()) for image in images]


def rebuild_cross_attention_mask(prompt_ids: Sequence[int], placeholders: Mapping[str, Sequence[PlaceholderRange]],
                                 items: Mapping[str, Sequence[Mapping[str, Any]]]) -> torch.Tensor:
    """HF's ``cross_attention_mask`` of one prompt (without the batch dimension), from what mmfront
    sends: the prompt's ids, each image's range (its one ``<|image|>``) and its data."""
    images = items.get("image", ())
    max_tiles = int(images[0]["aspect_ratio_mask"].shape[-1]) if images else 0
    return cross_attention_mask(len(prompt_ids), [r.offset for r in placeholders.get("image", ())],
                                tile_counts(images), max_tiles)


MLLAMA = register_model(ModelSpec(
    model_type="mllama",
    hf_processor_class="MllamaProcessor",
    prompt_layout=mllama_prompt_layout,
    unexpanded_placeholders=("image",),
    prompt_outputs={"cross_attention_mask": rebuild_cross_attention_mask},
))
