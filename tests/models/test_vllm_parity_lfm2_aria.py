"""LFM2-VL and Aria send what vLLM 0.33's native frontend sends (the harness is ``vllm_parity``, see
``test_vllm_parity.py``).

LFM2-VL (``Lfm2VLMultiModalProcessor``): an image's tiles ``[tiles, max_num_patches, 3 * patch**2]``
and their ``spatial_shapes`` (on the CPU) flat by its ``num_patches`` (batched, on the CPU), which
vLLM counts from the image's size and grid layout; ranges masked to the image tokens. Small images
(one tile), a 1024 x 768 image (a 3 x 2 grid and its thumbnail), a wide one beside a small one, the
tiled one twice. Aria (``AriaMultiModalProcessor``): an image's crop ``[3, 980, 980]`` and its
``pixel_mask``, batched; ranges without a mask. The default cases and a large wide image.

Where vLLM's own frontend fails or sends what its engine cannot read (Aria's ``split_image`` and a
smaller ``max_image_size``; LFM2-VL's tile count with ``use_thumbnail`` or ``do_image_splitting``
off), mmfront refuses the request with the reason; the peer test shows vLLM's failure beside it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_parity import Case, assert_a_hit_sends_the_miss, default_cases, family_folder, prompt_for, run_family

from mmfront import MultiModalConfig
from mmfront.errors import UnsupportedModelError, ValidationError
from mmfront.models.registry import create_processor
from mmfront.models.transformers import MultiModalProcessor, OffsetsMultiModalProcessor
from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)
LEGACY = MultiModalProcessor is not OffsetsMultiModalProcessor

TILED = make_image(1024, 768, seed=3)
"""Past LFM2-VL's single-tile budget: a 3 x 2 grid of 512 px tiles and a thumbnail, 7 tiles."""
WIDE = make_image(1600, 500, seed=4)
"""LFM2-VL: a 3 x 1 grid and a thumbnail, 4 tiles. Aria: resized into one 980 px crop."""

LFM2_REFUSED: dict[str, dict[str, Any]] = {"no_thumbnail": {"use_thumbnail": False}, "no_splitting": {"do_image_splitting": False}}
ARIA_REFUSED: dict[str, dict[str, Any]] = {"split_image": {"split_image": True}, "max_image_size_490": {"max_image_size": 490}}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-lfm2-aria")


