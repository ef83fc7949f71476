"""LLaVA-style tiling families equal to vLLM 0.33's native frontend (group 2 of the parity suite).

What ``vllm_parity.run_family`` compares (``test_vllm_parity.py``'s module docstring) for
LLaVA-NeXT and LLaVA-OneVision: several image sizes and aspect ratios, two images, the same image
twice, two images of different tile counts, and OneVision's videos. The one intended difference
(docs/vllm-parity.md, :mod:`mmfront.models.llava_next`): vLLM pads an image's tiles with zero
tiles up to the largest image of its request, mmfront sends each image as it is alone; here the
padded item is proven to be mmfront's tiles followed by zero tiles, which vLLM's model drops.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_parity import (
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    prompt_for,
    run_family,
    wire_frames,
)

from mmfront import MultiModalConfig
from mmfront.errors import UnsupportedModelError
from mmfront.models.llama4 import LLAMA4_NATIVE
from mmfront.models.registry import create_processor
from mmfront.models.transformers import MultiModalProcessor, OffsetsMultiModalProcessor
from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

ANYRES = ("LlavaNextProcessor", "LlavaOnevisionProcessor")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-llava")


def _tile_counts_case() -> Case:
    """A wide image (one row of tiles) beside a large square one (a 2 x 2 grid): vLLM pads the first."""
    return Case("image_two_tile_counts", "image", [make_image(64, 32, seed=5), make_image(120, 120, seed=6)])


def _digest(tensor: torch.Tensor) -> str:
    """The peer's hash of a tensor's bytes (``data/vllm_apply_peer.py``)."""
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def _items(processor_class: str, root: Path, case: Case) -> list[Any]:
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder)
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str(case.modality, 0), len(case.media)),
                                           add_special_tokens=False)
    return list(proc.apply(ids, {case.modality: case.media})["mm_kwargs"][case.modality])


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", ANYRES)
def test_anyres_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    # OneVision's videos, where transformers builds its video processor (it needs torchvision)
    modalities = ["image", *(["video"] if "video" in create_processor(folder).placeholder_str else [])]
    padded = _tile_counts_case()
    result = run_family(processor_class, root, cases=[*default_cases(modalities), padded])
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == processor_class.removesuffix("Processor") + "MultiModalProcessor"
    assert (resolved["dtype"], resolved["mm_device_do_normalize"]) == ("bfloat16", False)
    assert result["mmfront_impl"] == "native"
    expected_cases = {"image_one", "image_tall", "image_two", "image_same_twice", padded.name}
    if "video" in modalities:
        expected_cases |= {"video_all_frames", "video_sampled", "video_two"}
    assert set(result["diff"]) == expected_cases
    cases = result["vllm"]["cases"]
    for name, diff in result["diff"].items():
        if name == padded.name or (processor_class == "LlavaOnevisionProcessor" and name == "image_two"):
            continue  # vLLM's tile padding, proven below
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"

    # vLLM's item of the smaller image: mmfront's tiles, then zero tiles up to the larger image's count.
    (small, large) = _items(processor_class, root, padded)
    mine = small["pixel_values"].data
    vllm_small, vllm_large = cases[padded.name]["mm_kwargs"]["image"]
    _, dtype, shape, digest = vllm_small["pixel_values"]["data"]
    assert dtype == "bfloat16" and shape[1:] == list(mine.shape[1:]) and shape[0] > mine.shape[0]
    assert shape[0] == large["pixel_values"].data.shape[0]
    assert digest == _digest(torch.cat([mine, mine.new_zeros((shape[0] - mine.shape[0], *mine.shape[1:]))]))
    diff = result["diff"][padded.name]
    assert diff["differs"] == ["shape"]
    assert diff["details"] == [f"image[0].pixel_values shape vLLM {shape} mmfront {list(mine.shape)}"]
    assert vllm_large == result["mmfront"][padded.name]["mm_kwargs"]["image"][1]

    # Field classes do not change with the request: an image beside another is laid out as alone.
    (alone,) = result["mmfront"]["image_one"]["mm_kwargs"]["image"]
    assert result["mmfront"]["image_two"]["mm_kwargs"]["image"][0] == alone == cases["image_one"]["mm_kwargs"]["image"][0]
    assert alone["pixel_values"]["field"] == ["batched", {"keep_on_cpu": False}]
    assert alone["image_sizes"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert alone["image_sizes"]["data"][1:3] == ["int64", [2]]
    assert set(alone) == {"pixel_values", "image_sizes"}
    ranges = cases["image_two"]["mm_placeholders"]["image"]
    assert len(ranges) == 2 and all(r[2] is None for r in ranges)
    assert ranges == result["mmfront"]["image_two"]["mm_placeholders"]["image"]


@pytest.mark.parametrize("processor_class", ANYRES)
def test_anyres_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    config = MultiModalConfig()
    proc = create_processor(folder, config)
    assert proc.info.native is not None
    case = _tile_counts_case()
    miss, _ = assert_a_hit_sends_the_miss(proc, "image", case.media)
    # the smaller image alone, a miss in a fresh cache, sends the bytes it was sent with beside the larger
    alone = create_processor(folder, config).apply(
        proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), 1), add_special_tokens=False),
        {"image": case.media[:1]})
    assert wire_frames(alone)["image"][0] == wire_frames(miss)["image"][0]
    (item, _) = miss["mm_kwargs"]["image"]
    assert item is not None
    pixels, sizes = item["pixel_values"].data, item["image_sizes"].data
    assert isinstance(pixels, torch.Tensor) and isinstance(sizes, torch.Tensor)
    assert pixels.dtype == torch.bfloat16 and pixels.ndim == 4
    assert sizes.tolist() == [32, 64]


def _as_read(item: dict[str, Any]) -> dict[str, Any]:
    """An item's description without what the engine never reads of a shared field (its batch_size)."""
    return {key: {**entry, "field": [entry["field"][0], {k: v for k, v in entry["field"][1].items() if k != "batch_size"}]}
            for key, entry in item.items()}


