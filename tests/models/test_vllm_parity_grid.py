"""Grid-layout families (issue 32, group 1) equal to vLLM 0.33's native frontend after its msgpack
round trip: Qwen3-VL (raw uint8 patches, each video's frame ``timestamps``) and PaddleOCR-VL
(normalised patches in the model dtype). The cases of ``vllm_parity.default_cases``: three image
sizes and aspect ratios, two images in one prompt, the same image twice; for Qwen3-VL a short clip
with every frame kept (HF samples it, vLLM recomputes the timestamps of HF's frames), a sampled clip
and two clips in one prompt. A cache hit sends the bytes of a miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_parity import assert_a_hit_sends_the_miss, default_cases, family_folder, prompt_for, run_family, video_clip

from mmfront import MultiModalConfig
from mmfront.errors import ProcessorError, ValidationError
from mmfront.models.registry import create_processor
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

PROVEN = ("Qwen3VLProcessor", "PaddleOCRVLProcessor")

LEGACY_VIDEO = ("the backend places videos from transformers 5.18 on (vLLM 0.33's gate too); under older "
                "transformers (Legacy) Qwen3-VL's videos are refused: test_qwen3_vl_videos_refused_before_5_18")


LEGACY_PADDLE = ("under transformers before 5.15 (Legacy) PaddleOCR-VL's images of one prompt expand in one run of "
                 "tokens that the Legacy backend cannot split per image: the processor is refused with ProcessorError")


def _legacy() -> bool:
    """transformers before 5.15, where the backend is Legacy (HF reports no offsets)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version("5.15")


def _takes_video(folder: Path) -> bool:
    return "video" in create_processor(folder).info.get_supported_mm_limits()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-grid")


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", PROVEN)
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    result = run_family(processor_class, root)
    if processor_class == "PaddleOCRVLProcessor" and _legacy():  # LEGACY_PADDLE
        assert result["mmfront_error"].startswith("ProcessorError: Could not locate 2 image item(s)"), result
        return
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["model_impl"].endswith("auto") and resolved["processor"] == f"{processor_class[:-9]}MultiModalProcessor"
    assert result["mmfront_impl"] == "native"
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    cases = result["vllm"]["cases"]
    (item,) = cases["image_one"]["mm_kwargs"]["image"]
    assert item["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert item["pixel_values"]["field"][0] == "flat"
    ranges = cases["image_two"]["mm_placeholders"]["image"]
    assert len(ranges) == 2 and all(r[2] is None for r in ranges)
    assert resolved["dtype"] == "bfloat16"
    if processor_class == "Qwen3VLProcessor":
        assert item["pixel_values"]["data"][1] == "uint8" and resolved["mm_device_do_normalize"] is True
        if not _takes_video(family_folder(processor_class, root)[0]):
            assert not {"video_all_frames", "video_sampled", "video_two"} & set(result["diff"])
            return
        assert {"video_all_frames", "video_sampled", "video_two"} <= set(result["diff"])
        clips = cases["video_two"]["mm_kwargs"]["video"]
        assert [c["timestamps"]["data"] for c in clips] == [[0.25, 1.25, 2.25, 3.25], [0.25, 1.25]]
        assert clips[0]["timestamps"]["field"] == ["batched", {"keep_on_cpu": True}]
        (sampled,) = cases["video_sampled"]["mm_kwargs"]["video"]
        assert sampled["timestamps"]["data"] == [0.5, 2.5, 4.5, 6.5]  # frames 0, 2, ... 14 of 16 at 2 fps
        video_range = cases["video_all_frames"]["mm_placeholders"]["video"][0]
        assert video_range[2] is not None and not all(video_range[2])  # timestamps and markers are text
    else:
        assert item["pixel_values"]["data"][1] == "bfloat16" and resolved["mm_device_do_normalize"] is False


@pytest.mark.parametrize(("processor_class", "modality"),
                         [("Qwen3VLProcessor", "image"), ("Qwen3VLProcessor", "video"), ("PaddleOCRVLProcessor", "image")])
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, modality: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    if modality == "video" and not _takes_video(folder):
        pytest.skip(LEGACY_VIDEO)
    if processor_class == "PaddleOCRVLProcessor" and _legacy():
        pytest.skip(LEGACY_PADDLE)
    config = MultiModalConfig()
    proc = create_processor(folder, config)
    media = (next(c for c in default_cases(["image"]) if c.name == "image_two").media if modality == "image"
             else [video_clip(8, 2.0, range(8)), video_clip(4, 2.0, range(4), seed=1)])
    assert_a_hit_sends_the_miss(proc, modality, media)


def test_qwen3_vl_video_timestamps_only_for_the_native_class(root: Path) -> None:
    """The timestamps are vLLM's native class's own input; its transformers backend reads HF's outputs."""
    folder, _ = family_folder("Qwen3VLProcessor", root)
    if not _takes_video(folder):
        pytest.skip(LEGACY_VIDEO)
    clip = video_clip(8, 2.0, range(0, 16, 2), total=16)
    for impl, keys in (("auto", {"pixel_values_videos", "video_grid_thw", "timestamps"}),
                       ("transformers", {"pixel_values_videos", "video_grid_thw", "num_video_patches"})):
        proc = create_processor(folder, MultiModalConfig(model_impl=impl))
        ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("video", 0), 1),
                                               add_special_tokens=False)
        (item,) = proc.apply(ids, {"video": [clip]})["mm_kwargs"]["video"]
        assert item is not None and set(item) == keys, impl
        if impl == "auto":
            assert item["timestamps"].data == [0.5, 2.5, 4.5, 6.5]
            assert item["pixel_values_videos"].data.dtype == torch.uint8