def _digest(tensor: torch.Tensor) -> str:
    """The peer's hash of a tensor's bytes (``data/vllm_apply_peer.py``)."""
    return hashlib.sha256(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _as_read(item: dict[str, Any]) -> dict[str, Any]:
    """An item's description as the engine reads it: field class, ``dim``, ``keep_on_cpu`` and data
    (a flat field's slices place it in its request, which the engine never reads)."""
    return {k: [v["field"][0], {f: x for f, x in v["field"][1].items() if f != "slices"}, v["data"]]
            for k, v in item.items()}


def _served_cases(processor_class: str) -> list[Case]:
    small = make_image(48, 40, seed=0)
    if processor_class == "AriaProcessor":
        return [*default_cases(["image"]), Case("image_wide", "image", [WIDE])]
    return [*default_cases(["image"]), Case("image_tiled", "image", [TILED]),
            Case("image_tiled_and_small", "image", [WIDE, small]), Case("image_tiled_twice", "image", [TILED, TILED])]


def _refused_cases(processor_class: str) -> list[Case]:
    refused = ARIA_REFUSED if processor_class == "AriaProcessor" else LFM2_REFUSED
    image = make_image(48, 40, seed=0) if processor_class == "AriaProcessor" else TILED
    return [Case(name, "image", [WIDE if name == "split_image" else image], kwargs) for name, kwargs in refused.items()]


def _apply(processor_class: str, root: Path, media: list[Any], config: MultiModalConfig | None = None,
           **kwargs: Any) -> Any:
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, config or MultiModalConfig())
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), len(media)),
                                           add_special_tokens=False)
    return proc.apply(ids, {"image": media}, hf_processor_mm_kwargs=kwargs)


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", ["Lfm2VlProcessor", "AriaProcessor"])
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    if processor_class == "Lfm2VlProcessor" and LEGACY:
        pytest.skip("refused on the Legacy backend (test_lfm2_vl_is_refused_on_the_legacy_backend)")
    served, refused = _served_cases(processor_class), _refused_cases(processor_class)
    result = run_family(processor_class, root, cases=[*served, *refused])
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == {"Lfm2VlProcessor": "Lfm2VLMultiModalProcessor",
                                     "AriaProcessor": "AriaMultiModalProcessor"}[processor_class]
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", False, "native")
    assert set(result["diff"]) == {c.name for c in served + refused}
    for case in served:
        assert result["diff"][case.name] == {"differs": [], "details": []}, f"{processor_class} {case.name}"
    vllm, mine = result["vllm"]["cases"], result["mmfront"]
    # an item is sent as it is alone, whatever else the request holds (image_two's first image is image_one's)
    assert _as_read(mine["image_two"]["mm_kwargs"]["image"][0]) == _as_read(mine["image_one"]["mm_kwargs"]["image"][0])
    if processor_class == "AriaProcessor":
        first, second = vllm["image_two"]["mm_kwargs"]["image"]
        assert sorted(first) == ["pixel_mask", "pixel_values"]
        assert first["pixel_values"]["field"] == second["pixel_mask"]["field"] == ["batched", {"keep_on_cpu": False}]
        assert first["pixel_values"]["data"][1:3] == ["bfloat16", [3, 980, 980]]
        assert first["pixel_mask"]["data"][1:3] == ["bool", [980, 980]]
        assert [r[:3] for r in vllm["image_two"]["mm_placeholders"]["image"]] == [[2, 256, None], [260, 256, None]]
        assert len(set(vllm["image_same_twice"]["mm_hashes"]["image"])) == 1
        # vLLM fails on a split image (each crop counted as an image) ...
        assert "only found 2" in vllm["split_image"]["error"]
        assert mine["split_image"]["error"].startswith("ValidationError: Aria split 1 image(s) into 2 crops")
        # ... and sends a 490 px crop (128 embeddings) with a range of 256 tokens, which its engine cannot fill
        (small,) = vllm["max_image_size_490"]["mm_kwargs"]["image"]
        assert small["pixel_values"]["data"][2] == [3, 490, 490]
        assert [r[:2] for r in vllm["max_image_size_490"]["mm_placeholders"]["image"]] == [[2, 256]]
        assert "expands every image to 256 tokens" in mine["max_image_size_490"]["error"]
        return
    (tiled,) = vllm["image_tiled"]["mm_kwargs"]["image"]
    assert sorted(tiled) == ["num_patches", "pixel_values", "spatial_shapes"]
    assert tiled["num_patches"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert tiled["num_patches"]["data"] == ["tensor", "int64", [], _digest(torch.tensor(7))]
    assert tiled["pixel_values"]["field"][0] == "flat" and tiled["pixel_values"]["data"][1:3] == ["bfloat16", [7, 1024, 768]]
    assert tiled["spatial_shapes"]["field"][1]["keep_on_cpu"] is True
    assert tiled["spatial_shapes"]["data"][1:3] == ["int64", [7, 2]]
    wide, small = vllm["image_tiled_and_small"]["mm_kwargs"]["image"]
    assert (wide["pixel_values"]["data"][2][0], small["pixel_values"]["data"][2][0]) == (4, 1)
    ranges = vllm["image_tiled_twice"]["mm_placeholders"]["image"]
    assert [r[:2] for r in ranges] == [[2, 1881], [1885, 1881]]
    assert all(r[2] is not None and not r[2][0] and not all(r[2]) for r in ranges)  # <|image_start|>, tile markers
    # vLLM counts 7 tiles whatever use_thumbnail / do_image_splitting say; HF then made 6 and 1
    for name, rows in (("no_thumbnail", 6), ("no_splitting", 1)):
        (item,) = vllm[name]["mm_kwargs"]["image"]
        assert item["num_patches"]["data"][3] == _digest(torch.tensor(7)) and item["pixel_values"]["data"][2][0] == rows
        assert mine[name]["error"].startswith(f"ValidationError: LFM2-VL made [{rows}] tiles of the images, where vLLM "
                                              "0.33's native class counts [7]")


@pytest.mark.parametrize(("processor_class", "case"), [
    ("AriaProcessor", "split_image"), ("AriaProcessor", "max_image_size_490"),
    ("Lfm2VlProcessor", "no_thumbnail"), ("Lfm2VlProcessor", "no_splitting"),
])
def test_what_vllm_cannot_serve_is_refused_for_the_native_class(processor_class: str, case: str, root: Path) -> None:
    if processor_class == "Lfm2VlProcessor" and LEGACY:
        pytest.skip("refused on the Legacy backend (test_lfm2_vl_is_refused_on_the_legacy_backend)")
    [refused] = [c for c in _refused_cases(processor_class) if c.name == case]
    with pytest.raises(ValidationError, match="--model-impl transformers") as error:
        _apply(processor_class, root, refused.media, **refused.mm_processor_kwargs)
    assert error.value.parameter == "mm_processor_kwargs"
    backend = _apply(processor_class, root, refused.media, MultiModalConfig(model_impl="transformers"),
                     **refused.mm_processor_kwargs)
    assert len(backend["mm_placeholders"]["image"]) == 1


@pytest.mark.parametrize("processor_class", ["Lfm2VlProcessor", "AriaProcessor"])
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    if processor_class == "Lfm2VlProcessor" and LEGACY:
        pytest.skip("refused on the Legacy backend (test_lfm2_vl_is_refused_on_the_legacy_backend)")
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, MultiModalConfig())
    assert proc.info.native is not None
    miss, _ = assert_a_hit_sends_the_miss(proc, "image", [WIDE, make_image(48, 40, seed=0)])
    first, second = miss["mm_kwargs"]["image"]
    if processor_class == "Lfm2VlProcessor":
        assert sorted(first) == ["num_patches", "pixel_values", "spatial_shapes"]
        assert [int(i["num_patches"].data) for i in (first, second)] == [4, 1]
    else:
        assert sorted(first) == ["pixel_mask", "pixel_values"]
        assert first["pixel_values"].data.shape == (3, 980, 980) and first["pixel_values"].data.dtype == torch.bfloat16


