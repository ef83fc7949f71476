"""PaliGemma: served by the transformers backend's HF call, laid out as HF's processor lays a prompt
out (``--model-impl transformers``) or as vLLM 0.33's native ``PaliGemmaForConditionalGeneration``
reads it (``auto``/``vllm``).

PaliGemma was trained on ``<image>...<image><bos>prefix\\n``. HF's processor puts the tokenizer's
BOS after the last ``<image>`` of the text and a newline at its end (HF's ``prepare_inputs_layout``);
the transformers backend tokenizes that text, so its ids are HF's. vLLM's processor names no
placeholder: it inserts an image's ``<image>`` tokens and a BOS at the start of the prompt (after the
tokenizer's own BOS where it adds one, as PaliGemma 1's does), a range whose BOS is not embedded, and
appends the newline; it takes one image per prompt. Its one field is the image's batched
``pixel_values``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmfront.errors import ConfigError
from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import ItemLimit, NativeInputs
from mmfront.processing.updates import PromptIndexTargets, PromptInsertion, PromptUpdate, PromptUpdateDetails

__all__ = ["PALIGEMMA", "PALIGEMMA_NATIVE", "paligemma_fields", "paligemma_newline", "paligemma_prompt_layout",
           "paligemma_prompt_updates"]


def paligemma_prompt_layout(text: str, hf_processor: Any) -> str:
    """``text`` with the tokenizer's BOS after its last image placeholder and ``"\\n"`` at the end."""
    token = hf_processor.image_token
    last = text.rfind(token)
    if last < 0:
        return text
    end = last + len(token)
    return f"{text[:end]}{hf_processor.tokenizer.bos_token}{text[end:]}\n"


def paligemma_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's PaliGemma field: one ``[C, H, W]`` image per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image")}


def paligemma_prompt_updates(updates: Sequence[PromptUpdate], hf_processor: Any) -> list[PromptUpdate]:
    """vLLM's insertion: an image's tokens (HF's expansion of ``<image>``) and a BOS at the start of the
    prompt, after the tokenizer's BOS where it adds one (vLLM reads ``add_bos_token``: PaliGemma 1 and 2
    differ), the BOS not embedded."""
    tokenizer = hf_processor.tokenizer
    bos = int(tokenizer.bos_token_id)
    image = int(tokenizer.convert_tokens_to_ids(hf_processor.image_token))
    target = PromptIndexTargets.prefix([bos] if getattr(tokenizer, "add_bos_token", False) is True else [])
    out: list[PromptUpdate] = []
    for update in updates:
        if update.modality != "image":
            out.append(update)
            continue

        def insertion(index: int, expansion: PromptUpdate = update) -> PromptUpdateDetails[list[int]]:
            tokens = expansion.resolve(index).content.token_ids(tokenizer)
            return PromptUpdateDetails.select_token_id([image] * tokens.count(image) + [bos], image)

        out.append(PromptInsertion("image", target=target, insertion=insertion))
    return out


def paligemma_newline(ids: list[int], tokenizer: Any) -> list[int]:
    """``ids`` ending in the tokenizer's ``"\\n"`` token, which vLLM's processor appends where it is missing."""
    newline = _newline_id(tokenizer)
    return ids if ids and ids[-1] == newline else [*ids, newline]


def _newline_id(tokenizer: Any) -> int:
    token = tokenizer.convert_tokens_to_ids("\n")
    if not isinstance(token, int) or token == tokenizer.unk_token_id:
        raise ConfigError(
            "vLLM's PaliGemma processor ends every prompt with the tokenizer's \"\\n\" token, which this tokenizer has "
            "no single token for (vLLM fails on it too: KeyError '\\n'). Use the checkpoint's Gemma tokenizer, or serve "
            "it with --model-impl transformers.")
    return int(token)


PALIGEMMA_NATIVE = NativeInputs(("PaliGemmaForConditionalGeneration",), paligemma_fields,
                                prompt_updates=paligemma_prompt_updates, finish_prompt=paligemma_newline,
                                mm_limits={"image": ItemLimit(1, "vLLM 0.33's native PaliGemma class takes one image per "
                                                                 "prompt (its get_supported_mm_limits); send one image per "
                                                                 "request, or serve the model with --model-impl transformers")})

PALIGEMMA = register_model(ModelSpec(
    model_type="paligemma",
    hf_processor_class="PaliGemmaProcessor",
    prompt_layout=paligemma_prompt_layout,
    native=PALIGEMMA_NATIVE,
))
