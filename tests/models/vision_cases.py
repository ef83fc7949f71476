"""Shared by the tests of the vision families the transformers backend serves with a dedicated
model module (Qwen2.5-VL, LLaVA-OneVision): prompts of one to three images of different sizes
with text before, between and after them, processed by mmfront and by the HF processor alone."""

from __future__ import annotations

from typing import Any

import torch

from mmfront.testing.media import make_image

#: (width, height, seed) of the images the prompts take, in order
SIZES = [(64, 48, 0), (40, 72, 1), (100, 30, 2)]


def images(count: int) -> list[Any]:
    return [make_image(w, h, seed=s) for w, h, s in SIZES[:count]]


def prompt(placeholder: str, count: int) -> str:
    """Text before the first image, between each two, and after the last."""
    return "Before " + " and ".join([placeholder] * count) + " after."


def hf_call(hf: Any, text: str, items: list[Any]) -> dict[str, Any]:
    return dict(hf(text=text, images=items, return_tensors="pt"))


def check_placeholders(out: dict[str, Any], hf_ids: list[int], image_token: int, embeds: list[int]) -> None:
    """mmfront's ids are HF's; each image's range holds its image tokens, which are its
    embedding positions, and the ranges cover every image token of the prompt."""
    ids = out["prompt_token_ids"]
    assert ids == hf_ids
    placed = out["mm_placeholders"]["image"]
    assert len(placed) == len(embeds)
    covered: list[int] = []
    for p, count in zip(placed, embeds, strict=True):
        span = torch.tensor(ids[p.offset:p.offset + p.length])
        mask = torch.ones(p.length, dtype=torch.bool) if p.is_embed is None else p.is_embed
        assert torch.equal(mask, span == image_token)
        assert int(mask.sum()) == count
        covered += [p.offset + i for i in range(p.length) if mask[i]]
    assert covered == [i for i, t in enumerate(ids) if t == image_token]


def item(out: dict[str, Any], index: int, key: str) -> torch.Tensor:
    data: torch.Tensor = out["mm_kwargs"]["image"][index][key].data
    return data
