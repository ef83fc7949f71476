"""Video through the transformers backend (Offsets and Legacy) on each family with a video processor mmfront serves
(Qwen2.5-VL and LLaVA-OneVision on their model fixtures, Qwen2-VL on a folder the coverage builder
makes from its HF processor class, Qwen3-VL likewise): prompt ids, placeholder ranges and each video's tensors equal the
HF processor's own output for clips of three lengths and frame rates, sampled as vLLM 0.33
samples them and passed with their metadata; images and videos in one prompt; a repeated video
is a cache hit that equals the miss and decodes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from markers import NEEDS_TORCHVISION, VIDEO_SERVED
from mmfront import MediaWithBytes, MultiModalConfig, create_processor
from mmfront.cache import processor_only_cache_from_config
from mmfront.errors import ProcessorError, ValidationError
from mmfront.media import DecodeBudget, load_video_bytes
from mmfront.testing.coverage import build_processor_folder
from mmfront.testing.media import make_image, make_video
from mmfront.testing.models import build_model_folder, load_processor

pytestmark = [pytest.mark.backend, NEEDS_TORCHVISION]

#: (seconds, frames per second) of the three clips: three lengths, three rates
CLIPS = [(1.0, 8), (2.0, 10), (3.0, 6)]


@dataclass(frozen=True)
class Family:
    kind: str
    image_placeholder: str
    video_placeholder: str
    media_io_kwargs: dict[str, Any]
    """LLaVA-OneVision keeps every frame of these short clips (vLLM's 32 by default), and HF stacks
    a call's videos, so the comparison on one prompt keeps 4 frames of each; the Qwen families
    sample at 2 frames a second and take clips of any length in one call."""
    processor_class: str | None = None
    """Built by the coverage builder from this HF processor class (no model fixture)."""
    needs_metadata: bool = False
    """The backend passes each video's metadata to HF (as vLLM's own processor does)."""

    def build(self, folder: Path) -> Path:
        if self.processor_class is None:
            return build_model_folder(self.kind, folder)
        return build_processor_folder(self.processor_class, folder)


QWEN_PLACEHOLDERS = ("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>")
FAMILIES = {
    "qwen2_5_vl": Family("qwen2_5_vl", *QWEN_PLACEHOLDERS, {}, needs_metadata=True),
    "llava_onevision": Family("llava_onevision", "<image>", "<video>", {"video": {"num_frames": 4}}),
    # the builder's small tokenizer spells these placeholders <image> and <video>
    "qwen2_vl": Family("qwen2_vl", "<image>", "<video>", {}, processor_class="Qwen2VLProcessor"),
    # Qwen3-VL's fixture spells its real tokens (vLLM's native processor expands its own placeholder text)
    "qwen3_vl": Family("qwen3_vl", "<|image_pad|>", "<|video_pad|>", {}, processor_class="Qwen3VLProcessor",
                       needs_metadata=True),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    kind = request.param
    return FAMILIES[kind], FAMILIES[kind].build(tmp_path_factory.mktemp(kind))


@pytest.fixture(scope="module")
def hf(family: tuple[Family, Path]) -> Any:
    return load_processor(family[1])


@pytest.fixture(scope="module", params=["auto", "legacy"])
def processor(family: tuple[Family, Path], request: pytest.FixtureRequest) -> Any:
    """The installed transformers' backend (Offsets from 5.15), and Legacy chosen explicitly
    (which locates each video's expansion in HF's ids)."""
    if family[0].kind == "qwen3_vl" and request.param == "legacy":
        pytest.skip(QWEN3_VL_LEGACY)
    return create_processor(family[1], MultiModalConfig(dtype="float32", transformers_backend=request.param, model_impl="transformers"))


QWEN3_VL_LEGACY = ("Qwen3-VL writes a timestamp before each group of a video's frames, so one video's tokens come in "
                   "several runs, which the Legacy backend (it locates runs of tokens) cannot attribute to videos: "
                   "it refuses them (test_legacy_refuses_qwen3_vl_videos); Offsets places them from HF's offsets")


@pytest.fixture(scope="module")
def clips() -> list[bytes]:
    return [make_video(seconds=s, fps=r, seed=i) for i, (s, r) in enumerate(CLIPS)]


def load(hf: Any, clip: bytes, media_io_kwargs: dict[str, Any] | None = None) -> MediaWithBytes[Any]:
    config = MultiModalConfig(model_impl="transformers")
    return load_video_bytes(clip, config=config, budget=DecodeBudget.from_config(config),
                            media_io_kwargs=media_io_kwargs, video_processor=type(hf.video_processor).__name__)


def hf_video_kwargs(processor: Any, videos: list[MediaWithBytes[Any]]) -> dict[str, Any]:
    """What vLLM hands the HF processor: the kept frames, HF sampling none, and the metadata
    where the processor reads it."""
    kwargs: dict[str, Any] = {"videos": [v.media for v in videos], "do_sample_frames": False}
    if processor.info.video_needs_metadata:
        kwargs["video_metadata"] = [{k: v for k, v in video.info["metadata"].items() if k != "do_sample_frames"}
                                    for video in videos]
    return kwargs


def check_ranges(out: dict[str, Any], ids: list[int], modality: str, token: int) -> None:
    """Each range holds its item's embedding tokens, and the ranges cover every such token."""
    covered: list[int] = []
    for p in out["mm_placeholders"][modality]:
        span = torch.tensor(ids[p.offset:p.offset + p.length])
        mask = torch.ones(p.length, dtype=torch.bool) if p.is_embed is None else p.is_embed
        assert torch.equal(mask, span == token)
        covered += [p.offset + i for i in range(p.length) if mask[i]]
    assert covered == [i for i, t in enumerate(ids) if t == token]


