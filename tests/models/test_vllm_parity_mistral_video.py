"""Mistral 3 and LLaVA-NeXT-Video equal to vLLM 0.33's native frontend after its msgpack round trip.

**Mistral 3** (``PixtralProcessor`` folders of ``mistral3`` checkpoints, vLLM's
``Mistral3MultiModalProcessor``): raw ``uint8`` pixels (vLLM normalises them on the device), one
image's ``[C, H, W]`` per item, no ``image_sizes``, ranges whose ``[IMG_BREAK]``/``[IMG_END]``
tokens are not embedded. The harness aligns the folder's merged patch (vision ``patch_size`` times
``spatial_merge_size``, from which vLLM counts an image's tokens) with its processor's. Images of
three sizes and aspect ratios, one larger than the processor's ``longest_edge`` (resized down on
both sides), a request's own ``size``, two images, the same image twice.

**LLaVA-NeXT-Video** (vLLM's ``LlavaNextVideoMultiModalProcessor``): videos only, one per prompt
(vLLM's ``get_supported_mm_limits`` is ``{"video": 1}``): a clip with every frame kept, a sampled
clip, a clip of wide frames; two clips are refused on both sides with vLLM's limit, and an image by
mmfront with vLLM's limit of 0. Under transformers < 5.15 (Legacy) the class is refused: that
backend places no videos.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from vllm_parity import (
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    prompt_for,
    run_family,
    video_clip,
    wire_frames,
)

from mmfront import MultiModalConfig
from mmfront.errors import UnsupportedModelError, ValidationError
from mmfront.models.llava_next_video import LLAVA_NEXT_VIDEO_NATIVE
from mmfront.models.mistral3 import MISTRAL3_NATIVE
from mmfront.models.registry import create_processor
from mmfront.models.transformers import MultiModalProcessor, OffsetsMultiModalProcessor
from mmfront.processing.processor import BaseMultiModalProcessor
from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

LEGACY = MultiModalProcessor is not OffsetsMultiModalProcessor
"""transformers < 5.15: the default backend is Legacy."""
LEGACY_VIDEO = ("LLaVA-NeXT-Video is refused for vLLM's native class on the Legacy backend (transformers < 5.15 "
                "places no videos, and the class takes videos only): test_llava_next_video_is_refused_on_the_legacy_backend")

ONE_VIDEO = "At most 1 video(s) may be provided in one prompt."


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-mistral-video")


def _mistral3_cases() -> list[Case]:
    """The default image cases, an image wider than the processor's longest edge (1024 px), and a
    request's own longest edge (vLLM counts with the request's ``size`` too)."""
    return [*default_cases(["image"]), Case("image_large", "image", [make_image(1300, 500, seed=9)]),
            Case("image_request_size", "image", [make_image(96, 40, seed=3)], {"size": {"longest_edge": 32}})]


def _video_cases() -> list[Case]:
    """Every frame kept, a sampled clip, wide frames, and two clips (over vLLM's limit of one)."""
    cases = [c for c in default_cases(["video"]) if c.name != "video_two"]
    return [*cases, Case("video_wide", "video", [video_clip(6, 3.0, range(6), seed=2, size=(80, 48))]),
            Case("video_two", "video", [video_clip(8, 2.0, range(8)), video_clip(4, 2.0, range(4), seed=1)])]


@needs_peer
@pytest.mark.slow
def test_mistral3_images_equal_vllm_native(root: Path) -> None:
    cases = _mistral3_cases()
    result = run_family("PixtralProcessor", root, cases=cases)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["architecture"] == "Mistral3ForConditionalGeneration"
    assert resolved["processor"] == "Mistral3MultiModalProcessor"
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", True, "native")
    assert set(result["diff"]) == {c.name for c in cases}
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{name}: {diff}"
    vllm = result["vllm"]["cases"]
    (item,) = vllm["image_one"]["mm_kwargs"]["image"]
    assert set(item) == {"pixel_values"}
    assert item["pixel_values"]["field"] == ["batched", {"keep_on_cpu": False}]
    assert item["pixel_values"]["data"][1:3] == ["uint8", [3, 48, 48]]  # 48 x 40 px, rows rounded up to a patch
    # 3 x 3 merged patches of 16 px: rows of [IMG] x 3 closed by [IMG_BREAK], the last by [IMG_END]
    assert vllm["image_one"]["mm_placeholders"]["image"] == [[2, 12, [True, True, True, False] * 3]]
    (large,) = vllm["image_large"]["mm_kwargs"]["image"]
    assert large["pixel_values"]["data"][1:3] == ["uint8", [3, 400, 1024]]  # 1300 x 500 px scaled to 1024 x 393
    assert [r[:2] for r in vllm["image_large"]["mm_placeholders"]["image"]] == [[2, (64 + 1) * 25]]
    # 96 x 40 px scaled to 32 x 13: one row of two [IMG], closed by [IMG_END]
    assert vllm["image_request_size"]["mm_placeholders"]["image"] == [[2, 3, [True, True, False]]]
    # laid out as alone beside another image, whatever its size
    mine = result["mmfront"]
    assert mine["image_two"]["mm_kwargs"]["image"][0] == mine["image_one"]["mm_kwargs"]["image"][0]
    same = mine["image_same_twice"]
    assert same["mm_hashes"]["image"][0] == same["mm_hashes"]["image"][1]


def test_mistral3_cache_hit_sends_what_a_miss_sends(root: Path) -> None:
    folder, _ = family_folder("PixtralProcessor", root)
    proc = create_processor(folder)
    assert proc.info.native is MISTRAL3_NATIVE and proc.info.device_normalize
    miss, _ = assert_a_hit_sends_the_miss(proc, "image", [make_image(48, 40, seed=0), make_image(40, 56, seed=2)])
    shapes = []
    for item in miss["mm_kwargs"]["image"]:
        assert item is not None and set(item) == {"pixel_values"}
        pixels = item["pixel_values"].data
        assert isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8
        shapes.append(tuple(pixels.shape))
    assert shapes == [(3, 48, 48), (3, 64, 48)]


@needs_peer
@pytest.mark.slow
def test_llava_next_video_equal_vllm_native(root: Path) -> None:
    if LEGACY:
        pytest.skip(LEGACY_VIDEO)
    cases = _video_cases()
    result = run_family("LlavaNextVideoProcessor", root, cases=cases)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == "LlavaNextVideoMultiModalProcessor"
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", False, "native")
    assert resolved["placeholders"] == {"image": None, "video": "<video>", "audio": None}
    assert set(result["diff"]) == {c.name for c in cases}
    for name, diff in result["diff"].items():
        if name != "video_two":
            assert diff == {"differs": [], "details": []}, f"{name}: {diff}"
    # two clips: vLLM's limit of one video per prompt, refused on both sides
    two = result["diff"]["video_two"]
    assert two["differs"] == ["error"]
    assert two["vllm_error"] == f"VLLMValidationError: {ONE_VIDEO} (parameter=video)"
    assert two["mmfront_error"] == (f"ValidationError: {ONE_VIDEO} vLLM 0.33's native "
                                    "LlavaNextVideoForConditionalGeneration class takes at most 1 video(s) per prompt.")
    vllm = result["vllm"]["cases"]
    for name, frames in (("video_all_frames", 8), ("video_sampled", 8), ("video_wide", 6)):
        (item,) = vllm[name]["mm_kwargs"]["video"]
        assert set(item) == {"pixel_values_videos"}
        assert item["pixel_values_videos"]["field"] == ["batched", {"keep_on_cpu": False}]
        assert item["pixel_values_videos"]["data"][1:3] == ["bfloat16", [frames, 3, 224, 224]]
        # (224 / 14 patches, pooled by 2)^2 tokens a frame, the whole range embedded
        assert vllm[name]["mm_placeholders"]["video"] == [[2, 64 * frames, None]]


def _video_proc(root: Path, config: MultiModalConfig | None = None) -> tuple[BaseMultiModalProcessor, list[int]]:
    folder, _ = family_folder("LlavaNextVideoProcessor", root)
    proc = create_processor(folder, config)
    ids = proc.info.get_tokenizer().encode(prompt_for("<video>", 1), add_special_tokens=False)
    return proc, ids


def test_llava_next_video_cache_hit_sends_what_a_miss_sends(root: Path) -> None:
    if LEGACY:
        pytest.skip(LEGACY_VIDEO)
    from mmfront.cache.factory import processor_only_cache_from_config

    proc, ids = _video_proc(root)
    assert proc.info.native is LLAVA_NEXT_VIDEO_NATIVE
    cache = processor_only_cache_from_config(proc.info.config)
    assert cache is not None
    clip = video_clip(8, 2.0, range(8))
    miss = proc.apply(ids, {"video": [clip]}, cache=cache)
    hit = proc.apply(ids, {"video": [clip]}, cache=cache)
    assert cache.make_stats().hits == 1
    assert (hit["prompt_token_ids"], hit["mm_hashes"], hit["mm_placeholders"]) == (
        miss["prompt_token_ids"], miss["mm_hashes"], miss["mm_placeholders"])
    assert wire_frames(hit) == wire_frames(miss)
    (item,) = miss["mm_kwargs"]["video"]
    assert item is not None and set(item) == {"pixel_values_videos"}
    frames = item["pixel_values_videos"].data
    assert isinstance(frames, torch.Tensor) and frames.dtype == torch.bfloat16
    assert tuple(frames.shape) == (8, 3, 224, 224)


def test_llava_next_video_native_class_refuses_images_and_a_second_video(root: Path) -> None:
    """vLLM's class takes no images (its limit is 0) and one video per prompt: mmfront refuses both
    with vLLM's limit in the error; the transformers backend serves images."""
    if LEGACY:
        pytest.skip(LEGACY_VIDEO)
    proc, _ = _video_proc(root)
    assert proc.info.get_supported_mm_limits() == {"video": 1}
    image_ids = proc.info.get_tokenizer().encode(prompt_for("<image>", 1), add_special_tokens=False)
    with pytest.raises(ValidationError, match=r"does not support image inputs \(it accepts: \['video'\]\)\. vLLM 0\.33's "
                                              r"native LlavaNextVideoForConditionalGeneration class takes no image items "
                                              r"\(its limit is 0; it takes video only\): serve the model with "
                                              r"--model-impl transformers for them\.") as refused:
        proc.apply(image_ids, {"image": [make_image(48, 40)]})
    assert refused.value.parameter == "image"
    two_ids = proc.info.get_tokenizer().encode(prompt_for("<video>", 2), add_special_tokens=False)
    with pytest.raises(ValidationError, match=rf"^{re.escape(ONE_VIDEO)} vLLM 0\.33's native") as over:
        proc.apply(two_ids, {"video": [video_clip(4, 2.0, range(4)), video_clip(4, 2.0, range(4), seed=1)]})
    assert over.value.parameter == "video"
    served, _ = _video_proc(root, MultiModalConfig(model_impl="transformers"))
    assert served.info.native is None
    assert served.info.get_supported_mm_limits() == {"image": None}


def test_llava_next_video_is_refused_on_the_legacy_backend(root: Path) -> None:
    folder, _ = family_folder("LlavaNextVideoProcessor", root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend .* takes videos only, and the "
                                                     r"transformers backend places videos from transformers 5\.18 on"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))
    legacy = create_processor(folder, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    assert legacy.info.native is None


def test_llava_next_video_before_transformers_5_18_says_why(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between 5.15 and 5.18 the backend is not Legacy but places no videos: the native class then has
    nothing to receive, and the refusal says why for each modality."""
    if LEGACY:
        pytest.skip(LEGACY_VIDEO)
    from packaging.version import Version

    from mmfront.models.transformers import base

    monkeypatch.setattr(base, "TRANSFORMERS_VERSION", Version("5.17.0"))
    folder, _ = family_folder("LlavaNextVideoProcessor", root)
    with pytest.raises(UnsupportedModelError, match=r"^LlavaNextVideoProcessor: none of its modalities can be served here\. "
                                                     r"vLLM 0\.33's native .* takes no image items .* the transformers "
                                                     r"backend places videos from transformers 5\.18\.0 on"):
        create_processor(folder)


def test_models_table_says_both_families_equal_vllm_native() -> None:
    """docs/models.md's vLLM column: Pixtral's processor ships with mistral3 checkpoints (its own
    ``pixtral`` model type is the vision tower alone), and LLaVA-NeXT-Video is declared."""
    from mmfront.testing.coverage import SERVED, VLLM_NATIVE, Coverage, vllm_equality

    for processor_class in ("PixtralProcessor", "LlavaNextVideoProcessor"):
        assert vllm_equality(Coverage(processor_class, SERVED)) == f"**{VLLM_NATIVE}**"
