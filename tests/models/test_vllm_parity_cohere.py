"""Cohere2-Vision and CohereCompass send what vLLM 0.33's native frontend sends (the harness is
``vllm_parity``, see ``test_vllm_parity.py``), after vLLM's msgpack round trip.

Cohere2-Vision (``Cohere2VisionMultiModalProcessor``): an image's 512 px tiles and thumbnail are its
rows of ``pixel_values`` (flat along dim 0), counted by its ``num_patches`` (batched, on the CPU:
the model splits its embeddings by it); each range is ``<|START_OF_IMG|>`` + tiles +
``<|END_OF_IMG|>``, only the image tokens embedded. CohereCompass
(``CohereCompassMultiModalProcessor``): Qwen2-VL's image fields, normalised pixels in the model
dtype, ranges without a mask; vLLM's class takes no videos, so mmfront refuses them while it runs.
The default cases (three small images of other aspect ratios, two images, the same image twice) and
images large enough to tile (Cohere2-Vision: 3 and 4 tiles) or to change the grid (CohereCompass).

Under transformers 5.14.1 (the Legacy backend) Cohere2-Vision is equal too (the same tests);
CohereCompass has no processor there (transformers ships it from 5.16.0), so its tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_parity import Case, assert_a_hit_sends_the_miss, default_cases, family_folder, run_family, video_clip

from mmfront import MultiModalConfig
from mmfront.errors import ValidationError
from mmfront.models.registry import create_processor
from mmfront.models.transformers import TRANSFORMERS_VERSION
from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

NO_COMPASS = "transformers before 5.16.0 (the Legacy venv's 5.14.1) ships no CohereCompassProcessor: no folder loads"

LARGE_IMAGES = {"Cohere2VisionProcessor": ((800, 300), (512, 1536)), "CohereCompassProcessor": ((224, 112), (112, 336))}
"""Per family, two images of other tilings than the default cases' small ones (which all make one
Cohere2-Vision tile and the same CohereCompass row count): 800 x 300 makes two 512 px tiles and the
thumbnail, 512 x 1536 three and the thumbnail; CohereCompass grids 8 x 16 and 24 x 8."""


def _compass_ships() -> bool:
    """Whether the installed transformers ships CohereCompass (from the spec's ``transformers_since``)."""
    from packaging.version import Version

    from mmfront.models.catalog import model_specs

    return Version(str(model_specs()["cohere_compass"].transformers_since)) <= TRANSFORMERS_VERSION


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-cohere")


def cases(processor_class: str) -> list[Case]:
    """The default image cases, a large image alone and beside one of another tiling; for Cohere2-Vision
    the two with the request's ``max_patches`` (vLLM counts the tiles with the merged kwargs too)."""
    wide, tall = (make_image(w, h, seed=10 + i) for i, (w, h) in enumerate(LARGE_IMAGES[processor_class]))
    out = [*default_cases(["image"]), Case("image_large", "image", [wide]), Case("image_two_large", "image", [wide, tall])]
    if processor_class == "Cohere2VisionProcessor":
        out.append(Case("image_two_max_patches", "image", [wide, tall], mm_processor_kwargs={"max_patches": 2}))
    return out


def _equal(processor_class: str, root: Path) -> dict:
    result = run_family(processor_class, root, cases=cases(processor_class))
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    assert set(result["diff"]) == {c.name for c in cases(processor_class)}
    assert {"image_one", "image_tall", "image_two", "image_same_twice", "image_large", "image_two_large"} <= set(
        result["diff"])
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    resolved = result["vllm"]["resolved"]
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    first, second = result["vllm"]["cases"]["image_same_twice"]["mm_hashes"]["image"]
    assert first == second
    return result


@needs_peer
@pytest.mark.slow
def test_cohere2_vision_equals_vllm_native(root: Path) -> None:
    result = _equal("Cohere2VisionProcessor", root)
    assert result["vllm"]["resolved"]["processor"] == "Cohere2VisionMultiModalProcessor"
    vllm = result["vllm"]["cases"]
    wide, tall = vllm["image_two_large"]["mm_kwargs"]["image"]
    assert sorted(wide) == ["num_patches", "pixel_values"]
    assert wide["num_patches"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert wide["num_patches"]["data"][1:3] == ["int64", []]
    assert wide["pixel_values"]["field"][0] == "flat" and wide["pixel_values"]["field"][1]["dim"] == 0
    assert (wide["pixel_values"]["data"][1:3], tall["pixel_values"]["data"][1:3]) == (
        ["bfloat16", [3, 3, 512, 512]], ["bfloat16", [4, 3, 512, 512]])
    (small,) = vllm["image_one"]["mm_kwargs"]["image"]
    assert small["pixel_values"]["data"][2] == [1, 3, 512, 512]  # a small image is its thumbnail alone
    # <|START_OF_IMG|>, per tile 256 image tokens and a line break, <|END_OF_IMG|>
    ranges = vllm["image_two_large"]["mm_placeholders"]["image"]
    assert [r[1] for r in ranges] == [2 + 3 * 257, 2 + 4 * 257]
    for r in ranges:
        assert r[2][0] is False and r[2][-1] is False and sum(r[2]) == 256 * (r[1] - 2) // 257
    capped = vllm["image_two_max_patches"]["mm_kwargs"]["image"]  # two tiles and the thumbnail each
    assert [item["pixel_values"]["data"][2] for item in capped] == [[3, 3, 512, 512], [3, 3, 512, 512]]


@needs_peer
@pytest.mark.slow
def test_cohere_compass_equals_vllm_native(root: Path) -> None:
    if not _compass_ships():
        pytest.skip(NO_COMPASS)
    result = _equal("CohereCompassProcessor", root)
    assert result["vllm"]["resolved"]["processor"] == "CohereCompassMultiModalProcessor"
    vllm = result["vllm"]["cases"]
    wide, tall = vllm["image_two_large"]["mm_kwargs"]["image"]
    assert sorted(wide) == ["image_grid_thw", "pixel_values"]
    assert wide["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert wide["image_grid_thw"]["data"][1:3] == ["int64", [3]]
    assert wide["pixel_values"]["field"][0] == "flat" and wide["pixel_values"]["field"][1]["dim"] == 0
    assert (wide["pixel_values"]["data"][1:3], tall["pixel_values"]["data"][1:3]) == (
        ["bfloat16", [128, 1176]], ["bfloat16", [192, 1176]])
    ranges = vllm["image_two_large"]["mm_placeholders"]["image"]
    assert [r[1] for r in ranges] == [32, 48] and all(r[2] is None for r in ranges)


@pytest.mark.parametrize("processor_class", sorted(LARGE_IMAGES))
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    if processor_class == "CohereCompassProcessor" and not _compass_ships():
        pytest.skip(NO_COMPASS)
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder)
    assert proc.info.native is not None
    [case] = [c for c in cases(processor_class) if c.name == "image_two_large"]
    miss, _ = assert_a_hit_sends_the_miss(proc, "image", case.media)
    keys = {"Cohere2VisionProcessor": ["num_patches", "pixel_values"],
            "CohereCompassProcessor": ["image_grid_thw", "pixel_values"]}[processor_class]
    assert [sorted(item) for item in miss["mm_kwargs"]["image"]] == [keys, keys]


def test_cohere_compass_videos_refused_for_the_native_class(root: Path) -> None:
    """vLLM's class takes no video; ``--model-impl transformers`` serves them."""
    if not _compass_ships():
        pytest.skip(NO_COMPASS)
    folder, _ = family_folder("CohereCompassProcessor", root)
    proc = create_processor(folder)
    assert proc.info.native is not None and list(proc.info.get_supported_mm_limits()) == ["image"]
    with pytest.raises(ValidationError, match=r"native CohereCompass class takes no videos.*--model-impl transformers"):
        proc.apply("Watch <|VIDEO_PAD|> now", {"video": [video_clip(8, 2.0, range(8))]})
    backend = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert backend.info.native is None and "video" in backend.info.get_supported_mm_limits()


def test_cohere_compass_spec_is_declared_before_transformers_ships_it() -> None:
    """The catalog is the same under every transformers; the names are checked from 5.16.0 on."""
    from mmfront.models.catalog import model_specs

    spec = model_specs()["cohere_compass"]
    assert spec.transformers_since == "5.16.0" and spec.native is not None
    assert spec.native.architectures == ("CohereCompassForConditionalGeneration",)

