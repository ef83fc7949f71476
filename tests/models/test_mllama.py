"""Mllama (Llama 3.2 Vision) through the transformers backend: each image is its one ``<|image|>``,
its data its slice of HF's, and HF's ``cross_attention_mask``, which mmfront does not send, is
rebuilt exactly from mmfront's ids, ranges and items, consecutive images included (the coverage
suite proves the rest on prompts whose images are apart)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlavaProcessor, MllamaProcessor
from transformers.models.mllama.processing_mllama import (
    build_string_from_input,
    convert_sparse_cross_attention_mask_to_dense,
    get_cross_attention_token_mask,
)

from mmfront import MultiModalConfig
from mmfront.models.catalog import prompt_layout, prompt_outputs, unexpanded_placeholders
from mmfront.models.mllama import (
    cross_attention_mask,
    mllama_prompt_layout,
    rebuild_cross_attention_mask,
    tile_counts,
)
from mmfront.models.registry import create_processor
from mmfront.models.transformers import LegacyMultiModalProcessor
from mmfront.testing.coverage import build_processor_folder
from mmfront.testing.media import make_image

pytestmark = pytest.mark.backend

HF = SimpleNamespace(image_token="<|image|>", bos_token="<s>")

IMAGES = [make_image(48, 40, seed=0), make_image(64, 32, seed=1), make_image(40, 56, seed=2)]
"""4, 2 and 4 tiles of 28 px (the coverage fixture's tile size; 4 tiles at most)."""


@pytest.mark.parametrize(("text", "laid_out"), [
    ("<|image|>Describe it.", "<|image|><s>Describe it."),
    ("<|image|><|image|>Compare <|image|>", "<|image|><|image|><s>Compare <|image|>"),
    ("Describe <|image|> please.", "<s>Describe <|image|> please."),
    ("<s><|image|>Describe", "<s><|image|>Describe"),
    ("no image", "<s>no image"),
])
def test_bos_goes_after_the_images_that_open_the_prompt(text: str, laid_out: str) -> None:
    assert mllama_prompt_layout(text, HF) == laid_out == build_string_from_input(text, "<s>", "<|image|>")


def test_the_declarations_are_found_by_the_hf_processor_class() -> None:
    assert prompt_layout(MllamaProcessor) is mllama_prompt_layout
    assert unexpanded_placeholders(MllamaProcessor) == frozenset({"image"})
    assert prompt_outputs(MllamaProcessor) == {"cross_attention_mask": rebuild_cross_attention_mask}
    assert unexpanded_placeholders(LlavaProcessor) == frozenset() and prompt_outputs(LlavaProcessor) == {}


def test_the_mask_by_hand() -> None:
    # 7 tokens: images at 0 and 1 (a group: both seen up to the next image), text, an image at 5, text
    mask = cross_attention_mask(7, [0, 1, 5], [2, 1, 3], 4)
    assert mask.dtype == torch.int64 and mask.shape == (7, 3, 4)
    group = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    last = [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
    assert mask.tolist() == [[[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], group, group, group, group, last, last]


@pytest.mark.parametrize("positions", [
    [0], [3], [6], [0, 1], [0, 3], [5, 6], [2, 3, 4], [0, 1, 5], [1, 4, 5], [0, 1, 2], [0, 2, 3, 6], [3, 4, 6],
])
def test_the_mask_is_hfs_for_any_image_positions(positions: list[int]) -> None:
    image, length, max_tiles = 9, 7, 4
    ids = [image if i in positions else 1 for i in range(length)]
    tiles = [1 + (3 * i) % max_tiles for i in range(len(positions))]
    expected = convert_sparse_cross_attention_mask_to_dense(
        [get_cross_attention_token_mask(ids, image)], [tiles], max_tiles, length)
    assert torch.equal(cross_attention_mask(length, positions, tiles, max_tiles), torch.from_numpy(expected[0]))


@pytest.fixture(scope="module")
def mllama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_processor_folder("MllamaProcessor", tmp_path_factory.mktemp("mllama"))


@pytest.mark.parametrize("backend", ["auto", "legacy"])
@pytest.mark.parametrize(("text", "ranges"), [
    ("Describe <|image|> please.", [(3, 1)]),  # BOS, "Describe", " "
    ("<|image|><|image|>Compare them.", [(0, 1), (1, 1)]),
    ("<|image|><|image|>Hi <|image|>", [(0, 1), (1, 1), (6, 1)]),
    ("Look: <|image|><|image|><|image|> and say.", [(7, 1), (8, 1), (9, 1)]),  # BOS, "L", "o", "o", "k", ":", " "
])
def test_served_images_and_the_rebuilt_mask_equal_hfs(mllama_dir: Path, backend: Any, text: str,
                                                      ranges: list[tuple[int, int]]) -> None:
    proc = create_processor(mllama_dir, MultiModalConfig(dtype="float32", transformers_backend=backend))
    assert type(proc) is LegacyMultiModalProcessor
    hf = proc.info.hf_processor
    images = IMAGES[:len(ranges)]
    ref = hf(text=text, images=images, return_tensors="pt")
    out = proc.apply(text, {"image": images})

    ids = out["prompt_token_ids"]
    assert ids == ref["input_ids"][0].tolist()
    placeholders = out["mm_placeholders"]["image"]
    assert [(p.offset, p.length) for p in placeholders] == ranges
    assert all(ids[p.offset] == hf.image_token_id for p in placeholders)
    assert ids.count(hf.tokenizer.bos_token_id) == 1

    items = [{k: field.data for k, field in item.items()} for item in out["mm_kwargs"]["image"]]
    for i, item in enumerate(items):
        assert set(item) == {"pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "num_image_patches"}
        assert item["pixel_values"].shape == (1, 1, 4, 3, 28, 28)
        assert torch.equal(item["pixel_values"], ref["pixel_values"][:, i:i + 1])
        assert torch.equal(item["aspect_ratio_ids"], ref["aspect_ratio_ids"][:, i:i + 1])
        assert torch.equal(item["aspect_ratio_mask"], ref["aspect_ratio_mask"][:, i:i + 1])
    assert tile_counts(items) == [4, 2, 4][:len(ranges)]
    rebuilt = rebuild_cross_attention_mask(ids, out["mm_placeholders"], {"image": items})
    assert rebuilt.shape == (len(ids), len(ranges), 4)
    assert torch.equal(rebuilt, ref["cross_attention_mask"][0])