def test_qwen3_vl_videos_refused_before_5_18(root: Path) -> None:
    """Under transformers before 5.18 (the Legacy backend) a Qwen3-VL video is refused with the cause,
    never sent in another form; its images stay equal (the peer test)."""
    folder, _ = family_folder("Qwen3VLProcessor", root)
    if _takes_video(folder):
        pytest.skip("this transformers places videos (5.18 or newer): the peer test proves them")
    proc = create_processor(folder)
    ids = proc.info.get_tokenizer().encode("Watch <|video_pad|> now", add_special_tokens=False)
    with pytest.raises(ValidationError, match=r"places videos from transformers 5\.18\.0 on"):
        proc.apply(ids, {"video": [video_clip(8, 2.0, range(8))]})


def test_paddleocr_vl_refused_before_5_15(root: Path) -> None:
    folder, _ = family_folder("PaddleOCRVLProcessor", root)
    if not _legacy():
        assert create_processor(folder).info.native is not None
        return
    with pytest.raises(ProcessorError, match=r"Could not locate 2 image item\(s\) in PaddleOCRVLProcessor"):
        create_processor(folder)


GLM = ("Glm4vProcessor",)
"""Images proven; videos refused while the native class runs (models/glm4v.py says why)."""


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", GLM)
def test_glm_images_equal_vllm_native(processor_class: str, root: Path) -> None:
    result = run_family(processor_class, root)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == f"{processor_class[:-9]}MultiModalProcessor" and result["mmfront_impl"] == "native"
    assert set(result["diff"]) == {"image_one", "image_tall", "image_two", "image_same_twice"}
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    (item,) = result["vllm"]["cases"]["image_one"]["mm_kwargs"]["image"]
    assert item["pixel_values"]["data"][1] == "uint8" and resolved["mm_device_do_normalize"] is True


@pytest.mark.parametrize("processor_class", GLM)
def test_glm_videos_refused_for_the_native_class(processor_class: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder)
    assert proc.info.native is not None and list(proc.info.get_supported_mm_limits()) == ["image"]
    clip = video_clip(8, 2.0, range(8))
    with pytest.raises(ValidationError, match=r"from <\|begin_of_video\|> to <\|end_of_video\|>.*--model-impl transformers"):
        proc.apply("Watch <|video|> now", {"video": [clip]})
    import transformers
    from packaging.version import Version

    backend = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    places_videos = Version(transformers.__version__) >= Version("5.18")  # the backend's video gate
    assert ("video" in backend.info.get_supported_mm_limits()) == places_videos
