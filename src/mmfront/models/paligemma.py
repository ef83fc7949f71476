"""PaliGemma: served by the transformers backend. This module declares how its HF processor lays
a prompt out, which the backend must reproduce for its ids to be HF's.

PaliGemma was trained on ``<image>...<image><bos>prefix\\n``: its processor's ``__call__`` puts
the tokenizer's BOS after the last ``<image>`` of the text and a newline at its end (HF's
``prepare_inputs_layout``). vLLM 0.33's own PaliGemma processor reaches the same ids for one
image and a prompt without placeholders (it inserts ``<image>*n + <bos>`` at the start and appends
the newline); mmfront's prompts name their images, so the text is laid out as HF lays it out."""

from __future__ import annotations

from typing import Any

from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec


def paligemma_prompt_layout(text: str, hf_processor: Any) -> str:
    """``text`` with the tokenizer's BOS after its last image placeholder and ``"\\n"`` at the end."""
    token = hf_processor.image_token
    last = text.rfind(token)
    if last < 0:
        return text
    end = last + len(token)
    return f"{text[:end]}{hf_processor.tokenizer.bos_token}{text[end:]}\n"


PALIGEMMA = register_model(ModelSpec(
    model_type="paligemma",
    hf_processor_class="PaliGemmaProcessor",
    prompt_layout=paligemma_prompt_layout,
))