def video_rows(want: dict[str, Any], count: int) -> list[torch.Tensor]:
    """HF's pixel_values_videos cut per video: by grid (Qwen) or one row each (LLaVA)."""
    pixels = want["pixel_values_videos"]
    grid = want.get("video_grid_thw")
    if grid is None:
        return list(pixels[:count])
    return list(pixels.split([int(n) for n in grid.prod(-1)]))


@VIDEO_SERVED
def test_the_family_takes_video(processor: Any, family: tuple[Family, Path]) -> None:
    assert "video" in processor.info.get_supported_mm_limits()
    assert processor.info.video_needs_metadata == family[0].needs_metadata  # as vLLM's own processors


@pytest.mark.hf_version("<5.18", reason="from transformers 5.18 the backend serves video")
def test_video_is_refused_before_transformers_5_18(processor: Any) -> None:
    assert "video" not in processor.info.get_supported_mm_limits()


@VIDEO_SERVED
def test_three_clips_equal_hf(processor: Any, hf: Any, family: tuple[Family, Path], clips: list[bytes]) -> None:
    fam = family[0]
    videos = [load(hf, clip, fam.media_io_kwargs) for clip in clips]
    assert len({v.info["metadata"]["fps"] for v in videos}) == 3
    text = "Before " + " then ".join([fam.video_placeholder] * 3) + " after."
    out = processor.apply(text, {"video": videos})
    want = dict(hf(text=text, return_tensors="pt", **hf_video_kwargs(processor, videos)))
    ids = want["input_ids"][0].tolist()
    assert out["prompt_token_ids"] == ids
    check_ranges(out, ids, "video", hf.video_token_id)
    rows = video_rows(want, 3)
    for i in range(3):
        got = out["mm_kwargs"]["video"][i]
        assert torch.equal(got["pixel_values_videos"].data, rows[i])
        for key in ("video_grid_thw", "second_per_grid_ts"):
            if key in want:
                assert torch.equal(got[key].data, want[key][i])
    assert sum(p.length for p in out["mm_placeholders"]["video"]) < len(ids)