@pytest.mark.skipif(LEGACY, reason="the Legacy backend cannot place a tiled LFM2-VL image (LFM2_VL_NATIVE.legacy_mismatch)")
def test_the_transformers_backend_splits_a_tiled_lfm2_vl_image(root: Path) -> None:
    """HF's processor drops a tiled image's grid; the model module counts its tiles
    (``ModelSpec.image_patches``), so ``--model-impl transformers`` serves it beside an untiled one."""
    out = _apply("Lfm2VlProcessor", root, [TILED, make_image(48, 40, seed=0)], MultiModalConfig(model_impl="transformers"))
    tiled, small = out["mm_kwargs"]["image"]
    assert (tiled["pixel_values"].data.shape, small["pixel_values"].data.shape) == ((7, 1024, 768), (1, 1024, 768))
    assert [int(i["num_image_patches"].data) for i in (tiled, small)] == [7, 1]
    assert [(r.offset, r.length) for r in out["mm_placeholders"]["image"]] == [(2, 1881), (1885, 74)]


def test_lfm2_vl_is_refused_on_the_legacy_backend(root: Path) -> None:
    """Legacy cannot place a tiled LFM2-VL image's tokens (its runs lie between tile markers): refused
    for vLLM's native class, served with --model-impl transformers."""
    folder, _ = family_folder("Lfm2VlProcessor", root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend .* tiled image's expansion.* "
                                                     r"--model-impl transformers"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))
    legacy = create_processor(folder, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    assert legacy.info.native is None