def _tiled_cases(processor_class: str) -> list[Case]:
    """The default cases, and for Llama 4 (336 px tiles) images large enough for a grid of tiles."""
    cases = default_cases(["image"])
    if processor_class == "Llama4Processor":
        wide, tall = make_image(800, 300, seed=7), make_image(340, 1000, seed=8)
        cases += [Case("image_wide", "image", [wide]), Case("image_grids_two", "image", [wide, tall])]
    return cases


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", ["InternVLProcessor", "Llama4Processor"])
def test_tiled_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    """InternVL's tiles counted by ``image_num_patches`` with the shared ``image_token_id``; Llama 4's
    counted by ``patches_per_image`` with its tile grid ``aspect_ratios``."""
    if processor_class == "Llama4Processor" and MultiModalProcessor is not OffsetsMultiModalProcessor:
        pytest.skip("refused on the Legacy backend (test_llama4_is_refused_on_the_legacy_backend)")
    cases = _tiled_cases(processor_class)
    result = run_family(processor_class, root, cases=cases)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == {"InternVLProcessor": "InternS1MultiModalProcessor",
                                     "Llama4Processor": "Mllama4MultiModalProcessor"}[processor_class]
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", False, "native")
    assert set(result["diff"]) == {c.name for c in cases}
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    mine = result["mmfront"]
    (alone,) = mine["image_one"]["mm_kwargs"]["image"]
    # laid out as alone beside another image (a shared field's batch_size counts the call's items: the
    # engine reads the first item's data, as vLLM's reduce_data does)
    assert _as_read(mine["image_two"]["mm_kwargs"]["image"][0]) == _as_read(alone)
    assert alone["pixel_values"]["field"][0] == "flat"
    if processor_class == "InternVLProcessor":
        assert set(alone) == {"pixel_values", "image_num_patches", "image_token_id"}
        assert alone["image_token_id"]["field"] == ["shared", {"keep_on_cpu": True, "batch_size": 1}]
        assert alone["image_num_patches"]["field"] == ["batched", {"keep_on_cpu": True}]
        ranges = mine["image_two"]["mm_placeholders"]["image"]
        assert all(r[2][0] is False and r[2][-1] is False and all(r[2][1:-1]) for r in ranges)  # <img> ... </img>
    else:
        assert set(alone) == {"pixel_values", "patches_per_image", "aspect_ratios"}
        (wide,) = _items(processor_class, root, cases[-2])
        assert wide["aspect_ratios"].data.tolist() == [1, 3]  # 800 x 300 px: one row of three 336 px tiles
        assert wide["patches_per_image"].data.tolist() == 4  # and the global tile
        assert wide["pixel_values"].data.shape == (4, 3, 336, 336)
        grids = [i["aspect_ratios"].data.tolist() for i in _items(processor_class, root, cases[-1])]
        assert grids == [[1, 3], [3, 2]]  # 340 x 1000 px: HF picks three rows of two tiles


def test_llama4_is_refused_on_the_legacy_backend(root: Path) -> None:
    """Legacy places a Llama 4 image's range on one token: refused for vLLM's native class, served
    with --model-impl transformers."""
    folder, _ = family_folder("Llama4Processor", root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend .* one <\|image\|> token .* "
                                                     r"--model-impl transformers"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))
    legacy = create_processor(folder, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    assert legacy.info.native is None
    if MultiModalProcessor is OffsetsMultiModalProcessor:  # transformers >= 5.15: the default backend is proven
        assert create_processor(folder).info.native is LLAMA4_NATIVE
    else:
        with pytest.raises(UnsupportedModelError, match="Legacy transformers backend"):
            create_processor(folder)
