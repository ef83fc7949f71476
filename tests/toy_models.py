"""A small two-modality processor for pipeline tests.

It plays the HF step itself (image -> its width and height, audio -> its length), so tests can
watch what the pipeline asks for: which items reach the HF step, in what order caches are
updated, and when media are decoded. Its tokenizer is a real offline byte-level BPE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from mmfront import MultiModalConfig
from mmfront.fixtures.bpe import make_tokenizer
from mmfront.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from mmfront.parse import MultiModalDataItems
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo
from mmfront.processing.updates import PromptReplacement, PromptUpdate, PromptUpdateDetails


class _HF:
    """Just enough of an HF processor: a tokenizer."""

    def __init__(self) -> None:
        self.tokenizer = make_tokenizer(["<img>", "<aud>", "<emb>"], bos_token=None, eos_token="<eos>",
                                        pad_token="<pad>")


class ToyInfo(BaseProcessingInfo):
    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None, "audio": 4}


class ToyProcessor(BaseMultiModalProcessor):
    placeholder_str: ClassVar[Mapping[str, str]] = {"image": "<img>", "audio": "<aud>"}

    def __init__(self, info: BaseProcessingInfo) -> None:
        super().__init__(info)
        self.calls: list[dict[str, int]] = []
        tok = info.tokenizer
        self.img, self.aud, self.emb = (tok.convert_tokens_to_ids(t) for t in ("<img>", "<aud>", "<emb>"))

    def _call_hf_processor(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(mm_items.get_all_counts())
        out: dict[str, Any] = {}
        if "image" in mm_items:
            out["pixel_values"] = torch.tensor([[float(im.width), float(im.height)] for im in mm_items["image"].get_all()])
        if "audio" in mm_items:
            out["features"] = torch.tensor([[float(len(a))] for a in mm_items["audio"].get_all()])
        return out

    def _get_mm_fields_config(self, hf_inputs: Mapping[str, Any], hf_kwargs: Mapping[str, Any]
                              ) -> Mapping[str, MultiModalFieldConfig]:
        return {"pixel_values": MultiModalFieldConfig.batched("image"),
                "features": MultiModalFieldConfig.batched("audio")}

    def _get_prompt_updates(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        def image_repl(i: int) -> PromptUpdateDetails[list[int]]:
            item = out_mm_kwargs["image"][i]
            assert item is not None
            width = int(item["pixel_values"].data[0])
            return PromptUpdateDetails.select_token_id([self.img, *[self.emb] * (width % 3 + 1)], self.emb)

        return [PromptReplacement("image", [self.img], image_repl),
                PromptReplacement("audio", [self.aud], [self.emb] * 2)]


def toy(config: MultiModalConfig | None = None) -> ToyProcessor:
    return ToyProcessor(ToyInfo(_HF(), model_id="toy", config=config))