@VIDEO_SERVED
def test_each_clip_alone_equals_hf_alone(processor: Any, hf: Any, family: tuple[Family, Path],
                                         clips: list[bytes]) -> None:
    """With the default sampling the clips keep different frame counts; each video's data is what
    HF gives that video alone, whatever it is processed beside."""
    videos = [load(hf, clip) for clip in clips]
    together = processor.apply(" ".join([family[0].video_placeholder] * 3), {"video": videos})
    for i, video in enumerate(videos):
        want = dict(hf(text=family[0].video_placeholder, return_tensors="pt", **hf_video_kwargs(processor, [video])))
        assert torch.equal(together["mm_kwargs"]["video"][i]["pixel_values_videos"].data, video_rows(want, 1)[0])


@VIDEO_SERVED
def test_images_and_videos_in_one_prompt_equal_hf(processor: Any, hf: Any, family: tuple[Family, Path],
                                                  clips: list[bytes]) -> None:
    fam = family[0]
    videos = [load(hf, clip, fam.media_io_kwargs) for clip in clips[:2]]
    images = [make_image(64, 48, seed=0), make_image(40, 72, seed=1)]
    text = f"A {fam.image_placeholder} B {fam.video_placeholder} C {fam.image_placeholder} D {fam.video_placeholder} E"
    out = processor.apply(text, {"image": images, "video": videos})
    want = dict(hf(text=text, images=images, return_tensors="pt", **hf_video_kwargs(processor, videos)))
    ids = want["input_ids"][0].tolist()
    assert out["prompt_token_ids"] == ids
    check_ranges(out, ids, "video", hf.video_token_id)
    check_ranges(out, ids, "image", hf.image_token_id)
    rows = video_rows(want, 2)
    for i in range(2):
        assert torch.equal(out["mm_kwargs"]["video"][i]["pixel_values_videos"].data, rows[i])


@VIDEO_SERVED
def test_a_repeated_video_hits_the_cache_and_decodes_nothing(processor: Any, hf: Any, family: tuple[Family, Path],
                                                             clips: list[bytes]) -> None:
    cache = processor_only_cache_from_config(MultiModalConfig())
    assert cache is not None
    text = f"Watch {family[0].video_placeholder} now"
    first = processor.apply(text, {"video": [load(hf, clips[1])]}, cache=cache)
    again = load(hf, clips[1])
    second = processor.apply(text, {"video": [again]}, cache=cache)
    assert again.decode_count == 0
    assert cache.make_stats().hits > 0
    assert second["prompt_token_ids"] == first["prompt_token_ids"]
    assert second["mm_hashes"] == first["mm_hashes"]
    assert second["mm_placeholders"] == first["mm_placeholders"]
    missed, hit = first["mm_kwargs"]["video"][0], second["mm_kwargs"]["video"][0]
    assert sorted(hit) == sorted(missed)
    for key in hit:
        assert torch.equal(hit[key].data, missed[key].data)


def test_llava_next_video_is_refused_video_with_the_reason(tmp_path: Path) -> None:
    """LLaVA-NeXT-Video's processor has a video processor but counts no video tokens, so the
    transformers backend (like vLLM 0.33's) cannot place its videos: images only, and a video is
    refused with what to do."""
    folder = build_processor_folder("LlavaNextVideoProcessor", tmp_path / "llava_next_video")
    processor = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert list(processor.info.get_supported_mm_limits()) == ["image"]
    hf = load_processor(folder)
    video = load(hf, make_video(1.0, fps=8))
    with pytest.raises(ValidationError, match=r"does not support video inputs \(it accepts: \['image'\]\)\. "
                                              r"LlavaNextVideoProcessor has a video processor, but"):
        processor.apply("Watch <video> now", {"video": [video]})


@VIDEO_SERVED
def test_legacy_refuses_qwen3_vl_videos(tmp_path: Path, clips: list[bytes]) -> None:
    folder = build_processor_folder("Qwen3VLProcessor", tmp_path / "qwen3_vl")
    processor = create_processor(folder, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    video = load(load_processor(folder), clips[1])
    with pytest.raises(ProcessorError, match=r"Could not locate 1 video item\(s\) in Qwen3VLProcessor's expansion"):
        processor.apply("Watch <|video_pad|> now", {"video": [video]})
